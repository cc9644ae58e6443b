"""Exhaustive search: the model's state counts at fixed bounds, no violation in the spec,
and model x SUT search finding a shortest counterexample for every catalogued mutant.

The model searches here look for no sometimes-property (``sometimes=()``): the witness
search that follows every search (as long again as the state search at these bounds) reads
none of its states, so counts and violations are the same without it; tests/test_sometimes.py
holds the witnesses."""

from __future__ import annotations

import re

import pytest
from attrs import evolve

from kvfence.adapters import registry
from kvfence.adapters.mutants import MUTANTS
from kvfence.conformance.cli import cli_bounds, main_explore
from kvfence.conformance.explore import (
    KILL_SHALLOW,
    SETUPS,
    explore_adapter,
    fingerprint,
    kill_search,
    setups_for,
)
from kvfence.conformance.matrix import (
    BEYOND_FIRST_KILL,
)
from kvfence.conformance.replay import replay_trace, trace_actions
from kvfence.conformance.trace import read_trace
from kvfence.model.actions import ServeRequest
from kvfence.model.capabilities import EVIDENCE, Capability
from kvfence.model.explore import EXACT, STANDARD, default_configs, explore, initial_states
from kvfence.model.state import Bounds, Config, Entry, initial_state

CLI_DEFAULT = Bounds(prefixes=("P",), rids=("r1",), versions=2)
"""``kvfence explore``'s default bounds (``--prefixes 1 --versions 2 --inflight 1``)."""


# ----- the model alone ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoints", "bounds", "depth", "states", "transitions", "reached"),
    [
        # Each count moves when a branch is added or removed: they count the miss branch
        # of every prefill that finds an entry (any entry may have been evicted) and the two
        # stop branches of a refused mandatory flush on the exact lane (also inside a sync).
        # They count the lifecycle branches too. Memory tags: Sleep/WakeUp with three tag sets
        # and partial states in between (released kv_cache / weights), UpdateWeights and
        # FlushCache while asleep (each with its clean-refusal branch),
        # PauseGeneration(clear_cache), PublishVersion (accepted and refused, with and
        # without abort), the exact-lane stop branches of an injected refusal while asleep.
        # Two-phase windows: open, a chunk landed (mixed weights: serve or refuse), a chunk
        # set to fail, rolled back or closed; the serve and start branches inside it; the
        # finish's and abort's branches (they keep the one-endpoint frontier going).
        # The trust fixes added transitions: abort-then-flush on an exact lane (CD-08) and the
        # clean rejection of an unflushable opt-out update (CD-09). Merged, the memory tags
        # and the windows multiply (a window may open on a paused endpoint whose cache a
        # clearing pause emptied; a publish may run inside a window and is refused there).
        # The lifecycle designs (CD-10..CD-15) added branches: a chunk staged aside (CD-14),
        # a refusal to serve or start anywhere inside a window (CD-13), a publish the
        # weights back refused (CD-11), a refused publish reporting the asked-for aborts
        # (CD-12). No state was removed. A window may now also open on torn weights (the
        # retry of a failed update; its rollback returns to them): 18,995 -> 20,604 states
        # here, and the one-endpoint frontier grows most (4,820 -> 7,503 states), since a
        # failed window can be retried by another.
        # Failed updates (every update may also report failure: kept, closed on the new
        # weights, or torn and closed; semantics.Install.FAILED_*): 20,604 -> 42,173.
        # A release of KV memory may leave the released index listed until the wake, and
        # may spend an injected refusal on the engine's own flush (Sleep's branches beside
        # the reference's): 42,173 -> 43,637. An entry of the weights in force may outlive a
        # flush or a restart (a restart, or a stopped engine, keeps what is current; a flush
        # of only current entries leads back to a state already reached): 43,637 -> 43,829.
        (2, CLI_DEFAULT, 4, 43829, 1208229, 4),
        # Failed updates: every update may also report failure, leaving the endpoint kept
        # (with an injected refusal spent or not), closed on the new weights, or torn and
        # closed (semantics.Install.FAILED_*): 7,035 -> 13,834 states here. The release's
        # index kept until the wake, and a refusal spent inside it: 13,834 -> 14,110.
        # Current entries outliving a flush or a restart: 14,110 -> 14,167.
        (2, Bounds(), 3, 14167, 261985, 3),
        # one exact-lane endpoint: the windows keep the frontier going past depth 12
        # (failed updates add 83 states here and many edges into states already reached;
        # the release's kept index and spent refusal: 7,586 -> 7,670; current entries
        # outliving a flush or a restart, fewer states as flushes lead back: 7,667)
        (1, CLI_DEFAULT, 12, 7667, 346128, 12),
    ],
    ids=["cli-bounds-depth4", "default-bounds-depth3", "one-endpoint-depth12"],
)
def test_model_state_counts_are_pinned(endpoints, bounds, depth, states, transitions, reached):
    x = explore(initial_states(endpoints), bounds, depth, sometimes=())
    assert (x.states, x.transitions, x.depth_reached) == (states, transitions, reached)
    assert x.complete
    assert x.violation == () and x.trace == ()


