"""A small fork overlay written for kvfence's tests: a tensor update whose load fails
after some tensors landed answers ``success=False`` and the scheduler keeps serving.

Upstream's model runner has no ``try`` around ``update_weights_from_tensor``'s load
(``model_executor/model_runner_components/weight_updater.py``), so there the exception
stops the scheduler process. A fork that wants the server to survive such a failure
catches it in the manager, as below, and answers a clean failure; but nothing closes the
endpoint, so the next request runs on torn weights and reuses the old tree (FC-004:
neither rolled back nor closed; FC-002: served while it should be closed).
"""

import importlib.util
import os
import sys

import sglang.srt.managers.scheduler_components as _pkg

_NAME = "sglang.srt.managers.scheduler_components._upstream_weight_updater"
_spec = importlib.util.spec_from_file_location(
    _NAME, os.path.join(_pkg.__path__[0], "weight_updater.py")
)
_upstream = importlib.util.module_from_spec(_spec)
sys.modules[_NAME] = _upstream
_spec.loader.exec_module(_upstream)
globals().update({k: v for k, v in vars(_upstream).items() if not k.startswith("__")})


class SchedulerWeightUpdaterManager(_upstream.SchedulerWeightUpdaterManager):
    """Upstream's manager; a failed tensor load answers instead of raising."""

    __slots__ = ()

    def update_weights_from_tensor(self, recv_req):
        try:
            return super().update_weights_from_tensor(recv_req)
        except Exception as e:  # the load failed midway: answer, keep serving
            return UpdateWeightsFromTensorReqOutput(  # noqa: F821 (re-exported above)
                success=False, message=f"Failed to update weights from tensor: {e}"
            )
