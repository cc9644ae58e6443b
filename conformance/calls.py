"""Calls into an adapter, timed and bounded: ``call_with_timeout`` and ``Timing``.

Every call the checker makes into an engine adapter or a client resolver goes through
``call_with_timeout``: an in-process adapter (``is_direct``) runs in this thread under a
SIGALRM watchdog, any other on one daemon worker thread; a raise, a hang or an
``Unsupported`` becomes an ``AdapterError`` (ADP-001), and the seconds spent go to the
run's ``Timing``. ``check_capabilities`` reads an engine's declared capabilities (ADP-002).
"""

from __future__ import annotations

import _signal
import concurrent.futures
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from attrs import define

from ..adapters.protocol import AdapterFailure, EngineAdapter, Unsupported
from ..model.actions import TraceError
from ..model.capabilities import Capability, parse
from ..model.rules import RuleId
from .errors import AdapterError

SIGNALLED = threading.Event()
"""Set by the handler of a stop signal (SIGTERM, SIGINT: the CLI's, an isolated check's), and
only there: a search that a swallowed ``KeyboardInterrupt`` kept going stops at its next
step (``stop_if_asked``); ``runner.run_check`` clears it as a check starts."""


def stop_if_asked() -> None:
    """Raise ``KeyboardInterrupt`` when a stop signal was received (``SIGNALLED``): called at
    each step of a search and between battery scenarios, so a stop is honoured even where
    code between the signal and the search caught the first ``KeyboardInterrupt``."""
    if SIGNALLED.is_set():
        raise KeyboardInterrupt


@define(slots=True)
class Timing:
    """Where a run's time went: seconds spent inside the system under test, per side.

    ``engine_seconds`` / ``engine_calls``: every call into the engine adapter that
    ``call_with_timeout`` makes for the run (``start``, which for a real engine includes
    importing it and loading the model; ``apply`` per action; ``server_info``; ``close``),
    shrinking's replays included. ``client_seconds`` / ``client_calls``: the client
    resolver's ``resolve`` calls. Seconds are ``time.perf_counter`` spans taken on the
    thread that runs the call (this one for an in-process adapter, the adapter worker
    otherwise), so a thread handoff counts as the checker's time, not the engine's; a call
    that times out counts the time waited for it. A client *program*'s own code runs inside
    the checker's sync and is not split out: only its engine calls are engine time.
    Everything else in a run's wall time (the model, Hypothesis, judging, writing the
    counterexample) is the checker's own (``runner.TimeSplit``).
    """

    engine_seconds: float = 0.0
    client_seconds: float = 0.0
    engine_calls: int = 0
    client_calls: int = 0

    def add(self, seconds: float, client: bool = False) -> None:
        """Account one call of ``seconds`` to the engine, or to the client resolver."""
        if client:
            self.client_seconds += seconds
            self.client_calls += 1
        else:
            self.engine_seconds += seconds
            self.engine_calls += 1


class _Worker:
    """One daemon thread that runs adapter calls in turn. A daemon, unlike a thread pool's
    workers, is not joined at interpreter exit: a call that hangs for ever cannot keep
    kvfence (or pytest) from exiting with its verdict."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="kvfence-adapter", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, future = self.jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            try:
                result = fn()
            except BaseException as e:  # handed to the caller, which classifies it
                future.seconds = time.perf_counter() - started  # read by the caller
                future.set_exception(e)
            else:
                future.seconds = time.perf_counter() - started
                future.set_result(result)
            del fn, future

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((fn, future))
        return future


_WORKER: list[_Worker] = []
# A forked child (a process pool running matrix jobs) has none of its parent's threads:
# it must start its own worker rather than queue calls for one that does not exist there.
os.register_at_fork(after_in_child=_WORKER.clear)


class _Alarm(BaseException):
    """Raised into a direct (in-process) adapter call by the watchdog's SIGALRM. A
    ``BaseException``, so that an adapter's own ``except Exception`` does not swallow it."""