def test_default_initial_state_is_exact_plus_standard():
    (s,) = initial_states()
    assert tuple(ep.config for ep in s.endpoints) == (EXACT, STANDARD) == default_configs(2)
    assert s.endpoints[0].config.guarded and not s.endpoints[1].config.guarded
    assert len(initial_states(2, policies=[s.policy, evolve(s.policy, mode="none")])) == 2


def test_max_states_truncates():
    x = explore(initial_states(2), CLI_DEFAULT, 6, max_states=100, sometimes=())
    assert x.states == 100 and not x.complete and x.violation == ()


def _stale_standard_endpoint():
    """A standard-lane endpoint at version 1 holding version-0 KV, with no waiver: any hit
    on it is stale reuse (INV-001). Not reachable by the spec; built to test the search."""
    s = initial_state((STANDARD,))
    ep = evolve(s.endpoint(0), weights=1, draft=1, scales=1, label=1, cache=frozenset({Entry("P")}))
    return evolve(s.with_endpoint(0, ep), trainer=1)


def test_a_stale_hit_that_loops_back_is_caught():
    """The stale hit leads back to the state it started from: a check of new states alone
    would miss it; the search judges every transition's responses."""
    x = explore(_stale_standard_endpoint(), CLI_DEFAULT, 3, sometimes=())
    assert [v.rule for v in x.violation] == ["INV-001"]
    assert x.trace == (ServeRequest(0, "P"),)
    assert x.initial == _stale_standard_endpoint()
    assert not x.complete


def test_a_violating_initial_state_has_an_empty_trace():
    s = initial_state((EXACT,))
    bad = evolve(
        s.endpoint(0), weights=1, draft=1, scales=1, label=1, cache=frozenset({Entry("P")})
    )
    x = explore(s.with_endpoint(0, bad), CLI_DEFAULT, 3, sometimes=())
    assert [v.rule for v in x.violation] == ["INV-001"] and x.trace == ()


def test_cli_bounds():
    b = cli_bounds(3, 4, 2)
    assert (b.prefixes, b.rids, b.versions) == (("P", "Q", "R"), ("r1", "r2"), 4)


def test_main_explore_model_only():
    code, text = main_explore(2, 1, 2, 1, 3, None, None)
    assert code == 0, text
    # moves with the model's branches (miss branches, exact-lane stop branches;
    # the trust fixes' branches (CD-08, CD-09); memory tags, publish, pause
    # clear_cache, two-phase windows, as above; the lifecycle designs CD-10..CD-15);
    # the transitions moved once more when the reduced search began stepping each update
    # action through one funnel only (39,532 with every funnel; the states are the same);
    # windows on torn weights (the retry of a failed update) added 124 states; failed
    # updates (every update may report failure: kept, closed, or torn and closed,
    # semantics.Install.FAILED_*) took it from 3,554 to 7,057; a release that leaves its
    # index listed until the wake, or spends an injected refusal on the engine's own
    # flush, to 7,177; an entry of the weights in force outliving a flush or a restart
    # (a flush of current entries now leads back to a state already reached, a restart
    # keeps what is current), to 7,203
    assert "distinct states: 7,203" in text and "transitions: 43,960" in text
    assert "states/s" in text and "PASS" in text
    with pytest.raises(ValueError, match="--endpoints >= 1"):
        main_explore(0, 1, 2, 1, 3, None, None)


# ----- model x SUT ------------------------------------------------------------------------

