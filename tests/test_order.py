"""The model's stable order: the same candidate states sort alike in every process, so a
failing step with several model branches names the same rule whatever ``PYTHONHASHSEED``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.conformance.explore import explore_adapter
from kvfence.model.order import ordered, stable_key
from kvfence.model.state import Config, initial_state
from kvfence.model.vocabulary import Lane, Tier

SEEDS = ("1", "2", "3", "4", "5", "6")
"""Hash seeds under which one program must answer alike: string hashes differ in each."""


def _under_seeds(code: str) -> set[str]:
    """What ``code`` prints under each of ``SEEDS`` (a fresh interpreter each)."""
    outs = set()
    for seed in SEEDS:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(run.stdout.strip())
    return outs


def test_keys_compare_across_kinds_and_equal_values_get_equal_keys():
    values = [None, True, 3, "P", Lane.EXACT, (1, "a"), frozenset({"b", "a"})]
    assert sorted(values, key=stable_key)  # any two keys compare
    assert stable_key(frozenset({"a", "b"})) == stable_key(frozenset({"b", "a"}))
    one = Config(radix=True, lane=Lane.EXACT, tiers=frozenset({Tier.DEVICE, Tier.HOST}))
    two = Config(radix=True, lane=Lane.EXACT, tiers=frozenset({Tier.HOST, Tier.DEVICE}))
    assert stable_key(initial_state((one,))) == stable_key(initial_state((two,)))
    assert stable_key(one) != stable_key(Config(radix=False))


def test_a_value_of_no_known_kind_is_a_type_error():
    with pytest.raises(TypeError, match="no order for dict"):
        stable_key({"a": 1})


def test_the_order_of_a_set_of_strings_is_the_same_in_every_process():
    code = (
        "from kvfence.model.order import ordered\n"
        "print(ordered(frozenset(['P', 'Q', 'R', 'r1', 'r2', 'S'])))"
    )
    assert len(_under_seeds(code)) == 1
    assert ordered(["b", "a"]) == ["a", "b"]


def test_a_failing_step_with_two_model_branches_names_one_rule_in_every_process(tmp_path):
    """A bucketed update fails midway and the endpoint then serves: replayed from its record
    alone with no probe claimed, the model keeps two branches (weights intact, or torn),
    neither agrees with the serve, and the reported explanation is the first branch in
    ``stable_key`` order, the same under every hash seed."""
    x = explore_adapter(
        registry.engine("bucket-failure-keeps-serving"),
        registry.client("reference"),
        depth=2,
        out_dir=tmp_path,
        focus="FC-004",
    )
    assert x.counterexample is not None
    lines = Path(x.counterexample).read_text().splitlines()
    head = json.loads(lines[0])
    del head["capabilities"]  # no weights probe claimed: the two branches stay open
    bare = tmp_path / "bare.jsonl"
    bare.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    code = (
        "from kvfence.conformance.replay import replay_trace\n"
        "from kvfence.conformance.trace import read_trace\n"
        f"r = replay_trace(read_trace({str(bare)!r}), None, None)\n"
        "print(r.kind, sorted({v.rule for v in r.violations}))"
    )
    outs = _under_seeds(code)
    assert len(outs) == 1, outs
    assert "FAIL" in next(iter(outs))
