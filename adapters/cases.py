"""The track record: public fault reports as minimal traces in the model's vocabulary.

Each ``Case`` is one report from ``shared/cases/public-faults.md`` (PF-01..PF-18) or
``shared/cases/more-faults.md`` (PF-19..PF-24, PF-22 in two variants; PF-23 is a client
program's call sequence) or ``shared/cases/deployments-and-failures.md`` (PF-25, PF-26 in
two variants: data-parallel ranks; PF-27, PF-28, PF-32: failed updates and KV of no
version; PF-31: a KV store shared by several endpoints; PF-29, PF-30: prefill/decode
deployments, PF-30 in two variants: a live transfer, a request running on a single engine):
the endpoint configs and client policy, the smallest action list
that shows the fault, the mutant that makes the general mistake, and the rule a checker
must name. The regression
tests replay every case against the reference (it must pass) and against its mutant (it
must fail with that rule); ``tests/regressions/`` holds the recorded counterexamples.
"""

from __future__ import annotations

from attrs import frozen

from ..model.actions import (
    Action,
    ContinueGeneration,
    EvictPrefix,
    FaultRankUpdateFails,
    FaultUpdateFailsMidway,
    FinishRequest,
    FlushCache,
    LoadLora,
    PauseGeneration,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeights,
    WakeUp,
)
from ..model.rules import RuleId
from ..model.state import Config, Policy, server_info
from ..model.vocabulary import (
    ALL_MEMORY,
    CacheMode,
    Funnel,
    Lane,
    MemoryTag,
    PauseMode,
    Role,
    Tier,
)


@frozen
class Case:
    """``id`` (PF-NN), ``title``, ``source`` (public report), ``mutant`` (catalog name),
    ``rule`` (what the checker must name), ``configs``, ``policy``, ``actions``."""

    id: str
    title: str
    source: str
    mutant: str
    rule: str
    configs: tuple[Config, ...]
    policy: Policy
    actions: tuple[Action, ...]


STANDARD = Config()
EXACT = Config(lane=Lane.EXACT)
AUTO = Policy()
OPT_OUT = Policy(mode=CacheMode.NONE)
T = Funnel.TENSOR