class _Watchdog:
    """One daemon thread per process that times direct calls: every ``PERIOD`` seconds it
    reads the running call's ``deadline`` and, once it has passed, sends SIGALRM to the
    main thread (again every period, so a call that swallows one alarm gets the next).
    A call costs two attribute writes, no system call and no thread handoff: on a loaded
    machine a per-call ``setitimer`` or handoff costs a scheduling round each."""

    PERIOD = 0.05

    def __init__(self) -> None:
        self.deadline: float | None = None  # monotonic; None while no direct call runs
        self.main = threading.main_thread().ident
        threading.Thread(target=self._loop, name="kvfence-watchdog", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(self.PERIOD)
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline and self.main is not None:
                signal.pthread_kill(self.main, signal.SIGALRM)
                if time.monotonic() > deadline + STUCK_GRACE and _STUCK:
                    # SIGALRM did not stop the call (the adapter blocks, masks or ignores
                    # it): hand over to the stuck handler, which does not need the call back.
                    _STUCK[0](time.monotonic() - deadline)


STUCK_GRACE = 1.0
"""Seconds past a direct call's deadline after which, SIGALRM having not stopped it, the
stuck handler (``on_stuck``) runs."""

_STUCK: list[Callable[[float], None]] = []


def on_stuck(handler: Callable[[float], None] | None) -> None:
    """Install ``handler(seconds past the deadline)``, run on the watchdog thread when a
    direct call outlives its deadline by ``STUCK_GRACE`` although SIGALRM was sent (an
    adapter that blocks, masks or ignores SIGALRM); ``None`` removes it. The handler must
    not wait for the call: the check in a child process (``runner.run_isolated``) reports
    the timeout to its parent and exits."""
    _STUCK.clear()
    if handler is not None:
        _STUCK.append(handler)


_DOG: list[_Watchdog] = []
os.register_at_fork(after_in_child=_DOG.clear)  # a forked child has no watchdog thread

# The raw handler lookup: ``signal.getsignal`` maps it to an enum, which costs more (a
# failed enum lookup per call for a Python handler) than the whole direct call.
_getsignal = getattr(_signal, "getsignal", signal.getsignal)


def _on_alarm(signum: int, frame: Any) -> None:
    """Raise into the main thread only while a direct call is past its deadline (a late
    or foreign SIGALRM is ignored)."""
    deadline = _DOG[0].deadline if _DOG else None
    if deadline is not None and time.monotonic() > deadline:
        raise _Alarm


def _direct_possible() -> bool:
    """A direct call can be timed: POSIX ``pthread_kill``, the main thread, and SIGALRM
    free or already ours (not pytest-timeout's or a caller's)."""
    if (
        not hasattr(signal, "pthread_kill")
        or threading.current_thread() is not threading.main_thread()
    ):
        return False
    handler = _getsignal(signal.SIGALRM)
    if handler is not _on_alarm:
        if handler not in (signal.SIG_DFL, signal.SIG_IGN, None):
            return False
        signal.signal(signal.SIGALRM, _on_alarm)  # installed once, left in place
    return True


def _call_direct(fn: Callable[[], Any], timeout: float) -> Any:
    """Run ``fn`` in this thread under the watchdog (started on first use)."""
    if not _DOG:
        _DOG.append(_Watchdog())
    dog = _DOG[0]
    dog.deadline = time.monotonic() + timeout
    try:
        return fn()
    finally:
        dog.deadline = None


def is_direct(adapter: object) -> bool:
    """The adapter declares ``in_process = True``: its calls are plain Python in this
    process (the in-process reference, its mutants and designs, the reference client), so
    the checker calls it directly and times it with a watchdog (``call_with_timeout``)."""
    return getattr(adapter, "in_process", False) is True


_clock = time.perf_counter  # one global lookup per read on the direct path


def call_with_timeout(
    fn: Callable[[], Any],
    timeout: float,
    what: str,
    direct: bool = False,
    timing: Timing | None = None,
    client: bool = False,
) -> Any:
    """Run an adapter call; its exceptions and hangs become ``AdapterError`` (ADP-001).

    ``timing``: the run's ``Timing``, which gets the call's seconds (as a client resolver
    call when ``client``), whether it answered, raised or timed out: two
    ``perf_counter`` reads per call (the explorer makes tens of thousands a second).

    ``direct`` (an in-process adapter, ``is_direct``): the call runs in this thread, and one
    watchdog thread per process (``_Watchdog``) interrupts it with SIGALRM once
    ``timeout`` has passed: no thread handoff per call. Where SIGALRM cannot be
    used (not the main thread, someone else's handler in force), or for an adapter that is not
    in-process (a real engine, a user's resolver), calls run on one daemon worker thread,
    reused while calls return. A hung call's thread cannot be killed: it is abandoned (the
    next call gets a new worker; the process can still exit) and the run stops with ERROR
    naming the timeout. ``Unsupported`` is an error too: the checker only sends what the
    adapter's capabilities allow, so refusing it breaks the adapter contract. A
    ``TraceError`` (a recorded trace the spec cannot follow) passes through: it is the
    trace's fault, not an adapter's.
    """
    try:
        if direct and _direct_possible():
            started = _clock()
            try:
                return _call_direct(fn, timeout)
            except _Alarm:
                raise concurrent.futures.TimeoutError from None
            finally:
                if timing is not None:  # inlined ``Timing.add``: the hot path (explorer)
                    if client:
                        timing.client_seconds += _clock() - started
                        timing.client_calls += 1
                    else:
                        timing.engine_seconds += _clock() - started
                        timing.engine_calls += 1
        if not _WORKER:
            _WORKER.append(_Worker())
        started = time.perf_counter()
        future = _WORKER[0].submit(fn)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            _WORKER.pop()  # abandoned with its hung call; a daemon, so never joined
            raise
        finally:
            if timing is not None:
                # the worker's own span (set before the result); a hung call: the wait
                spent = getattr(future, "seconds", None)
                timing.add(time.perf_counter() - started if spent is None else spent, client)
    except concurrent.futures.TimeoutError:
        raise AdapterError(RuleId.ADP_001, f"{what} did not answer within {timeout:g} s") from None
    except TraceError:
        raise
    except Unsupported as e:
        raise AdapterError(
            RuleId.ADP_001, f"{what}: unsupported ({e}), though the adapter's capabilities allow it"
        ) from e
    except AdapterFailure as e:
        raise AdapterError(RuleId.ADP_001, f"{what} failed: {e}") from e
    except KeyboardInterrupt:
        raise
    except Exception as e:
        raise AdapterError(
            RuleId.ADP_001, f"{what} raised {type(e).__name__}: {e}", raised=True
        ) from e
    except BaseException as e:  # SystemExit from an adapter must not end the run as 'exit 0'
        raise AdapterError(RuleId.ADP_001, f"{what} raised {type(e).__name__}: {e}") from e


def check_capabilities(engine: EngineAdapter) -> frozenset[Capability]:
    """The engine's capabilities, parsed (``capabilities.parse``); ADP-002 for what is not
    a set of known names (a typo would silently turn rules into SKIP)."""
    try:
        return parse(getattr(engine, "capabilities", None))
    except ValueError as e:
        raise AdapterError(RuleId.ADP_002, str(e)) from None
