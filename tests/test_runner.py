"""A derandomized check draws the same examples in any process.

Hypothesis mixes literals of the *local* modules loaded so far into its draws, so without
``runner.no_local_constants`` the same ``ci`` check drew different examples in the CLI, in
a pytest run and in a matrix pool worker (each loads other modules): a correct design was
UNKNOWN in one and PASS in another. Each test loads a new local module full of integer
literals in the range an action draw may take, between two checks of the reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
from pathlib import Path

from kvfence.adapters import registry
from kvfence.conformance import runner


def _fingerprint(out: Path) -> tuple[int, str]:
    """What a short ci check's random search of the reference drew: its examples, and a
    digest of every rule's evidence count (the battery, which draws nothing, is off so that
    the whole budget is the search's)."""
    result = runner.run_check(
        registry.engine("reference"),
        registry.client("reference"),
        "ci",
        out_dir=out,
        max_examples=100,
        battery=False,
    )
    evidence = repr([(r.rule.id, r.evidence) for r in result.rules]).encode()
    return result.examples, hashlib.sha256(evidence).hexdigest()


def _load_constants(folder: Path, name: str, monkeypatch) -> None:
    """Import a new local module ``name`` holding the integers 100..199 (an action draw
    over a pool of more than 100 actions may take them)."""
    (folder / f"{name}.py").write_text("N = (" + ", ".join(str(i) for i in range(100, 200)) + ")\n")
    monkeypatch.syspath_prepend(str(folder))
    importlib.import_module(name)


def test_a_ci_check_draws_the_same_examples_whatever_modules_are_loaded(tmp_path, monkeypatch):
    before = _fingerprint(tmp_path / "before")
    _load_constants(tmp_path, "kvfence_probe_constants_a", monkeypatch)
    assert _fingerprint(tmp_path / "after") == before


def test_without_the_guard_the_draw_depends_on_the_modules_loaded(tmp_path, monkeypatch):
    """Shows the test above can fail: with a module of such literals loaded, the same check
    draws other examples once the guard is off. If this fails after a Hypothesis upgrade,
    the draw no longer reads local modules and ``no_local_constants`` can go."""
    _load_constants(tmp_path, "kvfence_probe_constants_b", monkeypatch)
    guarded = _fingerprint(tmp_path / "guarded")
    monkeypatch.setattr(runner, "no_local_constants", contextlib.nullcontext)
    assert _fingerprint(tmp_path / "unguarded") != guarded
