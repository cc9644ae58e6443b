"""The stubbed half of an SGLang endpoint: model runner, memory pools, metrics.

Everything SGLang runs on a GPU is replaced here, and nothing else. The scheduler-side
control plane that decides whether a weight update flushes the radix cache (SGLang
``python/sglang/srt/managers/scheduler.py``, ``scheduler_components/weight_updater.py``,
``flush_wrapper.py``, ``mem_cache/*radix_cache.py``) stays upstream's own code; see
:mod:`adapters.sglang_host`.

* ``StubRunner``: a model runner whose "weights" are one integer version. It offers both
  runner APIs SGLang has used: the 0.5.20+ one (``weight_update_runners()`` yielding
  ``(role, runner)`` with ``runner.weight_updater.update_weights_from_disk(path, fmt,
  recapture_cuda_graph=...)``) and the 0.5.17 one (``tp_worker.update_weights_from_disk
  (recv_req)``). The version a load installs is the one the host set as ``pending`` for
  the request at hand. A load can be made to fail after some tensors landed; each funnel
  then answers as upstream's model-runner code does (``FUNNEL_FAILURES``).
* ``KvPool``: the token-to-KV allocator the radix tree frees into. Each KV slot remembers
  the weight version that "computed" it, so the cache probe reads provenance from the
  indices the real tree returns, not from a side table.
* ``Recorder``: an inert stand-in for pools, metrics, grammar and the memory saver that
  records every call (``flush_cache`` calls ``clear()`` on the pools, for instance).
* ``install_torchvision_stub``: CPU torch wheels ship no torchvision; transformers and
  SGLang import it at module level.

No SGLang import here: this module is imported inside the host process before SGLang.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

GARBAGE = -1


def version_label(version: int) -> str:
    """The ``weight_version`` string kvfence sends for ``version`` (SGLang labels are free
    text): ``3 -> "v3"``."""
    return f"v{version}"


def label_version(label: object) -> int | None:
    """The kvfence version an SGLang label names (``"v3" -> 3``, SGLang's launch default
    ``"default" -> 0``); ``None`` for anything else."""
    if label == "default":
        return 0
    if isinstance(label, str) and label.startswith("v") and label[1:].isdigit():
        return int(label[1:])
    return None


MIXED = -2
"""The version of a runner whose load failed after some tensors landed (torn weights), and
of KV computed under them (kvfence's ``model.vocabulary.MIXED``)."""

FUNNEL_FAILURES = {
    "disk": "rollback",
    "distributed": "torn",
    "ipc": "torn",
    "tensor": "raise",
    "two_phase": "torn",
    "sparse_delta": "torn",
}
"""What upstream's model-runner weight updater does when a load fails after some tensors
landed (``python/sglang/srt/model_executor/model_runner_components/weight_updater.py``,
0.5.17; the same shape in 0.5.23): ``update_weights_from_disk`` reloads the original
checkpoint and answers ``(False, "... Rolling back to original weights.")``;
``update_weights_from_distributed`` (and its flattened-bucket path) answers ``(False, "...
partially updated. Please discard the whole weights.")``; ``update_weights_from_ipc``
answers ``(False, str(e))``; ``update_weights_from_tensor`` has no ``try``: the loader's
exception propagates out of the scheduler's handler."""


class StubWeightUpdater:
    """The runner's ``weight_updater`` (SGLang ``model_executor/model_runner`` 0.5.20+):
    every load installs the version named by ``pending``, unless a failure is armed
    (``StubRunner.fail_midway``): then some tensors land and the funnel answers as
    upstream's does (``FUNNEL_FAILURES``)."""

    def __init__(self, runner: StubRunner) -> None:
        self._runner = runner

    def _load(self, funnel: str, final: bool = True) -> tuple[bool, str]:
        """Load the weights a call carries: all of them (``final``), or one chunk of an
        open session, which lands in the live parameters beside the old ones (torn until
        the final chunk)."""
        runner = self._runner
        if not runner.fail_midway:
            runner.version = runner.pending if final else MIXED
            return True, "stub runner: loaded" if final else "stub runner: chunk loaded"
        runner.fail_midway = False
        old, runner.version = runner.version, MIXED  # some tensors landed
        how = FUNNEL_FAILURES[funnel]
        if how == "rollback":
            runner.version = old
            return False, "Failed to update weights: stub fault.\nRolling back to original weights."
        if how == "raise":
            raise RuntimeError("stub runner: load_weights failed after some tensors landed")
        return False, (
            "Failed to update parameter online: stub fault. The full weights of the "
            "ModelRunner are partially updated. Please discard the whole weights."
        )

    def update_weights_from_disk(self, model_path, load_format=None, **kwargs):
        return self._load("disk")

    def update_weights_from_tensor(self, named_tensors=None, load_format=None, **kwargs):
        names = [name for name, _ in named_tensors or ()]
        return self._load("tensor", final=CHUNK_TENSOR not in names)

    def receive_weights_from_distributed(self, **kwargs):
        return ["stub-weights"]

    def load_weights_from_distributed(self, weights):
        return self._load("distributed")

    def update_weights_from_ipc(self, recv_req):
        return self._load("ipc")

    def begin_weight_update(self, *args, **kwargs) -> None:
        pass

    def end_weight_update(self, *args, **kwargs) -> None:
        pass

    # P2P (one-sided writes), as the seed fork's model runner names it
    def prepare_weights_update_p2p(self, group_name, **kwargs):
        """Register the live parameters' memory for the trainer's one-sided writes: every
        chunk written from now on lands where the forward reads (``LiveParameters``)."""
        self._runner.armed = LiveParameters(self._runner)
        return True, "stub runner: live parameters registered", None, "stub-session"

    def complete_weights_update_p2p(self, group_name, **kwargs):
        return self._runner.complete_armed()


CHUNK_TENSOR = "stub.chunk"
"""The tensor name of a non-final chunk of a session (``update_weights_from_tensor`` inside
``begin/end_weight_update``): it lands beside the old weights, which are torn until the
final call, whose tensors (``stub.weight``) complete the version."""


class LiveParameters:
    """Receive targets in the live parameters (what a P2P prepare registers for one-sided
    writes, the seed fork's ``prepare_weights_update_p2p``): a chunk written here is read
    by every forward from then on, so the weights are torn until the final chunk."""

    staged = False

    def __init__(self, runner: StubRunner) -> None:
        self.runner = runner
        self.failed = False
        self.whole = False

    def write(self, version: int, final: bool, fail: bool) -> tuple[bool, str]:
        if self.failed:
            return False, "stub transfer: the receivers failed; nothing more is taken"
        if fail:
            self.failed = True
            self.runner.version = MIXED
            return False, "stub transfer: a chunk failed after some tensors landed"
        self.whole = final
        self.runner.version = version if final else MIXED
        return True, "stub transfer: chunk written into the live parameters"


class StagingBuffer:
    """Receive targets set aside (what the receivers ``prepare_weights_update`` arms write
    into: temporary buffers no forward reads); the live weights change only when the
    complete step swaps the staged tensors in."""

    staged = True

    def __init__(self) -> None:
        self.version: int | None = None
        self.failed = False
        self.whole = False

    def write(self, version: int, final: bool, fail: bool) -> tuple[bool, str]:
        if self.failed:
            return False, "stub transfer: the receivers failed; nothing more is taken"
        if fail:
            self.failed = True
            return False, "stub transfer: a chunk failed; the staged tensors are incomplete"
        self.version, self.whole = version, final
        return True, "stub transfer: chunk staged"


class StubRunner:
    """A model runner with one integer weight version (``MIXED`` while torn) and a torch
    module for SGLang's static-state export on release_memory_occupation.
    ``fail_midway``: the next load fails after some tensors landed (one shot). ``armed``:
    the receive targets the last prepare armed (``LiveParameters`` or ``StagingBuffer``),
    where the trainer's chunks land."""

    def __init__(self, version: int = 0) -> None:
        import torch

        self.version = version
        self.pending = version
        self.fail_midway = False
        self.armed: LiveParameters | StagingBuffer | None = None
        self.weight_updater = StubWeightUpdater(self)
        self.model = torch.nn.Linear(2, 2)

    def complete_armed(self) -> tuple[bool, str]:
        """The complete step over what the prepare armed: staged tensors are swapped into
        the live parameters; live ones only post-processed. Fails, changing nothing more,
        when a chunk failed or the final chunk never arrived."""
        armed, self.armed = self.armed, None
        if armed is None:
            return False, "stub runner: no receivers armed"
        if armed.failed or not armed.whole:
            return False, "stub runner: the transfer did not complete; nothing applied"
        if armed.staged:
            self.version = armed.version
            return True, "stub runner: staged weights swapped in"
        return True, "stub runner: live parameters post-processed"


class StubTpWorker:
    """``Scheduler.tp_worker``: both the 0.5.20+ runner fan-out and the 0.5.17 direct API."""

    def __init__(self, runner: StubRunner) -> None:
        self.model_runner = runner

    # 0.5.20+: the weight updater manager fans out over runners
    def weight_update_runners(self):
        return [("target", self.model_runner)]

    def deserialize_own_rank(self, serialized):
        import torch

        name = CHUNK_TENSOR if list(serialized or ()) == [CHUNK_TENSOR.encode()] else "stub.weight"
        return [(name, torch.zeros(1))]

    # 0.5.17: the manager calls the worker with the request
    def _load(self, funnel: str) -> tuple[bool, str]:
        return self.model_runner.weight_updater._load(funnel)

    def update_weights_from_disk(self, recv_req):
        return self._load("disk")

    def update_weights_from_tensor(self, recv_req):
        return self._load("tensor")

    def update_weights_from_distributed(self, recv_req):
        return self._load("distributed")

    def update_weights_from_ipc(self, recv_req):
        return self._load("ipc")

    # the seed fork's tp_worker API (togethercomputer/xorl-sglang): two-phase, sparse delta
    def prepare_weights_update(self, recv_req):
        """Arm receivers into temporary buffers (``StagingBuffer``): the seed fork's NCCL
        two-phase prepare, whose recv threads store what arrives aside."""
        self.model_runner.armed = StagingBuffer()
        return True, "stub runner: receivers armed"

    def complete_weights_update(self, recv_req):
        """Apply what the receivers got. With nothing armed (a caller that skipped the
        transfer), a plain load of the pending version, as before two-phase chunks."""
        if self.model_runner.armed is None:
            return self._load("two_phase")
        return self.model_runner.complete_armed()

    def update_weights_from_sparse_delta(self, recv_req, validate_only=False):
        return (True, "stub runner: delta valid") if validate_only else self._load("sparse_delta")


class KvPool:
    """KV slots and the weight version that computed each (``GARBAGE`` once freed).

    Also the ``token_to_kv_pool_allocator`` handed to the radix tree: the tree calls
    ``free`` on duplicate or evicted indices; ``clear`` is what ``Scheduler.flush_cache``
    calls after resetting the tree.
    """

    device = "cpu"

    def __init__(self) -> None:
        self.version_of: dict[int, int] = {}
        self._next = 0
        self.calls: list[str] = []

    def alloc(self, n: int, version: int):
        import torch

        idx = torch.arange(self._next, self._next + n, dtype=torch.int64)
        for i in range(self._next, self._next + n):
            self.version_of[i] = version
        self._next += n
        return idx

    def versions(self, indices) -> set[int]:
        return {self.version_of.get(int(i), GARBAGE) for i in indices}

    def free(self, indices, *args, **kwargs) -> None:
        self.calls.append("free")
        for i in indices:
            self.version_of[int(i)] = GARBAGE

    def free_segment(self, indices, *args, **kwargs) -> None:
        self.free(indices)

    def clear(self) -> None:
        self.calls.append("clear")
        self.version_of = dict.fromkeys(self.version_of, GARBAGE)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a, **k: self.calls.append(name)


class Recorder:
    """An inert pool / metrics / grammar / memory-saver stand-in: records each call by
    name; ``attrs`` are plain attributes SGLang reads."""

    def __init__(self, name: str, **attrs: Any) -> None:
        self._name = name
        self.log: list[tuple[str, tuple, dict]] = []
        self.__dict__.update(attrs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a, **k: self.log.append((name, a, k))


def install_torchvision_stub() -> None:
    """Register an empty ``torchvision`` so transformers and SGLang import on CPU torch.

    transformers' availability probe is cached as False first, so it keeps treating
    torchvision as absent; SGLang only reads ``InterpolationMode`` at import time."""
    if "torchvision" in sys.modules:
        return
    try:
        import transformers.utils.import_utils as iu

        iu.is_torchvision_available()
    except Exception:
        pass

    class InterpolationMode:
        NEAREST = "nearest"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        LANCZOS = "lanczos"
        BOX = "box"
        HAMMING = "hamming"
        NEAREST_EXACT = "nearest-exact"

    def unavailable(*a: Any, **k: Any) -> Any:
        raise RuntimeError("torchvision is stubbed in kvfence's SGLang host")

    names = (
        "torchvision",
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.v2",
        "torchvision.transforms.v2.functional",
        "torchvision.io",
        "torchvision.ops",
    )
    for name in names:
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        m.__path__ = []
        m.InterpolationMode = InterpolationMode
        m.decode_jpeg = m.decode_image = m.read_file = unavailable
        sys.modules[name] = m
    for name in names[1:]:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, sys.modules[name])
    sys.modules["torchvision"].__version__ = "0.0.0+kvfence-stub"


def tolerate_config_reregistration() -> None:
    """SGLang releases before transformers learnt a model type register their own config
    class for it at import (``sglang/srt/configs/*.py``, e.g. ``qwen3_asr`` in 0.5.17);
    transformers 5.x refuses a second registration. Let the older SGLang's registration
    win quietly (``exist_ok=True``), as it did on the transformers it was released with."""
    from transformers import AutoConfig

    if getattr(AutoConfig.register, "_kvfence", False):
        return
    original = AutoConfig.register

    def register(model_type: str, config: Any, exist_ok: bool = False) -> None:
        original(model_type, config, exist_ok=True)

    register._kvfence = True  # type: ignore[attr-defined]
    AutoConfig.register = register
