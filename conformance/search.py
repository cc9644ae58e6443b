"""Level-parallel breadth-first search: the worker pool that expands a level on several cores.

The model's explorer (``kvfence.model.explore``) is pure: it computes successors, judges
them and merges a level's results, and leaves how a level's frontier is expanded to a
``Levels`` runner (``model.explore.serial`` by default, in the calling process). This
module holds the runner that forks: ``forked(workers)`` expands each level of
``PARALLEL_MIN`` states or more on ``workers`` processes (this one and ``workers - 1``
forked children reading the visited set copy-on-write) and yields the chunks' results in
frontier order, so the merged result is the one-process search's. ``explore`` is the model
explorer on such a runner; ``kvfence explore`` and ``scripts/bench.py`` call it with the
usable cores (``usable_cores``).

``pool(chunks, run, workers)`` is the pool itself, generic over what a chunk is and what
its result is (anything picklable): ``forked`` cuts a level into chunks of frontier
states; another breadth-first search can cut its own levels the same way.

Needs the ``fork`` start method (POSIX); elsewhere a level is expanded in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TypeVar

from ..model.explore import Cut, Expand, Exploration, Levels, Slice, serial
from ..model.explore import explore as explore_model
from ..model.properties import SOMETIMES, Sometimes
from ..model.state import Bounds, State

T = TypeVar("T")

PARALLEL_MIN = 2000
"""Frontier states below which a level is expanded in this process even with ``workers``
> 1: forking, sending the new states back and merging them cost more than such a level
(a test pins that the default-bound search has levels on both sides of it)."""

MAX_SECONDS = "max-seconds"
"""``Exploration.cut`` of a search the time cap ended."""

DEADLINE_SLICE = 500
"""With a time cap, no slice of a level is larger than this (frontier states): the cap is
checked between slices, so a search overruns it by about one slice's expansion."""

CHUNKS_PER_WORKER = 8
"""A forked level's frontier is cut into ``CHUNKS_PER_WORKER * workers`` contiguous chunks,
claimed one at a time: states differ in cost (a paused endpoint has few actions), so equal
halves would leave one core idle; small chunks keep both busy to the end."""


def usable_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``, where the platform has
    it; else ``os.cpu_count()``): ``kvfence explore``'s default ``--workers``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """The platform has the ``fork`` start method (the pool needs it)."""
    return "fork" in multiprocessing.get_all_start_methods()


def _child(conn: Connection, work: Callable[[], object]) -> None:
    """A forked worker: ``work()`` sent back pickled, or the traceback of why it failed."""
    try:
        out: tuple[str, object] = ("ok", work())
    except BaseException:  # the parent raises it, naming this worker
        out = ("error", traceback.format_exc())
    conn.send_bytes(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
    conn.close()


def pool(
    chunks: int,
    run: Callable[[int], T],
    workers: int,
    name: str = "search",
    deadline: float | None = None,
) -> Iterator[T]:
    """``run(c)`` for every chunk ``c`` in ``range(chunks)``, on ``workers`` processes: this
    one and ``workers - 1`` forked children claim chunks one at a time from a shared
    counter; each child sends its results back (pickled, over a pipe) when none is left.
    Yields the results in chunk order. Forked, not spawned: whatever ``run`` reads is shared
    copy-on-write, nothing is pickled in. Closing the generator (or an exception in it, e.g.
    a caller's ``SIGALRM``) kills and reaps every child still running: none is left behind.
    ``RuntimeError`` naming the worker (``f"{name} worker N"``) if a child failed or died.

    ``deadline`` (``time.monotonic()`` seconds): no chunk is claimed after it; chunks are
    claimed in order and each claimed one is finished, so the results of a prefix of the
    chunks are yielded, then ``model.explore.Cut("max-seconds")`` is raised.
    """
    ctx = multiprocessing.get_context("fork")
    claimed = ctx.Value("i", 0)  # the next chunk nobody has claimed

    def work() -> list[tuple[int, T]]:
        done = []
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                return done
            with claimed.get_lock():
                c = claimed.value
                claimed.value = c + 1
            if c >= chunks:
                return done
            done.append((c, run(c)))

    children: list[tuple[BaseProcess, Connection]] = []
    try:
        for _ in range(1, workers):
            reader, writer = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, args=(writer, work), daemon=True)
            children.append((child, reader))
            child.start()
            writer.close()
        results: list[tuple[bool, T | None]] = [(False, None)] * chunks
        for c, got in work():
            results[c] = (True, got)
        for w, (child, reader) in enumerate(children, start=1):
            try:
                status, sent = pickle.loads(reader.recv_bytes())
            except EOFError:
                child.join()
                raise RuntimeError(
                    f"{name} worker {w} (pid {child.pid}) died without its results "
                    f"(exit code {child.exitcode})"
                ) from None
            if status != "ok":
                raise RuntimeError(f"{name} worker {w} (pid {child.pid}) failed:\n{sent}")
            for c, got in sent:
                results[c] = (True, got)
        for c, (done, got) in enumerate(results):
            if not done and deadline is not None:
                raise Cut(MAX_SECONDS)
            if not done:  # cannot happen: every chunk is claimed once and sent back
                raise RuntimeError(f"{name}: chunk {c} of {chunks} came back from no worker")
            yield got  # type: ignore[misc]
    finally:
        for child, reader in children:
            reader.close()
            if child.is_alive():
                child.kill()
            child.join()


