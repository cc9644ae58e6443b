"""A small fork overlay written for kvfence's tests: upstream's weight updater plus an
exact-lane guard, in the shape of the seed fork's (togethercomputer/xorl-sglang,
``_radix_flush_required_for_rl`` in this same file).

It replaces ``sglang.srt.managers.scheduler_components.weight_updater``: upstream's own file
is loaded under a private name and every name re-exported; only
``SchedulerWeightUpdaterManager.flush_cache_after_weight_update`` changes. On an exact lane
(``rl_on_policy_target`` set) with the radix cache on, every update flushes whatever the
caller asked, and a flush that is refused raises: the scheduler process stops instead of
serving KV of the old weights (fail-closed by stopping). Elsewhere it is upstream's.
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
    """Upstream's manager with the exact-lane guard."""

    __slots__ = ()

    def flush_cache_after_weight_update(self, recv_req, *args):
        if exact_lane_radix_on():
            if not self.flush_cache(empty_cache=recv_req.torch_empty_cache):
                raise RuntimeError(
                    "exact lane: the prefix-cache flush after a weight update was refused; "
                    "stopping instead of serving KV computed under the old weights"
                )
            return args[:2] if args else None
        return super().flush_cache_after_weight_update(recv_req, *args)
