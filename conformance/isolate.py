"""A check of an in-process engine, run in a child process: an engine that exits the process
(``os._exit``), ends its thread, raises ``BaseException`` or hangs where SIGALRM cannot reach
it cannot take the checker with it, and can never read as a pass.

The child (``os.fork``) runs the check and sends its ``Result`` back through a pipe. What the
parent gets instead of a result is an ERROR ``Result`` naming what happened: the child's
exit status, the signal that ended it, or a direct call that outlived ``--timeout`` although
SIGALRM was sent (the watchdog's stuck handler, ``lockstep.on_stuck``, reports it and exits
the child). A stop signal (SIGTERM, SIGINT) to the parent is passed to the child, which
stops its search, writes what it recorded and answers ERROR; a second one kills the child.
POSIX only (``os.fork``); elsewhere the check runs in this process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .calls import SIGNALLED, on_stuck

T = TypeVar("T")
"""What the check returns (a ``runner.Result``): sent back through the pipe pickled."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _send(fd: int, kind: str, value: Any) -> None:
    data = pickle.dumps((kind, value))
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int, on_progress: Callable[[Any], None] | None) -> tuple[str, Any] | None:
    """The child's last complete message other than progress, or ``None``; each
    ``progress`` message is handed to ``on_progress`` as it arrives."""
    data, last = b"", None
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
        while len(data) >= 8:
            size = int.from_bytes(data[:8], "big")
            if len(data) < 8 + size:
                break
            try:
                message = pickle.loads(data[8 : 8 + size])
            except Exception:  # a torn message: the child died while writing it
                return last
            data = data[8 + size :]
            if message[0] == "progress":
                if on_progress is not None:
                    with contextlib.suppress(Exception):
                        on_progress(message[1])
            else:
                last = message
    return last


_CHANNEL: list[int] = []
"""In the child: the pipe to the parent (``notify``); empty in any other process."""


def notify(value: Any) -> bool:
    """Send a progress message to the parent when this process is an isolated check's
    child (the parent hands it to ``run_isolated``'s ``on_progress``); ``False`` elsewhere,
    where the caller reports progress itself."""
    if not _CHANNEL:
        return False
    with contextlib.suppress(OSError):
        _send(_CHANNEL[0], "progress", value)
    return True


def run_isolated(
    check: Callable[[], T],
    fallback: Callable[[str], T],
    timeout: float,
    on_progress: Callable[[Any], None] | None = None,
) -> T:
    """``check()`` in a child process; its ``Result``, or ``fallback(message)`` when the
    child gave none (``message`` says why). ``timeout``: the check's per-call limit, named in
    the message of a call the watchdog found stuck. ``on_progress``: called in this process
    with each value the child passes to ``notify``."""
    if not hasattr(os, "fork"):
        return check()
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run the check, send the result, exit without cleanup
        os.close(read)
        _CHANNEL[:] = [write]
        code = 0
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, _stop_once)

            def stuck(late: float) -> None:
                message = (
                    f"a direct engine call did not answer within {timeout:g} s (still "
                    f"running {late:.1f} s later: SIGALRM blocked, masked or ignored)"
                )
                _send(write, "error", message)
                os._exit(0)

            on_stuck(stuck)
            _send(write, "result", check())
        except BaseException as e:
            with_type = f"the check raised {type(e).__name__}: {e}"
            try:
                _send(write, "error", with_type)
            except BaseException:
                code = 2
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write)
    stops: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        stops.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if len(stops) > 1 else signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        message = _receive(read, on_progress)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
    finally:
        os.close(read)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if message is not None and message[0] == "result":
        return message[1]
    if message is not None:
        return fallback(message[1])
    if os.WIFSIGNALED(status):
        how = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        how = f"exited with status {os.WEXITSTATUS(status)}"
    return fallback(f"the check's process {how} before a verdict (the engine ended it)")


_stopped: list[float] = []


def _stop_once(signum: int, frame: Any) -> None:
    """The child's stop handler: the first signal interrupts the search (which writes what
    it recorded); later ones are ignored while it does (the parent kills on a second)."""
    SIGNALLED.set()  # honoured at the search's next step even if this interrupt is caught
    if not _stopped:
        _stopped.append(time.monotonic())
        raise KeyboardInterrupt
