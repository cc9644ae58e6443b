"""Trinity-RFT's own SGLang client driving weight syncs against an SGLang-API server.

Run with a Python that has Trinity-RFT installed from the package index, unmodified, beside
torch and vLLM: ``PYTHON tests/peer/trinity_sync.py MODE=URL...`` (MODE ``nccl``, ``async`` or
``checkpoint``; one sync against each server in turn, so torch is imported once). It
prints one JSON line per call: the server's index, the mode, the call and what
Trinity-RFT 0.6.0's ``SGLangRolloutModel`` (``trinity/common/models/sglang_model.py``,
over its ``SGLangClient``) returned or raised. The calls are the ones Trinity's explorer
makes (``trinity/explorer/explorer.py``):

* ``nccl``: ``init_process_group`` once (``/init_weights_update_group``),
  ``set_state_dict_meta`` (two parameters of 1 MB each, with ``weight_sync_buffer_size``
  1 MB: two batches), then ``sync_model_weights(1, SyncMethod.NCCL)``: ``/flush_cache``,
  then one ``/update_weights_from_distributed`` per batch, ``flush_cache`` true on the
  last batch only; at the end ``teardown_process_group``
  (``/destroy_weights_update_group``).
* ``async``: the NCCL path as the fully-async explorer runs it (``SyncStyle.FULLY_ASYNC``:
  ``_watch_trainer_sync_signal`` syncs while rollout batches are in flight, nothing
  paused): one rollout's ``generate`` lands after the sync's ``/flush_cache`` answered
  and before its updates.
* ``checkpoint``: ``sync_model_weights(1, SyncMethod.CHECKPOINT)``: the synchronizer's
  latest model path, then ``/update_weights_from_disk`` (no ``flush_cache`` field: SGLang's
  default, true; ``abort_all_requests`` true).

Around the sync, ``SGLangClient.generate`` of the same token ids before and after (SGLang
``/generate``). Trinity pauses nothing around the sync.

The glue, all of it:

* ``trinity/common/models/mm_utils.py`` imports ``vllm.entrypoints.chat_utils``, which
  vLLM 0.32 (the lane's) serves as ``vllm.renderers.chat_utils``: the old name is
  registered as an alias of the new module before Trinity is imported (Trinity pins
  ``vllm<=0.23``; the SGLang client uses nothing of it).
* ``run_api_server`` launches Trinity's embedded SGLang server; instead the model's
  ``api_client`` is the ``SGLangClient`` that method builds, pointed at serve.
* Trinity's ``Synchronizer`` is a Ray actor; the model holds a stand-in whose
  ``get_latest_model_path.remote(use_huggingface=True)`` answers what the actor answers
  (``<model_path>/huggingface``). The NCCL path only asserts one is there.
* ``async``: to land the rollout at that point every run, the model's
  ``api_client.flush_cache`` is wrapped so that, once Trinity's own ``flush_cache``
  returned, the rollout's ``generate`` is awaited before the sync goes on.
* The trainer's half of the NCCL rendezvous and broadcast cannot run on CPU and is not
  made; serve answers the HTTP half as SGLang does and takes the update from its metadata.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import tempfile
import types

from peer_records import emit


def load_model_module():
    sys.modules["vllm.entrypoints.chat_utils"] = importlib.import_module(
        "vllm.renderers.chat_utils"
    )
    from trinity.common.models import sglang_model

    return sglang_model


class Synchronizer:
    """Trinity's ``Synchronizer`` actor handle, for ``get_latest_model_path`` only."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.get_latest_model_path = types.SimpleNamespace(remote=self._latest)

    async def _latest(self, use_huggingface: bool = False) -> str:
        return os.path.join(self.model_path, "huggingface") if use_huggingface else self.model_path


async def sync(module, mode: str, server: int, url: str, root: str) -> None:
    from trinity.common.config import InferenceModelConfig
    from trinity.common.constants import SyncMethod

    async def call(name, coro):
        line = {"server": server, "mode": mode, "call": name}
        try:
            out = await coro
            emit({**line, "ok": True, "returned": repr(out)[:200]})
            return out
        except Exception as e:  # what Trinity raised: the verdict is serve's
            emit({**line, "ok": False, "raised": repr(e)[:300]})
            return None

    model = module.SGLangRolloutModel(InferenceModelConfig(weight_sync_buffer_size=1))
    model.api_client = module.SGLangClient(server_url=url, api_key=None, logger=model.logger)
    model.synchronizer = Synchronizer(os.path.join(root, f"checkpoint{server}"))
    prompt = [101, 2023, 2003, 1037, 3231]
    if mode != "checkpoint":
        group = dict(master_address="127.0.0.1", master_port=29500, rank_offset=1, world_size=2)
        await call("init_process_group", model.init_process_group(**group, group_name="sync"))
        meta = [("model.layers.0.w", "bfloat16", (1024, 512))]
        meta.append(("model.layers.1.w", "bfloat16", (1024, 512)))
        await call("set_state_dict_meta", model.set_state_dict_meta(meta))
    if mode == "async":
        flush = model.api_client.flush_cache

        async def flush_then_rollout(*args, **kwargs):
            out = await flush(*args, **kwargs)
            await call("generate", model.api_client.generate(input_ids=prompt, max_tokens=4))
            return out

        model.api_client.flush_cache = flush_then_rollout
    method = SyncMethod.CHECKPOINT if mode == "checkpoint" else SyncMethod.NCCL
    await call("generate", model.api_client.generate(input_ids=prompt, max_tokens=4))
    await call("sync_model_weights", model.sync_model_weights(1, method))
    await call("generate", model.api_client.generate(input_ids=prompt, max_tokens=4))
    if mode != "checkpoint":
        await call("teardown_process_group", model.teardown_process_group())


async def main(args: list[str]) -> None:
    module = load_model_module()
    with tempfile.TemporaryDirectory() as root:
        for i, arg in enumerate(args):
            mode, url = arg.split("=", 1)
            await sync(module, mode, i, url, root)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
