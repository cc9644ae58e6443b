"""The four deployments of the explorer (``kvfence explore --deployment``: ranks, store, pd,
router) in one shape: each is opt-in (no default setup has its feature), a plain engine
has none of their rules at stake, and each correct design of a deployment explores clean
on it at depth 4. What each deployment means (its vocabulary, semantics, reference engine,
mutants, pinned counts) is in its own module: tests/test_ranks.py, tests/test_store.py,
tests/test_pd.py, tests/test_router.py."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.designs import DESIGNS as CATALOG
from kvfence.adapters.pd import PD_CONFIGS
from kvfence.adapters.router import ROUTER_CONFIGS
from kvfence.conformance.explore import DEPLOYMENTS, SETUPS, deployment, explore_adapter
from kvfence.conformance.runner import run_check
from kvfence.model.capabilities import Capability
from kvfence.model.state import Config

SHAPES = {
    Capability.RANKS: "ranks",
    Capability.STORE: "store",
    Capability.ROLES: "pd",
    Capability.ROUTER: "router",
}
"""The capability that makes an engine one of each deployment."""

OPT_IN = {
    "ranks": ((Config(ranks=2),), lambda c: c.ranks > 1),
    "store": (
        (Config(store=True), Config(store=True, lineage="sft-b", kv_format="fp8")),
        lambda c: c.store,
    ),
    "pd": (PD_CONFIGS, lambda c: c.role),
    "router": (ROUTER_CONFIGS, lambda c: c.router),
}
"""Each deployment: the configs of its one setup, and the feature no default setup has."""

DESIGNS = [
    ("ranks", "reference-ranks", 500),
    ("ranks", "merges-every-flush-reply", 500),
    ("ranks", "closes-on-any-rank-failure", 500),
    ("ranks", "rolls-back-moved-ranks", 500),
    ("store", "keys-store-by-weights", 500),
    ("store", "rotates-store-namespace", 500),
    ("pd", "checks-transferred-kv-version", 400),
    ("pd", "holds-admission-across-versions", 400),
    ("pd", "drains-transfers-before-update", 400),
    ("router", "drains-serving-workers", 400),
    ("router", "drains-and-readds", 400),
    ("router", "updates-paused-rotation", 400),
]
"""Each correct design of a deployment, and the fewest states its search must pass."""


def explores_clean(name: str, setup: str, min_states: int) -> None:
    """Design ``name`` under the product explorer on deployment ``setup`` (``kvfence
    explore --deployment``) at depth 4 with the reference client: no violation, no error,
    the search complete and past its first steps (more than ``min_states`` states)."""
    x = explore_adapter(
        registry.engine(name),
        registry.client("reference"),
        depth=4,
        out_dir=None,
        setups=deployment(setup),
    )
    assert not x.error and not x.violation and not x.other, (x.error, x.violation, x.other)
    assert x.complete and x.depth_reached == 4 and x.setups == (setup,)
    assert x.states > min_states, x.states


@pytest.mark.parametrize("name", sorted(OPT_IN))
def test_a_deployment_is_opt_in(name):
    configs, feature = OPT_IN[name]
    (setup,) = deployment(name)
    assert setup not in SETUPS and setup.configs == configs
    assert all(feature(c) for c in setup.configs)
    assert not any(feature(c) for s in SETUPS for c in s.configs)


def test_every_deployment_is_here_and_an_unknown_one_is_named():
    assert set(DEPLOYMENTS) == set(OPT_IN) == {setup for setup, _, _ in DESIGNS}
    with pytest.raises(ValueError, match="unknown deployment 'mesh'; known: ranks"):
        deployment("mesh")


def test_every_correct_design_of_a_deployment_is_here():
    """A design whose engine has ranks, a store, roles or a router is explored on its
    deployment below (``reference-ranks``, the ranks deployment's own reference, too)."""
    of = {}
    for d in CATALOG:
        caps = registry.engine(d.name).capabilities if d.side == "engine" else ()
        shapes = [shape for cap, shape in SHAPES.items() if cap in caps]
        if shapes:
            of[d.name] = shapes[0]
    here = {name: setup for setup, name, _ in DESIGNS}
    assert of == {n: s for n, s in here.items() if n in of}, (of, here)
    assert set(here) - set(of) == {"reference-ranks"}


def test_deployment_rules_are_not_at_stake_on_a_plain_engine(out_dir):
    """One run of the reference engine on the default configs: the rules that bind only
    ranks, a store, roles or a router are N/A, never PASS."""
    engine, client = registry.engine("reference"), registry.client("reference")
    result = run_check(engine, client, out_dir=out_dir, max_examples=20, battery=False)
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    for rule in ("RNK-001", "STO-001", "PD-001", "RTR-001"):
        assert verdicts[rule] == "N/A", (rule, verdicts[rule])


@pytest.mark.parametrize(("setup", "name", "min_states"), DESIGNS)
def test_deployment_design_explores_clean(setup, name, min_states):
    explores_clean(name, setup, min_states)