def forked(workers: int, deadline: float | None = None) -> Levels:
    """A ``Levels`` runner for ``model.explore.explore``: a level of ``PARALLEL_MIN``
    frontier states or more is cut into ``CHUNKS_PER_WORKER * workers`` contiguous slices
    expanded on ``workers`` processes (``pool``); a smaller level, or ``workers`` 1, or a
    platform without ``fork``, in this process (``model.explore.serial``).

    ``deadline`` (``time.monotonic()`` seconds): the time cap. Every level is then cut into
    slices of at most ``DEADLINE_SLICE`` states, in this process too, and no slice is begun
    after it: the search ends with ``Cut("max-seconds")`` (``Exploration.cut``), having
    merged the slices done. ``ValueError`` if ``workers`` < 1."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if not can_fork():
        workers = 1
    if workers == 1 and deadline is None:
        return serial

    def levels(n: int, expand: Expand) -> Iterator[Slice]:
        here = workers == 1 or n < PARALLEL_MIN
        if here and deadline is None:
            return serial(n, expand)
        chunks = min(n, CHUNKS_PER_WORKER * workers) if not here else 1
        if deadline is not None:
            chunks = max(chunks, -(-n // DEADLINE_SLICE))
        cuts = [n * c // chunks for c in range(chunks + 1)]
        return pool(
            chunks,
            lambda c: expand(cuts[c], cuts[c + 1]),
            1 if here else workers,
            "explore",
            deadline,
        )

    return levels


def explore(
    initial: State | Iterable[State],
    bounds: Bounds = Bounds(),
    depth: int = 6,
    faults: bool = True,
    max_states: int | None = None,
    symmetry: bool = False,
    stop: Callable[[int], bool] | None = None,
    workers: int = 1,
    max_seconds: float | None = None,
    sometimes: Iterable[Sometimes] = SOMETIMES,
) -> Exploration:
    """``model.explore.explore`` with each large level on ``workers`` processes
    (``forked``); the result is the one-process search's whatever ``workers``: the same
    counts, and the same first violation and trace. ``max_seconds``: the time cap, from
    now (``Exploration.cut`` is ``"max-seconds"`` when it ended the search; the witness
    search that follows is bounded by its own state cap, not by this). ``sometimes``: the
    sometimes-properties the witness search looks for (``model.explore.explore``'s; it
    runs in this process after the levels). ``ValueError`` if ``workers`` < 1 or
    ``max_seconds`` is not positive."""
    deadline = None
    if max_seconds is not None:
        if not max_seconds > 0:
            raise ValueError(f"max_seconds must be positive, got {max_seconds}")
        deadline = time.monotonic() + max_seconds
    levels = forked(workers, deadline)
    return explore_model(
        initial,
        bounds,
        depth,
        faults,
        max_states,
        symmetry,
        stop,
        levels=levels,
        sometimes=sometimes,
    )


__all__ = [
    "CHUNKS_PER_WORKER",
    "MAX_SECONDS",
    "PARALLEL_MIN",
    "can_fork",
    "explore",
    "forked",
    "pool",
    "usable_cores",
]
