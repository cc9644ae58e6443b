"""Hypothesis strategies for what a run is made of: endpoint configs and client policies.

Every strategy shrinks towards the plainest case (radix on and reported, standard lane, no
tiers, mode ``auto``), so a counterexample carries only the features it needs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from ..model.capabilities import CONFIG_FEATURES, Capability
from ..model.client import REPORTS_WHEN_OFF, REPORTS_WHEN_ON
from ..model.state import Config, Policy
from ..model.vocabulary import CacheMode, Lane, PauseMode, Tier

C = Capability

TIERS = (
    frozenset({Tier.DEVICE}),
    frozenset({Tier.DEVICE, Tier.HOST}),
    frozenset({Tier.DEVICE, Tier.HOST, Tier.STORAGE}),
)


@st.composite
def configs(draw, capabilities: frozenset[str] = frozenset(), endpoints: int = 2):
    """``endpoints`` endpoint configs; features the adapter lacks are never drawn."""

    def feature(name: Capability) -> bool:
        assert name in CONFIG_FEATURES
        return name in capabilities and draw(st.booleans())

    out = []
    for _ in range(endpoints):
        radix = not draw(st.booleans())
        lane = Lane.EXACT if feature(C.EXACT_LANE) else Lane.STANDARD
        info = draw(st.sampled_from(REPORTS_WHEN_ON if radix else REPORTS_WHEN_OFF))
        fp8 = feature(C.FP8_KV)
        if fp8 and info is not None:
            info = tuple(sorted((*info, ("kv_cache_dtype", "fp8_e4m3"))))
        tiers = draw(st.sampled_from(TIERS)) if C.TIERS in capabilities else TIERS[0]
        out.append(
            Config(
                radix=radix,
                lane=lane,
                info=info,
                tiers=tiers,
                draft=feature(C.DRAFT),
                encoder=feature(C.ENCODER),
                fp8_kv=fp8,
                lora=feature(C.LORA),
                derived=feature(C.DERIVED),
            )
        )
    return tuple(out)


@lru_cache(maxsize=1 << 6)
def configs_for(capabilities: frozenset[str], endpoints: int = 2) -> st.SearchStrategy[Any]:
    """``configs(capabilities, endpoints)``, built once per argument: the same draws, without
    Hypothesis validating a new strategy at every example."""
    return configs(capabilities, endpoints)


policies = st.builds(
    Policy,
    mode=st.sampled_from(list(CacheMode)),
    flush_cache=st.sampled_from([None, True, False]),
    pause_mode=st.sampled_from([PauseMode.RETRACT, PauseMode.IN_PLACE, PauseMode.ABORT]),
)
"""Client policies: every ``cache_invalidation_mode``, explicit flag and pause mode."""
