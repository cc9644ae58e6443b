"""An overlay that breaks the harness on purpose (kvfence's tests): upstream's weight
updater, except that a flush after an update reads a scheduler attribute that does not
exist. kvfence must report this as an adapter ERROR (ADP-001) naming the SGLang version and
the attribute, never as a verdict about SGLang."""

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
    __slots__ = ()

    def flush_cache_after_weight_update(self, recv_req, *args):
        return self.scheduler.kvfence_attribute_that_no_sglang_has
