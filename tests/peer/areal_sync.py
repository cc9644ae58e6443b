"""AReaL's own SGLang client driving weight syncs against an SGLang-API server.

Run with a Python that has AReaL installed from the package index, unmodified, beside
torch: ``PYTHON tests/peer/areal_sync.py MODE=URL...`` (MODE ``disk`` or ``xccl``; one
sync against each server in turn, so torch is imported once). It prints one JSON line
per call: the server's index, the call and what AReaL 1.0.4's ``RemoteSGLangEngine``
(``areal/engine/sglang_remote.py``, over ``areal/infra/remote_inf_engine.py``) returned
or raised. The calls are the ones AReaL's FSDP trainer makes around a sync
(``areal/engine/fsdp_engine.py``):

* ``disk`` (``_update_weights_from_disk``): ``pause_generation`` (SGLang
  ``/pause_generation``), ``update_weights_from_disk(meta)`` (a future: it waits in
  AReaL's name service for the trainer's save, then ``/update_weights_from_disk`` with
  ``abort_all_requests``), the trainer's ``name_resolve.add`` of the save,
  ``fut.result()``, ``continue_generation``.
* ``xccl`` (``_init_weight_update_group`` once, then ``_update_weights_from_distributed``):
  ``init_weights_update_group(meta)`` (``/init_weights_update_group``), then per sync
  ``pause_generation``, ``update_weights_from_distributed(meta, param_specs)``
  (``/update_weights_from_distributed`` with the names, dtypes and shapes),
  ``continue_generation``.

Around the sync, ``agenerate`` of the same token ids before and after (SGLang
``/generate``). AReaL never calls ``/flush_cache`` itself: the flush is the update's own
(SGLang's ``flush_cache`` field, omitted, defaults to true).

The glue, all of it:

* AReaL's name service is pointed at a temporary directory (``name_resolve.reconfigure``
  with its own ``nfs`` config), and the driver makes the trainer's ``name_resolve.add``
  of the saved checkpoint; nothing is saved (serve takes the update from the request).
* ``xccl``: the trainer's half of the NCCL rendezvous and broadcast
  (``torch.distributed.init_process_group``, the bucket broadcast) cannot run on CPU and
  is not made; serve answers the HTTP half as SGLang does and takes the update from its
  metadata.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from datetime import datetime

from peer_records import emit


def sync(mode: str, server: int, url: str, root: str) -> None:
    from areal.api.alloc_mode import ModelAllocation
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.api.io_struct import ModelRequest, ParamSpec, WeightUpdateMeta
    from areal.engine.sglang_remote import RemoteSGLangEngine
    from areal.utils import name_resolve, names

    def call(name, fn):
        line = {"server": server, "mode": mode, "call": name}
        try:
            out = fn()
            emit({**line, "ok": True, "returned": repr(out)[:200]})
            return out
        except Exception as e:  # what AReaL raised: the verdict is serve's
            emit({**line, "ok": False, "raised": repr(e)[:300]})
            return None

    experiment, trial = "kvfence", f"peer-{mode}-{server}"
    config = InferenceEngineConfig(
        backend="sglang:d1",
        experiment_name=experiment,
        trial_name=trial,
        request_timeout=30,
        request_retries=1,
        setup_timeout=30,
        pause_grace_period=0.0,
    )
    engine = RemoteSGLangEngine(config)
    call("initialize", lambda: engine.initialize(addr=url.removeprefix("http://")))
    prompt = [101, 2023, 2003, 1037, 3231]

    def generate():
        req = ModelRequest(input_ids=prompt, gconfig=GenerationHyperparameters(max_new_tokens=4))
        return asyncio.run(engine.agenerate(req)).output_tokens

    if mode == "disk":
        meta = WeightUpdateMeta.from_disk(experiment, trial, root)
        meta.clear_checkpoint_after_load = False
    else:
        meta = WeightUpdateMeta.from_fsdp_xccl(ModelAllocation.from_str("sglang:d1"))
        meta.nccl_master_address, meta.nccl_master_port = "127.0.0.1", 29500
        meta.nccl_group_name = "update_weight_group"
        call("init_weights_update_group", lambda: engine.init_weights_update_group(meta).result())
    call("agenerate", generate)
    call("pause_generation", engine.pause_generation)
    if mode == "disk":
        fut = engine.update_weights_from_disk(meta)
        key = names.update_weights_from_disk(experiment, trial, engine.get_version())
        name_resolve.add(key, str(datetime.now().timestamp()), keepalive_ttl=120)
        call("update_weights_from_disk", fut.result)
    else:
        specs = [ParamSpec(name="model.w", shape=(2,), dtype="bfloat16")]
        call(
            "update_weights_from_distributed",
            lambda: engine.update_weights_from_distributed(meta, specs).result(),
        )
    call("continue_generation", engine.continue_generation)
    engine.set_version(engine.get_version() + 1)
    call("agenerate", generate)
    engine.destroy()


if __name__ == "__main__":
    from areal.api.cli_args import NameResolveConfig
    from areal.utils import name_resolve

    with tempfile.TemporaryDirectory() as root:
        name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=root))
        for i, arg in enumerate(sys.argv[1:]):
            mode, url = arg.split("=", 1)
            sync(mode, i, url, root)
