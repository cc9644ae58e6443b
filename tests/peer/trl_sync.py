"""TRL's own vLLM client driving weight syncs against a vLLM-API server.

Run with a Python that has TRL installed from the package index, unmodified, beside torch
and vLLM: ``PYTHON tests/peer/trl_sync.py URL...`` (one sync against each server in turn,
so torch and vLLM are imported once). It prints one JSON line per call: the server's
index, the call and what TRL 1.16.0's ``VLLMClient`` (``trl/generation/vllm_client.py``)
returned or raised. The calls are the ones TRL's trainer makes in server mode
(``trl/generation/vllm_generation.py`` ``sync_weights``: ``update_named_params`` with the
parameters' metadata, then ``reset_prefix_cache``), between generations of the same
prompt: ``VLLMClient(base_url)`` (``/health``, ``/v1/models``), ``get_world_size``,
``get_server_info``, then per sync a ``generate``, ``update_named_params`` (TRL's own
``/start_weight_update``, ``/update_weights`` with ``update_info``, ``/finish_weight_update``)
and ``reset_prefix_cache``; a last ``generate``.

The glue, all of it:

* ``trl/__init__.py`` imports TRL's trainers (pandas, datasets, ...): ``trl`` and
  ``trl.generation`` are registered as bare packages so that the client's own module,
  unmodified, imports with torch and vLLM alone.
* No NCCL group can form on CPU (``init_communicator`` refuses a non-CUDA device): the
  broadcast that would carry the tensors (``packed_nccl_broadcast_producer``, vLLM's) is
  replaced by one that consumes the parameters and sends nothing. Serve takes the update
  from its HTTP metadata, which TRL sends unchanged.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import types
from pathlib import Path

from peer_records import emit


def load_client():
    root = Path(str(md.distribution("trl").locate_file("trl")))
    for name, path in (("trl", root), ("trl.generation", root / "generation")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    from trl.generation import vllm_client

    def broadcast(iterator, group, src, post_iter_func, **kwargs):  # the tensors: over NCCL
        for item in iterator:
            post_iter_func(item)

    vllm_client.packed_nccl_broadcast_producer = broadcast
    return vllm_client


def sync(module, server: int, url: str) -> None:
    import torch

    def call(name, fn):
        line = {"server": server, "call": name}
        try:
            out = fn()
            emit({**line, "ok": True, "returned": repr(out)[:200]})
            return out
        except Exception as e:  # what TRL raised: the verdict is serve's
            emit({**line, "ok": False, "raised": str(e)[:300]})
            return None

    client = module.VLLMClient(base_url=url, connection_timeout=30)
    call("get_world_size", client.get_world_size)
    call("get_server_info", client.get_server_info)
    weights = [("model.w", torch.zeros(2))]
    metadata = [("model.w", "float32", [2])]
    call("generate", lambda: client.generate(["The capital of France is"], max_tokens=4))
    call("update_named_params", lambda: client.update_named_params(metadata, iter(weights)))
    call("reset_prefix_cache", client.reset_prefix_cache)
    call("generate", lambda: client.generate(["The capital of France is"], max_tokens=4))


if __name__ == "__main__":
    trl = load_client()
    for i, url in enumerate(sys.argv[1:]):
        sync(trl, i, url)
