"""JSONL counterexample traces: writing, reading and validating them.

Format (``docs/traces.md``): line 1 is a header object with ``kvfence_trace: 1``,
``spec_version``, ``model_digest``, ``engine``, ``client``, ``seed``, ``profile``,
``configs`` and ``policy``. Then one object per step: ``step`` (its number), ``action``
(the action's trace form), and either ``plans`` (SyncWeights: per endpoint the server info
seen and the plan expected and observed) or ``observed`` plus ``expected`` (an engine
action; ``within`` names the SyncWeights step it belongs to). The last line is the
verdict: ``{"verdict": "FAIL", "step": N, "violations": [{rule, expected, actual,
where}]}``.

Every reader error is a ``TraceError`` naming the line number and the field. This module
is the only one that turns a run into JSON or JSON into a run: the lockstep records typed
``Step`` values, and they are serialised only when written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from attrs import define, field

from ..model import READABLE_SPECS, SPEC_VERSION
from ..model.actions import Action, TraceError, action_from_json
from ..model.capabilities import Capability
from ..model.client import Plan
from ..model.observation import (
    Entry,
    Observation,
    Outcome,
    Response,
    View,
    entry_from_json,
    entry_json,
)
from ..model.state import Config, Policy, StoreEntry, Use
from ..model.vocabulary import CacheMode, Lane, PauseMode, Role, Status, Tier
from .verdict import Verdict

TRACE_FORMAT = 1

MAX_TRACE_BYTES = 256 * 1024 * 1024
"""A trace larger than this is refused before it is read (a 50,000-step trace is about
40 MB; a serve session about 1 KB per request); ``read_trace`` never reads more. The
environment variable ``KVFENCE_MAX_TRACE_BYTES`` (a byte count) overrides it."""

MAX_TRACE_ENV = "KVFENCE_MAX_TRACE_BYTES"


def max_trace_bytes() -> int:
    """The size limit in force: ``KVFENCE_MAX_TRACE_BYTES`` if set, else
    ``MAX_TRACE_BYTES``; ``TraceError`` for a value that is not a positive byte count."""
    raw = os.environ.get(MAX_TRACE_ENV)
    if raw is None:
        return MAX_TRACE_BYTES
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) < 1:
        raise TraceError(f"{MAX_TRACE_ENV}={raw[:40]!r}: expected a positive number of bytes")
    return int(text)


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
    """``value`` as JSON data, whatever an adapter put in it: enums as their words, sets
    sorted, bytes as a list of byte values, and anything JSON cannot hold as its repr. Text
    stays text (``json.dumps`` escapes lone surrogates and control characters)."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return list(bytes(value))
    if hasattr(value, "value") and not isinstance(value, (int, str)):
        return _jsonable(value.value)
    if isinstance(value, (frozenset, set)):
        items = [_jsonable(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def dumps(obj: Any) -> str:
    """One JSON line for ``obj``; never raises for what an adapter returned."""
    return json.dumps(_jsonable(obj), sort_keys=False, allow_nan=False, ensure_ascii=True)


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
        "derived": c.derived,
        **({"encoder_reset_separate": True} if c.encoder_reset_separate else {}),
        **({"ranks": c.ranks} if c.ranks != 1 else {}),
        **({"store": True, "lineage": c.lineage, "kv_format": c.kv_format} if c.store else {}),
        **({"role": c.role.value} if c.role is not None else {}),
        **({"router": True} if c.router else {}),
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


def cache_json(cache: frozenset[Entry], base: frozenset[Entry] | None) -> dict[str, Any]:
    """A view's cache as its trace field: ``{"cache": [entries]}``, or, where ``base`` (the
    cache the previous step's observation showed) is given and the change is smaller than
    the listing, ``{"cache_delta": {"add": [...], "drop": [...]}}`` against it. A session
    that fills the cache one prefix a step so writes a line of constant size, not one
    listing every prefix so far (a trace quadratic in its distinct prompts)."""
    if base is not None:
        add, drop = cache - base, base - cache
        if len(add) + len(drop) < len(cache):
            return {
                "cache_delta": {
                    "add": [entry_json(e) for e in sorted(add, key=str)],
                    "drop": [entry_json(e) for e in sorted(drop, key=str)],
                }
            }
    return {"cache": [entry_json(e) for e in sorted(cache, key=str)]}


def observation_json(o: Observation, base: frozenset[Entry] | None = None) -> dict[str, Any]:
    """An observation as its trace field; ``base``: see ``cache_json``."""
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
        if r.fresh is not None:  # the restart oracle (older traces lack the field)
            out["response"]["fresh"] = _jsonable(r.fresh)
        if r.stored is not None:  # a load from the shared store (older traces lack it)
            out["response"]["stored"] = store_entry_json(r.stored)
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
            **({"cache": None} if v.cache is None else cache_json(v.cache, base)),
        }
        if v.derived is not None:  # derived weight state (older traces lack the field)
            out["view"]["derived"] = v.derived
    if o.detail:
        out["detail"] = str(o.detail)
    return out


def outcome_json(o: Outcome, base: frozenset[Entry] | None = None) -> dict[str, Any]:
    return {"observation": observation_json(o.observation, base), "because": dict(o.because)}


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
    capabilities: Iterable[str] | None = None,
    system: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A trace's first line. ``system``: how to reach the system under test again
    (``adapters.registry.system``: the engine as given, URL, checkpoints, served model,
    overlay, SGLang version; nothing secret), recorded when known."""
    out: dict[str, Any] = {
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
    if capabilities is not None:
        out["capabilities"] = sorted(str(getattr(c, "value", c)) for c in capabilities)
    if system:
        out["system"] = {k: _jsonable(v) for k, v in system.items()}
    if comment:
        out["comment"] = comment
    return out


def step_json(s: Step, base: frozenset[Entry] | None = None) -> dict[str, Any]:
    """A step as its trace line (the format table in ``docs/traces.md``); ``base``: the
    cache of the previous step's observation (``cache_json``), ``None`` for a line that
    stands alone."""
    out: dict[str, Any] = {"step": s.step, "action": s.action.to_json()}
    if s.plans is not None:
        out["plans"] = [
            {
                "endpoint": p.endpoint,
                "server_info": _jsonable(p.server_info),
                "expected": None if p.expected is None else plan_json(p.expected),
                "observed": plan_json(p.observed),
                **({} if p.asked is None else {"asked": p.asked}),
            }
            for p in s.plans
        ]
    if s.program is not None:
        out["program"] = {
            "infos": [
                {"endpoint": c.endpoint, "at": c.at, "server_info": _jsonable(c.server_info)}
                for c in s.program.infos
            ],
            **({} if s.program.raised is None else {"raised": s.program.raised}),
            **(
                {}
                if not s.program.calls
                else {
                    "calls": [
                        {"endpoint": c.endpoint, "at": c.at, "verb": c.verb, "args": list(c.args)}
                        for c in s.program.calls
                    ]
                }
            ),
        }
    if s.observed is not None:
        out["observed"] = observation_json(s.observed, base)
        if s.observed.flushed is None and any(
            o.observation.flushed is not None for o in s.expected
        ):
            out["observed"]["flushed"] = None  # a flush result the spec expected, not given
        out["expected"] = [outcome_json(o, base) for o in s.expected]
    if s.within is not None:
        out["within"] = s.within
    return out


def verdict_line(steps: Sequence[Step], violations: Sequence[Any], error: str = "") -> dict:
    """The last line: FAIL with the violations, or ERROR with the adapter error."""
    if violations:
        last = steps[-1].step if steps else 0
        return {
            "verdict": Verdict.FAIL.value,
            "step": last,
            "violations": [violation_json(v) for v in violations],
        }
    return {"verdict": Verdict.ERROR.value, "error": error}


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """``text`` as one file-name component: anything but letters, digits, ``.``, ``_`` and
    ``-`` becomes ``_`` (no ``/``, ``..`` or ``:``), so the file stays in its folder and
    survives artifact uploads and Windows."""
    return _UNSAFE.sub("_", text).lstrip(".") or "_"


def unique_path(folder: Path, stem: str, suffix: str = ".jsonl") -> Path:
    """A new file ``folder/<stem>-<UTC time>-<pid>[-n]<suffix>``, created empty (``O_EXCL``)
    so that no two runs sharing ``folder`` can pick the same name."""
    folder.mkdir(parents=True, exist_ok=True)
    base = f"{safe_name(stem)}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    for n in range(10_000):
        path = folder / (base + (f"-{n}" if n else "") + suffix)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return path
        except FileExistsError:
            continue
    raise OSError(f"no free file name for {base} in {folder}")


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename:
    a reader sees the old file or the whole new one, never a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_trace(path: Path, head: dict[str, Any], steps: Sequence[Any], verdict) -> Path:
    """Write header, step lines (``Step`` values or their JSON) and the verdict line,
    atomically; returns ``path``. Never fails on what an adapter returned."""
    text = "".join(dumps(obj) + "\n" for obj in (head, *step_lines(steps), verdict))
    return write_atomic(path, text)


def step_lines(steps: Sequence[Any]) -> list[dict[str, Any]]:
    """The step lines of a trace file: each ``Step``'s ``step_json`` against the cache the
    line before it showed (``shown_cache``), so that a session filling the cache one prefix
    a step costs a constant per line to write and to show, not one listing of every prefix
    so far (quadratic in its distinct prompts); a line given as JSON is kept as it is, and
    the step line after it stands alone."""
    lines, base = [], None
    for s in steps:
        if isinstance(s, Step):
            lines.append(step_json(s, base))
            base = shown_cache(s, base)
        else:
            lines.append(s)
            base = None
    return lines


def shown_cache(s: Step, base: frozenset[Entry] | None) -> frozenset[Entry] | None:
    """The cache a later step's line is written against (``cache_json``): the one ``s``'s
    observation shows, else (no observation, or no cache in its view) ``base`` still."""
    view = s.observed.view if s.observed is not None else None
    return base if view is None or view.cache is None else view.cache


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
    names = (
        *("draft", "encoder", "fp8_kv", "lora", "flush_default", "versioned_keys", "misreports"),
        "derived",  # older traces lack it
        "encoder_reset_separate",
    )
    flags = {k: obj.get(k, False) for k in names}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise TraceError(f"{where}: field {k!r} must be bool, got {v!r}")
    ranks = obj.get("ranks", 1)  # written only for an endpoint with data-parallel ranks
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise TraceError(f"{where}: field 'ranks' must be an int of at least 1, got {ranks!r}")
    store = obj.get("store", False)  # written only for an endpoint on a shared KV store
    if not isinstance(store, bool):
        raise TraceError(f"{where}: field 'store' must be bool, got {store!r}")
    tags = {k: obj.get(k, d) for k, d in (("lineage", "base"), ("kv_format", "bf16"))}
    for k, v in tags.items():
        if not isinstance(v, str):
            raise TraceError(f"{where}: field {k!r} must be a string, got {v!r}")
    role = obj.get("role")  # written only for an endpoint of a prefill/decode deployment
    if role is not None and role not in {r.value for r in Role}:
        raise TraceError(f"{where}: field 'role' must be prefill or decode, got {role!r}")
    router = obj.get("router", False)  # written only for a worker behind a router
    if not isinstance(router, bool):
        raise TraceError(f"{where}: field 'router' must be bool, got {router!r}")
    try:
        return Config(
            role=role,
            router=router,
            store=store,
            **tags,
            radix=_need(obj, "radix", bool, where),
            lane=_enum(Lane, obj.get("lane", "standard"), f"{where}.lane"),
            info=None if info is None else tuple(sorted(info.items())),
            tiers=frozenset(_enum(Tier, t, f"{where}.tiers") for t in tiers),
            ranks=ranks,
            **flags,
        )
    except ValueError as e:  # ranks with a feature they are not modelled with
        raise TraceError(f"{where}: {e}") from None


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


def store_entry_json(e: StoreEntry) -> dict[str, Any]:
    """A shared store's entry as a trace field."""
    return {"prefix": e.prefix, "lineage": e.lineage, "version": e.version, "format": e.kv_format}


def _store_entry(obj: Any, where: str) -> StoreEntry | None:
    """``Response.stored`` from its trace field (``None``: absent or null)."""
    if obj is None:
        return None
    try:
        return StoreEntry(
            str(obj["prefix"]), str(obj["lineage"]), int(obj["version"]), str(obj["format"])
        )
    except (TypeError, KeyError, ValueError):
        raise TraceError(f"{where}: expected prefix, lineage, version and format") from None


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def observation_from_json(
    obj: Any, where: str, base: frozenset[Entry] | None = None
) -> Observation:
    """An observation from its trace field; ``base``: the cache a ``cache_delta`` is
    against (the previous step's, ``shown_cache``)."""
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
        for name in ("output", "cold", "fresh"):
            if r.get(name) is not None and not isinstance(r[name], (list, str)):
                raise TraceError(f"{w}.{name}: expected a list or null, got {r[name]!r:.40}")
        response = Response(
            hit=_need(r, "hit", bool, w),
            uses=parsed_uses,
            sampled=None if sampled is None else frozenset(sampled),
            output=_tuplify(r.get("output")),
            cold=_tuplify(r.get("cold")),
            fresh=_tuplify(r.get("fresh")),
            stored=_store_entry(r.get("stored"), f"{w}.stored"),
        )
    view = None
    if obj.get("view") is not None:
        v = obj["view"]
        w = f"{where}.view"
        if not isinstance(v, dict):
            raise TraceError(f"{w}: must be an object")
        for k in ("weights", "draft", "scales", "label", "derived"):
            if v.get(k) is not None and (not isinstance(v[k], int) or isinstance(v[k], bool)):
                raise TraceError(f"{w}.{k}: expected a version or null, got {v[k]!r}")
        cache, delta = v.get("cache"), v.get("cache_delta")
        try:
            if delta is not None:
                if base is None:
                    raise TraceError(f"{w}.cache_delta: no earlier step showed a cache")
                if not isinstance(delta, dict) or set(delta) - {"add", "drop"}:
                    raise TraceError(f"{w}.cache_delta: expected {{'add': [...], 'drop': [...]}}")
                add = frozenset(entry_from_json(e) for e in delta.get("add", []))
                drop = frozenset(entry_from_json(e) for e in delta.get("drop", []))
                parsed = (base - drop) | add
            else:
                parsed = None if cache is None else frozenset(entry_from_json(e) for e in cache)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TraceError(f"{w}.cache: malformed entry ({e})") from None
        view = View(
            v.get("weights"),
            v.get("draft"),
            v.get("scales"),
            v.get("label"),
            parsed,
            v.get("derived"),
        )
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


@define
class PlanRecord:
    """One endpoint's plan at a sync: the ``server_info`` it showed, the plan ``expected``
    by the spec (``None`` when read from a trace that lacks it) and the client's
    ``observed`` plan. ``asked``: set on a second question for the same endpoint (``"retract"``:
    the same policy with a retract pause, CLI-007), recorded so that replay asks it too."""

    endpoint: int
    server_info: dict[str, Any] | None
    expected: Plan | None
    observed: Plan
    asked: str | None = None


@define
class InfoCall:
    """A client program's ``server_info()`` call: the ``endpoint``, the number of engine
    calls of the sync made before it (``at``), and what the endpoint returned."""

    endpoint: int
    at: int
    server_info: dict[str, Any] | None


CLIENT_VERBS: dict[str, tuple[type, ...]] = {
    "requeue_request": (str, bool),
    "deliver_response": (str, list),
}
"""Client-side calls of a program (CLI-012) -> the types of their
arguments: ``requeue_request(rid, keep_partial)`` (its engine call is the sync's next
``within`` step) and ``deliver_response(rid, versions)`` (no engine call)."""


@define
class ClientCall:
    """A client program's call that is not one engine call: the ``endpoint``, the number
    of engine calls of the sync made before it (``at``), the ``verb`` (``CLIENT_VERBS``)
    and its ``args`` as JSON values."""

    endpoint: int
    at: int
    verb: str
    args: tuple[Any, ...]


@define
class ProgramRecord:
    """What a client program's sync did besides engine calls (those are the sync's
    ``within`` steps): its ``server_info()`` calls, its client-side ``calls``
    (``ClientCall``: requeue and deliver, CLI-012) and the message of the exception it
    raised (``None``: it returned)."""

    infos: list[InfoCall] = field(factory=list)
    raised: str | None = None
    calls: list[ClientCall] = field(factory=list)


@define
class Step:
    """One step of a run, as the lockstep records it and as a trace line reads back.

    ``step``: its number in the run. ``action``: the action. ``observed``/``expected``: an
    engine step's observation and every outcome the spec allowed. ``plans``: a sync's
    ``PlanRecord`` per endpoint. ``within``: the sync step an engine call belongs to.
    ``line``: the file line it was read from (0 when recorded live). ``program``: a sync
    made by a client program (``ProgramRecord``), not a resolver.
    """

    step: int
    action: Action
    observed: Observation | None = None
    expected: tuple[Outcome, ...] = ()
    plans: list[PlanRecord] | None = None
    within: int | None = None
    line: int = field(default=0, eq=False)
    program: ProgramRecord | None = None

    @property
    def answers(self) -> list[Plan]:
        """Every plan the client gave at this sync, in the order asked (re-asks included)."""
        return [p.observed for p in self.plans or ()]

    @property
    def shown(self) -> list[PlanRecord]:
        """The first question per endpoint (its server info as the endpoint showed it)."""
        return [p for p in self.plans or () if p.asked is None]


class Trace:
    """A parsed trace: ``header`` (dict), ``configs``, ``policy``, ``steps`` (``Step``
    values), ``verdict`` (the last line, or ``None`` if the trace has none),
    ``declared``: the capabilities the recorded system declared (the header's
    ``capabilities``; empty when the header has none), and ``unanswered``: whether a step
    recorded ``"flushed": null`` (a flush result the spec expected and the system did not
    give; a step without the key recorded nothing about it)."""

    def __init__(
        self, head, configs, policy, steps, verdict, declared=frozenset(), unanswered=False
    ) -> None:
        self.header = head
        self.configs: tuple[Config, ...] = configs
        self.policy: Policy = policy
        self.steps: list[Step] = steps
        self.verdict: dict[str, Any] | None = verdict
        self.declared: frozenset[Capability] = declared
        self.unanswered: bool = unanswered


def _declared(raw: object, where: str) -> frozenset[Capability]:
    """A header's ``capabilities``: absent (``None``) or a list of capability names."""
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        raise TraceError(f"{where}: expected a list of capability names, got {raw!r}")
    unknown = sorted(set(raw) - {c.value for c in Capability})
    if unknown:
        raise TraceError(f"{where}: unknown capabilities {unknown}")
    return frozenset(Capability(c) for c in raw)


def read_trace(path: Path, allow_other_spec: bool = False) -> Trace:
    """Parse and validate a JSONL trace. ``TraceError`` names the line and field of the
    first problem: not a regular file or larger than ``MAX_TRACE_BYTES``, not UTF-8, not
    JSON, no header, another spec version, unknown action, wrong types, a ``within`` that
    does not name the sync step just before it. Whatever the bytes, it raises nothing
    else, and its time is linear in the file's size."""
    try:
        return _read_trace(path, allow_other_spec)
    except TraceError:
        raise
    except (TypeError, ValueError, KeyError, OverflowError, RecursionError, AttributeError) as e:
        raise TraceError(f"{path}: malformed trace ({type(e).__name__}: {e})") from None


def _read_lines(path: Path) -> Iterator[bytes]:
    """The file's lines, one at a time, refusing what is not a regular file once links are
    resolved (a FIFO would hang, a device never ends), a pseudo-file (``/proc``: size 0 but
    not empty; opened non-blocking, so one that would block, such as ``/proc/kmsg``, is
    refused rather than waited on), and what is larger than the limit (``max_trace_bytes``).
    The checks are made on the opened file, so a link swapped after them changes nothing."""
    limit = max_trace_bytes()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise TraceError(f"{path}: not a regular file")
            if info.st_size > limit:
                raise TraceError(
                    f"{path}: {info.st_size} bytes; traces are limited to {limit} "
                    f"(set {MAX_TRACE_ENV} to raise it)"
                )
            if info.st_size == 0:
                if f.read(1):
                    raise TraceError(f"{path}: a pseudo-file (size 0, yet it reads): not a trace")
                return
            total = 0
            while line := f.readline(limit + 1 - total):
                total += len(line)
                if total > limit:
                    raise TraceError(
                        f"{path}: larger than {limit} bytes (set {MAX_TRACE_ENV} to raise it)"
                    )
                yield line.rstrip(b"\n")
        except BlockingIOError:
            raise TraceError(f"{path}: reading it would block: not a trace file") from None
        except OSError as e:
            raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None


def _decode(path: Path, n: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(
            f"{path}:{n}: not a text file (byte 0x{raw[e.start]:02x} at column {e.start + 1} "
            "is not UTF-8)"
        ) from None


def _server_info(value: Any, where: str) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise TraceError(f"{where}: field 'server_info' must be an object or null")
    return value


def _program(obj: Any, where: str) -> ProgramRecord:
    """The ``program`` field of a sync step made by a client program."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: field 'program' must be an object")
    infos_raw = obj.get("infos", [])
    if not isinstance(infos_raw, list):
        raise TraceError(f"{where}: field 'program.infos' must be a list")
    infos = []
    for i, c in enumerate(infos_raw):
        w = f"{where}.program.infos[{i}]"
        if not isinstance(c, dict):
            raise TraceError(f"{w}: must be an object")
        infos.append(
            InfoCall(
                _need(c, "endpoint", int, w),
                _need(c, "at", int, w),
                _server_info(c.get("server_info"), w),
            )
        )
    raised = obj.get("raised")
    if raised is not None and not isinstance(raised, str):
        raise TraceError(f"{where}: field 'program.raised' must be a string")
    calls_raw = obj.get("calls", [])
    if not isinstance(calls_raw, list):
        raise TraceError(f"{where}: field 'program.calls' must be a list")
    return ProgramRecord(
        infos,
        raised,
        [_client_call(c, f"{where}.program.calls[{i}]") for i, c in enumerate(calls_raw)],
    )


def _client_call(c: Any, where: str) -> ClientCall:
    """One recorded client-side call: ``verb`` one of ``CLIENT_VERBS`` with its arguments'
    types (``deliver_response``'s versions a list of ints)."""
    if not isinstance(c, dict):
        raise TraceError(f"{where}: must be an object")
    verb = _need(c, "verb", str, where)
    if verb not in CLIENT_VERBS:
        raise TraceError(f"{where}: verb {verb!r} is not one of {', '.join(CLIENT_VERBS)}")
    args = _need(c, "args", list, where)
    types = CLIENT_VERBS[verb]
    if len(args) != len(types) or not all(
        isinstance(a, t) and not (t is not bool and isinstance(a, bool))
        for a, t in zip(args, types, strict=False)
    ):
        shape = ", ".join(t.__name__ for t in types)
        raise TraceError(f"{where}: {verb} args must be [{shape}], got {args!r}")
    if verb == "deliver_response" and not all(
        isinstance(v, int) and not isinstance(v, bool) for v in args[1]
    ):
        raise TraceError(f"{where}: deliver_response versions must be ints, got {args[1]!r}")
    return ClientCall(
        _need(c, "endpoint", int, where), _need(c, "at", int, where), verb, tuple(args)
    )


def _sync_step(obj: dict[str, Any], n: int, number: int, action: Action, where: str) -> Step:
    if "program" in obj:
        return Step(number, action, plans=[], line=n, program=_program(obj["program"], where))
    plans_raw = _need(obj, "plans", list, where)
    plans = []
    for i, p in enumerate(plans_raw):
        w = f"{where}.plans[{i}]"
        if not isinstance(p, dict):
            raise TraceError(f"{where}: field 'plans' must hold objects")
        expected = p.get("expected")
        plans.append(
            PlanRecord(
                endpoint=p.get("endpoint", i) if isinstance(p.get("endpoint"), int) else i,
                server_info=_server_info(p.get("server_info"), w),
                expected=None if not isinstance(expected, dict) else plan_from_json(expected, w),
                observed=plan_from_json(p.get("observed"), w),
                asked=None if p.get("asked") is None else str(p["asked"]),
            )
        )
    return Step(number, action, plans=plans, line=n)


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, JSON value)`` of each line that is not blank or a ``#`` comment,
    parsed one at a time (a trace is never held whole as JSON)."""
    for n, line_bytes in enumerate(_read_lines(path), start=1):
        line = _decode(path, n, line_bytes)
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{n}: not JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise TraceError(f"{path}:{n}: JSON nested too deeply") from None


def _read_trace(path: Path, allow_other_spec: bool) -> Trace:
    raw = _json_lines(path)
    first = next(raw, None)
    if first is None:
        raise TraceError(f"{path}: empty trace: no header line")
    n, head = first
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
    declared = _declared(head.get("capabilities"), f"{where}.capabilities")
    unanswered = False  # a step recorded "flushed": null
    steps: list[Step] = []
    verdict = None
    sync: int | None = None  # the number of the sync step engine calls may belong to
    base: frozenset[Entry] | None = None  # the cache a cache_delta is against
    for n, obj in raw:
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
        number = obj.get("step", len(steps))
        if not isinstance(number, int) or isinstance(number, bool):
            raise TraceError(f"{where}: field 'step' must be a step number")
        within = obj.get("within")
        if within is not None and (
            not isinstance(within, int) or isinstance(within, bool) or within != sync
        ):
            raise TraceError(
                f"{where}: field 'within' is {within!r}, but an engine call can only belong to "
                "the SyncWeights step just before it" + ("" if sync is None else f" (step {sync})")
            )
        if action.name == "SyncWeights":
            if within is not None:
                raise TraceError(f"{where}: a SyncWeights step cannot be within another")
            steps.append(_sync_step(obj, n, number, action, where))
            sync = number
            continue
        if within is None:
            sync = None
        observed = obj.get("observed")
        parsed = None if observed is None else observation_from_json(observed, where, base)
        if isinstance(observed, dict) and "flushed" in observed and observed["flushed"] is None:
            unanswered = True
        steps.append(Step(number, action, parsed, within=within, line=n))
        base = shown_cache(steps[-1], base)
    return Trace(head, configs, policy, steps, verdict, declared, unanswered)
