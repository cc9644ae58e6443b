"""``kvfence serve`` behind a deployment: an endpoint of data-parallel ranks (``--ranks N``)
and a prefill/decode pair (``--pd``), judged on the deployment rules (RNK-001..003, PD-001,
FC-005).

Each test starts ``kvfence serve`` as a subprocess and drives it with httpx as a trainer
drives SGLang: its rollouts place requests on a rank (``routed_dp_rank``) or send them to
the decode server, its sync pauses, updates and resumes each server. The same trainer runs
against the reference deployment (PASS) and against a mutant of the deployment's catalog
(FAIL, by the rule of its mechanism); a session's trace replays to the same verdict.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kvfence.conformance.serve import Session, default_engine

KVFENCE = [sys.executable, "-m", "kvfence.conformance.cli"]

GENERATE = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}}
OTHER = {"text": "Two plus two is", "sampling_params": {"max_new_tokens": 4}}


class Deployment:
    """A running ``kvfence serve`` of a deployment: ``http`` (the endpoint, or the prefill
    server of a P/D pair), ``decode`` (the decode server of a P/D pair), ``out``."""

    def __init__(self, proc: subprocess.Popen, urls: list[str], out: Path) -> None:
        self.proc, self.out = proc, out
        self.clients = [httpx.Client(base_url=u, timeout=30.0, trust_env=False) for u in urls]
        self.http = self.clients[0]
        self.decode = self.clients[-1]
        self.stdout = ""
        #: The status of the trainer's ``/flush_cache`` while a request ran.
        self.flush: int | None = None

    def verdict(self) -> dict:
        return self.http.get("/kvfence/verdict").json()

    def stop(self) -> int:
        """SIGTERM, as a CI job ends a background server; the exit code."""
        for c in self.clients:
            c.close()
        self.proc.send_signal(signal.SIGTERM)
        self.stdout, _ = self.proc.communicate(timeout=60)
        return self.proc.returncode


@contextmanager
def serve(tmp_path: Path, *flags: str) -> Iterator[Deployment]:
    out = tmp_path / "out"
    cmd = [*KVFENCE, "serve", "--api", "sglang", "--port", "0", "--out", str(out), *flags]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        urls = re.findall(r"http://127\.0\.0\.1:\d+", first)
        assert urls, f"kvfence serve did not announce its port(s): {first!r}"
        yield Deployment(proc, urls, out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def rules(verdict: dict) -> dict[str, str]:
    return {r["id"]: r["verdict"] for r in verdict["rules"]}


def evidence(verdict: dict, rule: str) -> int:
    return next(r["evidence"] for r in verdict["rules"] if r["id"] == rule)


def failed(verdict: dict) -> set[str]:
    return {r["id"] for r in verdict["rules"] if r["verdict"] == "FAIL"}


def replays(trace: Path, expect: int) -> None:
    """``kvfence replay TRACE``, against the engine and against the spec alone, exits
    ``expect``."""
    for extra in ((), ("--model-only",)):
        r = subprocess.run(
            [*KVFENCE, "replay", str(trace), *extra], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == expect, r.stdout + r.stderr


def generate(http: httpx.Client, rank: int | None = None, body: dict = GENERATE) -> int:
    """One rollout request, placed on ``rank`` (SGLang's ``routed_dp_rank``); its status."""
    if rank is not None:
        body = {**body, "routed_dp_rank": rank}
    return http.post("/generate", json=body).status_code


def update(http: httpx.Client, retries: int = 0, **fields: object) -> list[int]:
    """``/update_weights_from_disk``, retried up to ``retries`` times while refused (as a
    trainer that retries a failed sync does); each answer's status."""
    statuses = []
    for _ in range(retries + 1):
        r = http.post("/update_weights_from_disk", json={"model_path": "/ckpt/step-1", **fields})
        statuses.append(r.status_code)
        if r.status_code == 200:
            break
    return statuses


def sync(http: httpx.Client, retries: int = 0) -> list[int]:
    """A trainer's sync of one server: pause, update (retried), continue."""
    assert http.post("/pause_generation", json={"mode": "abort"}).status_code == 200
    statuses = update(http, retries)
    assert http.post("/continue_generation", json={}).status_code == 200
    return statuses


# ----- data-parallel ranks behind one endpoint: --ranks N ----------------------------------


def flush_while_rank_one_runs(d: Deployment) -> None:
    """Rollouts on both ranks; a stream runs on rank 1 when the trainer flushes (rank 1
    must refuse); the trainer then aborts it, syncs with a flush and rolls out again."""
    assert generate(d.http, 0) == 200
    assert generate(d.http, 1) == 200
    body = {**OTHER, "stream": True, "routed_dp_rank": 1}
    with d.http.stream("POST", "/generate", json=body) as running:
        assert running.status_code == 200
        lines = running.iter_lines()  # kept: a closed reader would close the connection
        next(lines)  # admitted: it holds its KV on rank 1
        d.flush = d.http.post("/flush_cache").status_code
        assert d.http.post("/pause_generation", json={"mode": "abort"}).status_code == 200
    assert update(d.http, flush_cache=True) == [200]
    assert d.http.post("/continue_generation", json={}).status_code == 200
    assert generate(d.http, 0) == 200
    assert generate(d.http, 1) == 200


@pytest.mark.parametrize(
    ("engine", "flush", "verdict"),
    [
        ("reference-ranks", 400, "PASS"),
        ("merges-every-flush-reply", 400, "PASS"),  # CD-16
        ("flush-first-rank-reply", 200, "FAIL"),  # PF-25: rank 0's reply is the endpoint's
    ],
)
def test_a_dp_flush_answers_after_every_rank(tmp_path, engine, flush, verdict):
    """SGLang's DP controller sends ``/flush_cache`` to every rank and the tokenizer
    manager answers after every reply: a rank where a request runs refuses, so the flush
    must be reported refused (RNK-001), though rank 0 emptied its tree."""
    with serve(tmp_path, "--ranks", "2", "--engine", engine, "--stream-hold", "5") as d:
        flush_while_rank_one_runs(d)
        got = d.verdict()
        code = d.stop()
    assert d.flush == flush
    assert got["verdict"] == verdict, got
    if verdict == "FAIL":
        assert failed(got) == {"RNK-001"}, got
        assert code == 1
    else:
        assert rules(got)["RNK-001"] == "PASS" and evidence(got, "RNK-001") > 0, got
        assert code == 0, d.stdout
    log = json.loads(Path(got["trace"]).with_suffix(".traffic.json").read_text())
    flushes = [e for e in log["traffic"] if e.get("path") == "/flush_cache"]
    assert flushes[0]["rank_weights"] == [0, 0]  # each rank's version, logged per rank
    placed = [e["rank"] for e in log["traffic"] if e.get("path") == "/generate"]
    assert placed[:3] == [0, 1, 1]


@pytest.mark.parametrize(
    ("engine", "verdict"),
    [
        ("reference-ranks", "PASS"),
        ("closes-on-any-rank-failure", "PASS"),  # CD-17
        ("rolls-back-moved-ranks", "PASS"),
        ("update-first-rank-reply", "FAIL"),  # PF-26 before the fix: rank 0's success
    ],
)
def test_an_update_that_fails_on_one_rank_is_reported_failed(tmp_path, engine, verdict):
    """``--fail-rank-updates 1``: the first update fails on the last rank. A trainer that
    retries a refused update and only then resumes PASSes on a DP controller that merges
    every rank's reply; one that answers with rank 0's success FAILs RNK-002."""
    flags = ("--ranks", "2", "--engine", engine, "--fail-rank-updates", "1")
    with serve(tmp_path, *flags) as d:
        assert generate(d.http, 0) == 200
        assert generate(d.http, 1) == 200
        statuses = sync(d.http, retries=2)
        assert generate(d.http, 0) == 200
        assert generate(d.http, 1) == 200
        got = d.verdict()
        code = d.stop()
    if verdict == "FAIL":
        assert statuses == [200], statuses  # the lie: rank 1 is still at v0
        assert failed(got) == {"RNK-002"}, got
        assert code == 1
        return
    assert statuses == [400, 200], statuses
    assert got["verdict"] == "PASS", got
    assert rules(got)["RNK-002"] == "PASS" and evidence(got, "RNK-002") > 0, got
    assert code == 0, d.stdout
    replays(Path(got["trace"]), 0)
    log = json.loads(Path(got["trace"]).with_suffix(".traffic.json").read_text())
    updates = [e for e in log["traffic"] if e.get("path") == "/update_weights_from_disk"]
    assert updates[0]["drawn"]["action"] == {
        "action": "FaultRankUpdateFails",
        "endpoint": 0,
        "rank": 1,
    }
    assert updates[-1]["rank_weights"] == [1, 1]


@pytest.mark.parametrize(
    ("engine", "served"), [("reference-ranks", 400), ("failed-rank-update-keeps-serving", 200)]
)
def test_ranks_torn_by_a_failed_update_serve_nothing(tmp_path, engine, served):
    """Rollouts go on while the trainer's update fails on rank 1 and before its retry: a
    DP controller that reports the failure but keeps both ranks serving (PF-26 after the
    fix) answers them under two policies (RNK-003); the reference refuses them. Serve
    cannot tell a rollout's request from the trainer's own calls, so those requests are
    also a resume after a failed update (CLI-014), on both engines: a client rule, apart
    from the engine's."""
    flags = ("--ranks", "2", "--engine", engine, "--fail-rank-updates", "1")
    with serve(tmp_path, *flags) as d:
        assert generate(d.http, 0) == 200
        assert generate(d.http, 1) == 200
        assert update(d.http) == [400]
        assert generate(d.http, 0) == served
        assert update(d.http) == [200]  # the retry
        assert generate(d.http, 0) == 200
        assert generate(d.http, 1) == 200
        got = d.verdict()
        assert d.stop() == 1
    engine_rules = {r for r in failed(got) if not r.startswith("CLI-")}
    if served == 200:
        assert engine_rules == {"RNK-003"}, got
    else:
        assert engine_rules == set(), got
        assert failed(got) == {"CLI-014"}, got
        assert rules(got)["RNK-003"] == "PASS" and evidence(got, "RNK-003") > 0, got


def test_ranks_are_placed_round_robin_and_a_missing_rank_is_refused(tmp_path):
    """A request that names no rank goes to the next in turn, as SGLang's default
    ``round_robin`` load balancing; one that names a rank the endpoint lacks is 400."""
    session = Session("sglang", "reference-ranks", out_dir=tmp_path, ranks=3)
    placed = []
    for body in ({}, {}, {}, {}, {"data_parallel_rank": 2}, {"routed_dp_rank": 3}):
        status, _, out = session.handle(
            "POST", "/generate", json.dumps({**GENERATE, **body}).encode()
        )
        placed.append(session.traffic[-1].get("rank") if status == 200 else status)
    assert placed == [0, 1, 2, 0, 2, 400]
    assert b"DP rank 3 is not active" in out
    info = json.loads(
        session.handle("POST", "/update_weights_from_disk", b'{"model_path": "x"}')[2]
    )
    assert info["num_paused_requests"] == [0, 0, 0]  # one count per rank, as SGLang's DP


def test_the_probe_resends_a_prompt_on_the_rank_it_was_served_on(tmp_path):
    """``--probe 1`` on ranks: a prompt served on rank 1 before a sync is re-sent there,
    where its KV of the old weights would be, so stale reuse on rank 1 can show."""

    def post(session: Session, path: str, body: dict) -> int:
        return session.handle("POST", path, json.dumps(body).encode())[0]

    session = Session("sglang", "reference-ranks", out_dir=tmp_path, ranks=2, probe=1)
    assert post(session, "/generate", {**GENERATE, "routed_dp_rank": 1}) == 200
    assert post(session, "/pause_generation", {"mode": "abort"}) == 200
    assert post(session, "/update_weights_from_disk", {"model_path": "/ckpt/step-1"}) == 200
    assert post(session, "/continue_generation", {}) == 200
    probes = [e for e in session.traffic if "probe" in e]
    assert probes and probes[0]["rank"] == 1, session.traffic
    assert probes[0]["action"]["rank"] == 1
    assert session.close().verdict.value == "PASS"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engine_name": "reference", "ranks": 2}, "does not declare the ranks capability"),
        ({"engine_name": "reference", "pd": True}, "does not declare the roles capability"),
        ({"engine_name": "reference-ranks", "ranks": 2, "api": "vllm"}, "use --api sglang"),
        ({"engine_name": "reference-ranks", "ranks": 2, "pd": True}, "one scheduler"),
        ({"engine_name": "reference", "fail_rank_updates": 1}, "one rank"),
        ({"engine_name": "reference-ranks", "ranks": 0}, "1 or more"),
    ],
)
def test_a_deployment_the_engine_cannot_serve_is_a_usage_error(tmp_path, kwargs, message):
    kwargs = {"api": "sglang", "out_dir": tmp_path, **kwargs}
    with pytest.raises(ValueError, match=message):
        Session(**kwargs)