SHORTEST: dict[str, int] = {
    "bucket-failure-keeps-serving": 2,  # the fault mid-update, then a request on torn weights
    "resumes-after-failed-update": 2,  # a refused flush fails the update; the program resumes
    "never-flush": 1,
    "unreported-means-disabled": 1,
    "fp8-only": 1,
    "keeps-in-place-pause": 1,
    "in-place-skips-flush": 1,
    "guard-yields-to-opt-out": 2,
    "guard-missing-on-disk": 2,
    "guard-missing-on-tensor": 2,
    "guard-missing-on-distributed": 2,
    "guard-missing-on-two-phase": 2,
    "guard-missing-on-ipc": 2,
    "guard-missing-on-sparse-delta": 2,
    "guard-missing-on-bucketed": 2,
    "update-never-flushes": 2,
    "forces-flush-on-standard-lane": 2,
    "swallows-failed-flush": 2,
    "serves-after-failed-flush": 3,
    "crashes-after-swap": 2,
    "flush-refusal-reported-as-success": 2,
    "retract-blocks-flush": 2,
    "flushes-around-paused-kv": 3,  # a request, an in-place pause, the update
    "flush-skips-idle-check": 2,  # a request starts, then a flush frees its KV
    "flush-forgets-storage": 3,
    "flush-forgets-encoder": 2,
    # 3: start a request, demote its prefix to the host tier, sync. On the encoder setup
    # the two-step path (an update whose flush spares the queued prefix) is named by the
    # encoder rules (ENG-001/ENG-002: encoder outputs follow every update), not ENG-003
    "flush-spares-queued-requests": 3,
    "draft-left-behind-on-distributed": 1,
    "load-back-loses-draft-kv": 3,
    "lora-keyed-by-name": 2,
    "sleep-keeps-index": 2,
    "scales-dropped-on-ipc": 1,
    "label-not-recorded-on-ipc": 1,
    "labels-with-final-version": 3,
    "hit-path-numerics-differ": 2,
    # shared/cases/more-faults.md (PF-21, PF-22, PF-24)
    "encoder-kept-on-opt-out": 2,  # serve, then an opt-out sync (the encoder-opt-out setup)
    "flush-is-a-stub": 2,
    "flush-stub-claims-success": 2,
    "session-pinned-namespace": 3,  # serve, sync, serve again: the session's second turn
    # memory tags, label-only publish, pause clear_cache
    "crash-on-flush-while-kv-released": 2,  # Sleep(kv_cache), then a flush or an update
    "index-kept-across-release": 3,  # serve, release, resume: the index comes back
    "kv-resumed-stale-after-weights-only-update": 4,  # serve, evict to host, release, update
    "publish-label-without-weights": 1,  # publish the trainer's next version at once
    "publish-aborts-kept-requests": 2,  # start a request, publish without abort
    "pause-clear-cache-ignored": 2,  # serve, pause with clear_cache
    # two-phase windows, derived state, restart oracle
    # begin, a chunk, a serve: its bytes are not v0's (since CD-14 a chunk may be staged,
    # so the probe's v0 after the chunk is no lie by itself)
    "p2p-prepare-writes-live": 3,
    "finish-publishes-after-failed-chunk": 4,  # begin, fault, chunk, finish
    # a tensor sync, then a forward: the probe shows derived v0 after it (before it, a lazy
    # rebuild may still be pending: CD-15)
    "derived-skipped-on-tensor-funnel": 2,
    "relabel-without-loading": 2,  # a sync, then a serve the restart oracle judges
    # client programs, each on the engine profile its mutant names
    "reset-before-finish": 1,
    "refused-reset-ignored": 2,
    "prefix-only-reset": 1,
    # one sync on the mixed-info setup (endpoint 0 radix off, endpoint 1 on): reachable
    # since that setup was added; before it no setup told the endpoints' infos apart
    "endpoint0-info-only": 1,
    "requeue-across-versions": 2,  # start a request, then a sync that aborts it (abort setup)
    "two-phase-finish-without-flush": 1,  # the sync alone: its finish leaves the reset owed
    # data-parallel ranks (the ranks deployment setup): a request on rank 1, then the flush;
    # a rank's failure injected, then the update; and then a request on the torn ranks
    "flush-first-rank-reply": 2,
    "update-first-rank-reply": 2,
    "failed-rank-update-keeps-serving": 3,
    # a shared KV store (the store deployment setup): endpoint 0 stores P, endpoint 1 (of
    # another lineage and KV format) loads it
    "store-keyed-by-tokens": 2,
    # prefill/decode (the pd deployment setup): the decode engine updated alone, then a
    # request; a live transfer, then a flush of the prefill engine
    "decode-serves-any-kv-version": 2,
    "flush-frees-live-transfer": 2,
    # a router (the router deployment setup): a worker paused for its sync, taken out of
    # rotation, then put back
    "readds-too-early": 3,
    "readds-at-newest-weights": 3,
}
"""Shortest counterexample per mutant, from the default setups at ``EXPLORE_BOUNDS``."""

