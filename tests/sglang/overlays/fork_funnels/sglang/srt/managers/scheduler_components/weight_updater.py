"""A small fork overlay written for kvfence's tests: upstream's weight updater plus the
seed fork's own update funnels, in its shape (togethercomputer/xorl-sglang
``weight_updater.py``): a two-phase ``prepare_weights_update`` (arm the receivers) /
``complete_weights_update`` (apply what they received, then the post-update flush), and
``update_weights_from_sparse_delta`` (validate the packed delta, then apply it, then the
flush). No exact-lane guard: on an exact lane these funnels keep the old tree as upstream's
do (ENG-001).

The fork adds its request types to ``io_struct``; this overlay defines small stand-ins
with the fields the manager reads and registers them there, so the host finds them as real
types and drives each funnel through its own request and method.
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
class _UpdateReq:
    group_name: str = ""
    weight_version: str | None = None
    flush_cache: bool = True
    torch_empty_cache: bool = False


@dataclass
class PrepareWeightsUpdateReqInput(_UpdateReq):
    transport: str = "nccl"


@dataclass
class CompleteWeightsUpdateReqInput(_UpdateReq):
    pass


@dataclass
class UpdateWeightsFromSparseDeltaReqInput(_UpdateReq):
    staging_op: str | None = None


@dataclass
class WeightsUpdateReqOutput:
    success: bool
    message: str


for _cls in (
    PrepareWeightsUpdateReqInput,
    CompleteWeightsUpdateReqInput,
    UpdateWeightsFromSparseDeltaReqInput,
):
    setattr(_io, _cls.__name__, _cls)


class SchedulerWeightUpdaterManager(_upstream.SchedulerWeightUpdaterManager):
    """Upstream's manager with the fork's two-phase and sparse-delta funnels."""

    __slots__ = ()

    def _after_load(self, recv_req, success, message):
        """What upstream's own funnels do after a successful load: record the label
        (0.5.20+) and run the post-update flush (its signature differs by version)."""
        if not success:
            return success, message
        if hasattr(self, "record_weight_version_after_update"):
            self.record_weight_version_after_update(recv_req.weight_version)
            return self.flush_cache_after_weight_update(recv_req, success, message)
        self.flush_cache_after_weight_update(recv_req)
        return success, message

    def prepare_weights_update(self, recv_req):
        success, message = self.tp_worker.prepare_weights_update(recv_req)
        return WeightsUpdateReqOutput(success=success, message=message)

    def complete_weights_update(self, recv_req):
        success, message = self.tp_worker.complete_weights_update(recv_req)
        return WeightsUpdateReqOutput(*self._after_load(recv_req, success, message))

    def update_weights_from_sparse_delta(self, recv_req):
        success, message = self.tp_worker.update_weights_from_sparse_delta(
            recv_req, validate_only=True
        )
        if success:
            success, message = self.tp_worker.update_weights_from_sparse_delta(recv_req)
            success, message = self._after_load(recv_req, success, message)
        return WeightsUpdateReqOutput(success=success, message=message)
