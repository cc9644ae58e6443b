"""The client half of the contract: SC-4..SC-8, for the spec's resolver and the reference
client (written independently), and for every client mutant's rule."""

from __future__ import annotations

import pytest

from kvfence.adapters.clients import CallableClient, ReferenceClient, load_callable_client
from kvfence.adapters.protocol import AdapterFailure
from kvfence.model.client import (
    off_in_booleans,
    parse_bool,
    parse_radix,
    plain_form,
    resolve_plan,
)
from kvfence.model.state import Policy
from kvfence.model.vocabulary import CacheMode, PauseMode

AUTO, FLUSH, NONE = CacheMode.AUTO, CacheMode.FLUSH, CacheMode.NONE
RETRACT, IN_PLACE, ABORT = PauseMode.RETRACT, PauseMode.IN_PLACE, PauseMode.ABORT

# SC-7: (server info, radix state it reports)
PARSING = [
    ({"radix_cache_enabled": True}, True),
    ({"radix_cache_enabled": False}, False),
    ({"radix_cache_enabled": "true"}, True),
    ({"radix_cache_enabled": " TRUE "}, True),
    ({"radix_cache_enabled": "0"}, False),
    ({"radix_cache_enabled": "off"}, False),
    ({"radix_cache_enabled": 1}, True),
    ({"radix_cache_enabled": 0}, False),
    ({"radix_cache_enabled": 2}, None),
    ({"radix_cache_enabled": "maybe"}, None),
    ({"radix_cache_enabled": None}, None),
    ({"radix_cache_enabled": [True]}, None),
    ({"disable_radix_cache": True}, False),
    ({"disable_radix_cache": "false"}, True),
    ({"disable_radix_cache": "on"}, False),
    ({"disable_radix_cache": "no"}, True),
    ({"radix_cache_enabled": True, "disable_radix_cache": True}, True),  # enabled wins
    ({"radix_cache_enabled": False, "disable_radix_cache": False}, False),
    ({"radix_cache_enabled": "?", "disable_radix_cache": "1"}, False),  # garbage falls back
    ({}, None),
    ({"other": 1}, None),
    (None, None),  # unreachable
    ("not a dict", None),
    ([("radix_cache_enabled", True)], None),
]


@pytest.mark.parametrize(("info", "radix"), PARSING)
def test_sc7_server_info_parsing(info, radix):
    assert parse_radix(info) is radix
    assert ReferenceClient().radix_enabled(info) is radix


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(True, True), ("yes", True), ("No", False), (1, True), (0, False), (1.0, None), ("", None)],
)
def test_parse_bool(value, parsed):
    assert parse_bool(value) is parsed


def both(policy: Policy, info):
    """The spec's plan and the reference client's, which must agree."""
    spec = resolve_plan(policy.mode, policy.flush_cache, policy.pause_mode, info)
    ref = ReferenceClient().resolve(policy, info)
    assert (ref.flush, ref.pause_mode) == (spec.flush, spec.pause_mode)
    return spec


def test_sc4_auto_flushes_when_radix_reported_on():
    plan = both(Policy(AUTO), {"radix_cache_enabled": True})
    assert plan.flush is True
    assert plan.rule_for("flush") == "CLI-001"


@pytest.mark.parametrize(
    "info", [{}, None, {"radix_cache_enabled": "maybe"}, {"disable_radix_cache": []}]
)
def test_sc5_auto_flushes_when_radix_unknown(info):
    plan = both(Policy(AUTO), info)
    assert plan.flush is True
    assert plan.rule_for("flush") == "CLI-002"


def test_auto_skips_when_radix_reported_off():
    plan = both(Policy(AUTO), {"disable_radix_cache": "true"})
    assert plan.flush is False
    assert plan.rule_for("flush") == "CLI-003"


