"""Every command the README, CONTRIBUTING.md and docs/ show in a code block runs.

A command is read from a fenced block (a ``$ `` prompt, ``.venv/bin/`` and a trailing ``#``
comment or ``&`` dropped, ``\\``-continued lines joined, ``&&`` chains split). Each page's
``kvfence`` commands run in page order in one working directory of their own, so a
``replay`` finds the counterexample an earlier command on the page wrote; a placeholder
(``TRACE``) is a counterexample written for it. A command fails here when the CLI refuses
it (a renamed flag, exit 3), when it raises, or when it exits with a code its kind does not
have. A command that needs what this machine may not have (a real engine, a server at a
URL, the reader's own module) or that another job runs whole is still parsed, and its
reason is listed in ``NOT_RUN_HERE``: a command that fits none of these is run.
"""

from __future__ import annotations

import glob
import importlib.util
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from attrs import frozen

from kvfence.adapters.designs import BY_NAME as DESIGNS_BY_NAME
from kvfence.conformance.cli import COMMANDS, build_parser, main
from kvfence.conformance.matrix import select

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    "CONTRIBUTING.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.M | re.S)
COMMAND = re.compile(r"^(kvfence|pytest|python|bash)\b")
SUBCOMMANDS = set(COMMANDS)

NOT_RUN_HERE = {
    "real engine": "a real engine (vLLM, SGLang, a fork's overlay): tests/vllm, tests/sglang "
    "and scripts/setup.sh run them where they are installed",
    "server": "a running server at a URL (an attach recipe: docs/engines.md; a shared fuzz "
    "database: tests/test_fuzz_database.py starts a redis-server for it)",
    "reader's code": "the reader's own module or script",
    "whole matrices": "scripts/setup.sh (README command 1) runs the whole matrices",
    "pass-matrix row": "a whole check of a catalogued design at ci, which is its row of the "
    "pass matrix: the main job runs it and tests/test_designs.py::test_design_passes_at_ci "
    "reads the row; test_kvfence_mutants_shows_both_matrices runs `mutants --only` with a "
    "design",
    "default explore": "about a minute on 2 cores: scripts/bench.py's explore-d6 figure is "
    "this search, and tests/test_explore.py pins its state counts",
}


@frozen
class Command:
    page: str
    line: int
    text: str

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _clean(line: str) -> str:
    line = line.strip().removeprefix("$ ").strip()
    line = re.sub(r"^\.venv/bin/", "", line)
    line = re.sub(r"\s+#.*$", "", line)  # a trailing comment
    line = re.sub(r"\s*&$", "", line)  # run in the background
    return re.sub(r"\s*\[[^\]]*\]", "", line).strip()  # an optional [--flag VALUE]


def documented(page: str) -> list[Command]:
    """The commands of ``page``'s code blocks, in page order."""
    text = (ROOT / page).read_text()
    found = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start("body")) + 1
        body = block.group("body").replace("\\\n", " ")
        for offset, raw in enumerate(body.splitlines()):
            for part in _clean(raw).split(" && "):
                part = _clean(part)
                words = part.split()
                if not COMMAND.match(part) or (len(words) < 2 and words[0] != "pytest"):
                    continue
                if words[0] == "kvfence" and words[1] not in SUBCOMMANDS:
                    continue  # output (``kvfence check: engine=...``), not a command
                found.append(Command(page, first + offset, part))
    return found


def not_run_here(argv: list[str]) -> str | None:
    """Why a command is parsed but not run here, or ``None``: it runs."""
    if argv[0] != "kvfence":
        return None
    words = " ".join(argv)
    engine = argv[argv.index("--engine") + 1] if "--engine" in argv else ""
    if "--url" in argv or any(a.startswith("redis://") for a in argv):
        return "server"
    if engine.split("@")[0] in ("vllm", "sglang", "vllm-lora", "vllm-rl") or "--overlay" in argv:
        return "real engine"
    if re.search(r"\bmy_\w+", words):
        return "reader's code"
    if argv[1] == "mutants" and "--only" not in argv:
        return "whole matrices"
    if _checks_a_design(argv):
        return "pass-matrix row"
    if argv[1] == "explore" and len(argv) == 2:
        return "default explore"
    return None


def _checks_a_design(argv: list[str]) -> bool:
    """``kvfence check`` of one catalogued design with no option but ``--engine``/``--client``
    and ``--out``, or ``kvfence mutants --only`` naming a design: the pass matrix's run."""
    if argv[1] == "mutants":
        designs, _, _ = select(argv[argv.index("--only") + 1 :])
        return bool(designs)
    if argv[1] != "check":
        return False
    options = dict(zip(argv[2::2], argv[3::2], strict=False))
    if len(argv) % 2 or set(options) - {"--engine", "--client", "--out"}:
        return False
    systems = {options.get("--engine", "reference"), options.get("--client", "reference")}
    return bool(systems & set(DESIGNS_BY_NAME)) and systems <= {"reference", *DESIGNS_BY_NAME}


