"""No history in the code: the project's issue numbers, "appended" section markers, "spec
0.x" tags and "failed on main at <commit>" notes belong in CHANGELOG.md, not in code,
docstrings, comments, README, docs or what the CLI and the bench print (their strings are
in the code scanned here). A rule's source stays: the public report it mirrors, such as
"sgl-project/sglang PR #31937, issue #14158", names another project's tracker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MARKERS = {
    "the project's issue number": re.compile(r"\bissues? #?\d{1,3}\b|\(#\d{1,3}\)", re.I),
    "a session's turn": re.compile(r"\b(?:in|since|from|of) turn \d+\b", re.I),
    "an appended-section marker": re.compile(r"\bappended(?::| with\b)", re.I),
    "a commit the text was written against": re.compile(r"\bon main at [0-9a-f]{7}\b"),
}
"""What marks history. Public trackers have four-digit numbers and more, so an issue number of
one to three digits is this project's, unless the line names the tracker (``PUBLIC``)."""

PUBLIC = re.compile(r"\b[\w.-]+/[\w.-]+(?: (?:issue|PR|pull)s?)? ?#\d+", re.I)
"""Another project's tracker, named: ``sgl-project/rbg issue #22``, ``owner/repo#7``. Such a
citation is a public report's source, not history, however small its number."""

SPEC_TAG = re.compile(r"\bspec 0\.\d+\b(?! (?:trace|reader))", re.I)
"""A "spec 0.3" tag on code or README text; docs/ may name the versions traces are read by."""

SCANNED = ("model", "adapters", "conformance", "scripts", "src", "docs", "tests", ".ci")
SUFFIXES = {".py", ".md", ".sh", ""}
EXEMPT = {"tests/test_no_history.py", "CHANGELOG.md"}


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    for folder in SCANNED:
        for p in sorted((ROOT / folder).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and "overlays" not in p.parts:
                files.append(p)
    return [p for p in files if p.exists() and str(p.relative_to(ROOT)) not in EXEMPT]


def history(path: Path, text: str) -> list[str]:
    """``path:line: what: the line`` for every history marker in ``text``."""
    rel = path.relative_to(ROOT) if path.is_absolute() else path
    code = rel.suffix == ".py" or rel.parts[0] != "docs"
    found = []
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        public = PUBLIC.sub("", line)
        # a marker a line break splits ("(issue" / "12: ..."): the last word and the next
        # line's first word, read together
        following = lines[n].lstrip(" #").split()[:1] if n < len(lines) else []
        seam = PUBLIC.sub("", " ".join(line.split()[-1:] + following))
        for what, pattern in MARKERS.items():
            if pattern.search(public) or pattern.search(seam):
                found.append(f"{rel}:{n}: {what}: {line.strip()}")
        if code and SPEC_TAG.search(line):
            found.append(f"{rel}:{n}: a spec version tag: {line.strip()}")
    return found


def test_no_history_markers_in_code_docs_or_output():
    found = [hit for p in scanned_files() for hit in history(p, p.read_text(errors="replace"))]
    assert not found, "history belongs in CHANGELOG.md:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "# ----- version publishing (issue #10 item 3) -----",
        "Targets (issues 8 and 12): the explorer's default bounds",
        "print('targets (issue 12):')",
        "the kill by exhaustive search (#12)",
        "# ----- appended: PF-21, PF-22 -----",
        "# appended with shared/cases/more-faults.md",
        "added in turn 3",
        "(it failed on main at 1f24e52)",
        "# lifecycle and two-phase verbs (spec 0.3)",
        'its wall time split (issue\n    12: "checker overhead under 10%")',
        "# the fix of the bounds (issues\n# 8 and 12)",
    ],
)
def test_each_marker_is_caught(line):
    assert history(Path("model/x.py"), line), line


@pytest.mark.parametrize(
    "line",
    [
        "sgl-project/sglang PR #31937, issue #14158 (PF-20)",
        "verl-project/verl PR #7616; sgl-project/rbg issue #22 (PF-29)",
        "the drain of sgl-project/rbg#22",
        "        return 0",
        "``cmd`` running in its own process group, output appended to ``log_path``.",
        "with the partial output appended to the prompt when ``keep_partial``",
        'ServeRequest(0, "P", namespace=0),  # g1, turn 1, salted with v0',
        "SkyRL 0.3.0's RemoteInferenceClient",
    ],
)
def test_what_is_not_history_passes(line):
    assert not history(Path("model/x.py"), line), line


def test_docs_may_name_the_spec_versions_traces_are_read_by():
    line = "a trace of spec 0.2, whose `Sleep` has no tags, keeps its meaning"
    assert not history(Path("docs/traces.md"), line)
    assert history(Path("README.md"), line)
