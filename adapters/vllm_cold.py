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


def main(argv: list[str] | None = None) -> int:
    """``python -m kvfence.adapters.vllm_cold ARGS_JSON``: one cold generation, written as
    JSON to ``args["out"]``. ``ARGS_JSON`` keys: root, version, workdir, prompt, max_tokens,
    out."""
    from .vllm_offline import OfflineVllmDriver

    argv = sys.argv[1:] if argv is None else argv
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