def test_a_real_engine_serves_its_own_ranks_only(tmp_path):
    """An engine of fixed endpoints that is not in process (the real SGLang lane,
    ``sglang --ranks N``) is served as it is: ``--ranks`` must name its own ranks."""
    from kvfence.model.capabilities import Capability
    from kvfence.model.state import Config

    class Fixed:
        capabilities = frozenset({Capability.RANKS})
        fixed_configs = (Config(ranks=2),)
        in_process = False

    with pytest.raises(ValueError, match=r"its own fixed endpoint \(2 rank"):
        Session("sglang", "sglang", out_dir=tmp_path, engine=Fixed(), ranks=3)  # type: ignore[arg-type]


def test_the_cli_serves_the_reference_deployment_by_default_and_refuses_the_rest(tmp_path):
    assert default_engine(2) == "reference-ranks"
    assert default_engine(pd=True) == "checks-transferred-kv-version"
    assert default_engine() == "reference"
    r = subprocess.run(
        [*KVFENCE, "serve", "--api", "sglang", "--engine", "reference", "--ranks", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "ranks capability" in r.stdout


# ----- a prefill/decode pair: --pd -----------------------------------------------------------


def rolling_update(d: Deployment) -> list[int]:
    """Rollouts through the decode server (and the router's prefill half on the prefill
    server); the trainer syncs the prefill server, rolls out, then syncs the decode server
    and rolls out again: the statuses of the rollouts after each sync."""
    prefill, decode = d.http, d.decode
    assert generate(decode) == 200
    assert generate(prefill, body={**GENERATE, "bootstrap_room": 7}) == 200  # a no-op half
    assert generate(prefill) == 400  # no decode half: send it to the router
    sync(prefill)
    between = generate(decode)
    sync(decode)
    return [between, generate(decode)]


@pytest.mark.parametrize(
    ("engine", "statuses", "verdict"),
    [
        ("checks-transferred-kv-version", [400, 200], "PASS"),  # the reference P/D engines
        ("holds-admission-across-versions", [400, 200], "PASS"),
        ("drains-transfers-before-update", [400, 200], "PASS"),
        ("decode-serves-any-kv-version", [200, 200], "FAIL"),  # PF-29
    ],
)
def test_a_rolling_update_of_a_pd_pair(tmp_path, engine, statuses, verdict):
    """Each role is a server with its own ``/update_weights_from_disk``: between the two
    syncs the pair is at two versions, and a request decoded over KV the other side
    computed is PD-001; the reference refuses it."""
    with serve(tmp_path, "--pd", "--engine", engine) as d:
        assert len(d.clients) == 2
        info = [c.get("/get_server_info").json()["disable_radix_cache"] for c in d.clients]
        assert info == [False, True]  # the decode server has no radix cache of its own
        assert rolling_update(d) == statuses
        got = d.verdict()
        code = d.stop()
    assert got["verdict"] == verdict, got
    if verdict == "FAIL":
        assert failed(got) == {"PD-001"}, got
        assert code == 1
        return
    assert rules(got)["PD-001"] == "PASS" and evidence(got, "PD-001") > 0, got
    assert code == 0, d.stdout
    log = json.loads(Path(got["trace"]).with_suffix(".traffic.json").read_text())
    assert set(log["versions_by_role"]) == {"prefill", "decode"}
    roles = [e["role"] for e in log["traffic"] if "/update_weights" in e.get("path", "")]
    assert roles == ["prefill", "decode"]


@pytest.mark.parametrize(
    ("engine", "verdict"),
    [("checks-transferred-kv-version", "UNKNOWN"), ("decode-serves-any-kv-version", "FAIL")],
)
def test_a_trainer_that_updates_only_one_role(tmp_path, engine, verdict):
    """The trainer syncs the prefill server and never the decode server. On a deployment
    whose decode side takes any KV (PF-29) every later request FAILs PD-001; the reference
    refuses them, so nothing is ever served after the update: UNKNOWN (never PASS)."""
    with serve(tmp_path, "--pd", "--engine", engine) as d:
        assert generate(d.decode) == 200
        sync(d.http)
        assert generate(d.decode) == (200 if verdict == "FAIL" else 400)
        got = d.verdict()
        d.stop()
    assert got["verdict"] == verdict, got
    if verdict == "FAIL":
        assert failed(got) == {"PD-001"}, got
    else:
        assert rules(got)["PD-001"] == "PASS", got


@pytest.mark.parametrize(
    ("engine", "flush", "verdict"),
    [("checks-transferred-kv-version", 400, "PASS"), ("flush-frees-live-transfer", 200, "FAIL")],
)
def test_a_prefill_flush_spares_a_live_transfer(tmp_path, engine, flush, verdict):
    """A streamed request on the decode server holds KV the prefill server computed: the
    prefill server's ``/flush_cache`` meanwhile must be refused (FC-005), as the
    reference does; PF-30's prefill server frees it and says so truthfully."""
    with serve(tmp_path, "--pd", "--engine", engine, "--stream-hold", "5") as d:
        assert generate(d.decode) == 200
        with d.decode.stream("POST", "/generate", json={**OTHER, "stream": True}) as running:
            lines = running.iter_lines()  # kept: a closed reader would close the connection
            next(lines)  # admitted: its transfer is live
            assert d.http.post("/flush_cache").status_code == flush
            assert d.decode.post("/pause_generation", json={"mode": "abort"}).status_code == 200
        assert d.decode.post("/continue_generation", json={}).status_code == 200
        sync(d.http)
        sync(d.decode)
        assert generate(d.decode) == 200
        got = d.verdict()
        code = d.stop()
    assert got["verdict"] == verdict, got
    if verdict == "FAIL":
        assert failed(got) == {"FC-005"}, got
        assert code == 1
    else:
        assert rules(got)["FC-005"] == "PASS" and evidence(got, "FC-005") > 0, got
        assert code == 0, d.stdout
        replays(Path(got["trace"]), 0)


# ----- the replay line --------------------------------------------------------------------


def ranked_flush(d: Deployment) -> None:
    flush_while_rank_one_runs(d)


def one_role(d: Deployment) -> None:
    assert generate(d.decode) == 200
    sync(d.http)
    generate(d.decode)


@pytest.mark.parametrize(
    ("flags", "session", "rule"),
    [
        (
            ("--ranks", "2", "--engine", "flush-first-rank-reply", "--stream-hold", "5"),
            ranked_flush,
            "RNK-001",
        ),
        (("--pd", "--engine", "decode-serves-any-kv-version"), one_role, "PD-001"),
    ],
    ids=["ranks", "pd"],
)
def test_the_printed_replay_line_fails_as_the_deployment_did(
    tmp_path, flags, session: Callable[[Deployment], None], rule
):
    with serve(tmp_path, *flags) as d:
        session(d)
        assert d.stop() == 1, d.stdout
    flat = d.stdout.replace("\n", " ")
    match = re.search(r"replay it: (kvfence replay \S+(?: --\S+ \S+)*)", flat)
    assert match, d.stdout
    words = shlex.split(match.group(1))
    r = subprocess.run(
        [*KVFENCE, *words[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith("FAILED"), r.stdout
    assert rule in set(re.findall(r"violated (\S+)", r.stdout)), r.stdout
