"""The words of the spec: every enumerated value the model, the traces and the docs use.

Each enum is a ``str`` subclass so that it serialises to the same lower-case word in a JSONL
trace as it has in the docs (``Funnel.TWO_PHASE`` is ``"two_phase"`` everywhere).
"""

from __future__ import annotations

from enum import Enum


class Funnel(str, Enum):
    """A weight-update path into an engine.

    Mirrors SGLang's ``/update_weights_from_disk``, ``/update_weights_from_tensor``,
    ``/update_weights_from_distributed`` (with ``/init_weights_update_group``), the two-phase
    ``/update_weights_from_disk`` + commit path, CUDA-IPC handles, sparse deltas, and bucketed
    tensor transfers. The engine guard (ENG-001) must hold on every one of them.
    """

    DISK = "disk"
    TENSOR = "tensor"
    DISTRIBUTED = "distributed"
    TWO_PHASE = "two_phase"
    IPC = "ipc"
    SPARSE_DELTA = "sparse_delta"
    BUCKETED = "bucketed"


class Lane(str, Enum):
    """EXACT when the engine runs with SGLang's ``rl_on_policy_target`` set, else STANDARD."""

    EXACT = "exact"
    STANDARD = "standard"


class CacheMode(str, Enum):
    """The client's ``cache_invalidation_mode`` (XoRL-style resolver)."""

    AUTO = "auto"
    FLUSH = "flush"
    NONE = "none"


class PauseMode(str, Enum):
    """What ``/pause_generation`` does to in-flight requests.

    ABORT ends them and frees their KV; RETRACT frees their KV and re-queues them (they
    recompute on resume); IN_PLACE freezes them with their KV kept.
    """

    IN_PLACE = "in_place"
    RETRACT = "retract"
    ABORT = "abort"


class Phase(str, Enum):
    """Endpoint lifecycle phase; the table of allowed actions lives in ``lifecycle.py``.

    STOPPED: the engine process exited (the seed fork's fail-closed: a refused mandatory
    flush raises out of the scheduler loop). Nothing is served; only Restart leaves it.
    """

    SERVING = "serving"
    PAUSED = "paused"
    ASLEEP = "asleep"
    STOPPED = "stopped"


class Role(str, Enum):
    """The part an endpoint plays in a prefill/decode (P/D) deployment (SGLang's
    ``--disaggregation-mode prefill|decode``, vLLM's KV connector roles): PREFILL computes a
    request's KV and transfers it; DECODE receives that KV and decodes under its own
    weights. Each side has its own weights and its own weight version."""

    PREFILL = "prefill"
    DECODE = "decode"


class Kind(str, Enum):
    """What a cache entry holds: target-model KV, draft-model KV, or encoder output."""

    TARGET = "target"
    DRAFT = "draft"
    ENCODER = "encoder"


class Tier(str, Enum):
    """Where a cache entry lives: device memory, host memory (L2), or a storage tier (L3)."""

    DEVICE = "device"
    HOST = "host"
    STORAGE = "storage"


class Status(str, Enum):
    """How a system under test answered an action, as classified by its adapter.

    OK: it did what was asked. REJECTED: it reported failure (HTTP error, ``success: false``,
    a refused flush). STOPPED: the engine process exited instead of answering (the adapter
    saw the process end, not merely a lost reply). INDETERMINATE: the answer does not say
    which (a timeout or dropped connection on a call that may have taken effect).

    The INDETERMINATE rule: the spec never predicts INDETERMINATE. Every action the spec
    lets fail has a definite failure (REJECTED, or STOPPED where stopping is allowed), so an
    INDETERMINATE answer matches no branch and is judged as a status mismatch against each:
    a lost reply on an update or a flush is never evidence that it was safe.
    """

    OK = "ok"
    REJECTED = "rejected"
    STOPPED = "stopped"
    INDETERMINATE = "indeterminate"


# ----- memory release tags ----------------------------------------------------------------


class MemoryTag(str, Enum):
    """What a memory release (Sleep) or resume (WakeUp) covers.

    Mirrors SGLang ``ReleaseMemoryOccupationReqInput.tags`` /
    ``ResumeMemoryOccupationReqInput.tags`` (``GPU_MEMORY_TYPE_KV_CACHE``,
    ``GPU_MEMORY_TYPE_WEIGHTS``; no tags means all) and vLLM ``/wake_up?tags=``
    (``kv_cache``, ``weights``). SGLang's third tag, ``cuda_graph``, holds neither KV nor
    weights, so nothing in this spec depends on it and it is not modelled.
    """

    KV_CACHE = "kv_cache"
    WEIGHTS = "weights"


ALL_MEMORY: frozenset[MemoryTag] = frozenset(MemoryTag)
"""Every tag: what a Sleep or WakeUp without tags means (vLLM ``/sleep?level=1``)."""


GARBAGE = -1
"""Version tag of a cache entry whose index survived but whose KV memory did not (PF-02):
whatever it holds was computed under no weight version at all."""


MIXED = -2
"""Version tag of live weights inside an open two-phase update window once a chunk has
landed (WIN-001): some tensors are new, the rest old, so they are no weight version at all.
KV computed under them carries this tag and must never be reused after the window closes
(WIN-002)."""
