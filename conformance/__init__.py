"""kvfence.conformance: hold a system under test to the spec.

``run_check(engine, client)`` runs the stateful machine and returns a ``Result`` with a
verdict per rule and, on failure, a minimal JSONL counterexample; ``build_machine`` gives
the Hypothesis ``RuleBasedStateMachine`` itself, to run inside your own test suite. The
``kvfence`` CLI (``cli.py``) and the pytest plugin (``plugin.py``) are built on these.
"""

from .machine import KvfenceMachine, build_machine
from .runner import Result, run_check

__all__ = ["KvfenceMachine", "Result", "build_machine", "run_check"]
