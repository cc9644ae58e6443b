"""The README's outputs are real: each block after ``<!-- output: ARGS -->`` is what
``kvfence ARGS`` prints at 80 columns, compared on every run (times, rates and the
counterexample's file name aside). ``KVFENCE_REGENERATE_README=1`` rewrites them."""

from __future__ import annotations

import glob
import os
import re
import shlex
from pathlib import Path

from kvfence.conformance.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- output: (?P<args>[^>]*?) -->\n```\n(?P<text>.*?)```\n", re.S)
VARYING = [
    (re.compile(r"\d{8}T\d{6}Z-\d+"), "<time>-<pid>"),
    (re.compile(r"\d+(\.\d+)? s\b"), "<t> s"),
    (re.compile(r"checker share \d+(\.\d+)?%"), "checker share <p>%"),
]


def _same(text: str) -> str:
    """``text`` with what varies between runs replaced, its whitespace as single spaces
    (a longer number may move a line break)."""
    text = " ".join(text.split())
    for pattern, word in VARYING:
        text = pattern.sub(word, text)
    return text


def _run(args: str, capsys) -> str:
    argv = [w for word in shlex.split(args) for w in (sorted(glob.glob(word)) or [word])]
    main(argv)
    return capsys.readouterr().out


def test_readme_outputs_are_what_the_commands_print(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    readme = README.read_text()
    blocks = list(BLOCK.finditer(readme))
    assert len(blocks) == 3, "the README shows three commands with their outputs"
    fresh = {m.group("args"): _run(m.group("args"), capsys) for m in blocks}
    if os.environ.get("KVFENCE_REGENERATE_README"):
        README.write_text(
            BLOCK.sub(
                lambda m: f"<!-- output: {m['args']} -->\n```\n{fresh[m['args']]}```\n", readme
            )
        )
        return
    for m in blocks:
        got = fresh[m.group("args")]
        assert _same(m.group("text")) == _same(got), (
            f"README output of `kvfence {m.group('args')}` is stale; regenerate with "
            f"KVFENCE_REGENERATE_README=1. Now:\n{got}"
        )


def test_readme_is_a_first_page():
    text = README.read_text()
    assert len(text.encode()) <= 10 * 1024
    assert "bash scripts/setup.sh" in text and ".venv/bin/pytest" in text
    assert not re.search(r"\bissue \d+", text, re.I)
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / link).exists() or link == "CONTRIBUTING.md", link
