"""A small fork overlay written for kvfence's tests, the careless one of a pair (see
``careful_fork``): upstream's weight updater (its ``release_memory_occupation`` too, which
drops the answer of its flush: MEM-002 once that flush is refused) plus a two-phase update
whose prepare registers the **live** parameters for the trainer's writes, in the shape of
the seed fork's P2P path (togethercomputer/xorl-sglang:
``prepare_weights_update_p2p`` registers every named parameter's memory for one-sided RDMA
writes; ``complete_weights_update_p2p`` post-processes them; the manager then records the
label and runs the post-update flush).

Between prepare and complete every chunk the trainer writes lands where the forward reads:
the endpoint serves torn weights while it still reports the old version's label (WIN-001),
and a chunk that fails leaves them torn under that label (WIN-003).
"""

import importlib.util
import os
import sys
from dataclasses import dataclass

import sglang.srt.managers.io_struct as _io
import sglang.srt.managers.scheduler_components as _pkg

_NAME = "sglang.srt.managers.scheduler_components._upstream_weight_updater"
_spec = importlib.util.spec_from_file_location(
    _NAME, os.path.join(_pkg.__path__[0], "weight_updater.py")
)
_upstream = importlib.util.module_from_spec(_spec)
sys.modules[_NAME] = _upstream
_spec.loader.exec_module(_upstream)
globals().update({k: v for k, v in vars(_upstream).items() if not k.startswith("__")})


@dataclass
class PrepareWeightsUpdateReqInput:
    group_name: str = ""
    weight_version: str | None = None
    flush_cache: bool = True
    torch_empty_cache: bool = False


@dataclass
class CompleteWeightsUpdateReqInput(PrepareWeightsUpdateReqInput):
    pass


@dataclass
class WeightsUpdateReqOutput:
    success: bool
    message: str


for _cls in (PrepareWeightsUpdateReqInput, CompleteWeightsUpdateReqInput):
    setattr(_io, _cls.__name__, _cls)


class SchedulerWeightUpdaterManager(_upstream.SchedulerWeightUpdaterManager):
    """Upstream's manager with a P2P two-phase update into the live parameters."""

    __slots__ = ()

    def prepare_weights_update(self, recv_req):
        runner = self.tp_worker.model_runner.weight_updater
        success, message, _locators, _session = runner.prepare_weights_update_p2p(
            recv_req.group_name
        )
        return WeightsUpdateReqOutput(success=success, message=message)

    def complete_weights_update(self, recv_req):
        runner = self.tp_worker.model_runner.weight_updater
        success, message = runner.complete_weights_update_p2p(recv_req.group_name)
        if success:
            self.record_weight_version_after_update(recv_req.weight_version)
            success, message = self.flush_cache_after_weight_update(recv_req, success, message)
        return WeightsUpdateReqOutput(success=success, message=message)
