"""A server kvfence started dies with kvfence on SIGTERM and SIGINT.

``adapters.vllm_process.ServerProcess`` runs the server in its own process group and
chains handlers for both signals that kill the group before the signal takes its usual
course. The "server" here is a stand-in (a Python process with a child), so the test needs
no vLLM and takes about a second: what is under test is the process handling that every
vLLM server kvfence starts goes through (``HttpVllmDriver.launch``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvfence.adapters.vllm_engine import VLLM_MISSING, vllm_installed
from kvfence.adapters.vllm_process import group_pids

KVFENCE_LIKE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kvfence.adapters.vllm_process import ServerProcess

    server = ServerProcess(
        [sys.executable, "-c",
         "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"],
        Path(sys.argv[1]),
    )
    print(server.pid, flush=True)
    time.sleep(300)
    """
)


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_server_group_dies_with_kvfence(tmp_path, sig):
    proc = subprocess.Popen(
        [sys.executable, "-c", KVFENCE_LIKE, str(tmp_path / "server.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pgid = int(proc.stdout.readline())
        assert wait_for(lambda: len(group_pids(pgid)) == 2), group_pids(pgid)
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=30)
        assert wait_for(lambda: not group_pids(pgid)), f"left running: {group_pids(pgid)}"
        if sig == signal.SIGTERM:
            assert code == -signal.SIGTERM  # the signal still ends kvfence as it would
        else:
            assert code != 0  # KeyboardInterrupt, after the group was killed
    finally:
        proc.kill()
        proc.wait()


def _children_running(parent: int, needle: str) -> list[int]:
    """Pids whose parent is ``parent`` and whose command line contains ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and needle in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.vllm
@pytest.mark.slow
def test_sigterm_to_kvfence_check_kills_its_vllm_server(tmp_path):
    """The real thing: ``kvfence check --engine vllm-http`` starts vLLM's server (from a
    worker thread), gets SIGTERM while it runs, and leaves no server process behind."""
    if not vllm_installed():
        pytest.skip(VLLM_MISSING)
    cmd = [sys.executable, "-m", "kvfence.conformance.cli", "check", "--engine", "vllm-http"]
    cmd += ["--timeout", "400", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(
            lambda: _children_running(proc.pid, "vllm.entrypoints.openai.api_server"), 120
        ), "kvfence never started the server"
        (pgid,) = _children_running(proc.pid, "vllm.entrypoints.openai.api_server")
        assert wait_for(lambda: len(group_pids(pgid)) >= 2, 120), group_pids(pgid)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        assert wait_for(lambda: not group_pids(pgid), 30), f"left running: {group_pids(pgid)}"
    finally:
        proc.kill()
        proc.wait()
