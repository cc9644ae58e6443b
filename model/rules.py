"""The rule registry: every requirement of the spec, with a stable ID.

An ID is ``KIND-NNN``; it never changes meaning once published. Kinds:

* CLI: the client (what a sync asks of each endpoint, and the calls it makes).
* ENG: the engine (what an update, flush, pause or sleep does to the prefix cache).
* FC: fail-closed (what happens when a flush or an update cannot complete).
* INV: invariants over everything served.
* LIV: progress (the spec never forces a deadlock).
* ADP: the adapter contract (a checker that cannot see is never a pass).
* REACH: scenarios a run must reach, so that a pass is never vacuous.
* MEM: memory release and resume (Sleep and WakeUp with tags, the colocated order).
* PUB: version publishing (the label-only PublishVersion).
* WIN: two-phase update windows (begin, chunks, finish, abort).
* DER: state derived from the weights at load time.
* RNK: data-parallel ranks behind one endpoint (the merge of their replies, their versions).
* STO: a KV store shared by several endpoints and surviving restarts (which entry may be reused).
* PD: prefill/decode deployments (the versions of a request's two engines).
* RTR: workers behind a router (which workers receive traffic, and when they re-enter).

Levels follow RFC 2119: a MUST violation is FAIL; a SHOULD violation is FAIL only under
``--strict`` and is otherwise reported as a warning.

Every rule has a class (``Klass``): SAFETY (stale or mixed KV served, a dishonest report or
label, serving while closed), AVAILABILITY (a crash, a hang, a refusal or an extra flush the
spec does not ask for) or CHECK (the run itself: the adapter answered, the scenarios were
reached). A user must be able to tell "serves stale KV" from "stops safely".

Code names a rule by its ``RuleId`` member (``RuleId.INV_001``), never by a string literal:
``RuleId("WIN-010")`` raises ``ValueError``, so a check citing an unregistered rule is a
checker error, never a silent pass. ``RuleId`` is a ``str`` enum, so traces and reports keep
the plain ``"INV-001"``.
"""

from __future__ import annotations

from enum import Enum

from attrs import field, frozen


class Klass(str, Enum):
    """What breaking a rule costs: ``SAFETY``, ``AVAILABILITY``, or ``CHECK`` (the run's
    own validity: ADP and REACH rules)."""

    SAFETY = "safety"
    AVAILABILITY = "availability"
    CHECK = "check"

    def __str__(self) -> str:
        return self.value


@frozen
class Rule:
    """One requirement.

    ``id``: stable ``KIND-NNN``. ``name``: CamelCase handle used in code and docs.
    ``level``: ``"MUST"`` or ``"SHOULD"``. ``text``: the requirement. ``rationale``: why.
    ``source``: the public code or report the behaviour mirrors. ``klass``: what breaking
    it costs (``Klass``); a single violation may say otherwise (``Violation.klass``: an
    engine that answers a refused flush by dying breaks FC-001 safely).
    """

    id: str
    name: str
    level: str
    text: str
    rationale: str
    source: str
    klass: Klass = field(default=Klass.SAFETY, kw_only=True)

    @property
    def kind(self) -> str:
        return self.id.split("-", 1)[0]


