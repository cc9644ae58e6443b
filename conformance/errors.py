"""The ways a conformance run ends other than PASS, as exceptions.

``ConformanceFailure``: the system under test broke a rule (FAIL). ``AdapterError``: the
system or its adapter could not answer (ERROR, ADP-001/ADP-002). ``Refused``: the client
under test raised for one configuration. ``Diverged``: a focused run broke other rules
only. ``NotEnabled``: a recorded action the model does not enable at its turn.
"""

from __future__ import annotations

from ..model.checks import Violation


class ConformanceFailure(AssertionError):
    """The SUT did something the spec forbids. ``violations`` name the rules."""

    def __init__(self, violations: list[Violation], step: int) -> None:
        self.violations = violations
        self.step = step
        super().__init__("; ".join(str(v) for v in violations))


class AdapterError(Exception):
    """The SUT or its adapter could not answer (crash, hang, malformed observation).
    ``raised``: the adapter call raised an ``Exception`` of its own (not a hang, not an
    ``AdapterFailure`` or malformed answer): for a client resolver that is a refusal the
    checker can judge."""

    def __init__(self, rule: str, message: str, raised: bool = False) -> None:
        self.rule = rule
        self.raised = raised
        super().__init__(f"{rule}: {message}")


class Refused(Exception):
    """The client under test raised instead of answering for one configuration: the
    refusal is recorded (``Recorder.refused``) and the example set aside, so the run goes on
    to judge the client on the others."""

    def __init__(self, violation: Violation) -> None:
        self.violation = violation
        super().__init__(str(violation))


class Diverged(Exception):
    """The SUT broke rules other than the one a focused run is after: this run ends
    without a verdict, and the search goes on (``Lockstep.focus``)."""


class BeyondModel(Exception):
    """A client program called what the deployment under check has no model of
    (``semantics.modelled``: a two-phase update on an endpoint attached to the shared KV
    store): the spec neither allows nor forbids it, so the example says nothing about the
    client. The search sets it aside; the battery skips the scenario, naming the call."""


class NotEnabled(Exception):
    """A recorded action the model does not enable at its turn (replay and shrinking)."""
