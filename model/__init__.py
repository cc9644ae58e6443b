"""kvfence's executable specification: KV must never be reused across a weight update.

Read in this order: ``vocabulary`` (the words), ``state`` (what is remembered),
``actions`` (what can happen), ``client`` (what a sync asks), ``cache`` (what a prefix cache
may hold after each event), ``semantics`` (what each action may do: the next-state
relation), ``checks`` (invariants, comparisons, evidence), ``rules`` (the registry every
check cites), ``lifecycle`` (the phase table), ``candidates`` (the actions drawn within
bounds), ``properties`` (the always- and sometimes-properties by name), ``explore``
(exhaustive search within bounds, and the witnesses of the sometimes-properties).

Pure: standard library, attrs and transitions only. No I/O, clock, randomness or Hypothesis.
"""

from .actions import ACTION_TYPES, Action, TraceError, action_from_json
from .candidates import actions
from .checks import SpecError, Violation, check_served, check_state, compare
from .client import Plan, parse_bool, parse_radix, resolve_plan
from .observation import Observation, Outcome, Response, View
from .rules import BY_ID, RULES, Rule, rule
from .semantics import enabled, plan_for, step, sync_actions, view
from .state import Bounds, Config, Endpoint, Entry, Policy, State, Use, initial_state, server_info

SPEC_VERSION = "0.4"
"""Written into every trace; bumped whenever a rule's meaning or a trace field changes.
CHANGELOG.md says what each version changed and why."""

READABLE_SPECS = ("0.1", "0.2", "0.3", "0.4")
"""Spec versions whose traces this spec reads: 0.2 and 0.3 only added fields with defaults
(a 0.2 ``Sleep`` without tags releases everything, as it always did); 0.4 changed no field
but allows more (an entry of the weights in force may outlive a flush or a restart), so an
older trace replays under the wider bound: a step it failed for such an entry now passes."""

__all__ = [
    "ACTION_TYPES",
    "BY_ID",
    "READABLE_SPECS",
    "RULES",
    "SPEC_VERSION",
    "Action",
    "Bounds",
    "Config",
    "Endpoint",
    "Entry",
    "Observation",
    "Outcome",
    "Plan",
    "Policy",
    "Response",
    "Rule",
    "SpecError",
    "State",
    "TraceError",
    "Use",
    "View",
    "Violation",
    "action_from_json",
    "actions",
    "check_served",
    "check_state",
    "compare",
    "enabled",
    "initial_state",
    "parse_bool",
    "parse_radix",
    "plan_for",
    "resolve_plan",
    "rule",
    "server_info",
    "step",
    "sync_actions",
    "view",
]
