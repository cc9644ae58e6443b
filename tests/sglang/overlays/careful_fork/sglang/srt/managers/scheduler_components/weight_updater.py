"""A small fork overlay written for kvfence's tests, the careful one of a pair (see
``careless_fork``): upstream's weight updater plus

* a two-phase update that **stages** what the trainer sends and swaps it in on complete,
  in the shape of the seed fork's NCCL two-phase path (togethercomputer/xorl-sglang:
  ``prepare_weights_update`` arms receivers that store each bucket in temporary buffers;
  ``complete_weights_update`` applies them, then the label and the post-update flush).
  Between prepare and complete the live parameters stay the old version, whole and
  labelled; a chunk that fails leaves them so, and the complete that follows reports
  failure and publishes nothing (WIN-001..003 hold);
* a ``release_memory_occupation`` that checks the answer of the flush it runs for the
  ``kv_cache`` tag. Upstream (0.5.17-0.5.23) calls ``self.flush_cache()`` there and drops
  the answer: a refused flush leaves the radix tree indexing KV memory the release gives
  back, and the resume brings the index back over garbage (MEM-002). Here a refused flush
  is remembered and the resume of the KV memory flushes before anything is served again
  (the scheduler is idle then); if that flush is refused too, the resume raises and the
  scheduler stops rather than serve from the stale index.
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

_KV = _upstream.GPU_MEMORY_TYPE_KV_CACHE


class SchedulerWeightUpdaterManager(_upstream.SchedulerWeightUpdaterManager):
    """Upstream's manager with a staged two-phase update and a checked release."""

    __slots__ = ("_index_outlived_release",)

    def prepare_weights_update(self, recv_req):
        success, message = self.tp_worker.prepare_weights_update(recv_req)
        return WeightsUpdateReqOutput(success=success, message=message)

    def complete_weights_update(self, recv_req):
        success, message = self.tp_worker.complete_weights_update(recv_req)
        if success:
            self.record_weight_version_after_update(recv_req.weight_version)
            success, message = self.flush_cache_after_weight_update(recv_req, success, message)
        return WeightsUpdateReqOutput(success=success, message=message)

    def release_memory_occupation(self, recv_req):
        answers = []
        flush = self.flush_cache

        def checked(*args, **kwargs):
            answers.append(flush(*args, **kwargs))
            return answers[-1]

        self.flush_cache = checked
        try:
            out = super().release_memory_occupation(recv_req)
        finally:
            self.flush_cache = flush
        if False in answers:
            self._index_outlived_release = True
        return out

    def resume_memory_occupation(self, recv_req):
        out = super().resume_memory_occupation(recv_req)
        tags = recv_req.tags or _upstream.GPU_MEMORY_ALL_TYPES
        if _KV in tags and getattr(self, "_index_outlived_release", False):
            if not self.flush_cache():
                raise RuntimeError("the prefix index outlived the KV release and cannot be reset")
            self._index_outlived_release = False
        return out
