"""A server subprocess that dies with kvfence: its own process group, killed on close, at
interpreter exit, and on SIGTERM/SIGINT to the kvfence process.

vLLM's OpenAI server (``vllm.entrypoints.openai.api_server``) is three processes on CPU:
the API server, its ``EngineCore`` and the worker. :class:`ServerProcess` starts the
command in a new session (``start_new_session=True``), so one ``killpg`` reaches all of
them, and registers it in a process-wide set. The first server started from the main
thread installs handlers for SIGTERM and SIGINT that kill every live group and then hand
the signal on (to the previous Python handler, or to the default action, so kvfence still
exits with the signal's status). Without them a SIGTERM to kvfence ends Python without
running ``atexit``/``weakref.finalize`` and left the server running.

Linux only (``/proc``); a SIGKILL to kvfence still cannot be caught.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

#: Seconds a group gets after SIGTERM before SIGKILL (vLLM exits in ~2 s).
TERM_GRACE = 15.0

_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()
_PREVIOUS: dict[int, Any] = {}


def group_pids(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in process group ``pgid`` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def kill_group(proc: subprocess.Popen[bytes], grace: float = TERM_GRACE) -> None:
    """SIGTERM the process group led by ``proc``; SIGKILL it after ``grace`` seconds; wait
    (at most 10 s more) until no process of the group is left."""
    pgid = proc.pid
    try:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if proc.poll() is not None and not group_pids(pgid):
                    return
                time.sleep(0.1)
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)


def rss_mib(pids: list[int]) -> float:
    """Sum of VmRSS of ``pids`` in MiB (Linux /proc); 0 for vanished pids."""
    total_kib = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total_kib / 1024


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Kill every live server group, then let the signal do what it did before."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        kill_group(proc)
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """Chain :func:`_on_signal` in front of SIGTERM and SIGINT (main thread only: Python
    allows ``signal.signal`` nowhere else; from another thread this is a no-op and only
    close/exit kill the server)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        current = signal.getsignal(sig)
        if current is _on_signal:
            continue
        _PREVIOUS[sig] = current
        signal.signal(sig, _on_signal)


def install_signal_handlers() -> None:
    """Public hook for a CLI that starts servers from worker threads: call it once from
    the main thread before the first server starts."""
    _install_handlers()


class ServerProcess:
    """``cmd`` running in its own process group, output appended to ``log_path``.

    Killed (the whole group) by :meth:`close`, at interpreter exit if never closed, and
    when kvfence gets SIGTERM or SIGINT (see the module doc).
    """

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self._log.write(f"$ {' '.join(self.cmd)}\n".encode())
        self._log.flush()
        _install_handlers()
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                cwd=None if cwd is None else str(cwd),
                start_new_session=True,
            )
        except BaseException:
            self._log.close()
            raise
        with _LIVE_LOCK:
            _LIVE.add(self.proc)
        self._finalizer = weakref.finalize(self, kill_group, self.proc)

    @property
    def pid(self) -> int:
        """Pid of the group leader (also the process group id)."""
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code, or ``None`` while the leader runs."""
        return self.proc.poll()

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def group_pids(self) -> list[int]:
        """Live pids of the server's process group."""
        return group_pids(self.proc.pid)

    def log_tail(self, n_lines: int = 40) -> str:
        """Last ``n_lines`` of the log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n_lines:])

    def close(self) -> None:
        """Kill the group (SIGTERM, SIGKILL after the grace) and close the log; idempotent."""
        self._finalizer()
        self._log.close()
