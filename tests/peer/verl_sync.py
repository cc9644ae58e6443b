"""verl's own SGLang HTTP adapter driving weight syncs against an SGLang-API server.

Run with a Python that has verl installed from the package index, unmodified, beside
torch and an importable ``sglang`` package: ``PYTHON tests/peer/verl_sync.py URL...`` (one
sync against each server in turn). It prints one JSON line per call: the server's index,
the call and what verl 0.9.1's ``AsyncHttpServerAdapter``
(``verl/workers/rollout/sglang_rollout/http_server_engine.py``) returned or raised. The
adapter is constructed as verl's rollout constructs it for a running server
(``sglang_rollout.py`` ``_init_server_adapter``: ``model_path``, ``host``, ``port``,
``launch_server=False``), and the sync is ``ServerAdapter.update_weights``' (same file):
one bucket through ``update_weights_from_tensor`` (``/update_weights_from_tensor``;
``flush_cache`` left at its default, true), then ``flush_cache()`` (``GET /flush_cache``,
retried on a refusal ``max_attempts * 4`` times, then given up with a log line); a
``generate`` of the same prompt before and after.

The glue, all of it:

* The ``sglang`` package verl imports (``EngineBase``, ``ServerArgs``, the request
  dataclasses) is SGLang 0.5.17's source: the 0.5.12 verl pins imports CUDA-only
  ``sgl_kernel`` at module level, and 0.5.23's ``EngineBase`` declares abstract methods
  verl 0.9.1 does not implement. Before it is imported, the SGLang lane's CPU shims apply
  (``adapters/sglang_stubs.py``: an empty ``torchvision``, transformers tolerating
  SGLang's own config registration), loaded by path.
* ``ServerArgs`` gets ``device="cpu"`` (it probes for an accelerator otherwise) and a
  ``model_path`` holding a one-layer Llama ``config.json`` (it reads the model's config).
  ``max_attempts=1`` and ``retry_delay=0.1`` are the adapter's own arguments, so a
  refused flush is retried 4 times in under a second.
* The bucket is what SGLang's ``weight_sync.utils.update_weights`` (which verl calls per
  bucket) sends for one tensor-parallel rank, serialized with SGLang's own
  ``MultiprocessingSerializer``; the CUDA IPC handles and the gather across ranks it
  makes first cannot happen on CPU.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from peer_records import emit

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "torch_dtype": "float32",
}


def apply_shims() -> None:
    spec = importlib.util.spec_from_file_location("sglang_stubs", ROOT / "adapters/sglang_stubs.py")
    assert spec and spec.loader
    stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubs)
    stubs.install_torchvision_stub()
    stubs.tolerate_config_reregistration()


async def sync(server: int, url: str, model: str) -> None:
    import torch
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
    from sglang.srt.utils import MultiprocessingSerializer
    from verl.workers.rollout.sglang_rollout.http_server_engine import AsyncHttpServerAdapter

    async def call(name, fn):
        line = {"server": server, "call": name}
        try:
            out = await fn()
            emit({**line, "ok": True, "returned": repr(out)[:200]})
        except Exception as e:  # what verl raised: the verdict is serve's
            emit({**line, "ok": False, "raised": repr(e)[:300]})

    host, port = url.removeprefix("http://").rsplit(":", 1)
    engine = AsyncHttpServerAdapter(
        model_path=model,
        host=host,
        port=int(port),
        launch_server=False,
        max_attempts=1,
        retry_delay=0.1,
        device="cpu",
    )
    params = {"max_new_tokens": 4}
    bucket = [("model.w", torch.zeros(2))]
    req = UpdateWeightsFromTensorReqInput(
        serialized_named_tensors=[MultiprocessingSerializer.serialize(bucket)], load_format=None
    )
    await call(
        "generate",
        lambda: engine.generate(prompt="The capital of France is", sampling_params=params),
    )
    await call("update_weights_from_tensor", lambda: engine.update_weights_from_tensor(req))
    await call("flush_cache", engine.flush_cache)
    await call(
        "generate",
        lambda: engine.generate(prompt="The capital of France is", sampling_params=params),
    )


if __name__ == "__main__":
    apply_shims()
    with tempfile.TemporaryDirectory() as model:
        (Path(model) / "config.json").write_text(json.dumps(CONFIG))
        for i, url in enumerate(sys.argv[1:]):
            asyncio.run(sync(i, url, model))
