"""A cold prefill: the bytes a fresh vLLM engine holding one version gives for a prompt,
with an empty prefix cache. The reference the byte oracle's shortcut (a fresh
``cache_salt``) was verified against.

In this process (a new :class:`adapters.vllm_offline.OfflineVllmDriver`, one request,
close) unless another offline engine is alive here, because closing an in-process engine
breaks the others; then in a subprocess: ``python -m kvfence.adapters.vllm_cold ARGS_JSON``
(this module's :func:`main`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .vllm_base import Generation, VllmDriverError


def cold_generate(
    model_root: Path,
    version: int,
    prompt: list[int] | str,
    max_tokens: int = 8,
    workdir: Path | None = None,
    *,
    in_process: bool | None = None,
) -> Generation:
    """Generate with a fresh engine holding tiny-model ``version`` and an empty cache.

    In-process (~3 s once vllm is imported) unless another offline engine is alive in this
    process (or ``in_process=False``); then in a subprocess of the same Python (~12 s:
    import vllm + start), whose output goes to ``workdir/cold_generate.log``. Logprobs are
    floats that survive the JSON round trip exactly. Raises ``VllmDriverError`` with the
    log tail when the subprocess fails.

    Cheaper equivalent when an engine is already at ``version``: ``reset_prefix_cache()``
    then ``generate`` (or a ``generate`` with a fresh ``cache_salt``) gives byte-identical
    tokens and logprobs on vLLM 0.32 CPU.
    """
    from .vllm_offline import LIVE_OFFLINE, OfflineVllmDriver

    if in_process is None:
        in_process = not any(not d._closed for d in list(LIVE_OFFLINE))
    if in_process:
        with OfflineVllmDriver(model_root, version, workdir) as driver:
            return driver.generate(prompt, max_tokens)

    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvfence-cold-")))
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        out = workdir / "cold_generation.json"
        log = workdir / "cold_generate.log"
        args = {
            "root": str(model_root),
            "version": version,
            "workdir": str(workdir / "engine"),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "out": str(out),
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(log, "wb") as log_file:
            proc = subprocess.run(
                [sys.executable, "-m", __name__, json.dumps(args)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(workdir),
                check=False,
            )
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise VllmDriverError(f"cold_generate subprocess failed ({proc.returncode}):\n{tail}")
        data = json.loads(out.read_text())
        return Generation(
            tuple(int(t) for t in data["token_ids"]),
            tuple(float(x) for x in data["logprobs"]),
            int(data["cached_tokens"]),
        )


class FreshEngines:
    """The restart oracle's engines: one subprocess of the same Python that keeps vLLM
    imported and holds one engine at a time, freshly started from a version's checkpoint
    (never reloaded: a reload is what the oracle checks). ``generate(version, prompt)``
    starts the engine at ``version`` when the one it holds is at another version (closing
    the old one), resets its prefix cache and answers with a cold generation.

    Cost, measured on vLLM 0.32 CPU (tiny model, 2 shared cores): the first call ~15-40 s
    (import vLLM + start), each change of version ~3-5 s (a new engine), a prompt ~0.1 s;
    instead of one subprocess per (prompt, version) at ~15-40 s each. The subprocess's own
    output (vLLM's loggers) goes to ``workdir/fresh-engines.log``; the protocol is one JSON
    line per request on its stdin and one per answer on a duplicate of its stdout.
    ``close`` ends it (also at garbage collection, via ``subprocess.Popen``)."""

    def __init__(self, model_root: Path, workdir: Path) -> None:
        self.model_root = Path(model_root)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "fresh-engines.log"
        self._proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(self.log_path, "ab") as log:
            args = {"root": str(self.model_root), "workdir": str(self.workdir / "engine")}
            return subprocess.Popen(
                [sys.executable, "-m", __name__, "--serve", json.dumps(args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=str(self.workdir),
                text=True,
            )

    def warm(self, version: int) -> None:
        """Start the subprocess and its engine at ``version`` without generating (the
        import and the start, the slow part, then happen where the caller chooses: the
        adapter's first ``start``, which has the long start timeout)."""
        self._ask({"version": version, "prompt": None, "max_tokens": 0})

    def generate(self, version: int, prompt: list[int], max_tokens: int) -> Generation:
        """A cold generation from an engine freshly started at ``version``; raises
        ``VllmDriverError`` with the log's tail when the subprocess fails."""
        data = self._ask({"version": version, "prompt": prompt, "max_tokens": max_tokens})
        return Generation(
            tuple(int(t) for t in data["token_ids"]),
            tuple(float(x) for x in data["logprobs"]),
            int(data["cached_tokens"]),
        )

    def _ask(self, request: dict) -> dict:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        assert self._proc.stdin is not None and self._proc.stdout is not None
        version = request["version"]
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            data = json.loads(line)
        except (OSError, ValueError) as exc:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
            self.close()
            raise VllmDriverError(f"fresh engine subprocess failed ({exc!r}):\n{tail}") from exc
        if "error" in data:
            raise VllmDriverError(f"fresh engine at v{version}: {data['error']}")
        return data

    def close(self) -> None:
        """End the subprocess (its engine with it). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(args: dict) -> int:
    """The :class:`FreshEngines` subprocess: answer JSON requests from stdin until EOF."""
    from .vllm_offline import OfflineVllmDriver

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's prints go to the log with its loggers, not into the answers
    driver = None
    try:
        for line in sys.stdin:
            request = json.loads(line)
            try:
                if driver is None or driver.loaded_version != request["version"]:
                    if driver is not None:
                        driver.close()
                        driver = None
                    driver = OfflineVllmDriver(args["root"], request["version"], args["workdir"])
                if request["prompt"] is None:
                    record: dict = {"ready": True}  # warm: the engine is up
                else:
                    if driver.reset_prefix_cache() is not True:
                        raise VllmDriverError("reset_prefix_cache refused on an idle engine")
                    gen = driver.generate(request["prompt"], request["max_tokens"])
                    record = {"token_ids": gen.token_ids, "logprobs": gen.logprobs}
                    record["cached_tokens"] = gen.cached_tokens
            except Exception as exc:  # answered, so the caller's error names it
                record = {"error": f"{type(exc).__name__}: {exc}"}
            answers.write(json.dumps(record) + "\n")
            answers.flush()
    finally:
        if driver is not None:
            driver.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m kvfence.adapters.vllm_cold ARGS_JSON``: one cold generation, written as
    JSON to ``args["out"]``. ``ARGS_JSON`` keys: root, version, workdir, prompt, max_tokens,
    out."""
    from .vllm_offline import OfflineVllmDriver

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--serve":
        return serve(json.loads(argv[1]))
    if len(argv) != 1:
        print("usage: python -m kvfence.adapters.vllm_cold ARGS_JSON", file=sys.stderr)
        return 2
    args = json.loads(argv[0])
    with OfflineVllmDriver(args["root"], args["version"], args["workdir"]) as driver:
        gen = driver.generate(args["prompt"], args["max_tokens"])
    record = {"token_ids": gen.token_ids, "logprobs": gen.logprobs}
    record["cached_tokens"] = gen.cached_tokens
    Path(args["out"]).write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
