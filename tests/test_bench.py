"""``scripts/bench.py``: every figure asked for prints with its ratio against a baseline,
``--update-baseline`` writes one, and each target is judged from the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ----- the bench ---------------------------------------------------------------------------


def test_bench_runs_with_tiny_bounds(tmp_path):
    """A smoke test, not a timing: every figure asked for prints, with its ratio against a
    given baseline, and ``--update-baseline`` writes one."""
    base = tmp_path / "base.json"
    figures = {"explore-d4": {"states_per_s": 1.0, "seconds": 100.0}}
    base.write_text(json.dumps({"commit": "x", "figures": figures}))
    cmd = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--baseline"]
    cmd += [str(base), "--only", "explore-d4", "explore-60s", "vllm", "--update-baseline"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "explore-d4: " in proc.stdout and "states_per_s=" in proc.stdout
    assert "(x" in proc.stdout  # a ratio against the baseline
    assert "explore-60s: depth=" in proc.stdout and "vllm: " in proc.stdout
    written = json.loads(base.read_text())
    assert set(written["figures"]) == {"explore-d4", "explore-60s", "vllm"}


def _figures(explore_s: float, depth: int, product: float, kill_s: float, frac: float) -> dict:
    """Figures as ``bench.py`` writes them, with the values the targets read."""
    return {
        "explore-d6": {"seconds": explore_s, "states": 9, "transitions": 99},
        "explore-60s": {
            "depth": depth,
            "seconds": 50.0,
            "budget_seconds": 60.0,
            "depth_in_filed_time": depth,
        },
        "product": {"transitions_per_s": product},
        "kill": {
            "slowest_kill_seconds": kill_s,
            "slowest_mutant": "m",
            "seconds": 9.0,
            "mutants": 52,
        },
        "vllm": {"checker_fraction": frac, "wall_seconds": 100.0},
    }


def test_bench_judges_each_target_from_the_figures():
    """The targets block says MET only where the figure meets the target, gives the
    reason for one not met, and says "not measured" where a figure is missing."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    met = bench.targets(_figures(41.0, 8, 30_000.0, 0.5, 0.05))
    lines = [ln for ln in met if not ln.strip().startswith("why:")]
    assert len(lines) == 5 and all(ln.strip().startswith("MET") for ln in lines), lines
    text = "\n".join(bench.targets(_figures(61.0, 7, 24_999.0, 1.5, 0.2)))
    assert text.count("NOT MET") == 5 and "why: " in text
    assert "not measured" in "\n".join(bench.targets({"vllm": {"note": "no vLLM"}}))


def test_bench_prints_the_battery_figures(tmp_path):
    """``battery`` (its generation on a cold cache) and ``battery-kills`` (each mutant's
    first kill with the battery) print, with tiny bounds."""
    base = tmp_path / "base.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--baseline"]
    cmd += [str(base), "--only", "battery", "battery-kills"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "battery: seconds=" in proc.stdout and "scenarios=" in proc.stdout
    assert "battery-kills: mutants=3" in proc.stdout and "slowest_kill_seconds=" in proc.stdout


def test_bench_judges_the_battery_kill_target():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))

    def judged(slowest: float) -> str:
        kills = {"slowest_kill_seconds": slowest, "slowest_mutant": "m", "mutants": 62}
        battery = {"seconds": 61.0, "cpu_seconds": 58.0, "scenarios": 85}
        figures = {"battery-kills": kills, "battery": battery}
        return "\n".join(bench.targets(figures))

    assert "MET          every mutant's first kill with the battery" in judged(0.4)
    assert "NOT MET      every mutant's first kill with the battery" in judged(1.2)
    assert "battery generation (cold cache): 61.0 s (58.0 s of CPU) for 85" in judged(0.4)
