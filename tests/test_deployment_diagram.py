"""``kvfence diagram --deployment NAME``: each deployment drawn from the setup the explorer
searches, with the parts its configs have and the rules on each edge, and docs/deployments.md
showing what the command prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvfence.conformance.cli import main
from kvfence.conformance.explore import DEPLOYMENTS, deployment_diagram
from kvfence.model.vocabulary import Role

DOC = Path(__file__).resolve().parents[1] / "docs" / "deployments.md"


def _edges(text: str) -> list[tuple[str, str, str]]:
    """(from, label, to) of every labelled edge."""
    return re.findall(r"^  (\w+)(?:\(\[.*?\]\))? <?-->\|(.*?)\| (\w+)$", text, re.M)


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_endpoint_is_drawn_with_the_trainers_calls_and_the_rules(name):
    text = deployment_diagram(name)
    (setup,) = DEPLOYMENTS[name]
    edges = _edges(text)
    for i, _ in enumerate(setup.configs):
        assert f'  ep{i}["endpoint {i}' in text, (name, i)
        assert any(a == "trainer" and b == f"ep{i}" for a, _, b in edges), (name, i)
    feature_edges = [label for a, label, b in edges if a != "trainer" and a != "requests"]
    assert feature_edges, name
    for label in feature_edges:
        assert all(rule in label for rule in setup.rules), (name, label)


def test_ranks_are_nodes_of_their_own_and_get_the_fan_out():
    text = deployment_diagram("ranks")
    (setup,) = DEPLOYMENTS["ranks"]
    ranks = setup.configs[0].ranks
    assert ranks > 1
    assert len(re.findall(r'^  ep0r\d+\["rank', text, re.M)) == ranks
    fanned = {b for a, label, b in _edges(text) if a == "ep0" and "fan-out" in label}
    assert fanned == {f"ep0r{k}" for k in range(ranks)}


def test_pd_transfers_kv_from_prefill_to_decode_and_requests_go_to_decode():
    text = deployment_diagram("pd")
    (setup,) = DEPLOYMENTS["pd"]
    p = next(i for i, c in enumerate(setup.configs) if c.role is Role.PREFILL)
    d = next(i for i, c in enumerate(setup.configs) if c.role is Role.DECODE)
    assert any(
        (a, b) == (f"ep{p}", f"ep{d}") and "KV transfer" in label for a, label, b in _edges(text)
    )
    assert f"--> ep{d}" in text and f'requests(["requests"]) --> ep{p}' not in text


def test_the_router_sends_traffic_to_every_worker_and_the_store_reaches_every_endpoint():
    routed = {b for a, _, b in _edges(deployment_diagram("router")) if a == "router"}
    (setup,) = DEPLOYMENTS["router"]
    assert routed == {f"ep{i}" for i, c in enumerate(setup.configs) if c.router}
    stored = {a for a, _, b in _edges(deployment_diagram("store")) if b == "store"}
    (setup,) = DEPLOYMENTS["store"]
    assert stored == {f"ep{i}" for i, c in enumerate(setup.configs) if c.store}


def test_an_unknown_deployment_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known: ranks"):
        deployment_diagram("mesh")


def test_the_doc_shows_what_the_command_prints(capsys):
    doc = DOC.read_text()
    for name in sorted(DEPLOYMENTS):
        assert main(["diagram", "--deployment", name]) == 0
        printed = capsys.readouterr().out.rstrip("\n")
        block = f"`kvfence diagram --deployment {name}`:\n\n```mermaid\n{printed}\n```"
        assert block in doc, f"docs/deployments.md: regenerate the {name} diagram"