@pytest.mark.parametrize(
    ("info", "plain"),
    [
        ({"radix_cache_enabled": True}, None),
        ({}, None),
        (None, None),
        ({"radix_cache_enabled": "maybe", "x": 2}, {"x": 2}),
        ({"radix_cache_enabled": None}, {}),
        ({"disable_radix_cache": "0"}, {"radix_cache_enabled": True}),
        ({"radix_cache_enabled": 1, "disable_radix_cache": True}, {"radix_cache_enabled": True}),
        ({"disable_radix_cache": 1, "x": 2}, {"x": 2, "radix_cache_enabled": False}),
    ],
)
def test_plain_form_of_a_report_that_needs_parsing(info, plain):
    assert plain_form(info) == plain


@pytest.mark.parametrize(
    ("info", "off"),
    [
        ({"radix_cache_enabled": False}, True),
        ({"disable_radix_cache": True}, True),
        ({"radix_cache_enabled": True, "disable_radix_cache": True}, False),
        ({"radix_cache_enabled": "false"}, False),
        ({"disable_radix_cache": "true"}, False),
        ({"disable_radix_cache": 1}, False),
        ({}, False),
        (None, False),
    ],
)
def test_off_in_booleans_reads_json_booleans_only(info, off):
    assert off_in_booleans(info) is off


@pytest.mark.parametrize("info", [{"radix_cache_enabled": False}, {}, None])
def test_flush_mode_always_flushes(info):
    assert both(Policy(FLUSH), info).flush is True
    assert both(Policy(AUTO, flush_cache=True), info).flush is True


@pytest.mark.parametrize("info", [{"radix_cache_enabled": True}, {}, None])
def test_sc6_none_mode_requests_no_flush(info):
    plan = both(Policy(NONE), info)
    assert plan.flush is False
    assert plan.rule_for("flush") == "CLI-005"
    # an explicit flush_cache=True still wins over the opt-out
    assert both(Policy(NONE, flush_cache=True), info).flush is True
    # an explicit False does not weaken auto's safety
    assert both(Policy(AUTO, flush_cache=False), {}).flush is True


@pytest.mark.parametrize("mode", [AUTO, FLUSH])
def test_sc8_in_place_upgraded_to_retract_when_flushing(mode):
    plan = both(Policy(mode, pause_mode=IN_PLACE), {"radix_cache_enabled": True})
    assert (plan.flush, plan.pause_mode) == (True, RETRACT)
    assert plan.rule_for("pause_mode") == "CLI-007"


@pytest.mark.parametrize("pause", [IN_PLACE, ABORT, RETRACT])
def test_pause_mode_kept_when_not_flushing(pause):
    plan = both(Policy(NONE, pause_mode=pause), {"radix_cache_enabled": True})
    assert plan.pause_mode is pause


def user_resolver(mode, flush_cache, pause_mode, server_info):
    """A resolver as users write it, for the plug-in test."""
    flush = mode == "flush" or (
        mode == "auto" and (server_info or {}).get("radix_cache_enabled") is not False
    )
    return {
        "flush": flush,
        "pause_mode": "retract" if flush and pause_mode == "in_place" else pause_mode,
    }


def test_callable_client_plugs_in():
    client = load_callable_client(f"{__name__}:user_resolver")
    plan = client.resolve(Policy(AUTO, pause_mode=IN_PLACE), {"radix_cache_enabled": True})
    assert (plan.flush, plan.pause_mode) == (True, RETRACT)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "expected 'package.module:function'"),
        ("kvfence_no_such_module:f", "cannot import"),
        (f"{__name__}:missing", "has no function"),
    ],
)
def test_callable_client_bad_spec(spec, message):
    with pytest.raises(ValueError, match=message):
        load_callable_client(spec)


@pytest.mark.parametrize(
    "answer", [None, 3, {"flush": "yes", "pause_mode": "retract"}, (True, "x")]
)
def test_callable_client_garbage_answer_is_adapter_failure(answer):
    client = CallableClient(lambda *a: answer, "garbage")
    with pytest.raises(AdapterFailure):
        client.resolve(Policy(), {})
