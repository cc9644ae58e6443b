"""The track record: public fault reports as minimal traces in the model's vocabulary.

Each ``Case`` is one report from ``shared/cases/public-faults.md`` (PF-01..PF-18) or
``shared/cases/more-faults.md`` (PF-19..PF-24, PF-22 in two variants; PF-23 is a client
program's call sequence): the endpoint configs and client policy, the smallest action list
that shows the fault, the mutant that makes the general mistake, and the rule a checker
must name. The regression
tests replay every case against the reference (it must pass) and against its mutant (it
must fail with that rule); ``tests/regressions/`` holds the recorded counterexamples.
"""

from __future__ import annotations

from attrs import frozen

from kvfence.model.actions import (
    Action,
    ContinueGeneration,
    EvictPrefix,
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
from kvfence.model.state import Config, Policy
from kvfence.model.vocabulary import ALL_MEMORY, CacheMode, Funnel, Lane, MemoryTag, PauseMode, Tier


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
        "INV-001",
        (STANDARD,),
        AUTO,
        (ServeRequest(0, "P"), SyncWeights(1, T), ServeRequest(0, "P")),
    ),
    Case(
        "PF-02",
        "Prefix index survives sleep while KV memory does not",
        "vllm-project/vllm #17103",
        "sleep-keeps-index",
        "ENG-006",
        (STANDARD,),
        AUTO,
        (ServeRequest(0, "P"), Sleep(0), WakeUp(0), ServeRequest(0, "P")),
    ),
    Case(
        "PF-03",
        "Flush refused, reported as success",
        "vllm-project/vllm PR #12284 and #28827",
        "flush-refusal-reported-as-success",
        "FC-003",
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
        "FC-001",
        (EXACT,),
        AUTO,
        (StartRequest(0, "r1", "P"), StartRequest(0, "r2", "Q"), UpdateWeights(0, 1, T, True)),
    ),
    Case(
        "PF-05",
        "Retract pause makes the flush impossible",
        "sgl-project/sglang PR #31962",
        "retract-blocks-flush",
        "LIV-001",
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
        "CLI-007",
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
        "ENG-001",
        (EXACT,),
        OPT_OUT,
        (ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.DISK, None), ServeRequest(0, "P")),
    ),
    Case(
        "PF-08",
        "Update accepted while KV is live, hit counters look normal",
        "InternLM/lmdeploy #4917",
        "update-never-flushes",
        "ENG-001",
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
        "ENG-003",
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
        "ENG-003",
        (Config(encoder=True),),
        OPT_OUT,
        # Encoder outputs now follow every update (ENG-012), so the forgotten kind shows on
        # an explicit flush: the flush must remove every entry of every kind.
        (
            ServeRequest(0, "P"),
            FlushCache(0),
            ServeRequest(0, "P"),
        ),
    ),
    Case(
        "PF-11",
        "Draft model not updated on one funnel",
        "sgl-project/sglang #27718",
        "draft-left-behind-on-distributed",
        "ENG-004",
        (Config(lane=Lane.EXACT, draft=True),),
        AUTO,
        (UpdateWeights(0, 1, Funnel.DISTRIBUTED, True),),
    ),
    Case(
        "PF-12",
        "Draft KV not restored with target KV from the host tier",
        "sgl-project/sglang PR #17338",
        "load-back-loses-draft-kv",
        "ENG-008",
        (Config(draft=True, tiers=frozenset({Tier.DEVICE, Tier.HOST})),),
        AUTO,
        (ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST), ServeRequest(0, "P")),
    ),
    Case(
        "PF-13",
        "Same-name LoRA reload reuses stale blocks",
        "vllm-project/vllm #42125",
        "lora-keyed-by-name",
        "ENG-007",
        (Config(lora=True),),
        AUTO,
        (ServeRequest(0, "P", lora=True), LoadLora(0), ServeRequest(0, "P", lora=True)),
    ),
    Case(
        "PF-14",
        "FP8 KV scales dropped on one funnel",
        "NVIDIA-NeMo/RL #3225",
        "scales-dropped-on-ipc",
        "ENG-005",
        (Config(fp8_kv=True),),
        AUTO,
        (UpdateWeights(0, 1, Funnel.IPC, True), ServeRequest(0, "Q")),
    ),
    Case(
        "PF-15",
        "Version label not recorded on one funnel",
        "vllm-project/vime PR #45",
        "label-not-recorded-on-ipc",
        "INV-003",
        (STANDARD,),
        AUTO,
        (UpdateWeights(0, 1, Funnel.IPC, True),),
    ),
    Case(
        "PF-16",
        "Tokens labelled with the version seen after generation",
        "areal-project/AReaL PR #1569",
        "labels-with-final-version",
        "INV-002",
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
        "FC-001",
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
        "INV-004",
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
        "ENG-012",
        (Config(encoder=True),),
        OPT_OUT,
        (ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")),
    ),
    Case(
        "PF-22",
        "The cache reset is a stub that clears nothing (placeholder answer)",
        "vllm-project/vllm-omni #6739",
        "flush-is-a-stub",
        "FC-003",
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
        "FC-003",
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
        "INV-001",
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
        "MEM-001",
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
        "DER-001",
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
        "CLI-008",
        (STANDARD,),
        AUTO,
        # A client program (issue 11): its sync pauses, resets the prefix cache, then
        # updates without a flush and resumes. The right decision in the wrong order; the
        # recorded calls of the sync are the trace's ``within`` steps, judged on replay.
        # The two-phase form (a request admitted between the reset and the finish, its KV
        # computed under mixed weights) is drawn at engine level in tests/test_twophase.py.
        (ServeRequest(0, "P"), SyncWeights(1, T), ServeRequest(0, "P")),
    ),
)

DEFERRED: dict[str, int] = {}
"""Public cases of the shared case files that another issue expresses, by issue number
(none today: PF-23 became a client-program case once issue 11's protocol landed)."""

BY_ID: dict[str, Case] = {}
"""The first case of each ID (PF-22 has two variants, one per mutant: see ``BY_MUTANT``)."""
for _case in CASES:
    BY_ID.setdefault(_case.id, _case)

BY_MUTANT: dict[str, Case] = {c.mutant: c for c in CASES}
"""Every case by the mutant that makes its mistake (one mutant per case)."""