RULES: tuple[Rule, ...] = (
    # ----- client resolver -------------------------------------------------------------
    Rule(
        "CLI-001",
        "AutoFlushesReportedRadix",
        "MUST",
        "With cache_invalidation_mode=auto, a sync requests a flush from every endpoint "
        "whose server info reports the radix cache on.",
        "A prefix cache that survives an update splices old-policy KV into new logprobs.",
        "SC-4; huggingface/trl #3024 (PF-01)",
    ),
    Rule(
        "CLI-002",
        "UnknownRadixMeansEnabled",
        "MUST",
        "With mode auto, an endpoint whose radix state is absent, unparseable, or whose "
        "server info cannot be fetched is treated as radix on: a flush is requested.",
        "Guessing 'off' from silence is the unsafe direction; an extra flush only costs a "
        "cold prefill.",
        "SC-5",
    ),
    Rule(
        "CLI-003",
        "AutoSkipsReportedOff",
        "SHOULD",
        "With mode auto, an endpoint that reports the radix cache off gets no flush request.",
        "Outside the radix cache there is nothing to flush; behaviour stays unchanged.",
        "SC-2",
        klass=Klass.AVAILABILITY,
    ),
    Rule(
        "CLI-004",
        "FlushModeAlwaysFlushes",
        "MUST",
        "With mode flush, or an explicit flush_cache=True, a sync requests a flush from "
        "every endpoint.",
        "An explicit request is never second-guessed.",
        "seed contract",
    ),
    Rule(
        "CLI-005",
        "NoneModeRequestsNoFlush",
        "MUST",
        "With mode none (and no explicit flush_cache=True), a sync requests no flush; the "
        "engine guard still protects exact lanes.",
        "The opt-out is the caller's to make, and it is honoured outside exact lanes.",
        "SC-6",
        klass=Klass.AVAILABILITY,
    ),
    Rule(
        "CLI-006",
        "ServerInfoParsing",
        "MUST",
        "On every server-info shape an engine emits (SGLang's disable_radix_cache bool, "
        "vLLM's silence on both fields, a fork's radix_cache_enabled bool, the strings "
        "'true'/'false', null, an unparseable value, a fetch that fails), a client reads "
        "the radix state the report gives: radix_cache_enabled when it is a boolean, else "
        "disable_radix_cache inverted, else unknown; a misreading that skips a flush the "
        "report asks for breaks this rule (one that only adds a flush is CLI-003's).",
        "Servers of different versions and forks report the flag under either name; the "
        "client that reads only one of them, or reads a string 'false' as true, skips the "
        "flush on an engine that has the radix cache on. Shapes no engine emits are "
        "CLI-013's.",
        "SC-7; SGLang /get_server_info (python/sglang/srt/server_args.py "
        "disable_radix_cache); vLLM /server_info (neither field)",
    ),
    Rule(
        "CLI-007",
        "FlushUpgradesInPlacePause",
        "MUST",
        "When the client's own plan requests a flush, a configured in_place pause is "
        "upgraded to retract (a client that does not flush is not charged with this rule).",
        "In-place paused requests hold KV, so the flush would be refused (PF-06).",
        "SC-8; radixark/miles PR #2782 (PF-06)",
        klass=Klass.AVAILABILITY,
    ),
    Rule(
        "CLI-013",
        "UnemittedServerInfoReadSafely",
        "SHOULD",
        "On a server-info shape no engine emits (an int for a boolean field, boolean words "
        "other than 'true'/'false', contradictory fields), a client with mode auto skips the "
        "flush only where some admissible reading of the report says the radix cache is "
        "off: each field read as the boolean it spells (0/1 included) or ignored as not "
        "reported, either field winning. An extra flush is never charged here.",
        "No producer sends these shapes, so no engine's verdict should hang on them (a "
        "SHOULD, not a MUST); but a client that reads one as 'off' where nothing in it says "
        "off would skip the flush on an engine that started sending it, and serve stale KV: "
        "the class is SAFETY.",
        "kvfence robustness of SC-7; the XoRL-style resolver that reads only real booleans "
        "and falls back to disable_radix_cache keeps it",
        klass=Klass.SAFETY,
    ),
    # ----- client programs: rules over the recorded call sequence (model/obligations.py) --
    Rule(
        "CLI-008",
        "ResetAfterFinalWeights",
        "MUST",
        "An endpoint whose prefix cache the policy requires invalidated has it invalidated "
        "after its final weights are installed and before serving resumes; a reset made "
        "before the update does not count.",
        "KV cached between an early reset and the end of the update is computed under old or "
        "mixed weights and is reused afterwards: the right decision in the wrong order.",
        "huggingface/trl PR #6765 review (PF-23)",
    ),
    Rule(
        "CLI-009",
        "EveryStaleCacheKindReset",
        "MUST",
        "Every cache kind an engine exposes as a reset of its own and does not invalidate "
        "on an update (an encoder cache) is reset by the client after the update and before "
        "serving resumes.",
        "Resetting the prefix cache alone leaves encoder outputs of the old weights to be "
        "reused; where the engine leaves that reset to the caller, it is the client's.",
        "vllm-project/vllm reset_encoder_cache beside reset_prefix_cache; PF-10, PF-21",
    ),
    Rule(
        "CLI-010",
        "RefusedResetActedOn",
        "MUST",
        "A reset the engine refused or failed is acted on: retried until it succeeds, the "
        "endpoint left paused, or the sync failed; the endpoint never resumes serving with "
        "the reset unacknowledged.",
        "A refused flush leaves the old KV in place; resuming serves it under new weights.",
        "SC-3; sgl-project/sglang flush_cache returning false while requests hold KV (PF-03)",
    ),
    Rule(
        "CLI-011",
        "SyncFailsOnlyOnFailure",
        "MUST",
        "A client program's sync raises only after an engine call of the sync failed (a "
        "refused reset, a rejected update); raising otherwise is the client's own failure.",
        "A sync that dies on its own bug leaves endpoints paused or half-updated for no "
        "reason the engine gave.",
        "kvfence client-program protocol (docs/clients.md)",
        klass=Klass.AVAILABILITY,
    ),
    Rule(
        "CLI-012",
        "RequeuedResponseLabelledByEveryVersion",
        "MUST",
        "A response the client delivers for a request that a sync aborted and the client "
        "requeued is labelled with exactly the weight versions that sampled its tokens: the "
        "aborted partial's, when the client kept the partial, and the continuation's. "
        "Discarding the partial and regenerating from the prompt is correct.",
        "A response stitched from tokens of two weight versions under one label trains on "
        "off-policy tokens as if on-policy; the label is all the trainer sees.",
        "THUDM/slime PR #2092 (one sample across weight versions 2, 4, 6); rllm-org/rllm "
        "PR #622 (stamped at completion); vllm-project/vllm #54443",
    ),
    Rule(
        "CLI-014",
        "FailedUpdateNotReportedDone",
        "MUST",
        "After an update of the sync that the engine refused or failed on an endpoint (an "
        "UpdateWeights or FinishWeightUpdate not answered OK), with no later update of the "
        "sync installing the version there, a client program neither resumes serving on "
        "that endpoint nor returns from the sync as if it succeeded: it retries the update "
        "until it succeeds, or leaves the endpoint paused or asleep and fails the sync.",
        "A refused update changed nothing and a failed one may have left anything: the "
        "endpoint serves the old policy (or is closed), while a sync reported done lets "
        "the trainer take its rollouts as samples of the new version.",
        "FC-001's refusal (sgl-project/sglang update answering success=false); "
        "sgl-project/sglang-omni PR #678 (PF-32: the failure is reported, serving goes on)",
    ),
    # ----- engine ------------------------------------------------------------------------
    Rule(
        "ENG-001",
        "ExactLaneGuardFlushes",
        "MUST",
        "On an exact lane with the radix cache on, every completed weight update, on every "
        "funnel, flushes the prefix cache whatever the caller asked.",
        "Exact lanes promise byte-equal trainer/sampler parity; a stale hit breaks it.",
        "SC-1; SGLang scheduler update_weights_from_* handlers",
    ),
    Rule(
        "ENG-002",
        "RequestedFlushHappens",
        "MUST",
        "On a standard lane, or with the radix cache off, an update the caller asked to flush "
        "(flush_cache true, or omitted where the engine's default is true) removes every "
        "entry computed under older weights before it reports success. Dropping more than "
        "asked is never a violation of this rule (see ENG-011).",
        "A flush the caller asked for that silently did not happen leaves stale KV reachable.",
        "SC-2; SGLang UpdateWeightFromDiskReqInput.flush_cache (default true)",
    ),
    Rule(
        "ENG-003",
        "FlushClearsEveryTier",
        "MUST",
        "A completed flush removes every cache entry of other weights, lineage or KV format, "
        "of every kind (target KV, draft KV, encoder output) on every tier (device, host, "
        "storage). An entry of the weights, LoRA revision, lineage and KV format in force may "
        "stay, on any tier.",
        "A tier the flush forgot loads old KV back after the update; an entry of the weights "
        "in force is no old KV, and an update's flush runs once they are the new ones.",
        "sgl-project/sglang #26792 (PF-09); verl-project/verl #6523 (PF-10)",
    ),
    Rule(
        "ENG-004",
        "DraftFollowsTarget",
        "MUST",
        "A completed update leaves the speculative draft model at the same weight version "
        "as the target model.",
        "A draft left behind silently lowers acceptance and breaks exact-lane parity.",
        "sgl-project/sglang #27718 (PF-11)",
    ),
    Rule(
        "ENG-005",
        "ScalesFollowWeights",
        "MUST",
        "With an FP8 KV cache, a completed update installs the KV scales of the new weight "
        "version.",
        "Dropped scales make every later KV wrong without any error.",
        "NVIDIA-NeMo/RL #3225 (PF-14)",
    ),
    Rule(
        "ENG-006",
        "SleepDropsIndex",
        "MUST",
        "Sleep that discards KV memory discards the prefix index with it; after WakeUp "
        "nothing is served from the discarded KV.",
        "An index that outlives its memory attends to garbage.",
        "vllm-project/vllm #17103 (PF-02)",
    ),
    Rule(
        "ENG-007",
        "LoraReloadInvalidates",
        "MUST",
        "Reloading a LoRA adapter in place under the same name makes the KV computed under "
        "its old bytes unreachable.",
        "The cache key must name the adapter's contents, not its name.",
        "vllm-project/vllm #42125 (PF-13); PrimeIntellect-ai/prime-rl PR #1650 (PF-07)",
    ),
    Rule(
        "ENG-008",
        "LoadBackRestoresDraftKv",
        "MUST",
        "Loading a prefix back from a lower tier restores its draft KV with its target KV.",
        "Draft slots that hold unrelated data change behaviour on a hit.",
        "sgl-project/sglang PR #17338 (PF-12)",
    ),
    Rule(
        "ENG-009",
        "PauseModeSemantics",
        "MUST",
        "abort ends in-flight requests and frees their KV; retract frees their KV and "
        "re-queues them to recompute on resume; in_place keeps them and their KV.",
        "Each mode leaves a different amount of old KV alive across an update.",
        "SGLang /pause_generation; sgl-project/sglang PR #31962 (PF-05)",
    ),
    Rule(
        "ENG-010",
        "RestartStartsCold",
        "MUST",
        "A restarted endpoint holds no in-flight requests, serves its last completely loaded "
        "weight version, and of its cache holds only entries of that version, lineage and KV "
        "format (a reopened disk tier), on any tier.",
        "Nothing of other weights survives a process restart: only the checkpoint on disk "
        "and KV computed under it.",
        "seed contract",
    ),
    Rule(
        "ENG-011",
        "KeepsCacheUnlessAsked",
        "SHOULD",
        "On a standard lane, an update that was not asked to flush keeps the prefix cache. "
        "Dropping more than asked is safe; it is reported as a performance note (cold "
        "prefills), judged only where the adapter declares exact_cache.",
        "Outside exact lanes existing behaviour is unchanged; but extra invalidation is never "
        "unsafe, so it is never a MUST failure.",
        "SC-2; vllm-project/vllm /pause (clears the cache by default, CD-01)",
        klass=Klass.AVAILABILITY,
    ),
    Rule(
        "ENG-012",
        "DerivedCachesFollowWeights",
        "MUST",
        "Every completed update invalidates encoder outputs (and any other weight-derived "
        "cache keyed without a weight version), whatever the caller asked about the prefix "
        "cache; draft KV follows the draft weights.",
        "The prefix-cache opt-out waives the prefix cache only; an encoder output keyed by "
        "content alone is stale the moment the weights change.",
        "vllm-project/vllm #44910 (PF-21)",
    ),
    # ----- fail-closed ------------------------------------------------------------------
    Rule(
        "FC-001",
        "FailedFlushFailsUpdate",
        "MUST",
        "An update whose flush (mandatory, requested, or one the engine runs on every "
        "update) cannot complete reports failure with a reply. Only on an exact lane may a "
        "refused mandatory flush instead stop the engine process, or be made possible by "
        "aborting the requests holding KV before the flush completes (nothing stale is "
        "served; reported as an availability note); a standard-lane update that dies on a "
        "requested flush is a violation.",
        "A refused flush swallowed as success leaves the client believing the cache clean; a "
        "crash where a failure reply was due leaves it not knowing.",
        "SC-3; areal-project/AReaL #140 (PF-04); vllm-project/vllm #54443 (PF-17)",
    ),
    Rule(
        "FC-002",
        "NothingServedWhileClosed",
        "MUST",
        "After an update failed closed (weights changed, flush not done) or tore the weights, "
        "the endpoint serves nothing until a flush completes on whole weights.",
        "Reporting failure is not enough if the stale tree keeps serving.",
        "SC-3",
    ),
    Rule(
        "FC-003",
        "FlushReportHonest",
        "MUST",
        "A flush reports success only if it removed every entry it had to: every entry but "
        "those of the weights, lineage and KV format in force (ENG-003), and every entry for "
        "a pause that clears the cache, since the update after it may skip its own flush; a "
        "refused, partial or no-op flush of such entries reports failure, and a missing "
        "result counts as failure.",
        "vLLM's reset_prefix_cache returns False while blocks are in use; callers ignored it.",
        "vllm-project/vllm PR #12284 and #28827 (PF-03)",
    ),
    Rule(
        "FC-004",
        "TornUpdateConsistentOrClosed",
        "MUST",
        "An update that fails midway (some buckets applied) reports failure and leaves the "
        "endpoint either at its old weights with its cache, or closed.",
        "Torn weights are no weight version at all.",
        "seed contract; bucketed transfers",
    ),
    Rule(
        "FC-005",
        "FlushSparesLiveKv",
        "MUST",
        "A flush (asked directly, or run by an update) never frees KV that a live request "
        "still holds: a request running or paused in place on the endpoint, or a live KV "
        "transfer reading the endpoint's pages (a prefill/decode deployment's prefill "
        "engine). While one does, the flush waits or is refused (an update whose flush it is "
        "then fails: FC-001), whatever timeout or force its caller passed or dropped.",
        "The flush's report can be true (it did empty the tree) and still break the idle "
        "gate: the live request decodes on pages that later prefills overwrite, or the decode "
        "engine reads a transfer's pages while they are reused. The mechanism is the gate, not "
        "the report: a success the observation contradicts (entries kept) is FC-003's, or "
        "FC-001's inside an update; a success it confirms broke this rule. One rule for the "
        "endpoint's own requests and a deployment's live transfers: the gate is the same, "
        "only what it must count differs.",
        "sgl-project/sglang PR #36150, PR #36152 (a /flush_cache without a timeout skips "
        "the scheduler's idle check, PF-30); sgl-project/sglang PR #12107 (an idle check "
        "that missed a request: the flush freed the tree under it)",
    ),
    # ----- invariants -------------------------------------------------------------------
    Rule(
        "INV-001",
        "NoStalePrefixReuse",
        "MUST",
        "No token is computed under weights v attending to KV (target, draft, encoder, LoRA) "
        "computed under anything else, nor KV of another namespace than the weights in force; "
        "on a standard lane this is waived only after an update the caller explicitly asked "
        "to run without a flush on an endpoint that honestly reports its radix cache, and for "
        "a request pinned to an older namespace only where the policy declares off-policy "
        "sessions (then it is reported, not failed).",
        "The bug class kvfence exists for.",
        "SC-9; PF-01, PF-06, PF-07, PF-08",
    ),
    Rule(
        "INV-002",
        "ResponseVersionAttribution",
        "MUST",
        "The weight versions an engine attributes to a response are exactly those that "
        "sampled its tokens; a response spanning an update is visibly mixed.",
        "Tokens labelled with the version seen at the end poison importance ratios.",
        "areal-project/AReaL PR #1569 (PF-16)",
    ),
    Rule(
        "INV-003",
        "VersionLabelSound",
        "MUST",
        "The reported weight-version label is v only when target, draft and KV scales are "
        "all at v and the weights are whole.",
        "A label that lies hides every other fault.",
        "vllm-project/vime PR #45 (PF-15)",
    ),
    Rule(
        "INV-004",
        "HitMatchesColdPrefill",
        "SHOULD",
        "On an exact lane, a response that hit fresh KV is byte-equal to a cold prefill of "
        "the same prompt under the same weights.",
        "Distinct from stale reuse: the hit path's numerics differ, not its provenance.",
        "sgl-project/sglang #34683 (PF-18)",
    ),
    # ----- liveness ---------------------------------------------------------------------
    Rule(
        "LIV-001",
        "FlushSucceedsWhenNoKvHeld",
        "MUST",
        "A flush is refused only while a request holds KV (running or paused in place) or a "
        "fault is injected; retracted and aborted requests never block it.",
        "Otherwise retract-then-flush, the fix for PF-06, deadlocks the update.",
        "sgl-project/sglang PR #31962 (PF-05)",
        klass=Klass.AVAILABILITY,
    ),
    Rule(
        "LIV-002",
        "OpenEndpointAnswers",
        "MUST",
        "An open endpoint carries out every enabled action the spec does not allow to fail "
        "(serving, pausing, resuming, sleeping, waking, evicting).",
        "A system that refuses everything would otherwise pass every safety rule.",
        "STYLE: stateright 'eventually' properties",
        klass=Klass.AVAILABILITY,
    ),
    # ----- memory release and resume ----------------------------------------------------
    Rule(
        "MEM-001",
        "NoCrashWhileKvReleased",
        "MUST",
        "An update, or a flush, while the KV memory is released (Sleep with kv_cache, not "
        "yet resumed) answers: it succeeds (the device holds no KV to remove; the index and "
        "lower tiers are emptied) or is refused cleanly; the engine never stops or goes "
        "silent there (a refusal injected as a fault is FC-001's, as anywhere).",
        "The colocated order (release all, resume weights, update with flush_cache, resume "
        "KV) runs the flush while the KV pools are released; touching them kills the "
        "scheduler and the trainer loses the endpoint.",
        "sgl-project/sglang PR #19029, regression PR #40480 (PF-19)",
        klass=Klass.AVAILABILITY,
    ),
    Rule(
        "MEM-002",
        "ResumedKvHoldsNoIndex",
        "MUST",
        "Resuming KV memory (WakeUp with kv_cache) brings back no prefix-index entry for the "
        "KV that was released: released KV memory is garbage, and an index stashed at "
        "release and restored on resume must never be hit.",
        "torch_memory_saver gives the pool back without its contents; an index that returns "
        "with it attends to garbage.",
        "SGLang release_memory_occupation (flush_cache with the kv_cache tag); "
        "vllm-project/vllm #17103 (PF-02)",
    ),
    # ----- version publishing -------------------------------------------------------------
    Rule(
        "PUB-001",
        "PublishedLabelMatchesWeights",
        "MUST",
        "A label-only publish (PublishVersion) of version v succeeds only when the whole "
        "weights installed (target, draft, KV scales, not torn) are v; any other publish is "
        "refused and leaves the label as it was. A publish the weights back may also be "
        "refused, changing nothing (an engine that labels only through its updates).",
        "INV-003 judges the label an update leaves; a separate publish call can move the "
        "label without any weights, and the trainer then attributes old-policy tokens to "
        "the new version.",
        "SGLang /update_weight_version (UpdateWeightVersionReqInput.new_version); vLLM "
        "/update_weight_version (vllm/entrypoints/serve/dev/rlhf/api_router.py)",
    ),
    Rule(
        "PUB-002",
        "PublishKeepsRequests",
        "MUST",
        "A publish aborts in-flight requests only when asked (abort_requests), whether or "
        "not the label then moves (the asked-for abort may run before the weights check, and "
        "is then reported with the refusal); otherwise every request stays, including those "
        "a pause kept (retract, in place).",
        "A pause mode promised to keep those requests; an abort the caller did not ask for "
        "silently throws away rollouts (one tenant's publish kills another's sampling).",
        "SGLang UpdateWeightVersionReqInput.abort_all_requests; radixark/miles "
        "multi-LoRA publish (abort_all_requests=False)",
        klass=Klass.AVAILABILITY,
    ),
    # ----- adapter contract -------------------------------------------------------------
    Rule(
        "ADP-001",
        "AdapterAnswers",
        "MUST",
        "Every adapter call returns an observation within its timeout; a crash or a hang is "
        "ERROR, never PASS.",
        "A checker that cannot see must not say 'fine'.",
        "Jepsen checkers; etcd robustness Unknown results",
        klass=Klass.CHECK,
    ),
    Rule(
        "ADP-002",
        "ObservationWellFormed",
        "MUST",
        "An observation carries a status and only fields of the right type.",
        "A garbled observation is not evidence either way.",
        "kvfence adapter guide",
        klass=Klass.CHECK,
    ),
    # ----- two-phase update windows and derived weight state -------------------------------
    Rule(
        "WIN-001",
        "WindowNeverClaimsNewVersion",
        "MUST",
        "Inside an open two-phase update window the endpoint may refuse to serve. Once a "
        "chunk has landed in the live parameters they are mixed: served under, the weights "
        "probe shows no whole version, no label, and responses are attributed to no version. "
        "A chunk staged aside (no forward reads it) leaves the old version whole, labelled "
        "and served as such, and its output must be the old version's; nothing is labelled "
        "with the new version before the finish.",
        "A window that serves mixed weights as the old (or the new) version hides torn "
        "numerics behind a clean label; P2P prepare writing live parameters does exactly that.",
        "vLLM /start_weight_update, /update_weights, /finish_weight_update "
        "(vllm/entrypoints/serve/dev/rlhf/api_router.py); SGLang update_weights_from_tensor "
        "chunks, P2P prepare/complete",
    ),
    Rule(
        "WIN-002",
        "WindowKvNeverOutlivesWindow",
        "MUST",
        "KV computed under the mixed weights of a window is never reused after the window "
        "closes (finish, abort, or a failed chunk rolled back), whatever flush_cache asked; "
        "KV of the old whole weights is the ordinary update question (ENG-001/002, INV-001's "
        "waiver), and a client that resets the cache before the finish breaks a client rule, "
        "not this one (PF-23).",
        "Only the engine knows it served under mixed weights; the caller's opt-out covers KV "
        "of a real older version, not of weights that never existed.",
        "huggingface/trl PR #6765 review (PF-23)",
    ),
    Rule(
        "WIN-003",
        "FailedChunkRollsBackOrCloses",
        "MUST",
        "A chunk that fails reports failure and leaves the endpoint rolled back (old weights "
        "whole, its label) or closed; later chunks and the finish of that window report "
        "failure and never publish its version; an abort rolls back or closes.",
        "A finish that publishes after a failed chunk labels torn weights as the new version.",
        "FC-004 for bucketed updates; SGLang update_weights_from_distributed two-step",
    ),
    Rule(
        "DER-001",
        "DerivedStateFollowsWeights",
        "MUST",
        "State derived from the weights at load time (transposed router gates, repacked "
        "quantized operands, caches built by a post-load hook) follows the target weights "
        "after every completed update, on every funnel, and after a restart: the output "
        "equals that of an engine freshly started at the same version. It may be rebuilt "
        "lazily, by a version check before the next forward: until a forward runs the probe "
        "may show an older derived version, never after one.",
        "New parameters mixed with old derived tensors compute under no weight version, "
        "cached or cold, while the label says the new one.",
        "sgl-project/sglang PR #31937, issue #14158 (PF-20)",
    ),
    # ----- data-parallel ranks behind one endpoint --------------------------------------
    Rule(
        "RNK-001",
        "MergedFlushReportTrue",
        "MUST",
        "On an endpoint with data-parallel ranks, a flush reports success only if the flush "
        "succeeded on every rank; a rank that refused (a request holds KV there) makes the "
        "endpoint's reply a failure, whatever the other ranks already emptied.",
        "Each rank's own reply can be honest (FC-003 holds on every scheduler) while the "
        "controller that merges them lies: the mistake is in the merge, a mechanism of its "
        "own, so it has a rule of its own. A client told the cache is empty then skips the "
        "update's flush and the refusing rank serves KV of the old weights.",
        "sgl-project/sglang PR #39562; lightseekorg/tokenspeed PR #1608 (PF-25)",
    ),
    Rule(
        "RNK-002",
        "FailedRankUpdateNotTorn",
        "MUST",
        "An update that fails on any data-parallel rank reports failure and leaves either "
        "every rank at its old weights with its cache (the ranks that moved rolled back), or "
        "the endpoint closed, reporting no weight version, until an update completes on "
        "every rank.",
        "Ranks at different versions behind one endpoint are torn weights at the scale of "
        "the deployment (FC-004's mechanism across schedulers): a reply or a label that "
        "names the new version while a rank stays at the old one lets that rank serve the "
        "old weights as the new.",
        "sgl-project/sglang PR #39534 (PF-26)",
    ),
    Rule(
        "RNK-003",
        "RanksServeOneVersion",
        "MUST",
        "An endpoint serves (admits, finishes or answers a request on any rank) only while "
        "every rank is at one weight version; while its ranks are torn it refuses.",
        "Reporting the failure is not enough if both ranks keep serving: the same prompt "
        "then gets tokens of two policies depending on where the router put it.",
        "sgl-project/sglang PR #39534, after the fix (PF-26)",
    ),
    # ----- a KV store shared by several endpoints ---------------------------------------
    Rule(
        "STO-001",
        "StoreEntryReusedBySameWeights",
        "MUST",
        "An entry of a KV store shared by several endpoints is reused (loaded into a "
        "request's prefill) only by an engine of the same weight lineage, the same weight "
        "version and the same KV format as the engine that stored it, on any endpoint and "
        "after any restart.",
        "A store outlives the engines that fill it and is shared by engines of other "
        "checkpoints, versions and KV layouts. No flush of an engine reaches it, so what its "
        "key carries (or a namespace that rotates on every update) is the only guard: a key "
        "of the prompt's tokens alone lets an engine load KV of the weights before its "
        "update, of another model, or bytes of another KV format.",
        "InternLM/lmdeploy issue #4930, PR #4932 (PF-31)",
    ),
    # ----- prefill/decode deployments ----------------------------------------------------
    Rule(
        "PD-001",
        "PrefillDecodeOneVersion",
        "MUST",
        "A request of a prefill/decode deployment is served (admitted, finished or answered) "
        "only while its prefill engine and its decode engine are at the same weight version, "
        "and only with transferred KV of that version; otherwise it is refused or aborted.",
        "Each side of a P/D deployment is updated by its own call, so a rolling update "
        "leaves them at two versions for a while: the decode engine then attends to KV the "
        "prefill engine computed under other weights, on every request, hit or miss, while "
        "its own label names its own version. No prefix cache is involved, so no flush and "
        "no cache rule can catch it: the version of the transferred KV is the guard.",
        "verl-project/verl PR #7616; sgl-project/sglang PR #18646; sgl-project/rbg issue #22 "
        "(PF-29)",
    ),
    # ----- workers behind a router -------------------------------------------------------
    Rule(
        "RTR-001",
        "RotationOnlyWhenSettled",
        "MUST",
        "A router sends traffic only to workers in its rotation; a worker taking an update "
        "while it serves leaves the rotation first (or the update is refused), and re-enters "
        "only once its sync settled: serving again, not closed, at the newest weight version "
        "of the deployment's workers, with no KV of other weights in its tree; before that, "
        "the router refuses to put it back.",
        "A worker put back into rotation before its sync settled takes traffic at the old "
        "weights, or from a tree whose flush has not run, while the trainer believes the "
        "deployment moved: each worker's own rules can hold (it would refuse while closed) "
        "and the rollouts still mix policies, because the mistake is in the router's "
        "bookkeeping, not in any engine.",
        "sgl-project/sglang-omni PR #1049 (a worker stays disabled while its weight update "
        "is unresolved); sgl-project/sglang PR #2392 (health check before a worker is "
        "added), PR #2369, PR #2380; sgl-project/sglang issue #4282",
    ),
    # ----- reachability -----------------------------------------------------------------
    Rule(
        "REACH-001",
        "ReuseAfterUpdateReached",
        "MUST",
        "The run served a prefix that was cached before a completed weight update.",
        "Without it, NoStalePrefixReuse was never at risk and a pass means nothing.",
        "STYLE: stateright 'sometimes' properties",
        klass=Klass.CHECK,
    ),
    Rule(
        "REACH-002",
        "GuardCaseReached",
        "MUST",
        "The run updated an exact-lane, radix-on endpoint whose caller did not ask to flush.",
        "The engine guard is only tested where the client would have skipped the flush.",
        "SC-1",
        klass=Klass.CHECK,
    ),
    Rule(
        "REACH-003",
        "RefusedFlushReached",
        "MUST",
        "The run attempted an update whose flush could not complete.",
        "Fail-closed behaviour is only tested when the flush is actually refused.",
        "SC-3",
        klass=Klass.CHECK,
    ),
)


