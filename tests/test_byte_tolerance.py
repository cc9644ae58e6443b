"""The byte oracle compares within the logprob tolerance an adapter declares for its
engine's numerics: float noise on the prefix-hit path is never stale reuse, a stale hit
still is."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.mutants import UpdateNeverFlushes
from kvfence.adapters.protocol import tolerance
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.adapters.vllm_engine import HTTP_CAPABILITIES
from kvfence.conformance.runner import run_check
from kvfence.model.checks import same_output
from kvfence.model.rules import RuleId

NOISE = 1e-7


class NoisyHitPath(ReferenceEndpoint):
    """A correct engine whose outputs are ``(token_ids, logprobs)`` and whose prefix-hit
    path adds float noise to the logprobs (a different kernel or batch)."""

    def _numerics(self, prefix, uses, hit):
        base = repr(super()._numerics(prefix, uses, hit))
        seed = sum(ord(ch) * (i + 1) for i, ch in enumerate(base))
        ids = tuple((seed * (i + 7)) % 50257 for i in range(4))
        lps = tuple(-1.0 - ((seed + 13 * i) % 97) / 100 for i in range(4))
        return (ids, tuple(x + NOISE for x in lps) if hit else lps)


class NoisyNeverFlushes(NoisyHitPath, UpdateNeverFlushes):
    """The same numerics on an engine whose update never flushes: stale hits."""


def adapter(cls, declared):
    engine = InProcessAdapter(cls, cls.__name__)
    engine.capabilities = frozenset(HTTP_CAPABILITIES)  # what the HTTP vLLM adapter sees
    if declared is not None:
        engine.logprob_tolerance = declared
    return engine


def test_same_output_within_tolerance():
    a = ((1, 2), (-1.0, -2.0))
    assert same_output(a, ((1, 2), (-1.0 + NOISE, -2.0)), 1e-5)
    assert not same_output(a, ((1, 2), (-1.0 + NOISE, -2.0)))  # exact by default
    assert not same_output(a, ((1, 3), (-1.0, -2.0)), 1e-5)  # another token
    assert not same_output(a, ((1, 2), (-1.1, -2.0)), 1e-5)


@pytest.mark.parametrize("bad", [-1.0, "1e-5", float("nan"), True])
def test_a_bad_tolerance_is_named(bad):
    class Engine:
        logprob_tolerance = bad

    with pytest.raises(ValueError, match="logprob_tolerance"):
        tolerance(Engine())


def test_noise_is_never_stale_reuse_under_the_declared_tolerance(out_dir):
    result = run_check(
        adapter(NoisyHitPath, 1e-5), registry.client("reference"), max_examples=40, out_dir=out_dir
    )
    assert RuleId.INV_001 not in {v.rule for v in result.violations}, result.violations
    assert result.verdict != "FAIL"


def test_without_a_declared_tolerance_the_oracle_is_exact(out_dir):
    result = run_check(
        adapter(NoisyHitPath, None),
        registry.client("reference"),
        max_examples=40,
        out_dir=out_dir,
        focus=RuleId.INV_001,
    )
    assert result.verdict == "FAIL"
    assert RuleId.INV_001 in {v.rule for v in result.violations}


def test_a_stale_hit_is_still_caught_under_the_tolerance(out_dir):
    result = run_check(
        adapter(NoisyNeverFlushes, 1e-5),
        registry.client("never-flush"),
        max_examples=60,
        out_dir=out_dir,
        focus=RuleId.INV_001,
    )
    assert result.verdict == "FAIL"
    assert RuleId.INV_001 in {v.rule for v in result.violations}
