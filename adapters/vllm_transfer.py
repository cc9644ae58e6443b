"""vLLM's native two-phase weight update on CPU, through a weight-transfer backend kvfence
registers: ``kvfence-disk``.

vLLM 0.32's RL update API is ``start_weight_update`` -> ``update_weights`` (one call per
chunk) -> ``finish_weight_update(weight_version)`` (``vllm/entrypoints/rl/offline.py``;
routes ``POST /start_weight_update``, ``/update_weights``, ``/finish_weight_update`` in
``vllm/entrypoints/rl/online/api_router.py``). The worker side (``Worker.start_weight_update``
/ ``update_weights`` / ``finish_weight_update``, ``vllm/v1/worker/gpu_worker.py``, which
``CPUWorker`` inherits) hands each step to a ``WeightTransferEngine`` chosen by
``WeightTransferConfig.backend`` (``vllm/config/weight_transfer.py``). Every backend vLLM
ships moves CUDA tensors: ``nccl``, ``sparse_nccl`` and ``nccl_m2n`` broadcast over NCCL,
``ipc`` rebuilds CUDA IPC handles (``vllm/distributed/weight_transfer/ipc_engine.py``),
``sharded_rdt`` pulls over Ray RDT, ``modelexpress`` over NIXL; none runs on CPU.

The factory takes backends registered at run time
(``WeightTransferEngineFactory.register_engine``,
``vllm/distributed/weight_transfer/factory.py``), so kvfence registers a transport that
reads the chunk's tensors from the checkpoint's safetensors file, and keeps everything
else vLLM's: ``start_weight_update`` runs ``initialize_layerwise_reload`` (each layer goes
to the meta device, its loaders buffer), each chunk goes through the model's own
``load_weights`` (a layer is materialised and processed once all its tensors arrived), and
``finish_weight_update`` runs ``finalize_layerwise_reload`` — the checkpoint-format path of
the ``ipc`` backend, with the file as the wire. Measured on 0.32 CPU (tiny model): a whole
update in two chunks takes ~0.35 s; its output equals ``collective_rpc("reload_weights")``
of the same checkpoint bit for bit; ``finish_weight_update`` leaves the prefix cache as it
was (a repeated prompt hits the old KV); and a forward pass inside the window fails
("Tensor on device cpu is not on the expected device meta"), so nothing may be served
between start and finish.

vLLM has no abort: no route, engine or worker method ends a window without finishing it
(the worker clears its flag only when a chunk raises). The driver's
``abort_weight_update`` therefore rolls back through the same API, in two windows: the
open one is finished with the old checkpoint's tensors for the layers not yet loaded (a
layer cannot be loaded twice in one window: vLLM asserts "Attempted to load weight ...
into parameter (torch.Size([0]))"), then a second window lands the old checkpoint whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The backend name kvfence registers with vLLM's weight-transfer factory.
BACKEND = "kvfence-disk"

#: Chunks a whole checkpoint is split into (sorted tensor names, contiguous runs).
CHUNKS = 2


@dataclass
class DiskInitInfo:
    """``init_weight_transfer_engine`` payload: nothing to rendezvous with."""


@dataclass
class DiskUpdateInfo:
    """``update_weights`` payload: the safetensors ``path`` and the tensor ``names`` of one
    chunk (checkpoint names, as ``load_weights`` takes them)."""

    path: str
    names: list[str] = field(default_factory=list)


_registered = False


def register_backend() -> None:
    """Register ``kvfence-disk`` with ``WeightTransferEngineFactory`` (once per process;
    before the engine starts, since the worker builds its transfer engine at model load)."""
    global _registered
    if _registered:
        return
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    class DiskWeightTransferEngine(WeightTransferEngine[DiskInitInfo, DiskUpdateInfo]):
        """Chunks read from a safetensors file; layerwise reload as vLLM's ``ipc``
        backend does it (``start``: initialize, ``finish``: finalize)."""

        init_info_cls = DiskInitInfo
        update_info_cls = DiskUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info: DiskInitInfo) -> None:
            return None

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def receive_weights(self, update_info: DiskUpdateInfo) -> None:
            from safetensors import safe_open

            with safe_open(update_info.path, framework="pt") as f:
                tensors = [(n, f.get_tensor(n)) for n in update_info.names]
            self.model.load_weights(iter(tensors))

        def shutdown(self) -> None:
            return None

    WeightTransferEngineFactory.register_engine(BACKEND, DiskWeightTransferEngine)
    _registered = True


def chunks_of(checkpoint: Path, n: int = CHUNKS) -> list[DiskUpdateInfo]:
    """The ``update_weights`` payloads of a whole checkpoint directory, ``n`` chunks of its
    sorted tensor names (one safetensors file, as the tiny model writes)."""
    from safetensors import safe_open

    files = sorted(Path(checkpoint).glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"{checkpoint}: expected one *.safetensors file, found {len(files)}")
    with safe_open(str(files[0]), framework="pt") as f:
        names = sorted(f.keys())
    size = -(-len(names) // n)
    return [DiskUpdateInfo(str(files[0]), names[i : i + size]) for i in range(0, len(names), size)]


@dataclass
class TwoPhase:
    """One open window: the target ``version``, the chunks still to land, the version the
    engine held before (for :meth:`abort`)."""

    version: int
    pending: list[DiskUpdateInfo]
    landed: int = 0
    before: int = 0
    landed_names: set[str] = field(default_factory=set)

    def payload(self, info: DiskUpdateInfo) -> dict[str, Any]:
        """``update_weights``' request body for one chunk."""
        return {"update_info": {"path": info.path, "names": list(info.names)}}