EXITS = {
    "check": {0, 1},
    "replay": {0, 1},
    "mutants": {0, 1},
    "explore": {0, 1},
    "rules": {0},
    "engines": {0},
    "tiny-model": {0},
    "serve": {0, 2},
    "diagram": {0},
}
"""The exit codes a documented command may end with: a check of a broken system FAILs
(1) by design; a usage error (3) or an ERROR/UNKNOWN (2) is never what a page means."""


def _placeholders(argv: list[str], here: Path) -> list[str]:
    """``argv`` with ``TRACE`` a counterexample written for it and globs expanded in
    ``here``."""
    out = []
    for word in argv:
        if word == "TRACE":
            main(["check", "--client", "never-flush", "--out", str(here / "trace"), "-q"])
            word = str(next((here / "trace").glob("counterexample-*.jsonl")))
        matches = sorted(glob.glob(str(here / word))) if any(c in word for c in "*?") else []
        out.extend([str(Path(m).relative_to(here)) for m in matches] or [word])
    return out


def _run_serve(command: Command, here: Path) -> None:
    """``kvfence serve`` runs until stopped: started (on a free port, not the page's), it
    announces its address; SIGTERM stops it with its verdict (no traffic: UNKNOWN, 2)."""
    argv = command.argv
    if "--port" in argv:
        argv[argv.index("--port") + 1] = "0"
    cli = [sys.executable, "-m", "kvfence.conformance.cli", *argv[1:]]
    proc = subprocess.Popen(
        cli, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "http://127.0.0.1:" in first, f"{command}: {first}"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (0, 2) and "verdict:" in out, f"{command}: {proc.returncode}\n{out}"


def _run_other(command: Command) -> None:
    """A command that is not ``kvfence``: its script or module exists and is well formed;
    a pytest command selects tests."""
    argv = command.argv
    if argv[0] == "bash":
        script = ROOT / argv[1]
        assert script.is_file(), f"{command}: no {argv[1]}"
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{command}: {syntax.stderr}"
    elif argv[0] == "python" and argv[1] == "-m":
        assert importlib.util.find_spec(argv[2]), f"{command}: no module {argv[2]}"
    elif argv[0] == "python":
        assert re.match(r"my_\w+", Path(argv[1]).name) or (ROOT / argv[1]).is_file(), command
    elif argv[0] == "pytest":
        collect = [sys.executable, "-m", "pytest", *argv[1:], "--collect-only", "-q", "-n", "0"]
        done = subprocess.run(collect, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert re.search(r"\b[1-9]\d* tests? collected", done.stdout), (str(command), done.stdout)


def test_the_pages_show_commands():
    """The reader sees the two set-up commands and the tour; the extraction finds them."""
    readme = [c.text for c in documented("README.md")]
    assert readme[:2] == ["bash scripts/setup.sh", "pytest"], readme
    assert any(t.startswith("kvfence replay ") for t in readme), readme
    assert len([c for p in PAGES for c in documented(p)]) >= 40


def test_every_kvfence_command_parses():
    for page in PAGES:
        for command in documented(page):
            if command.argv[0] == "kvfence":
                try:
                    build_parser().parse_args(command.argv[1:])
                except SystemExit as e:
                    pytest.fail(f"{command}: the CLI refuses it (exit {e.code})")


def test_what_is_not_run_here_has_a_reason_and_the_rest_runs():
    reasons = {not_run_here(c.argv) for p in PAGES for c in documented(p)} - {None}
    assert reasons <= set(NOT_RUN_HERE), reasons - set(NOT_RUN_HERE)
    assert not_run_here(shlex.split("kvfence check --client never-flush")) is None
    assert not_run_here(shlex.split("kvfence mutants --only never-flush")) is None
    design = "kvfence check --engine version-keyed-cache"
    assert not_run_here(shlex.split(design)) == "pass-matrix row"
    assert not_run_here(shlex.split(design + " --max-examples 50")) is None
    assert not_run_here(shlex.split("kvfence mutants --only CD-03 never-flush")) == (
        "pass-matrix row"
    )


@pytest.mark.parametrize("page", [p for p in PAGES if documented(p)])
def test_every_command_on_the_page_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    for command in documented(page):
        argv = command.argv
        if argv[0] != "kvfence":
            _run_other(command)
            continue
        if not_run_here(argv):
            continue
        if argv[1] == "serve":
            _run_serve(command, tmp_path)
            continue
        try:
            code = main(_placeholders(argv, tmp_path)[1:])
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        assert code in EXITS[argv[1]], f"{command}: exit {code}\n{out.out[-3000:]}{out.err[-2000:]}"