SHOWS_ANOTHER_RULE_FIRST = {
    "flush-spares-queued-requests",
    "flush-is-a-stub",
    "flushes-around-paused-kv",
    "flush-refusal-reported-as-success",
    "flush-stub-claims-success",
}
"""On an exact lane, a flush that spares every entry (all held by queued requests) looks
exactly like no flush at all, so a path no longer than the focused one shows ENG-001. A stub
reset on an empty cache keeps nothing it should not, so its one-step path shows only its
missing result (LIV-001) before a cached prefix shows FC-003. A flush that skips the KV a
paused request holds and says OK breaks FC-001 or FC-003 where the refusal was an injected
fault (no gate's), at the same length as FC-005 where a paused request's KV was flushed
around. A flush refused while a request runs on KV of the weights in force, reported as
success, shows only a success the gate did not allow (FC-005: a completed flush may keep
those entries, so the listing cannot show the report false) before an update makes the
kept entries stale (FC-003), or an injected refusal is called success (FC-003); a stub
flush that claims success does the same while a request runs."""

STATEFUL: dict[str, int] = {
    **{name: 1 for name in ("never-flush", "unreported-means-disabled", "fp8-only")},
    **{name: 1 for name in ("keeps-in-place-pause", "in-place-skips-flush")},
    **{name: 1 for name in ("draft-left-behind-on-distributed", "scales-dropped-on-ipc")},
    "label-not-recorded-on-ipc": 1,
    "guard-missing-on-bucketed": 3,
    "serves-after-failed-flush": 5,
    "flush-forgets-storage": 3,
    "load-back-loses-draft-kv": 3,
    "labels-with-final-version": 3,
    "flush-spares-queued-requests": 3,
    "session-pinned-namespace": 3,
    # the lifecycle vocabulary
    "index-kept-across-release": 3,
    "kv-resumed-stale-after-weights-only-update": 4,
    "publish-label-without-weights": 1,
    "publish-aborts-kept-requests": 4,
    "finish-publishes-after-failed-chunk": 4,
    "relabel-without-loading": 3,
    "derived-skipped-on-tensor-funnel": 2,  # CD-15: the lag shows only after a forward
    "flushes-around-paused-kv": 3,  # a request, an in-place pause, the update
    "p2p-prepare-writes-live": 3,  # CD-14: the chunk may be staged; the forward is not
    # a router: a worker out of rotation and not settled, then put back
    "readds-too-early": 3,
    "readds-at-newest-weights": 3,
    # client programs, each on the engine profile its mutant names
    "reset-before-finish": 1,  # the sync resets before its update
    "refused-reset-ignored": 2,  # a refusal injected, then a sync that resumes anyway
    "prefix-only-reset": 1,  # a sync on an engine leaving the encoder cache to the client
    "failed-rank-update-keeps-serving": 3,  # a rank's failure, the update, a request
}
"""``run_check(..., focus=mutant.rule).steps`` at the ci profile (derandomized); every
mutant not listed took 2 steps; the explorer's shortest is held to these, and
``tests/test_mutants.py``'s stateful kill to no fewer steps than ``SHORTEST``."""


NOT_EXPLORED = BEYOND_FIRST_KILL
"""Mutants the product explorer cannot reach at its bounds, each with the reason."""


def _sides(mutant) -> tuple[str, str]:
    return (mutant.name, "reference") if mutant.side == "engine" else (mutant.engine, mutant.name)


