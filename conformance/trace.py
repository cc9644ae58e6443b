"""JSONL counterexample traces: writing, reading and validating them.

Format (``docs/traces.md``): line 1 is a header object with ``kvfence_trace: 1``,
``spec_version``, ``model_digest``, ``engine``, ``client``, ``seed``, ``profile``,
``configs`` and ``policy``. Then one object per step: ``step`` (its number), ``action``
(the action's trace form), and either ``plans`` (SyncWeights: per endpoint the server info
seen and the plan expected and observed) or ``observed`` plus ``expected`` (an engine
action; ``within`` names the SyncWeights step it belongs to). The last line is the
verdict: ``{"verdict": "FAIL", "step": N, "violations": [{rule, expected, actual,
where}]}``.

Every reader error is a ``TraceError`` naming the line number and the field.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from kvfence.model import READABLE_SPECS, SPEC_VERSION
from kvfence.model.actions import Action, TraceError, action_from_json
from kvfence.model.client import Plan
from kvfence.model.observation import (
    Observation,
    Outcome,
    Response,
    View,
    entry_from_json,
    entry_json,
)
from kvfence.model.state import Config, Policy, Use
from kvfence.model.vocabulary import CacheMode, Lane, PauseMode, Status, Tier

TRACE_FORMAT = 1


def model_digest() -> str:
    """sha256 (first 16 hex digits) of the model's source: a trace records which spec
    judged it."""
    h = hashlib.sha256()
    files = sorted(resources.files("kvfence.model").iterdir(), key=lambda p: p.name)
    for f in files:
        if f.name.endswith(".py"):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


# ----- to JSON -----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if hasattr(value, "value") and not isinstance(value, (int, str)):
        return value.value
    if isinstance(value, (frozenset, set)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def config_json(c: Config) -> dict[str, Any]:
    return {
        "radix": c.radix,
        "lane": c.lane.value,
        "info": None if c.info is None else dict(c.info),
        "tiers": sorted(t.value for t in c.tiers),
        "draft": c.draft,
        "encoder": c.encoder,
        "fp8_kv": c.fp8_kv,
        "lora": c.lora,
        "flush_default": c.flush_default,
        "versioned_keys": c.versioned_keys,
        "misreports": c.misreports,
    }


def policy_json(p: Policy) -> dict[str, Any]:
    return {
        "mode": p.mode.value,
        "flush_cache": p.flush_cache,
        "pause_mode": p.pause_mode.value,
        "off_policy_sessions": p.off_policy_sessions,
    }


def plan_json(p: Plan) -> dict[str, Any]:
    return {"flush": p.flush, "pause_mode": p.pause_mode.value}


def observation_json(o: Observation) -> dict[str, Any]:
    out: dict[str, Any] = {"status": o.status.value}
    if o.response is not None:
        r = o.response
        out["response"] = {
            "hit": r.hit,
            "uses": None if r.uses is None else sorted([u.component, u.version] for u in r.uses),
            "sampled": None if r.sampled is None else sorted(r.sampled),
            "output": _jsonable(r.output),
            "cold": _jsonable(r.cold),
        }
    if o.flushed is not None:
        out["flushed"] = o.flushed
    if o.aborted is not None:
        out["aborted"] = sorted(o.aborted)
    if o.view is not None:
        v = o.view
        out["view"] = {
            "weights": v.weights,
            "draft": v.draft,
            "scales": v.scales,
            "label": v.label,
            "cache": None if v.cache is None else [entry_json(e) for e in sorted(v.cache, key=str)],
        }
    if o.detail:
        out["detail"] = o.detail
    return out


def outcome_json(o: Outcome) -> dict[str, Any]:
    return {"observation": observation_json(o.observation), "because": dict(o.because)}


def violation_json(v: Any) -> dict[str, Any]:
    return {
        "rule": v.rule,
        "expected": _jsonable(v.expected),
        "actual": _jsonable(v.actual),
        "where": v.where,
    }


def header(
    engine: str,
    client: str,
    seed: int | None,
    profile: str,
    configs: tuple[Config, ...],
    policy: Policy,
    comment: str = "",
) -> dict[str, Any]:
    out = {
        "kvfence_trace": TRACE_FORMAT,
        "spec_version": SPEC_VERSION,
        "model_digest": model_digest(),
        "engine": engine,
        "client": client,
        "seed": seed,
        "profile": profile,
        "configs": [config_json(c) for c in configs],
        "policy": policy_json(policy),
    }
    if comment:
        out["comment"] = comment
    return out


def write_trace(path: Path, head: dict[str, Any], lines: list[dict[str, Any]], verdict) -> Path:
    """Write header, step lines and verdict line; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for obj in (head, *lines, verdict):
            f.write(json.dumps(obj, sort_keys=False, default=_jsonable) + "\n")
    return path


