"""Findings are named after the mechanism that failed, not the config they were found on:
an update that never flushed is ENG-001/ENG-002 on an encoder config too (the encoder
outputs an update drops anyway are no sign of a partial flush), and shrinking keeps the
first violated rule while dropping the config features it does not need."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.conformance.replay import replay_actions, shrink
from kvfence.model.actions import ServeRequest, UpdateWeights
from kvfence.model.rules import RuleId
from kvfence.model.state import Config, Policy
from kvfence.model.vocabulary import CacheMode, Funnel, Lane

OPT_OUT = Policy(mode=CacheMode.NONE)


def _never_flushes(config: Config, flush_cache: bool):
    actions = [
        ServeRequest(0, "P"),
        UpdateWeights(0, 1, Funnel.TENSOR, flush_cache),
        ServeRequest(0, "P"),
    ]
    engine, client = registry.engine("update-never-flushes"), registry.client("reference")
    return engine, client, replay_actions(engine, client, (config,), OPT_OUT, actions)


@pytest.mark.parametrize(
    ("lane", "flush_cache", "rule"),
    [(Lane.EXACT, False, RuleId.ENG_001), (Lane.STANDARD, True, RuleId.ENG_002)],
    ids=["guard", "asked"],
)
def test_an_unflushed_update_on_an_encoder_config_is_named_by_its_flush_rule(
    lane, flush_cache, rule
):
    _, _, r = _never_flushes(Config(encoder=True, lane=lane), flush_cache)
    assert r.kind == "FAIL" and [v.rule for v in r.violations] == [rule]


def test_shrinking_drops_the_encoder_and_keeps_the_rule():
    engine, client, found = _never_flushes(Config(encoder=True, lane=Lane.EXACT), False)
    best = shrink(engine, client, found.run, {RuleId.ENG_001}, True)
    assert best is not None and [v.rule for v in best.hard] == [RuleId.ENG_001]
    assert [c.encoder for c in best.run.configs] == [False]