def test_every_mutant_is_pinned():
    assert set(SHORTEST) | set(NOT_EXPLORED) == {m.name for m in MUTANTS}
    assert not set(SHORTEST) & set(NOT_EXPLORED)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_explorer_finds_a_shortest_counterexample(mutant, out_dir):
    """The kill matrix's own search (``kill_search``) finds a shortest counterexample.

    ``kill_search`` is shortest over every setup of the rule (``setups_for``) only within
    ``KILL_SHALLOW`` steps, and for a rule of one setup; a longer kill comes from its later
    rounds, which search one setup at a time and so are shortest within that setup. For
    those, the rule's other setups are searched here to one step less than the kill: no
    setup breaks the rule sooner (the kill is shortest over all of them, as one search over
    every setup to the kill's depth finds, at a fraction of its cost), and no path that
    short breaks another rule there either (the ``other`` check)."""
    if mutant.name in NOT_EXPLORED:
        pytest.skip(NOT_EXPLORED[mutant.name])
    engine, client = _sides(mutant)
    x = kill_search(
        lambda: registry.engine(engine), lambda: registry.client(client), mutant.rule, out_dir
    )
    assert x is not None, "the breadth-first kill found nothing within its bounds"
    assert x.error == ""
    assert x.focus == mutant.rule
    assert mutant.rule in x.caught(), (x.caught(), x.trace)
    assert x.steps == SHORTEST[mutant.name], x.trace
    assert x.steps <= STATEFUL.get(mutant.name, 2)
    rest = tuple(s for s in setups_for(mutant.rule) if s.name != x.setup)
    other, other_trace = x.other, x.other_trace
    if x.steps > KILL_SHALLOW and rest:
        sooner = explore_adapter(
            registry.engine(engine),
            registry.client(client),
            focus=mutant.rule,
            depth=x.steps - 1,
            setups=rest,
            out_dir=None,
        )
        assert sooner.error == "" and sooner.complete
        assert sooner.depths == (x.steps - 1,) * len(rest)
        assert mutant.rule not in sooner.caught(), (sooner.setup, sooner.trace)
        other, other_trace = other or sooner.other, other_trace or sooner.other_trace
    if mutant.name in SHOWS_ANOTHER_RULE_FIRST:
        assert other and len(other_trace) <= x.steps
    else:
        assert other == ()  # no shorter path broke another rule first
    assert x.counterexample is not None
    trace = read_trace(x.counterexample)
    assert tuple(trace_actions(trace)) == x.trace
    assert trace.verdict is not None and trace.verdict["verdict"] == "FAIL"
    assert mutant.rule in {v["rule"] for v in trace.verdict["violations"]}
    assert tuple(trace.configs) == x.configs and trace.policy == x.policy
    # the recorded observations alone convict it (unless its rule needs exact_cache, which a
    # recorded listing cannot promise: it may hold less), and so does a live replay
    if Capability.EXACT_CACHE not in EVIDENCE.get(mutant.rule, ()):
        assert mutant.rule in {v.rule for v in replay_trace(trace, None, None).violations}
    live = replay_trace(trace, registry.engine(engine), registry.client(client))
    assert live.kind == "FAIL" and mutant.rule in {v.rule for v in live.violations}


def test_a_path_breaking_another_rule_is_reported_and_not_extended():
    """Focused on a rule the mutant does not break, the search records the shortest path
    that broke another one and goes on without extending it."""
    x = explore_adapter(
        registry.engine("sleep-keeps-index"),
        registry.client("reference"),
        focus="INV-003",
        depth=2,
        out_dir=None,
    )
    assert x.violation == () and x.counterexample is None and x.complete
    assert {v.rule for v in x.other} == {"ENG-006"} and len(x.other_trace) == 2


def test_given_configs_and_policy_are_one_setup(out_dir):
    x = explore_adapter(
        registry.engine("flush-forgets-encoder"),
        registry.client("reference"),
        focus="ENG-003",
        configs=(Config(encoder=True), STANDARD),
        policy=initial_states(1)[0].policy,
        depth=3,
        out_dir=out_dir,
    )
    assert x.setups == ("given",) and x.steps == 2 and "ENG-003" in x.caught()


