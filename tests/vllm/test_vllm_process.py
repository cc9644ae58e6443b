"""A server kvfence started dies with kvfence on SIGTERM and SIGINT (issue 8, H-6).

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

import pytest
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
