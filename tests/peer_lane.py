"""What every peer test does around its framework's driver: one ``kvfence serve`` per
server it names (``test_serve.serve``), the driver run in the framework's own venv with each
server's URL, then the driver's calls and each server's verdict, exit code and traffic.

A server is ``(label, engine, extra)``: the driver gets ``label=URL`` for it, or the bare
URL when ``label`` is ``None`` (the driver's argument shapes, tests/peer/*_sync.py).
"""

from __future__ import annotations

import json
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from attrs import frozen
from test_serve import serve


@frozen
class PeerRun:
    """The driver's ``calls`` (its JSON lines naming a ``call``), and per server, in the
    order given: its ``verdicts`` (``/kvfence/verdict``), its exit ``codes`` and its
    ``traffic`` (the session's ``*.traffic.json``)."""

    calls: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    codes: list[int]
    traffic: list[dict[str, Any]]


def run_peer(
    python: Path,
    driver: Path,
    tmp_path: Path,
    api: str,
    servers: list[tuple[str | None, str, tuple[str, ...]]],
    timeout: float = 600,
) -> PeerRun:
    """Start every server, run ``python driver ARGS`` (``timeout`` seconds; a non-zero exit
    fails the test with the driver's stderr), stop the servers, and collect what they
    judged."""
    with ExitStack() as stack:
        served = [
            stack.enter_context(serve(tmp_path / f"{label or 'server'}{i}", engine, api, extra))
            for i, (label, engine, extra) in enumerate(servers)
        ]
        args = [
            s.url if label is None else f"{label}={s.url}"
            for (label, _, _), s in zip(servers, served, strict=True)
        ]
        r = subprocess.run(
            [str(python), str(driver), *args], capture_output=True, text=True, timeout=timeout
        )
        assert r.returncode == 0, r.stderr[-3000:]
        calls = [json.loads(line) for line in r.stdout.splitlines() if '"call"' in line]
        verdicts = [s.http.get("/kvfence/verdict").json() for s in served]
        codes = [s.stop() for s in served]
    traffic = [json.loads(next(s.out.glob("*.traffic.json")).read_text()) for s in served]
    return PeerRun(calls, verdicts, codes, traffic)