def test_setups_for_a_rule():
    assert [s.name for s in setups_for("ENG-003")] == ["plain", "tiers", "encoder"]
    assert setups_for(None) == SETUPS == setups_for("ADP-001")
    assert all(s.configs for s in SETUPS)
    # endpoint0-info-only's fault needs endpoints that report different server info
    assert [s.name for s in setups_for("CLI-001")] == ["plain", "mixed-info"]
    (mixed,) = (s for s in SETUPS if s.name == "mixed-info")
    assert len({str(c.info) for c in mixed.configs}) == 2
    assert [s.name for s in setups_for("CLI-012")] == ["abort"]  # a pause that aborts


def test_snapshot_restore_and_fingerprint():
    e = registry.engine("reference")
    e.start((STANDARD,))
    before = fingerprint(e.endpoints)
    snap = e.snapshot()
    e.apply(ServeRequest(0, "P"))
    e.apply(ServeRequest(0, "Q"))
    after = fingerprint(e.endpoints)
    assert after != before
    e.restore(snap)
    assert fingerprint(e.endpoints) == before
    e.restore(snap)  # a snapshot stays reusable
    e.apply(ServeRequest(0, "Q"))
    e.apply(ServeRequest(0, "P"))
    assert fingerprint(e.endpoints) == after  # insertion order does not count
    e.close()


def test_main_explore_against_a_mutant(out_dir, monkeypatch):
    monkeypatch.chdir(out_dir.parent)
    code, text = main_explore(2, 1, 2, 1, 4, "serves-after-failed-flush", None)
    assert code == 1, text
    assert "shortest counterexample, 3 step(s)" in text and "FC-002" in text
    code, text = main_explore(1, 1, 2, 1, 2, "reference", None)
    assert code == 0 and "PASS" in text, text
    code, text = main_explore(2, 1, 2, 1, 3, None, "never-flush")
    assert code == 1 and "CLI-001" in text, text


# ----- per-setup depths (the pass matrix's explorer fixture) -------------------------------


def test_a_setup_can_be_explored_shallower():
    """``depths`` overrides ``depth`` for the setups it names: the shallower setup reaches
    exactly the nodes a search of it alone to that depth does, the other keeps ``depth``."""
    engine, client = registry.engine("reference"), registry.client("reference")
    focus = "ENG-003"  # setups plain, tiers and encoder (see setups_for)
    assert [s.name for s in setups_for(focus)] == ["plain", "tiers", "encoder"]
    both = explore_adapter(engine, client, depth=2, depths={"plain": 1}, focus=focus, out_dir=None)
    assert both.complete and both.depths == (1, 2, 2) and both.depth_reached == 2
    assert sum(both.setup_states) == both.states
    plain = next(s for s in SETUPS if s.name == "plain")
    alone = explore_adapter(
        engine, client, configs=plain.configs, policy=plain.policy, depth=1, out_dir=None
    )
    assert both.setup_states[0] == alone.states and alone.depths == (1,)
    deeper = explore_adapter(engine, client, depth=2, focus=focus, out_dir=None)
    assert deeper.setup_states[1:] == both.setup_states[1:]
    assert deeper.setup_states[0] > both.setup_states[0]


@pytest.mark.parametrize(
    ("depths", "message"),
    [({"plian": 1}, "not explored here: ['plian']"), ({"plain": -1}, "0 or more")],
)
def test_bad_depths_are_named(depths, message):
    engine, client = registry.engine("reference"), registry.client("reference")
    with pytest.raises(ValueError, match=re.escape(message)):
        explore_adapter(engine, client, depth=2, depths=depths, focus="ENG-003", out_dir=None)


def test_a_snapshot_keeps_its_own_configs():
    """``InProcessAdapter.snapshot`` names each endpoint's config instead of copying it: a
    restore gives back the very config objects of its own start, even after the explorer
    started the next setup."""
    e = registry.engine("reference")
    e.start((STANDARD, Config(encoder=True)))
    first = tuple(ep.config for ep in e.endpoints)
    e.apply(ServeRequest(0, "P"))
    snap, before = e.snapshot(), fingerprint(e.endpoints)
    e.start((Config(lora=True),))
    e.restore(snap)
    assert tuple(ep.config for ep in e.endpoints) == first
    assert all(ep.config is c for ep, c in zip(e.endpoints, first, strict=True))
    assert fingerprint(e.endpoints) == before
    e.close()
