"""One SGLang endpoint, hosted in its own process: upstream's scheduler control plane on CPU.

Runs inside a process started by :class:`adapters.sglang_engine.SglangAdapter`, forked
from a :func:`zygote` or spawned (one per endpoint: SGLang keeps its config
process-wide, ``runtime_context.publish``, and a fork's overlay replaces modules in
``sys.modules``). The child puts the chosen SGLang version's folder first on
``sys.path``, applies an overlay if one is given, and then builds an endpoint from
upstream's own classes:

* the real ``Scheduler`` class (``python/sglang/srt/managers/scheduler.py``), built with
  ``object.__new__`` (its ``__init__`` starts ZMQ sockets, a model runner and CUDA pools)
  and given by hand the attributes its control-plane methods read; every attribute list
  below names the SGLang method that reads it;
* the real radix tree that version's scheduler uses by default (``UnifiedRadixCache``,
  ``mem_cache/unified_radix_cache.py``, 0.5.17+; ``RadixCache`` before);
* the real ``SchedulerWeightUpdaterManager`` (``scheduler_components/weight_updater.py``)
  through ``Scheduler.init_weight_updater``, the real ``SchedulerFlushWrapper``
  (``flush_wrapper.py``) and the real request dispatcher
  (``Scheduler.init_request_dispatcher``): every control action is a real ``io_struct``
  request object sent through that dispatcher;
* a real single-rank gloo process group (the manager's ``torch.distributed.barrier``).

Only the model runner, the memory pools and metrics are stubs (:mod:`adapters.sglang_stubs`),
plus two things the scheduler's event loop and tokenizer manager would do and this host
does in their place, each said where it happens: the prefill of a request (match the real
tree, "compute" the missing KV under the runner's version, insert it into the real tree),
and the ``abort`` pause mode, which SGLang's tokenizer manager implements by aborting every
request without telling the scheduler to pause (``tokenizer_manager.py``
``pause_generation``). In-flight requests are real ``schedule_batch.Req`` objects holding a
request-to-token row, in the real running batch and waiting queue.

Errors: an exception of a kind that means *this harness* no longer fits the SGLang version
(``AttributeError``, ``TypeError``, ``ImportError``, ``NameError``, ``KeyError``) is
reported as ``Broken`` (an ADP-001 ERROR naming the version and the attribute), never as a
verdict. Any other exception raised by SGLang's handler is what the real scheduler process
does with it: ``run_scheduler_process`` logs it and the server exits; the endpoint is
``stopped`` from then on (until Restart).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import sys
import tempfile
import traceback
from array import array
from collections import deque
from types import SimpleNamespace
from typing import Any

from . import sglang_stubs as stubs

#: Exceptions that mean the harness no longer fits this SGLang version.
HARNESS_ERRORS = (AttributeError, TypeError, ImportError, NameError, KeyError)

#: Tokens per prompt (page size 1, so every token is a radix-tree edge unit).
PROMPT_TOKENS = 8
VOCAB = 30000


class Broken(Exception):
    """The harness no longer fits this SGLang version: ADP-001, never a verdict."""


class SglangRaised(Exception):
    """An exception of a harness-error kind (``KeyError``) that SGLang's own handler raised
    on its own state: what the scheduler process dies of, not a harness mismatch."""


def prompt_tokens(prefix: str) -> tuple[int, ...]:
    """The prompt ids a request for ``prefix`` sends: seeded by the name's SHA-256,
    distinct from the first token on, so two prefixes never share a tree branch."""
    seed = int.from_bytes(hashlib.sha256(prefix.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    return tuple(rng.randrange(100, VOCAB) for _ in range(PROMPT_TOKENS))


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    path = f.filename
    for marker in ("sglang/srt/", "adapters/"):
        if marker in path:
            path = marker + path.split(marker, 1)[1]
    return f" at {path}:{f.lineno} ({f.name})"


def _kwargs_for(fn: Any, **wanted: Any) -> dict[str, Any]:
    """Keep only the keyword arguments ``fn`` accepts (adjacent versions add and drop
    parameters); everything if it takes ``**kwargs``."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return wanted
    return {k: v for k, v in wanted.items() if k in params}


def tiny_model_dir(root: str) -> str:
    """A folder holding only a small LlamaForCausalLM ``config.json``: ``ServerArgs``
    reads it; no weights exist and nothing is downloaded."""
    path = os.path.join(root, "tiny-llama")
    os.makedirs(path, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": VOCAB + 100,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


FUNNELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "disk": (("UpdateWeightFromDiskReqInput",), ("update_weights_from_disk",)),
    "tensor": (("UpdateWeightsFromTensorReqInput",), ("update_weights_from_tensor",)),
    "distributed": (
        ("UpdateWeightsFromDistributedReqInput",),
        ("update_weights_from_distributed",),
    ),
    "ipc": (("UpdateWeightsFromIPCReqInput",), ("update_weights_from_ipc",)),
    "bucketed": (
        ("BeginWeightUpdateReqInput", "UpdateWeightsFromTensorReqInput", "EndWeightUpdateReqInput"),
        ("begin_weight_update", "update_weights_from_tensor", "end_weight_update"),
    ),
    "two_phase": (
        ("PrepareWeightsUpdateReqInput", "CompleteWeightsUpdateReqInput"),
        ("prepare_weights_update", "complete_weights_update"),
    ),
    "sparse_delta": (
        ("UpdateWeightsFromSparseDeltaReqInput",),
        ("update_weights_from_sparse_delta",),
    ),
}
"""kvfence funnel -> the ``io_struct`` request types and the weight-updater manager
methods that make it up, as upstream SGLang (disk, tensor, distributed, ipc; bucketed =
tensor calls inside a ``begin/end_weight_update`` session, 0.5.20+) and the seed fork
(togethercomputer/xorl-sglang ``weight_updater.py``: two-phase
``prepare_weights_update`` / ``complete_weights_update``, ``update_weights_from_sparse_
delta``) name them. A funnel exists on an endpoint when every type is a real class (not an
overlay placeholder) and every method is on the manager the scheduler built; a funnel
that does not is N/A there, never mapped onto another."""


class Tracked:
    """kvfence's bookkeeping beside a real in-flight ``Req``: its prefix name and the
    weight versions its KV depends on (what the spec calls the request's uses)."""

    def __init__(self, req: Any, prefix: str, uses: set[int]) -> None:
        self.req = req
        self.prefix = prefix
        self.uses = uses