class _RuleIdBase(str, Enum):
    """A registered rule ID. It prints, formats and reprs as its plain ID (``'INV-001'``),
    so messages and traces read as they do with strings."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    __format__ = str.__format__

    @property
    def rule(self) -> Rule:
        """The registered ``Rule`` this ID names."""
        return BY_ID[self.value]


RuleId = _RuleIdBase(
    "RuleId", [(r.id.replace("-", "_"), r.id) for r in RULES], module=__name__, qualname="RuleId"
)
"""Every registered rule ID, as a ``str`` enum: ``RuleId.INV_001 == "INV-001"``.
``RuleId(text)`` raises ``ValueError`` for an ID that is not in ``RULES``."""

BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}
BY_NAME: dict[str, Rule] = {rule.name: rule for rule in RULES}


def rule_id(value: object) -> RuleId:
    """``value`` as a registered ``RuleId`` (attrs converter for every field that names a
    rule). ``ValueError`` names an unregistered ID: a check that cites a rule the registry
    does not hold is a bug in the checker, and the run that meets it is ERROR."""
    try:
        return RuleId(value)
    except ValueError:
        raise ValueError(f"no rule {value!r} in the registry") from None


def rule(rule_id: str) -> Rule:
    """Return the rule with this ID; ``KeyError`` names the unknown ID."""
    try:
        return BY_ID[rule_id]
    except KeyError:
        raise KeyError(f"no rule {rule_id!r} in the registry") from None
