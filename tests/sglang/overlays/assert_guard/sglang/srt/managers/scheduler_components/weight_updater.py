"""A small fork overlay written for kvfence's tests: the exact-lane guard of
``overlays/exact_guard``, with its fail-closed written as a bare ``assert``, the way
upstream 0.5.17 checks its own post-update flush (``flush_cache_after_weight_update``,
``assert flush_cache_success, "Cache flush failed after updating weights"``).

With assertions on, a refused forced flush raises ``AssertionError`` out of the handler and
the scheduler process stops (fail-closed by stopping). Under ``python -O`` the ``assert``
is gone: the refused flush is ignored, the update reports success, and the old prefix
stays matchable beside the new weights (ENG-001).
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


def exact_lane_radix_on() -> bool:
    """The engine runs an exact lane with the radix cache on (SGLang's runtime config)."""
    from sglang.srt.runtime_context import get_exec, get_memory

    exact = get_exec().deterministic.rl_on_policy_target is not None
    return exact and not get_memory().disable_radix_cache


class SchedulerWeightUpdaterManager(_upstream.SchedulerWeightUpdaterManager):
    """Upstream's manager with the exact-lane guard, fail-closed by ``assert``."""

    __slots__ = ()

    def flush_cache_after_weight_update(self, recv_req, *args):
        if exact_lane_radix_on():
            flushed = self.flush_cache(empty_cache=recv_req.torch_empty_cache)
            assert flushed, "exact lane: the prefix-cache flush after a weight update failed"
            return args[:2] if args else None
        return super().flush_cache_after_weight_update(recv_req, *args)