class Endpoint:
    """One SGLang endpoint under kvfence's actions (see the module docstring).

    ``lane``: ``"exact"`` sets ``rl_on_policy_target="fsdp"`` (with
    ``attention_backend="triton"``, which SGLang requires for it on CPU); ``"standard"``
    leaves it unset. ``workdir``: where the tiny model config goes.
    """

    def __init__(self, lane: str, workdir: str) -> None:
        self.lane = lane
        self.workdir = workdir
        self.version = "?"
        try:
            self._import()
            self.server_args = self._server_args(weight_version=None)
            self._publish(self.server_args)
            self._init_group()
        except HARNESS_ERRORS as e:
            raise Broken(self._say(e, "import/setup")) from e
        self.weights = 0
        self.stopped = ""
        self.prefixes: dict[str, tuple[int, ...]] = {}
        self.build(0)

    # ----- setup ------------------------------------------------------------------------

    def _say(self, e: BaseException, what: str) -> str:
        return f"SGLang {self.version}: {what}: {type(e).__name__}: {e}{_where(e)}"

    def _import(self) -> None:
        apply_shims()
        import sglang

        self.version = getattr(sglang, "__version__", None) or _dist_version()
        import torch
        from sglang.srt.managers import io_struct
        from sglang.srt.managers import scheduler as scheduler_module
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.mem_cache import radix_cache
        from sglang.srt.server_args import ServerArgs

        self.torch = torch
        self.io = io_struct
        self.scheduler_module = scheduler_module
        self.Scheduler = Scheduler
        self.ScheduleBatch = ScheduleBatch
        self.ServerArgs = ServerArgs
        self.radix_cache = radix_cache
        try:
            from sglang.srt.managers.scheduler_components.flush_wrapper import (
                SchedulerFlushWrapper,
            )
        except ImportError:
            SchedulerFlushWrapper = None
        self.FlushWrapper = SchedulerFlushWrapper
        try:
            from sglang.srt.disaggregation.utils import DisaggregationMode

            self.disagg_null = DisaggregationMode.NULL
        except ImportError:
            self.disagg_null = None
        try:
            from sglang.srt import runtime_context
        except ImportError:
            runtime_context = None
        self.rc = runtime_context

    def _server_args(self, weight_version: str | None) -> Any:
        wanted: dict[str, Any] = {
            "model_path": tiny_model_dir(self.workdir),
            "device": "cpu",
            "skip_tokenizer_init": True,
        }
        if self.lane == "exact":
            wanted["rl_on_policy_target"] = "fsdp"
            wanted["attention_backend"] = "triton"
        if weight_version is not None:
            wanted["weight_version"] = weight_version
        fields = getattr(self.ServerArgs, "__dataclass_fields__", None)
        if fields is not None:
            missing = [k for k in wanted if k not in fields]
            if missing:
                raise AttributeError(f"ServerArgs has no field(s) {missing}")
        return self.ServerArgs(**wanted)

    def _publish(self, server_args: Any) -> None:
        if self.rc is not None and hasattr(self.rc, "publish"):
            self.rc.publish(server_args, role="scheduler")
        else:
            from sglang.srt import server_args as sa_module

            sa_module.set_global_server_args_for_scheduler(server_args)

    def _init_group(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            store = os.path.join(self.workdir, "gloo-store")
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        self.tp_cpu_group = dist.group.WORLD
        group = SimpleNamespace(cpu_group=self.tp_cpu_group)
        # 0.5.20+: the manager reads get_parallel().tp_group.cpu_group; before, the
        # scheduler hands it its own tp_cpu_group (set in _build).
        parallel = self.rc.get_parallel() if self.rc is not None else None
        if parallel is not None and hasattr(parallel, "override_permanently"):
            parallel.override_permanently(tp_group=group)

    def _tree(self, pool: stubs.KvPool) -> Any:
        """The tree class this version's scheduler builds by default for a plain model:
        ``UnifiedRadixCache`` with the FULL component where it exists (SGLang
        ``mem_cache/registry.py`` ``default_radix_cache_factory``), else ``RadixCache``."""
        try:
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.unified_cache.components import ComponentType
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        except ImportError:
            return self.radix_cache.RadixCache.create_simulated(disable=False, page_size=1)
        params = CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=pool, page_size=1
        )
        params.tree_components = (ComponentType.FULL,)
        return UnifiedRadixCache(params)

    def build(self, weights: int) -> None:
        """A fresh scheduler serving ``weights``: empty tree, nothing queued, not paused.

        The attributes are those the driven methods read in SGLang 0.5.17-0.5.23:
        ``flush_cache`` (tree_cache, pools, grammar_manager, metrics_reporter,
        draft_worker, cur_batch_for_debug, last_batch), ``is_fully_idle`` (running_batch,
        chunked_req, dllm_manager, last_batch, enable_overlap, result_queue,
        waiting_queue, grammar_manager, disaggregation_mode), ``pause_generation`` /
        ``continue_generation`` (_engine_paused, _pause_started_at, _pause_intervals,
        enable_overlap(_mlx), decode_offload_manager, hisparse_coordinator,
        kv_events_publisher, metrics_reporter), ``record_weight_version_change``
        (hisparse_coordinator, chunked_req), ``init_weight_updater`` (tp_worker,
        draft_worker, memory_saver_adapter, metrics_collector)."""
        try:
            self._build(weights)
        except HARNESS_ERRORS as e:
            raise Broken(self._say(e, "building the scheduler")) from e

    def _build(self, weights: int) -> None:
        self.weights = weights
        self.whole = weights
        self.stopped = ""
        self.tm_paused = False
        self.tm_label = 0 if weights == 0 else weights
        self.runner = stubs.StubRunner(weights)
        # 0.5.17 _assert_weight_cache_inactive reads model_runner.server_args
        self.runner.server_args = self.server_args
        self.pool = stubs.KvPool()
        s = object.__new__(self.Scheduler)
        s.server_args = self.server_args
        s.tp_worker = stubs.StubTpWorker(self.runner)
        s.tp_cpu_group = self.tp_cpu_group
        s.draft_worker = None
        s.tree_cache = self._tree(self.pool)
        s.req_to_token_pool = stubs.Recorder("req_to_token_pool")
        s.token_to_kv_pool_allocator = self.pool
        s.grammar_manager = stubs.Recorder("grammar_manager", grammar_queue=[])
        s.metrics_reporter = stubs.Recorder(
            "metrics_reporter",
            is_stats_logging_rank=False,
            last_gen_throughput=0.0,
            current_scheduler_metrics_enabled=False,
        )
        s.kv_events_publisher = stubs.Recorder("kv_events_publisher")
        s.memory_saver_adapter = stubs.Recorder("memory_saver_adapter")
        s.dllm_manager = SimpleNamespace(any_staging_reqs=lambda: False)
        s.running_batch = self.ScheduleBatch(reqs=[])
        s.waiting_queue = []
        s.chunked_req = None
        s.last_batch = None
        s.cur_batch_for_debug = None
        s.enable_overlap = False
        s.enable_overlap_mlx = False
        s.result_queue = deque()
        s._engine_paused = False
        s._pause_started_at = None
        s._pause_intervals = []
        s.disaggregation_mode = self.disagg_null
        s.enable_hisparse = False
        s.enable_hierarchical_cache = False
        s.enable_lmcache = False
        s.hisparse_coordinator = None
        s.enable_continuous_input_polling = False
        s.decode_offload_manager = None
        s.metrics_collector = None
        s.pp_size = 1
        s.ps = SimpleNamespace(pp_size=1)  # _pp_microbatches_drained, 0.5.17
        # _add_request_to_queue (a retracted request goes back to the waiting queue)
        s.enable_priority_scheduling = False
        s.abort_on_priority_when_disabled = False
        s.schedule_low_priority_values_first = False
        s.max_queued_requests = None
        s.enable_hicache_storage = False
        s.processed_tokens_counter = 0
        self.refuse_next_flush = False
        self.holding_fault = False
        self.window: dict[str, Any] | None = None
        self.fail_next_chunk = False
        s.flush_cache = self._faulty_flush(s.flush_cache)
        s.init_weight_updater()
        if self.FlushWrapper is not None:
            wrapper_kwargs = _kwargs_for(
                self.FlushWrapper.__init__,
                flush_cache=s.flush_cache,
                is_fully_idle=s.is_fully_idle,
                send_output=lambda out, req: None,
                ipc_channels=SimpleNamespace(
                    send_to_tokenizer=SimpleNamespace(send_output=lambda *a, **k: None)
                ),
            )
            s.flush_wrapper = self.FlushWrapper(**wrapper_kwargs)
        s.init_request_dispatcher()
        self.s = s
        self.requests: dict[str, Tracked] = {}
        self._rows = 0
        # Retraction frees a request's KV slots (a memory-pool operation): stubbed, the
        # scheduler's choice of what to retract and where it re-queues it stay real.
        self.scheduler_module.retract_all = self._release_for_retract

    def funnels(self) -> list[str]:
        """The funnels this scheduler's code has (``FUNNELS``), in that order."""
        manager = getattr(self.s, "weight_updater", None)
        out = []
        for funnel, (types, methods) in FUNNELS.items():
            real = all(
                isinstance(getattr(self.io, t, None), type)
                and not getattr(getattr(self.io, t), "_kvfence_placeholder", False)
                for t in types
            )
            if real and all(callable(getattr(manager, m, None)) for m in methods):
                out.append(funnel)
        return out

    def window_mechanism(self) -> str | None:
        """How this scheduler code opens a two-phase update window, from the funnels it
        has: ``"two_phase"`` (a fork's prepare/complete pair), ``"session"`` (upstream's
        ``begin/end_weight_update``, 0.5.20+, with the chunks as tensor calls inside it), or
        ``None`` (no window: a window action is N/A there)."""
        have = self.funnels()
        if "two_phase" in have:
            return "two_phase"
        return "session" if "bucketed" in have else None

    def _faulty_flush(self, flush: Any) -> Any:
        """``Scheduler.flush_cache`` with kvfence's injected refusal (``FaultRefuseFlush``):
        while armed, the next flush attempt answers ``False`` and changes nothing, as the
        real method does when ``is_fully_idle`` is false (KV pinned). Installed before
        ``init_weight_updater`` and the flush wrapper read the method, so the manager's
        post-update flush, ``/flush_cache`` and the flush inside a release of KV memory
        all see it; while ``holding_fault`` the release's flush does not spend it."""

        def flush_cache(*args: Any, **kwargs: Any) -> bool:
            if self.refuse_next_flush and not self.holding_fault:
                self.refuse_next_flush = False
                return False
            return flush(*args, **kwargs)

        return flush_cache

    def _release_for_retract(self, *, reqs, **pools: Any) -> None:
        """What ``schedule_batch.release_req`` does to a retracted request's KV: frees its
        request-to-token row (``req_pool_idx = None``, so ``kv.holds_kv`` is false)."""
        for r in reqs:
            self._set_row(r, None)

    def _set_row(self, req: Any, row: int | None) -> None:
        kv = getattr(req, "kv", None)
        if kv is not None and hasattr(kv, "req_pool_idx"):
            kv.req_pool_idx = row  # 0.5.20+: ReqKvInfo; holds_kv derives from it
        else:
            req.req_pool_idx = row

    def _holds_row(self, req: Any) -> bool:
        kv = getattr(req, "kv", None)
        row = kv.req_pool_idx if kv is not None and hasattr(kv, "req_pool_idx") else None
        return (row if row is not None else getattr(req, "req_pool_idx", None)) is not None

    def _real_req(self, rid: str, tokens: tuple[int, ...]) -> Any:
        """A real ``schedule_batch.Req`` for the prompt, holding a request-to-token row
        as a request that finished its prefill does."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        req = Req(
            **_kwargs_for(
                Req.__init__,
                rid=rid,
                origin_input_text="",
                origin_input_ids=array("q", tokens),
                sampling_params=SamplingParams(),
            )
        )
        self._rows += 1
        self._set_row(req, self._rows)
        return req

    # ----- probes -----------------------------------------------------------------------

    def label(self) -> int | None:
        """The weight-version label: where the scheduler records it (0.5.20+:
        ``Scheduler.record_weight_version_change`` into the runtime context), else where
        the tokenizer manager keeps it (0.5.17: ``_update_weight_version_if_provided`` after
        a successful update, emulated here)."""
        if hasattr(self.Scheduler, "record_weight_version_change") and self.rc is not None:
            return stubs.label_version(self.rc.get_serving().weight_version)
        return self.tm_label

    def match(self, tokens: tuple[int, ...]) -> tuple[int, set[int]]:
        """Matched length and the versions of the matched KV slots, from the real tree."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        tree = self.s.tree_cache
        key = self.radix_cache.RadixKey(token_ids=array("q", tokens))
        m = tree.match_prefix(MatchPrefixParams(key=key))
        n = getattr(m, "device_prefix_len", None)
        indices = getattr(m, "device_indices", None)
        if n is None:
            n = len(indices)
        if n == 0:
            return 0, set()
        if indices is None or len(indices) < n:
            indices = tree.path_device_indices(m.last_device_node)
        return n, self.pool.versions(list(indices[:n]))

    def cache_view(self) -> list[tuple[str, int]]:
        """Every served prefix the tree still matches whole, with the version that
        computed its KV (``GARBAGE`` if the slots were freed, or mixed)."""
        out = []
        for prefix, tokens in self.prefixes.items():
            n, versions = self.match(tokens)
            if n == len(tokens):
                out.append((prefix, versions.pop() if len(versions) == 1 else stubs.GARBAGE))
        return out

    def probe(self) -> dict[str, Any]:
        """Weights (``None`` while torn: a load failed after some tensors landed), label,
        cache listing."""
        weights = None if self.runner.version == stubs.MIXED else self.runner.version
        return {"weights": weights, "label": self.label(), "cache": self.cache_view()}

    # ----- actions ----------------------------------------------------------------------

    def prefill(self, prefix: str) -> tuple[bool, set[int]]:
        """What the event loop's prefill does to the tree: match, compute the rest under
        the runner's weights, insert (``Scheduler.cache_finished_req`` path). Returns
        (hit, versions of the reused KV)."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        tokens = self.prefixes.setdefault(prefix, prompt_tokens(prefix))
        n, versions = self.match(tokens)
        if n == len(tokens):
            return True, versions
        value = self.pool.alloc(len(tokens), self.runner.version)
        key = self.radix_cache.RadixKey(token_ids=array("q", tokens))
        self.s.tree_cache.insert(InsertParams(key=key, value=value))
        return n > 0, versions

    def serve(self, prefix: str) -> dict[str, Any]:
        hit, versions = self.prefill(prefix)
        return {"status": "ok", "hit": hit, "uses": sorted(versions)}

    def start_request(self, rid: str, prefix: str) -> dict[str, Any]:
        _, versions = self.prefill(prefix)
        req = self._real_req(rid, self.prefixes[prefix])
        self.requests[rid] = Tracked(req, prefix, set(versions) | {self.runner.version})
        self.s.running_batch.reqs.append(req)
        return {"status": "ok"}

    def finish_request(self, rid: str) -> dict[str, Any]:
        tracked = self.requests.pop(rid)
        s = self.s
        s.running_batch.reqs = [r for r in s.running_batch.reqs if r is not tracked.req]
        s.waiting_queue = [r for r in s.waiting_queue if r is not tracked.req]
        return {"status": "ok", "hit": False, "uses": sorted(tracked.uses)}

    def _request(self, cls_name: str, **fields: Any) -> Any:
        cls = getattr(self.io, cls_name)
        return cls(**_kwargs_for(cls, **fields))

    def update(
        self, version: int, funnel: str, flush_cache: bool | None, fail_midway: bool = False
    ) -> dict[str, Any]:
        """One update through the funnel's own request types (``FUNNELS``): disk; tensor
        and distributed, inside a ``begin/end_weight_update`` session where this version has
        one (0.5.20+ refuses them outside); bucketed, two tensor calls in one session;
        ipc; a fork's two-phase prepare then complete, and its sparse delta. A funnel this
        scheduler lacks is ``Broken`` (the adapter never sends one). ``fail_midway``: the
        (first) load fails after some tensors landed, and the stub runner answers as
        upstream's does for that funnel (``stubs.FUNNEL_FAILURES``)."""
        self.runner.pending = version
        self.runner.fail_midway = fail_midway
        fields: dict[str, Any] = {"weight_version": stubs.version_label(version)}
        if flush_cache is not None:
            fields["flush_cache"] = flush_cache
        if funnel not in self.funnels():
            raise Broken(f"SGLang {self.version}: this scheduler has no {funnel!r} funnel")
        session = funnel in ("tensor", "bucketed", "distributed") and "bucketed" in self.funnels()
        calls: list[Any]
        if funnel == "disk":
            calls = [self._request("UpdateWeightFromDiskReqInput", model_path="/ckpt", **fields)]
        elif funnel in ("tensor", "bucketed"):
            one = self._request(
                "UpdateWeightsFromTensorReqInput", serialized_named_tensors=[b"x"], **fields
            )
            calls = [one, one] if funnel == "bucketed" else [one]
        elif funnel == "distributed":
            calls = [
                self._request(
                    "UpdateWeightsFromDistributedReqInput",
                    names=["w"],
                    dtypes=["float32"],
                    shapes=[[1]],
                    group_name="kvfence",
                    **fields,
                )
            ]
        elif funnel == "ipc":
            calls = [self._request("UpdateWeightsFromIPCReqInput", zmq_handles={}, **fields)]
        elif funnel == "two_phase":
            calls = [
                self._request("PrepareWeightsUpdateReqInput", group_name="kvfence", **fields),
                self._request("CompleteWeightsUpdateReqInput", group_name="kvfence", **fields),
            ]
        else:  # sparse_delta
            calls = [self._request("UpdateWeightsFromSparseDeltaReqInput", **fields)]
        outs = []
        if session:
            self._dispatch(self._request("BeginWeightUpdateReqInput"))
        try:
            for k, call in enumerate(calls):
                if funnel == "two_phase" and k == 1 and self.runner.armed is not None:
                    # the trainer's transfer, between prepare and complete: every chunk
                    # lands where the prepare pointed the receivers
                    self.runner.armed.write(version, final=True, fail=False)
                outs.append(self._dispatch(call))
                if getattr(outs[-1], "success", None) is not True:
                    break  # a failed prepare is not followed by its complete
        finally:
            if session and not self.stopped:
                self._dispatch(self._request("EndWeightUpdateReqInput"))
        success = all(getattr(o, "success", None) is True for o in outs)
        message = "; ".join(str(getattr(o, "message", "")) for o in outs)
        if success:
            self.tm_label = version
        return {"status": "ok" if success else "rejected", "detail": message}

    # ----- a two-phase update window ----------------------------------------------------

    def begin_window(self, version: int, funnel: str) -> dict[str, Any]:
        """``BeginWeightUpdate``: through the window this code has (``window_mechanism``):
        a fork's ``PrepareWeightsUpdateReqInput`` (with ``funnel="two_phase"``: the fork's
        prepare arms the receivers, where the trainer's chunks will land), or upstream's
        ``BeginWeightUpdateReqInput`` (every other funnel: SGLang's session is the window
        whatever transport fills it; the chunks go as tensor calls, as
        ``weight_sync/utils.update_weights`` documents). Nothing lands yet."""
        have = self.funnels()
        mechanism = "two_phase" if funnel == "two_phase" else "session"
        if {"two_phase": "two_phase", "session": "bucketed"}[mechanism] not in have:
            raise Broken(f"SGLang {self.version}: no two-phase window through {funnel!r}")
        self.runner.pending = version
        self.runner.armed = None
        if mechanism == "two_phase":
            label = stubs.version_label(version)
            req = self._request(
                "PrepareWeightsUpdateReqInput", group_name="kvfence", weight_version=label
            )
        else:
            req = self._request("BeginWeightUpdateReqInput")
        out = self._dispatch(req)
        success = getattr(out, "success", None) is True
        if success:
            self.window = {"version": version, "mechanism": mechanism}
        return {"status": "ok" if success else "rejected", "detail": str(out.message)}

    def _window(self) -> dict[str, Any]:
        if self.window is None:
            raise Broken(f"SGLang {self.version}: a window action with no window open")
        return self.window

    def chunk(self) -> dict[str, Any]:
        """``UpdateWeightChunk``: one non-final chunk. Two-phase: the trainer writes it into
        the receivers the fork's prepare armed (live parameters or a staging buffer: the
        fork's code chose). Session: ``UpdateWeightsFromTensorReqInput`` with a non-final
        chunk, ``flush_cache=False`` and no ``weight_version`` (a trainer labels and
        flushes with the last chunk), through upstream's manager. ``FaultChunkFails``
        armed: this chunk fails after some tensors landed."""
        w = self._window()
        fail, self.fail_next_chunk = self.fail_next_chunk, False
        if w["mechanism"] == "two_phase":
            if self.runner.armed is None:
                return {"status": "rejected", "detail": "no receivers armed"}
            success, message = self.runner.armed.write(w["version"], final=False, fail=fail)
            return {"status": "ok" if success else "rejected", "detail": message}
        self.runner.fail_midway = fail
        req = self._request(
            "UpdateWeightsFromTensorReqInput",
            serialized_named_tensors=[stubs.CHUNK_TENSOR.encode()],
            flush_cache=False,
        )
        out = self._dispatch(req)
        success = getattr(out, "success", None) is True
        return {"status": "ok" if success else "rejected", "detail": str(out.message)}

    def finish_window(self, flush_cache: bool | None, back_to: int | None = None) -> dict[str, Any]:
        """``FinishWeightUpdate``: the last chunk lands, then the close that publishes:
        the fork's ``CompleteWeightsUpdateReqInput`` or, in a session, the final tensor call
        (``weight_version``, ``flush_cache`` as asked) and ``EndWeightUpdateReqInput``.
        ``back_to``: an abort (neither SGLang nor the seed fork has one): the trainer
        closes the window with the old version's weights, ``flush_cache=False`` (the old
        KV is still good; KV served under torn weights is the engine's to drop, WIN-002)."""
        w = self._window()
        version = w["version"] if back_to is None else back_to
        fields: dict[str, Any] = {"weight_version": stubs.version_label(version)}
        if flush_cache is not None:
            fields["flush_cache"] = flush_cache
        self.runner.pending = version
        outs = []
        try:
            if w["mechanism"] == "two_phase":
                if back_to is not None:  # re-arm, as a retry of the transfer would
                    outs.append(
                        self._dispatch(
                            self._request(
                                "PrepareWeightsUpdateReqInput", group_name="kvfence", **fields
                            )
                        )
                    )
                if self.runner.armed is not None:
                    self.runner.armed.write(version, final=True, fail=False)
                outs.append(
                    self._dispatch(
                        self._request(
                            "CompleteWeightsUpdateReqInput", group_name="kvfence", **fields
                        )
                    )
                )
            else:
                outs.append(
                    self._dispatch(
                        self._request(
                            "UpdateWeightsFromTensorReqInput",
                            serialized_named_tensors=[b"x"],
                            **fields,
                        )
                    )
                )
                outs.append(self._dispatch(self._request("EndWeightUpdateReqInput")))
        finally:
            self.window = None
        success = all(getattr(o, "success", None) is True for o in outs)
        if success:
            self.tm_label = version
        message = "; ".join(str(getattr(o, "message", "")) for o in outs)
        return {"status": "ok" if success else "rejected", "detail": message}

    def abort_window(self) -> dict[str, Any]:
        """``AbortWeightUpdate``: closed with the old version's weights (``finish_window``
        with ``back_to``): the last version loaded whole."""
        return self.finish_window(False, back_to=self.whole)

    def _dispatch(self, req: Any) -> Any:
        """Through the scheduler's real request dispatcher; a request type it does not
        route (a fork's own, when only its weight updater is overlaid) goes to the
        manager method ``FUNNELS`` names for it, as the fork's dispatcher would."""
        routes = getattr(self.s._request_dispatcher, "_mapping", None)
        if routes is None or type(req) in routes:
            return self.s._request_dispatcher(req)
        for types, methods in FUNNELS.values():
            if type(req).__name__ in types:
                method = methods[types.index(type(req).__name__)]
                return getattr(self.s.weight_updater, method)(req)
        return self.s._request_dispatcher(req)

    def flush(self) -> dict[str, Any]:
        out = self._dispatch(self._request("FlushCacheReqInput"))
        success = getattr(out, "success", None)
        status = "ok" if success is True else "rejected"
        return {"status": status, "flushed": success, "detail": getattr(out, "message", "")}

    def pause(self, mode: str) -> dict[str, Any]:
        if mode == "abort":
            # SGLang's tokenizer manager: abort every request, hold new ones; the
            # scheduler is not paused (tokenizer_manager.py pause_generation).
            aborted = sorted(self.requests)
            s = self.s
            gone = {id(t.req) for t in self.requests.values()}
            s.running_batch.reqs = [r for r in s.running_batch.reqs if id(r) not in gone]
            s.waiting_queue = [r for r in s.waiting_queue if id(r) not in gone]
            self.requests.clear()
            self.tm_paused = True
            return {"status": "ok", "aborted": aborted}
        self._dispatch(self._request("PauseGenerationReqInput", mode=mode))
        self.tm_paused = True
        return {"status": "ok", "aborted": []}

    def resume(self) -> dict[str, Any]:
        self._dispatch(self._request("ContinueGenerationReqInput", torch_empty_cache=False))
        self.tm_paused = False
        # The event loop's next rounds: retracted requests are scheduled again and
        # recompute their prefix against the tree as it is now.
        s = self.s
        for tracked in self.requests.values():
            req = tracked.req
            if any(r is req for r in s.waiting_queue) and not self._holds_row(req):
                _, versions = self.prefill(tracked.prefix)
                tracked.uses = set(versions) | {self.runner.version}
                self._rows += 1
                self._set_row(req, self._rows)
                s.waiting_queue = [r for r in s.waiting_queue if r is not req]
                s.running_batch.reqs.append(req)
        return {"status": "ok"}

    def sleep(self, tags: list[str], spend_refusal: bool = True) -> dict[str, Any]:
        """``ReleaseMemoryOccupationReqInput(tags=...)``: the tags as given (``kv_cache``,
        ``weights``), through the real manager (``release_memory_occupation``: it asserts
        idleness, pauses the memory saver, and for ``kv_cache`` flushes; 0.5.17-0.5.23
        ignore that flush's result). An injected flush refusal is spent on that flush
        (``spend_refusal``, the spec's Sleep allows either), or held across it."""
        self.holding_fault = not spend_refusal
        try:
            self._dispatch(self._request("ReleaseMemoryOccupationReqInput", tags=list(tags)))
        finally:
            self.holding_fault = False
        return {"status": "ok"}

    def wake_up(self, tags: list[str]) -> dict[str, Any]:
        """``ResumeMemoryOccupationReqInput(tags=...)``. SGLang removes each tag from its
        offload set (``offload_tags.remove``): a tag that was not released raises
        ``KeyError`` inside the handler, which is SGLang's own failure (the scheduler
        exits), not the harness's."""
        try:
            self._dispatch(self._request("ResumeMemoryOccupationReqInput", tags=list(tags)))
        except KeyError as e:
            if "weight_updater.py" not in _where(e):
                raise
            raise SglangRaised(f"KeyError: {e}{_where(e)}") from e
        return {"status": "ok"}

    def restart(self) -> dict[str, Any]:
        """A new process from the last completely loaded checkpoint: new ServerArgs whose
        launch ``weight_version`` names it, a new scheduler, an empty tree."""
        weights = self.whole  # the last version loaded whole (torn weights are not one)
        label = None if weights == 0 else stubs.version_label(weights)
        try:
            self.server_args = self._server_args(weight_version=label)
            self._publish(self.server_args)
        except HARNESS_ERRORS as e:
            raise Broken(self._say(e, "restart")) from e
        self.build(weights)
        return {"status": "ok"}

    def server_info(self) -> dict[str, Any]:
        """The real ``build_server_info`` body (``utils/common.py``, 0.5.20+; the
        ``server_args`` dict before), as JSON would carry it."""
        try:
            from sglang.srt.utils.common import build_server_info
        except ImportError:
            info = dict(vars(self.server_args))
        else:
            info = build_server_info(self.server_args, {})
        return json.loads(json.dumps(info, default=str))

    def apply(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run one action; the answer carries a probe of the endpoint afterwards."""
        if self.stopped and op not in ("restart", "reset"):
            return {"status": "stopped", "detail": self.stopped}
        ok = {"status": "ok"}
        handlers = {
            "serve": lambda: self.serve(args["prefix"]),
            "start": lambda: self.start_request(args["rid"], args["prefix"]),
            "finish": lambda: self.finish_request(args["rid"]),
            "update": lambda: self.update(
                args["version"], args["funnel"], args["flush_cache"], args.get("fail_midway", False)
            ),
            "fault_refuse_flush": lambda: (setattr(self, "refuse_next_flush", True), ok)[1],
            "fault_chunk_fails": lambda: (setattr(self, "fail_next_chunk", True), ok)[1],
            "begin_window": lambda: self.begin_window(args["version"], args["funnel"]),
            "chunk": self.chunk,
            "finish_window": lambda: self.finish_window(args["flush_cache"]),
            "abort_window": self.abort_window,
            "flush": self.flush,
            "pause": lambda: self.pause(args["mode"]),
            "resume": self.resume,
            "sleep": lambda: self.sleep(args["tags"], args.get("spend_refusal", True)),
            "wake_up": lambda: self.wake_up(args["tags"]),
            "restart": self.restart,
            "reset": lambda: (self.restart_fresh(), {"status": "ok"})[1],
        }
        try:
            out = handlers[op]()
        except Broken:
            raise
        except HARNESS_ERRORS as e:
            raise Broken(self._say(e, op)) from e
        except Exception as e:
            # What SGLang's scheduler process does with an exception out of a handler:
            # run_scheduler_process logs it and the whole server exits.
            self.stopped = f"{type(e).__name__}: {e}{_where(e)}"
            return {"status": "stopped", "detail": self.stopped}
        finally:
            if self.runner.version != stubs.MIXED:
                self.whole = self.runner.version
        out["view"] = self.probe()
        return out

    def restart_fresh(self) -> None:
        """Back to version 0, the launch label, an empty tree (a new example)."""
        if self.runner.version != 0 or self.label() != 0:
            self.server_args = self._server_args(weight_version=None)
            self._publish(self.server_args)
        self.prefixes = {}
        self.build(0)


def apply_shims() -> None:
    """The host's compatibility shims, each about the shared CPU environment and none about
    SGLang's logic: an empty ``torchvision`` (:func:`stubs.install_torchvision_stub`),
    transformers' config registry tolerating an older SGLang's own registration
    (:func:`stubs.tolerate_config_reregistration`; 0.5.17 registers ``qwen3_asr``), and an
    offline Hugging Face hub. Applied before any SGLang module is imported, upstream's or an
    overlay's (an overlay imports its package's parents as it loads). Idempotent."""
    stubs.install_torchvision_stub()
    stubs.tolerate_config_reregistration()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")


def _dist_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def overlay_modules(overlay: str) -> list[tuple[str, str]]:
    """``(file, module name)`` for every ``*.py`` under ``overlay``, in the order
    :func:`install_overlay` loads them: a path ending in ``sglang/...`` (or relative to the
    ``sglang`` package) names the module it replaces. ``Broken`` if there is no file."""
    files = []
    for root, _, names in os.walk(overlay):
        for name in sorted(names):
            if name.endswith(".py"):
                files.append(os.path.join(root, name))
    if not files:
        raise Broken(f"overlay {overlay!r} holds no .py file")
    modules = []
    for path in files:
        rel = os.path.relpath(path, overlay).replace(os.sep, "/")
        if "sglang/" in rel and not rel.startswith("sglang/"):
            rel = "sglang/" + rel.split("sglang/", 1)[1]
        if not rel.startswith("sglang/"):
            rel = "sglang/" + rel
        modname = rel[:-3].replace("/", ".")
        if modname.endswith(".__init__"):
            modname = modname[: -len(".__init__")]
        modules.append((path, modname))
    return modules


def install_overlay(overlay: str) -> list[str]:
    """Serve SGLang modules from a fork's files: every ``*.py`` under ``overlay``
    (:func:`overlay_modules`) replaces the module of that name, before anything imports
    it. The fork's files run unmodified; io_struct names a fork adds beyond the host
    version are added as placeholders that raise if used (they are only needed by
    fork-only RPCs kvfence does not drive).

    Returns the module names replaced. ``Broken`` if a file cannot be loaded."""
    import importlib.util

    replaced = []
    for path, modname in overlay_modules(overlay):
        rel = os.path.relpath(path, overlay).replace(os.sep, "/")
        _add_fork_io_names(path)
        parent, _, child = modname.rpartition(".")
        importlib.import_module(parent)
        spec = importlib.util.spec_from_file_location(modname, path)
        if spec is None or spec.loader is None:
            raise Broken(f"overlay file {rel} cannot be loaded as {modname}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            del sys.modules[modname]
            raise Broken(f"overlay {rel} as {modname}: {type(e).__name__}: {e}{_where(e)}") from e
        setattr(sys.modules[parent], child, module)
        replaced.append(modname)
    return replaced


def _add_fork_io_names(path: str) -> None:
    """Placeholders for ``from sglang.srt.managers.io_struct import X`` names the host
    version lacks (a fork's own request types)."""
    import re

    with open(path, encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"from sglang\.srt\.managers\.io_struct import \(([^)]*)\)", text)
    if not block:
        return
    from sglang.srt.managers import io_struct

    for name in re.findall(r"\b([A-Z]\w+)\b", block.group(1)):
        if not hasattr(io_struct, name):

            def __init__(self, *a: Any, _name: str = name, **k: Any) -> None:
                raise NotImplementedError(f"{_name}: a fork-only io_struct type (placeholder)")

            body = {"__init__": __init__, "_kvfence_placeholder": True}
            setattr(io_struct, name, type(name, (), body))


def _enter(spec: dict[str, Any]) -> None:
    """A host's or zygote's first step: its output to ``spec["log"]`` (held open for the
    process's life), ``spec["sglang_path"]`` first on ``sys.path``."""
    log = open(spec["log"], "a", buffering=1)  # noqa: SIM115 (held for the process's life)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.path.insert(0, spec["sglang_path"])


def main(conn: Any, spec: dict[str, Any]) -> None:
    """The host process: set up, then answer ``(op, args)`` messages on ``conn`` with
    ``("ok", answer)``, ``("broken", message)`` until ``("close", {})``."""
    _enter(spec)
    workdir = spec.get("workdir") or tempfile.mkdtemp(prefix="kvfence-sglang-")
    try:
        apply_shims()
        if spec.get("overlay"):
            try:
                install_overlay(spec["overlay"])
            except HARNESS_ERRORS as e:
                what = f"overlay {spec['overlay']}: {type(e).__name__}: {e}{_where(e)}"
                raise Broken(what) from e
        if spec.get("ranks", 1) > 1:
            ep = RankedEndpoint(spec["lane"], workdir, spec["ranks"])
        else:
            ep = Endpoint(spec["lane"], workdir)
        started = {
            "version": ep.version,
            "tree": type(ep.s.tree_cache).__name__,
            "funnels": ep.funnels(),
            "window": ep.window_mechanism(),
        }
        conn.send(("ok", {**started, "optimize": sys.flags.optimize}))
    except Broken as e:
        conn.send(("broken", str(e)))
        return
    except BaseException as e:
        conn.send(("broken", f"SGLang host setup: {type(e).__name__}: {e}{_where(e)}"))
        return
    while True:
        try:
            op, args = conn.recv()
        except EOFError:
            return
        if op == "close":
            conn.send(("ok", {}))
            return
        try:
            if op == "server_info":
                conn.send(("ok", ep.server_info()))
            else:
                conn.send(("ok", ep.apply(op, args)))
        except Broken as e:
            conn.send(("broken", str(e)))
        except BaseException as e:
            conn.send(("broken", f"SGLang {ep.version}: {op}: {type(e).__name__}: {e}{_where(e)}"))


PRELOAD = ("sglang.srt.managers.schedule_batch",)
"""What a zygote (:func:`zygote`) imports before it forks hosts: SGLang's batch
structures, which pull in torch, transformers and the model layers, about nine tenths of
a host's start (0.5.23 on CPU: ~6 of ~7 CPU-s). None of the scheduler's own modules, so
that an overlay replacing one is still loaded before anything imports it."""


def zygote(conn: Any, spec: dict[str, Any]) -> None:
    """A process that imports SGLang's heavy modules once (:data:`PRELOAD`, after the
    shims, from ``spec["sglang_path"]``) and forks hosts from that state: each host is a
    fork running :func:`main`, so a host starts in about a second instead of importing
    SGLang again. Answers ``("ok", {"modules": [...]})`` once loaded (the ``sglang``
    modules it holds: a host whose overlay replaces one of them cannot be forked from
    here) or ``("broken", message)``; then, for each ``(target, child_conn, child_spec)``,
    forks a child in ``child_spec["cwd"]`` and answers ``("ok", pid)``, until its own
    connection closes. The child runs :func:`main` on ``child_conn`` (target ``"main"``)
    or one of :data:`FORKED_CALLS` on ``child_spec``, sending ``("ok", result)`` or
    ``("broken", message)`` there. Children are reaped by the system (``SIGCHLD``
    ignored); a host ends when its connection closes, as a spawned one does."""
    import importlib
    import signal

    _enter(spec)
    try:
        apply_shims()
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException as e:
        conn.send(("broken", f"SGLang preload: {type(e).__name__}: {e}{_where(e)}"))
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    loaded = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
    conn.send(("ok", {"modules": loaded}))
    while True:
        try:
            target, child_conn, child_spec = conn.recv()
        except EOFError:
            return
        pid = os.fork()
        if pid == 0:  # the child, in the caller's working folder
            conn.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 1
            try:
                os.chdir(child_spec["cwd"])
                if target == "main":
                    main(child_conn, child_spec)
                else:
                    answer(child_conn, FORKED_CALLS[target], child_spec)
                code = 0
            finally:
                os._exit(code)
        child_conn.close()
        conn.send(("ok", pid))


def answer(conn: Any, function: Any, spec: dict[str, Any]) -> None:
    """Send ``("ok", function(spec))``, or ``("broken", message)`` if it raises."""
    try:
        result = function(spec)
    except BaseException as e:
        conn.send(("broken", f"{function.__name__}: {type(e).__name__}: {e}{_where(e)}"))
        return
    conn.send(("ok", result))


def dp_flush(spec: dict[str, Any]) -> dict[str, Any]:
    """SGLang's data-parallel flush fan-in, run for real over two real schedulers.

    Two endpoints (standard lane) stand for DP ranks 0 and 1 in this process. The real
    ``FanOutCommunicator`` (``managers/communicator.py``) with ``fan_out=2`` sends the real
    ``FlushCacheReqInput`` to both schedulers' request dispatchers and collects both
    replies, and the real ``TokenizerControlMixin.flush_cache`` (``managers/
    tokenizer_control_mixin.py``) answers the caller with what it makes of them. Only the
    ZMQ hop is replaced: each reply is handed to ``handle_recv`` on the event loop, as the
    tokenizer manager's receive loop does. Before the flush both ranks served ``P`` and a
    request runs on rank 1 (``spec["busy_rank"]``), so rank 1 refuses.

    Returns ``{"merged": success the caller gets, "ranks": [each rank's success],
    "cached": [whether each rank still matches P]}``."""
    import asyncio

    sys.path.insert(0, spec["sglang_path"])
    apply_shims()
    ranks = [Endpoint("standard", os.path.join(spec["workdir"], f"rank{k}")) for k in range(2)]
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin

    for ep in ranks:
        ep.serve("P")
    ranks[spec["busy_rank"]].start_request("r1", "P")
    replies: list[Any] = []

    async def flush() -> Any:
        loop = asyncio.get_running_loop()

        def send(req: Any) -> None:
            for ep in ranks:
                out = ep._dispatch(req)
                replies.append(out)
                loop.call_soon(comm.handle_recv, out)

        comm = FanOutCommunicator(send, 2)
        manager = SimpleNamespace(
            auto_create_handle_loop=lambda: None, flush_cache_communicator=comm, mm_processor=None
        )
        return await TokenizerControlMixin.flush_cache(manager)

    merged = asyncio.run(flush())
    cached = [ep.match(ep.prefixes["P"])[0] == PROMPT_TOKENS for ep in ranks]
    return {
        "merged": bool(merged.success),
        "ranks": [bool(r.success) for r in replies],
        "cached": cached,
    }


def dp_update(spec: dict[str, Any]) -> dict[str, Any]:
    """SGLang's data-parallel fan-in of an IPC weight update, run for real over two real
    schedulers (PF-26: sgl-project/sglang PR #39534, an IPC update answered with the first
    rank's reply).

    As :func:`dp_flush`: two endpoints (standard lane) stand for DP ranks 0 and 1 in this
    process, the real ``FanOutCommunicator`` with ``fan_out=2`` sends the real
    ``UpdateWeightsFromIPCReqInput`` to both schedulers' dispatchers, and the real
    ``TokenizerControlMixin.update_weights_from_ipc`` answers with what it makes of the two
    replies. The tokenizer manager reads the DP size from the runtime context
    (``get_parallel().dp_size``); this process runs no DP launch, so that one read is
    answered with 2 (``spec["dp_size"]``). Rank ``spec["failing_rank"]`` (or none) fails
    its load after some tensors landed.

    Returns ``{"merged": [success, message] the caller gets, "sent": how many ranks got
    the request, "weights": [each rank's runner version, MIXED while torn]}``."""
    import asyncio
    import contextlib

    sys.path.insert(0, spec["sglang_path"])
    apply_shims()
    ranks = [Endpoint("standard", os.path.join(spec["workdir"], f"rank{k}")) for k in range(2)]
    from sglang.srt.managers import tokenizer_control_mixin as mixin
    from sglang.srt.managers.communicator import FanOutCommunicator

    mixin.get_parallel = lambda: SimpleNamespace(dp_size=spec.get("dp_size", 2))
    sent: list[int] = []

    async def update() -> Any:
        loop = asyncio.get_running_loop()

        def send(req: Any) -> None:
            for k, ep in enumerate(ranks):
                ep.runner.pending = 1
                ep.runner.fail_midway = k == spec.get("failing_rank")
                sent.append(k)
                loop.call_soon(comm.handle_recv, ep._dispatch(req))

        comm = FanOutCommunicator(send, 2)

        @contextlib.asynccontextmanager
        async def lock() -> Any:
            yield

        manager = SimpleNamespace(
            auto_create_handle_loop=lambda: None,
            update_weights_from_ipc_communicator=comm,
            is_pause_cond=asyncio.Condition(),
            is_pause=False,
            model_update_lock=SimpleNamespace(writer_lock=lock()),
            mm_processor=None,
            _update_weight_version_if_provided=lambda version: None,
        )
        req = ranks[0]._request(
            "UpdateWeightsFromIPCReqInput", zmq_handles={}, weight_version="v1", flush_cache=True
        )
        return await mixin.TokenizerControlMixin.update_weights_from_ipc(manager, req)

    success, message = asyncio.run(update())
    weights = [ep.runner.version for ep in ranks]
    return {"merged": [bool(success), str(message)], "sent": len(sent), "weights": weights}


class RankedEndpoint:
    """One endpoint of ``n`` data-parallel ranks, each a real scheduler (:class:`Endpoint`)
    in this process, behind SGLang's own fan-in: ``/flush_cache`` is the real
    ``TokenizerControlMixin.flush_cache`` over the real ``FanOutCommunicator``, and a disk
    update the real ``TokenizerManager.update_weights_from_disk`` (its
    ``_wait_for_model_update_from_disk`` and ``_handle_update_weights_from_disk_req_
    output``, which merge the ranks' replies). Only the ZMQ hop is replaced: each rank's
    reply is handed to the receive handler on the event loop. Requests go to the rank they
    name (``GenerateReqInput.data_parallel_rank``); pause and continue go to every rank, as
    the tokenizer manager sends them. The label is the tokenizer manager's
    (``_update_weight_version_if_provided``, after a merged success).

    The tensor, distributed and IPC paths refuse DP replicas (``assert dp_size == 1`` in
    the tokenizer manager): on a ranked endpoint only ``disk`` is a funnel."""

    def __init__(self, lane: str, workdir: str, n: int) -> None:
        self.ranks = [Endpoint(lane, os.path.join(workdir, f"rank{k}")) for k in range(n)]
        self.version = self.ranks[0].version
        self.s = self.ranks[0].s
        self.reset()

    def reset(self) -> None:
        for ep in self.ranks:
            ep.restart_fresh()
        self.label = 0
        self.placed: dict[str, int] = {}
        self.failing: set[int] = set()

    def funnels(self) -> list[str]:
        return ["disk"] if "disk" in self.ranks[0].funnels() else []

    def window_mechanism(self) -> None:
        return None

    def server_info(self) -> dict[str, Any]:
        return self.ranks[0].server_info()

    def probe(self) -> dict[str, Any]:
        views = [ep.probe() for ep in self.ranks]
        weights = {v["weights"] for v in views}
        cache = sorted({tuple(e) for v in views for e in v["cache"]})
        whole = weights.pop() if len(weights) == 1 else None
        return {"weights": whole, "label": self.label, "cache": [list(e) for e in cache]}

    def _fan_in(self, call: Any) -> Any:
        import asyncio

        return asyncio.run(call())

    def flush(self) -> dict[str, Any]:
        from sglang.srt.managers.communicator import FanOutCommunicator
        from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin

        async def flush() -> Any:
            loop = asyncio.get_running_loop()

            def send(req: Any) -> None:
                for ep in self.ranks:
                    loop.call_soon(comm.handle_recv, ep._dispatch(req))

            comm = FanOutCommunicator(send, len(self.ranks))
            manager = SimpleNamespace(
                auto_create_handle_loop=lambda: None,
                flush_cache_communicator=comm,
                mm_processor=None,
            )
            return await TokenizerControlMixin.flush_cache(manager)

        import asyncio

        out = self._fan_in(flush)
        success = getattr(out, "success", None)
        return {
            "status": "ok" if success is True else "rejected",
            "flushed": success,
            "detail": str(getattr(out, "message", "")),
        }

    def update(self, version: int, flush_cache: bool | None, fail_all: bool) -> dict[str, Any]:
        import asyncio
        import contextlib
        import types

        from sglang.srt.managers.tokenizer_manager import TokenizerManager

        fields: dict[str, Any] = {"weight_version": stubs.version_label(version)}
        if flush_cache is not None:
            fields["flush_cache"] = flush_cache
        for k, ep in enumerate(self.ranks):
            ep.runner.pending = version
            ep.runner.fail_midway = fail_all or k in self.failing
        self.failing.clear()
        req = self.ranks[0]._request(
            "UpdateWeightFromDiskReqInput", model_path="/ckpt", load_format="auto", **fields
        )
        labelled: list[str] = []

        async def update() -> Any:
            loop = asyncio.get_running_loop()

            @contextlib.asynccontextmanager
            async def lock() -> Any:
                yield

            manager = SimpleNamespace(
                auto_create_handle_loop=lambda: None,
                abort_request=lambda **k: None,
                is_pause_cond=asyncio.Condition(),
                is_pause=False,
                model_update_lock=SimpleNamespace(writer_lock=lock()),
                elastic_worker_count=len(self.ranks),
                mm_processor=None,
                _update_model_path_info=lambda *a: None,
                _update_weight_version_if_provided=labelled.append,
            )
            manager._handle_update_weights_from_disk_req_output = types.MethodType(
                TokenizerManager._handle_update_weights_from_disk_req_output, manager
            )
            manager._wait_for_model_update_from_disk = types.MethodType(
                TokenizerManager._wait_for_model_update_from_disk, manager
            )

            def dispatch(obj: Any) -> None:
                for ep in self.ranks:
                    reply = ep._dispatch(obj)
                    loop.call_soon(manager._handle_update_weights_from_disk_req_output, reply)

            manager._dispatch_to_scheduler = dispatch
            return await TokenizerManager.update_weights_from_disk(manager, req)

        success, message, _ = self._fan_in(update)
        if labelled:
            self.label = stubs.label_version(labelled[-1])
        return {"status": "ok" if success else "rejected", "detail": str(message)}

    def apply(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        rank = args.get("rank", 0)

        def start() -> dict[str, Any]:
            self.placed[args["rid"]] = rank
            return self.ranks[rank].start_request(args["rid"], args["prefix"])

        def fault_rank() -> dict[str, Any]:
            self.failing.add(args["rank"])
            return {"status": "ok"}

        handlers = {
            "serve": lambda: self.ranks[rank].serve(args["prefix"]),
            "start": start,
            "finish": lambda: self.ranks[self.placed.pop(args["rid"])].finish_request(args["rid"]),
            "update": lambda: self.update(
                args["version"], args["flush_cache"], args.get("fail_midway", False)
            ),
            "fault_rank_update_fails": fault_rank,
            "flush": self.flush,
            "pause": lambda: [ep.pause(args["mode"]) for ep in self.ranks][-1],
            "resume": lambda: [ep.resume() for ep in self.ranks][-1],
            "reset": lambda: (self.reset(), {"status": "ok"})[1],
        }
        if op not in handlers:
            raise Broken(f"SGLang {self.version}: {op} is not driven on a ranked endpoint")
        try:
            out = handlers[op]()
        except Broken:
            raise
        except HARNESS_ERRORS as e:
            raise Broken(self.ranks[0]._say(e, op)) from e
        out["view"] = self.probe()
        return out


FORKED_CALLS = {"dp_flush": dp_flush, "dp_update": dp_update}
"""The whole-run functions a zygote's child may run in place of a host
(:func:`adapters.sglang_engine.run_forked`)."""