# ----- from JSON ---------------------------------------------------------------------------


def _need(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise TraceError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise TraceError(f"{where}: field {key!r} must be {names}, got {value!r}")
    return value


def _enum(enum: Any, value: Any, where: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        words = ", ".join(m.value for m in enum)
        raise TraceError(f"{where}: {value!r} is not one of {words}") from None


def config_from_json(obj: Any, where: str) -> Config:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a config must be an object")
    info = obj.get("info")
    if info is not None and not isinstance(info, dict):
        raise TraceError(f"{where}: field 'info' must be an object or null")
    scalars = (str, int, float, bool, type(None))
    if info is not None and not all(isinstance(v, scalars) for v in info.values()):
        raise TraceError(f"{where}: field 'info' must map names to scalars (got {info!r:.60})")
    tiers = obj.get("tiers", ["device"])
    if not isinstance(tiers, list):
        raise TraceError(f"{where}: field 'tiers' must be a list")
    names = ("draft", "encoder", "fp8_kv", "lora", "flush_default", "versioned_keys", "misreports")
    flags = {k: obj.get(k, False) for k in names}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise TraceError(f"{where}: field {k!r} must be bool, got {v!r}")
    return Config(
        radix=_need(obj, "radix", bool, where),
        lane=_enum(Lane, obj.get("lane", "standard"), f"{where}.lane"),
        info=None if info is None else tuple(sorted(info.items())),
        tiers=frozenset(_enum(Tier, t, f"{where}.tiers") for t in tiers),
        **flags,
    )


def policy_from_json(obj: Any, where: str) -> Policy:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: the policy must be an object")
    flush = obj.get("flush_cache")
    if flush is not None and not isinstance(flush, bool):
        raise TraceError(f"{where}: field 'flush_cache' must be bool or null, got {flush!r}")
    return Policy(
        mode=_enum(CacheMode, obj.get("mode", "auto"), f"{where}.mode"),
        flush_cache=flush,
        pause_mode=_enum(PauseMode, obj.get("pause_mode", "retract"), f"{where}.pause_mode"),
        off_policy_sessions=_need(obj, "off_policy_sessions", bool, where)
        if "off_policy_sessions" in obj
        else False,
    )


def plan_from_json(obj: Any, where: str) -> Plan:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a plan must be an object")
    return Plan(
        _need(obj, "flush", bool, where),
        _enum(PauseMode, obj.get("pause_mode"), f"{where}.pause_mode"),
    )


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def observation_from_json(obj: Any, where: str) -> Observation:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: an observation must be an object")
    status = _enum(Status, _need(obj, "status", str, where), f"{where}.status")
    response = None
    if obj.get("response") is not None:
        r = obj["response"]
        w = f"{where}.response"
        if not isinstance(r, dict):
            raise TraceError(f"{w}: must be an object")
        uses = r.get("uses")
        try:
            parsed_uses = None if uses is None else frozenset(Use(str(c), int(v)) for c, v in uses)
        except (TypeError, ValueError):
            raise TraceError(f"{w}.uses: expected [[component, version], ...]") from None
        sampled = r.get("sampled")
        if sampled is not None and not all(isinstance(x, int) for x in sampled):
            raise TraceError(f"{w}.sampled: expected a list of versions")
        for name in ("output", "cold"):
            if r.get(name) is not None and not isinstance(r[name], list):
                raise TraceError(f"{w}.{name}: expected a list or null, got {r[name]!r:.40}")
        response = Response(
            hit=_need(r, "hit", bool, w),
            uses=parsed_uses,
            sampled=None if sampled is None else frozenset(sampled),
            output=_tuplify(r.get("output")),
            cold=_tuplify(r.get("cold")),
        )
    view = None
    if obj.get("view") is not None:
        v = obj["view"]
        w = f"{where}.view"
        if not isinstance(v, dict):
            raise TraceError(f"{w}: must be an object")
        for k in ("weights", "draft", "scales", "label"):
            if v.get(k) is not None and (not isinstance(v[k], int) or isinstance(v[k], bool)):
                raise TraceError(f"{w}.{k}: expected a version or null, got {v[k]!r}")
        cache = v.get("cache")
        try:
            parsed = None if cache is None else frozenset(entry_from_json(e) for e in cache)
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{w}.cache: malformed entry ({e})") from None
        view = View(v.get("weights"), v.get("draft"), v.get("scales"), v.get("label"), parsed)
    aborted = obj.get("aborted")
    if aborted is not None and not all(isinstance(x, str) for x in aborted):
        raise TraceError(f"{where}.aborted: expected a list of request IDs")
    flushed = obj.get("flushed")
    if flushed is not None and not isinstance(flushed, bool):
        raise TraceError(f"{where}.flushed: expected bool or null, got {flushed!r}")
    return Observation(
        status=status,
        response=response,
        flushed=flushed,
        aborted=None if aborted is None else frozenset(aborted),
        view=view,
        detail=str(obj.get("detail", "")),
    )


class Trace:
    """A parsed trace: ``header`` (dict), ``configs``, ``policy``, ``steps`` (parsed step
    records) and ``verdict`` (the last line, or ``None`` if the trace has none)."""

    def __init__(self, head, configs, policy, steps, verdict) -> None:
        self.header = head
        self.configs: tuple[Config, ...] = configs
        self.policy: Policy = policy
        self.steps: list[Step] = steps
        self.verdict: dict[str, Any] | None = verdict


class Step:
    """One step line: ``action``, ``observed`` (engine step), ``plans`` (sync step:
    ``[(server_info, observed Plan)]``, one per endpoint), ``answers`` (every plan the
    client gave, in the order asked: ``plans`` plus a re-asked one marked ``"asked"``),
    ``within`` and its ``line`` number."""

    def __init__(self, line: int, action: Action, observed, plans, within, answers=None) -> None:
        self.line = line
        self.action = action
        self.observed: Observation | None = observed
        self.plans: list[tuple[dict[str, Any] | None, Plan]] | None = plans
        self.within: int | None = within
        self.answers: list[Plan] = (
            answers if answers is not None else [plan for _, plan in plans or ()]
        )


def read_trace(path: Path, allow_other_spec: bool = False) -> Trace:
    """Parse and validate a JSONL trace. ``TraceError`` names the line and field of the
    first problem: not JSON, no header, another spec version, unknown action, wrong types.
    Whatever the bytes, it raises nothing else."""
    try:
        return _read_trace(path, allow_other_spec)
    except TraceError:
        raise
    except (TypeError, ValueError, KeyError, OverflowError, RecursionError, AttributeError) as e:
        raise TraceError(f"{path}: malformed trace ({type(e).__name__}: {e})") from None


def _read_trace(path: Path, allow_other_spec: bool) -> Trace:
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file") from None
    raw: list[tuple[int, Any]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            raw.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{n}: not JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise TraceError(f"{path}:{n}: JSON nested too deeply") from None
    if not raw:
        raise TraceError(f"{path}: empty trace: no header line")
    n, head = raw[0]
    where = f"{path}:{n}"
    if not isinstance(head, dict) or head.get("kvfence_trace") != TRACE_FORMAT:
        raise TraceError(f"{where}: first line must be a header with kvfence_trace: 1")
    version = _need(head, "spec_version", str, where)
    if version not in READABLE_SPECS and not allow_other_spec:
        raise TraceError(
            f"{where}: trace is for spec {version} (older or unknown), this is spec "
            f"{SPEC_VERSION}, which reads {', '.join(READABLE_SPECS)}; "
            "re-record it or pass --allow-other-spec"
        )
    configs_raw = _need(head, "configs", list, where)
    if not configs_raw:
        raise TraceError(f"{where}: field 'configs' must list at least one endpoint")
    configs = tuple(config_from_json(c, f"{where}.configs[{i}]") for i, c in enumerate(configs_raw))
    policy = policy_from_json(head.get("policy", {}), f"{where}.policy")
    steps: list[Step] = []
    verdict = None
    for n, obj in raw[1:]:
        where = f"{path}:{n}"
        if verdict is not None:
            raise TraceError(f"{where}: a line after the verdict line")
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: each line must be a JSON object")
        if "verdict" in obj:
            verdict = obj
            continue
        try:
            action = action_from_json(obj.get("action"))
        except TraceError as e:
            raise TraceError(f"{where}: {e}") from None
        endpoint = getattr(action, "endpoint", 0)
        if not 0 <= endpoint < len(configs):
            raise TraceError(f"{where}: {action.name}.endpoint {endpoint} out of range")
        within = obj.get("within")
        if within is not None and (not isinstance(within, int) or isinstance(within, bool)):
            raise TraceError(f"{where}: field 'within' must be a step number")
        if action.name == "SyncWeights":
            plans_raw = _need(obj, "plans", list, where)
            if not all(isinstance(p, dict) for p in plans_raw):
                raise TraceError(f"{where}: field 'plans' must hold objects")
            answers = [
                plan_from_json(p.get("observed"), f"{where}.plans[{i}]")
                for i, p in enumerate(plans_raw)
            ]
            plans = [
                (p.get("server_info"), plan)
                for p, plan in zip(plans_raw, answers, strict=True)
                if "asked" not in p
            ]
            steps.append(Step(n, action, None, plans, within, answers))
        else:
            observed = obj.get("observed")
            parsed = None if observed is None else observation_from_json(observed, where)
            steps.append(Step(n, action, parsed, None, within))
    return Trace(head, configs, policy, steps, verdict)