CASES: tuple[Case, ...] = (
    Case(
        "PF-01",
        "Missing flush after a tensor update",
        "huggingface/trl #3024",
        "never-flush",
        RuleId.INV_001,
        (STANDARD,),
        AUTO,
        (ServeRequest(0, "P"), SyncWeights(1, T), ServeRequest(0, "P")),
    ),
    Case(
        "PF-02",
        "Prefix index survives sleep while KV memory does not",
        "vllm-project/vllm #17103",
        "sleep-keeps-index",
        RuleId.ENG_006,
        (STANDARD,),
        AUTO,
        (ServeRequest(0, "P"), Sleep(0), WakeUp(0), ServeRequest(0, "P")),
    ),
    Case(
        "PF-03",
        "Flush refused, reported as success",
        "vllm-project/vllm PR #12284 and #28827",
        "flush-refusal-reported-as-success",
        RuleId.FC_003,
        (STANDARD,),
        OPT_OUT,
        (
            StartRequest(0, "r1", "P"),
            UpdateWeights(0, 1, T, False),
            FlushCache(0),
            FinishRequest(0, "r1"),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-04",
        "Flush refused while requests run, assert kills the engine",
        "areal-project/AReaL #140",
        "crashes-after-swap",
        RuleId.FC_001,
        (EXACT,),
        AUTO,
        (StartRequest(0, "r1", "P"), StartRequest(0, "r2", "Q"), UpdateWeights(0, 1, T, True)),
    ),
    Case(
        "PF-05",
        "Retract pause makes the flush impossible",
        "sgl-project/sglang PR #31962",
        "retract-blocks-flush",
        RuleId.LIV_001,
        (EXACT,),
        AUTO,
        (
            StartRequest(0, "r1", "P"),
            PauseGeneration(0, PauseMode.RETRACT),
            FlushCache(0),
            UpdateWeights(0, 1, T, True),
        ),
    ),
    Case(
        "PF-06",
        "In-place pause skips the flush forever",
        "radixark/miles PR #2782",
        "in-place-skips-flush",
        RuleId.CLI_007,
        (STANDARD,),
        Policy(pause_mode=PauseMode.IN_PLACE),
        (
            ServeRequest(0, "P"),
            StartRequest(0, "r1", "P"),
            SyncWeights(1, T),
            FinishRequest(0, "r1"),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-07",
        "Reset after a disk reload forgotten",
        "PrimeIntellect-ai/prime-rl PR #1650",
        "guard-missing-on-disk",
        RuleId.ENG_001,
        (EXACT,),
        OPT_OUT,
        (ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.DISK, None), ServeRequest(0, "P")),
    ),
    Case(
        "PF-08",
        "Update accepted while KV is live, hit counters look normal",
        "InternLM/lmdeploy #4917",
        "update-never-flushes",
        RuleId.ENG_001,
        (EXACT,),
        OPT_OUT,
        (
            ServeRequest(0, "P"),
            ServeRequest(0, "P"),
            UpdateWeights(0, 1, T, None),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-09",
        "Storage tier survives the flush",
        "sgl-project/sglang #26792",
        "flush-forgets-storage",
        RuleId.ENG_003,
        (Config(lane=Lane.EXACT, tiers=frozenset(Tier)),),
        AUTO,
        (
            ServeRequest(0, "P"),
            EvictPrefix(0, "P", Tier.STORAGE),
            UpdateWeights(0, 1, T, True),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-10",
        "Encoder cache not reset with the prefix cache",
        "verl-project/verl #6523",
        "flush-forgets-encoder",
        RuleId.ENG_003,
        (Config(encoder=True),),
        OPT_OUT,
        # Encoder outputs follow every update (ENG-012), and a flush may keep an entry of the
        # weights in force, so the forgotten kind shows where a clear must remove every entry
        # of every kind: a pause that clears the cache (the update after it may skip its own
        # flush).
        (
            ServeRequest(0, "P"),
            PauseGeneration(0, PauseMode.RETRACT, clear_cache=True),
        ),
    ),
    Case(
        "PF-11",
        "Draft model not updated on one funnel",
        "sgl-project/sglang #27718",
        "draft-left-behind-on-distributed",
        RuleId.ENG_004,
        (Config(lane=Lane.EXACT, draft=True),),
        AUTO,
        (UpdateWeights(0, 1, Funnel.DISTRIBUTED, True),),
    ),
    Case(
        "PF-12",
        "Draft KV not restored with target KV from the host tier",
        "sgl-project/sglang PR #17338",
        "load-back-loses-draft-kv",
        RuleId.ENG_008,
        (Config(draft=True, tiers=frozenset({Tier.DEVICE, Tier.HOST})),),
        AUTO,
        (ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST), ServeRequest(0, "P")),
    ),
    Case(
        "PF-13",
        "Same-name LoRA reload reuses stale blocks",
        "vllm-project/vllm #42125",
        "lora-keyed-by-name",
        RuleId.ENG_007,
        (Config(lora=True),),
        AUTO,
        (ServeRequest(0, "P", lora=True), LoadLora(0), ServeRequest(0, "P", lora=True)),
    ),
    Case(
        "PF-14",
        "FP8 KV scales dropped on one funnel",
        "NVIDIA-NeMo/RL #3225",
        "scales-dropped-on-ipc",
        RuleId.ENG_005,
        (Config(fp8_kv=True),),
        AUTO,
        (UpdateWeights(0, 1, Funnel.IPC, True), ServeRequest(0, "Q")),
    ),
    Case(
        "PF-15",
        "Version label not recorded on one funnel",
        "vllm-project/vime PR #45",
        "label-not-recorded-on-ipc",
        RuleId.INV_003,
        (STANDARD,),
        AUTO,
        (UpdateWeights(0, 1, Funnel.IPC, True),),
    ),
    Case(
        "PF-16",
        "Tokens labelled with the version seen after generation",
        "areal-project/AReaL PR #1569",
        "labels-with-final-version",
        RuleId.INV_002,
        (STANDARD,),
        AUTO,
        (
            StartRequest(0, "r1", "P"),
            PauseGeneration(0, PauseMode.RETRACT),
            UpdateWeights(0, 1, T, True),
            ContinueGeneration(0),
            FinishRequest(0, "r1"),
        ),
    ),
    Case(
        "PF-17",
        "Keep-mode pause resumes a request on old KV under new weights",
        "vllm-project/vllm #54443",
        "flushes-around-paused-kv",
        RuleId.FC_005,
        (EXACT,),
        AUTO,
        (
            StartRequest(0, "R", "P"),
            PauseGeneration(0, PauseMode.IN_PLACE),
            UpdateWeights(0, 1, T, None),
            ContinueGeneration(0),
            FinishRequest(0, "R"),
        ),
    ),
    Case(
        "PF-18",
        "A cache hit changes the numbers",
        "sgl-project/sglang #34683",
        "hit-path-numerics-differ",
        RuleId.INV_004,
        (EXACT,),
        AUTO,
        (FlushCache(0), ServeRequest(0, "P"), ServeRequest(0, "P")),
    ),
)

CASES += (
    Case(
        "PF-21",
        "Encoder outputs survive an update when the caller opted out of the prefix flush",
        "vllm-project/vllm #44910",
        "encoder-kept-on-opt-out",
        RuleId.ENG_012,
        (Config(encoder=True),),
        OPT_OUT,
        (ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")),
    ),
    Case(
        "PF-22",
        "The cache reset is a stub that clears nothing (placeholder answer)",
        "vllm-project/vllm-omni #6739",
        "flush-is-a-stub",
        RuleId.FC_003,
        (STANDARD,),
        OPT_OUT,
        (
            ServeRequest(0, "P"),
            UpdateWeights(0, 1, T, False),
            FlushCache(0),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-22",
        "The cache reset is a stub that clears nothing (answers True)",
        "vllm-project/vllm-omni #6739",
        "flush-stub-claims-success",
        RuleId.FC_003,
        (STANDARD,),
        OPT_OUT,
        (
            ServeRequest(0, "P"),
            UpdateWeights(0, 1, T, False),
            FlushCache(0),
            ServeRequest(0, "P"),
        ),
    ),
)

CASES += (
    Case(
        "PF-24",
        "A session pinned to the namespace of older weights",
        "PrimeIntellect-ai/prime-rl PR #2266, #2687",
        "session-pinned-namespace",
        RuleId.INV_001,
        (EXACT,),
        OPT_OUT,
        # g1's first turn under v0; the update (no flush: the engine keys by version); g1's
        # second turn, which the serving layer keys by g1's first salt, v0.
        (ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")),
    ),
)

CASES += (
    Case(
        "PF-19",
        "Update with flush while KV memory is released kills the scheduler",
        "sgl-project/sglang PR #19029; regression PR #40480",
        "crash-on-flush-while-kv-released",
        RuleId.MEM_001,
        (STANDARD,),
        AUTO,
        # The colocated order: release everything, train, resume the weights, update with
        # a flush while the KV is still released, resume the KV, serve P again under v1.
        (
            ServeRequest(0, "P"),
            Sleep(0, ALL_MEMORY),
            WakeUp(0, frozenset({MemoryTag.WEIGHTS})),
            UpdateWeights(0, 1, T, True),
            WakeUp(0, frozenset({MemoryTag.KV_CACHE})),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-20",
        "Derived weight state not rebuilt on one funnel",
        "sgl-project/sglang PR #31937, issue #14158",
        "derived-skipped-on-tensor-funnel",
        RuleId.DER_001,
        (Config(derived=True),),
        AUTO,
        # A prompt never seen before: no KV is reused at all, and still the forward mixes
        # v1 parameters with v0 derived tensors.
        (UpdateWeights(0, 1, T, True), ServeRequest(0, "Q")),
    ),
)

CASES += (
    Case(
        "PF-23",
        "The client resets the prefix cache before the weight update has finished",
        "huggingface/trl PR #6765 (review)",
        "reset-before-finish",
        RuleId.CLI_008,
        (STANDARD,),
        AUTO,
        # A client program: its sync pauses, resets the prefix cache, then
        # updates without a flush and resumes. The right decision in the wrong order; the
        # recorded calls of the sync are the trace's ``within`` steps, judged on replay.
        # The two-phase form (a request admitted between the reset and the finish, its KV
        # computed under mixed weights) is drawn at engine level in tests/test_twophase.py.
        (ServeRequest(0, "P"), SyncWeights(1, T), ServeRequest(0, "P")),
    ),
    # shared/cases/deployments-and-failures.md: judging continues past a failed update
    Case(
        "PF-27",
        "A bucketed update fails midway and the mixed weights keep serving",
        "NVIDIA/TensorRT-LLM PR #16642 (review); sgl-project/sglang-omni PR #784 (review)",
        "bucket-failure-keeps-serving",
        RuleId.FC_004,
        (STANDARD,),
        AUTO,
        (ServeRequest(0, "P"), FaultUpdateFailsMidway(0, 1), ServeRequest(0, "P")),
    ),
    Case(
        "PF-28",
        "An in-place pause leaves the overlapped forward racing the weight write",
        "sgl-project/sglang PR #27886; PR #25319",
        "in-place-pause-races-weight-write",
        RuleId.INV_001,
        (STANDARD,),
        OPT_OUT,
        (
            StartRequest(0, "r1", "P"),
            PauseGeneration(0, PauseMode.IN_PLACE),
            UpdateWeights(0, 1, Funnel.DISK, False),
            ContinueGeneration(0),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-32",
        "The flush raises after the weights moved; the endpoint keeps serving",
        "sgl-project/sglang-omni PR #678",
        "serves-after-raised-flush",
        RuleId.FC_002,
        (STANDARD,),
        AUTO,
        # two prefixes cached: the mutant's post-update flush raises on such a tree
        (
            ServeRequest(0, "P"),
            ServeRequest(0, "Q"),
            UpdateWeights(0, 1, Funnel.DISK, True),
            ServeRequest(0, "P"),
        ),
    ),
)

# shared/cases/deployments-and-failures.md: data-parallel ranks behind one endpoint
RANKS = Config(ranks=2)
CASES += (
    Case(
        "PF-25",
        "A DP flush answered with the first rank's reply",
        "sgl-project/sglang PR #39562; lightseekorg/tokenspeed PR #1608",
        "flush-first-rank-reply",
        RuleId.RNK_001,
        (RANKS,),
        AUTO,
        # r1 holds KV on rank 1, so rank 1 refuses the flush; rank 0 clears and says so
        (StartRequest(0, "r1", "Q", rank=1), FlushCache(0)),
    ),
    Case(
        "PF-26",
        "A DP weight update answered with the first rank's reply",
        "sgl-project/sglang PR #39534 (before the fix)",
        "update-first-rank-reply",
        RuleId.RNK_002,
        (RANKS,),
        AUTO,
        (FaultRankUpdateFails(0, 1), UpdateWeights(0, 1, T, True), ServeRequest(0, "P", rank=1)),
    ),
    Case(
        "PF-26",
        "A DP weight update that failed on one rank; both ranks keep serving, torn",
        "sgl-project/sglang PR #39534 (after the fix)",
        "failed-rank-update-keeps-serving",
        RuleId.RNK_003,
        (RANKS,),
        AUTO,
        (FaultRankUpdateFails(0, 1), UpdateWeights(0, 1, T, True), ServeRequest(0, "P", rank=1)),
    ),
)

# shared/cases/deployments-and-failures.md: a KV store shared by several endpoints
CASES += (
    Case(
        "PF-31",
        "A shared KV store whose keys omit weight lineage and KV format",
        "InternLM/lmdeploy issue #4930 (before PR #4932)",
        "store-keyed-by-tokens",
        RuleId.STO_001,
        (Config(store=True), Config(store=True, kv_format="fp8")),
        AUTO,
        # endpoint 0 stores P's KV at v0, updates and flushes its own tree; the store keeps
        # the entry, and a key of the tokens alone matches it under v1
        (ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.DISK, True), ServeRequest(0, "P")),
    ),
)

# shared/cases/deployments-and-failures.md: prefill/decode deployments (endpoint 0 the
# prefill engine, endpoint 1 the decode engine: adapters/pd.py's PD_CONFIGS)
PD = (
    Config(role=Role.PREFILL),
    Config(role=Role.DECODE, radix=False, info=server_info(radix_cache_enabled=False)),
)
CASES += (
    Case(
        "PF-29",
        "Prefill and decode engines on different weight versions",
        "verl-project/verl PR #7616; sgl-project/sglang PR #18646; sgl-project/rbg issue #22",
        "decode-serves-any-kv-version",
        RuleId.PD_001,
        PD,
        AUTO,
        # a rolling update reaches the decode engine first; the prefill engine computes P's
        # KV under v0 and the decode engine decodes it under v1
        (UpdateWeights(1, 1, Funnel.DISK, True), ServeRequest(1, "P")),
    ),
    Case(
        "PF-30",
        "The router drops the flush timeout and the flush frees KV a live transfer holds",
        "sgl-project/sglang PR #36150, PR #36152",
        "flush-frees-live-transfer",
        RuleId.FC_005,
        PD,
        AUTO,
        # P's KV is in transfer to the decode engine (the request is live) when the flush
        # reaches the prefill engine without its timeout: it must wait or be refused
        (StartRequest(1, "r1", "P"), FlushCache(0)),
    ),
    Case(
        "PF-30",
        "The flush skips its idle check and frees KV a running request holds",
        "sgl-project/sglang PR #36150 (the scheduler's immediate flush path), PR #12107",
        "flush-skips-idle-check",
        RuleId.FC_005,
        (STANDARD,),
        AUTO,
        # the same gate on a single engine: a flush without a timeout while r1 runs
        (StartRequest(0, "r1", "P"), FlushCache(0)),
    ),
)

DEFERRED: dict[str, int] = {"PF-33": 41, "PF-34": 41, "PF-35": 41, "PF-36": 41}
"""Public cases of the shared case files not expressed yet, each with the number of the
tracker issue that will express it: PF-33..PF-36 (shared/cases/shipped-designs.md) are each
to be killed by the harm it causes, which needs the harm-and-mechanism judging of that
issue."""

BY_ID: dict[str, Case] = {}
"""The first case of each ID (PF-22 has two variants, one per mutant: see ``BY_MUTANT``)."""
for _case in CASES:
    BY_ID.setdefault(_case.id, _case)

BY_MUTANT: dict[str, Case] = {c.mutant: c for c in CASES}
"""Every case by the mutant that makes its mistake (one mutant per case)."""
