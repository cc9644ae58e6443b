"""SkyRL's own HTTP client driving one weight sync against a vLLM-API server.

Run with the peer Python (SkyRL installed from the package index, unmodified):
``PYTHON tests/peer/skyrl_sync.py URL``. It prints one JSON line per call: the call, and
what SkyRL's ``RemoteInferenceClient`` (skyrl 0.3.0,
``skyrl/backends/skyrl_train/inference_servers/remote_inference_client.py``) returned or
raised. The calls are the ones its trainer makes around a non-colocated weight sync
(``skyrl/backends/skyrl_train/workers/worker_dispatch.py`` pauses with ``keep`` and resumes
around the broadcast; ``weight_sync/broadcast_strategy.py`` sends ``start_weight_update``,
``update_weights_nccl`` with the chunk's metadata, ``finish_weight_update``;
``workers/fsdp/fsdp_worker.py`` awaits ``reset_prefix_cache(reset_running_requests=True)``
after the chunks are sent): ``pause(keep, clear_cache=False)``, start, one chunk, finish,
reset, ``resume``, with a ``completion`` before and after. The chunk's tensors travel over
NCCL outside HTTP; its metadata (names, dtypes, shapes) is all the HTTP call carries.

On Python < 3.12 the package's ``skyrl/backends/__init__.py`` cannot be imported (it
imports the Tinker backend's types, a pydantic model over ``typing.TypedDict``, which
pydantic refuses before 3.12). The client module does not need it: this driver then
registers ``skyrl.backends`` as a bare package so that the client's own module, unmodified,
imports. Nothing of SkyRL's is edited.
"""

from __future__ import annotations

import asyncio
import os
import sys
import types

from peer_records import emit


def load_client():
    try:
        from skyrl.backends.skyrl_train.inference_servers import remote_inference_client
    except Exception as e:  # the Tinker backend's pydantic types on Python < 3.12
        for name in [m for m in sys.modules if m.startswith("skyrl.backends")]:
            del sys.modules[name]
        import skyrl

        pkg = types.ModuleType("skyrl.backends")
        pkg.__path__ = [os.path.join(os.path.dirname(skyrl.__file__), "backends")]
        sys.modules["skyrl.backends"] = pkg
        from skyrl.backends.skyrl_train.inference_servers import remote_inference_client

        emit({"note": f"skyrl.backends bypassed: {type(e).__name__}"})
    return remote_inference_client.RemoteInferenceClient


async def main(url: str, skip: str = "") -> None:
    client_cls = load_client()
    client = client_cls(proxy_url=url, server_urls=[url], data_parallel_size=1,
                        model_name="kvfence-serve")  # fmt: skip
    prompt = {"json": {"prompt": [101, 102, 103, 104], "max_tokens": 4}}
    chunk = {"names": ["lm_head.weight"], "dtype_names": ["bfloat16"], "shapes": [[8, 4]],
             "packed": True}  # fmt: skip
    calls = [
        ("completion", lambda: client.completion(dict(prompt, json=dict(prompt["json"])))),
        ("pause", lambda: client.pause(mode="keep", clear_cache=False)),
        ("start_weight_update", lambda: client.start_weight_update()),
        ("update_weights_nccl", lambda: client.update_weights_nccl(chunk)),
        ("finish_weight_update", lambda: client.finish_weight_update()),
        ("reset_prefix_cache", lambda: client.reset_prefix_cache(reset_running_requests=True)),
        ("resume", lambda: client.resume()),
        ("completion", lambda: client.completion(dict(prompt, json=dict(prompt["json"])))),
    ]
    try:
        for name, call in calls:
            if name == skip:
                continue
            try:
                got = await call()
                emit({"call": name, "ok": True, "result": got})
            except Exception as e:
                status = getattr(e, "status", None)
                out = {"call": name, "ok": False, "status": status, "error": str(e)}
                emit(out)
    finally:
        await client.teardown()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
