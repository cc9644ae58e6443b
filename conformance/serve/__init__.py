"""``kvfence serve``: an HTTP server that speaks an engine's own weight-sync routes, with a
kvfence engine behind it, judged live.

A trainer's sync code (or any HTTP client) talks to ``kvfence serve`` as it would to SGLang
or vLLM. Each request that maps to a model action (the ``ROUTES`` table: one route, one
action) is applied to the model and to the engine in lockstep (``Lockstep.run``) and
recorded as a kvfence trace step; the answer is the engine's observation in the real
engine's own JSON shape. Routes that only probe (server info, health, the model list) are
answered from the engine and logged, not stepped; routes whose engine effect the cache does
not depend on (an NCCL group's init, SGLang's update session) are documented no-ops
(``Route.noop``), answered as the engine does and logged. Forms of a route whose model
action a serve endpoint cannot take yet (``PENDING``: a second LoRA adapter, a preempting
vLLM reset, namespaced requests on an engine that cannot key them) are parsed and answered
501 in the engine's error shape, naming the action they wait for. The trainer's calls are
judged by the client obligations too (``CallSequence``); ``--probe N`` and ``--refuse-resets
N`` are in ``Session``.

The package, one module per concern:

* ``wire``: the HTTP server, request bodies, the engines' error shapes, signals.
* ``session``: the engine and the model in lockstep, the traffic log (``Session``).
* ``sglang`` and ``vllm``: one route table per API (``ROUTES``), each entry holding its
  handler; the engine files and versions the bodies mirror are in their docstrings.
* ``weights``: the weight versions the endpoint has installed, tracked in one place.
* ``judge``: the verdict, the session trace and the counterexample.

How a request maps to the model (docs/clients.md, "Over HTTP: kvfence serve"):

* Weight versions: every weight update a trainer sends is the next weight version of the
  endpoint (the checkpoint path, tensor payload or ``weight_version`` label is recorded in
  the session log beside it). An update always changes the weights as far as the cache is
  concerned: the engine cannot know two checkpoints hold the same bytes, so KV computed
  before it is stale after it, whatever the path or label says. A retry after a refused
  update keeps the version the refused one had.
* Prompts: each distinct prompt (text, or token ids) is one prefix name of the model (P, Q,
  R, ...), in order of first appearance. Two prompts sharing only a leading part are
  distinct prefixes (the model then sees less reuse than a radix tree would: never a false
  stale-reuse FAIL).
* Cache keys: on an in-process engine an ``extra_key`` / ``cache_salt`` names the weight
  version installed when it was first used, and the request is a ServeRequest in that
  namespace (``Session.serve``). On an engine that cannot key requests, the byte oracle:
  a ``/generate`` with an ``extra_key`` (SGLang) or a ``/v1/completions``
  with a ``cache_salt`` (vLLM) never sent before shares no cached KV on the real engines
  (SGLang scopes the radix tree's root by ``extra_key``, ``mem_cache/base_prefix_cache.py``
  ``root_node_handle``; vLLM hashes ``cache_salt`` into the first block). It is answered
  with the engine's cold prefill of that prompt at the weights in force (the ``cold`` bytes
  of the last request served for it), and logged, not stepped.
* Output tokens: the engine's output bytes hashed into token ids and logprobs, so a stale
  reuse changes them and a fresh hit does not.
* Version labels (``/update_weight_version``, an update's ``weight_version``): a label names
  the version it was first given to (an update's ``weight_version``), else the newest
  version the trainer pushed; publishing it is PublishVersion of that version, which the
  model refuses when the installed weights do not back it (PUB-001).
* Deployments (SGLang's API; docs/deployments.md, "Serving a deployment"): ``--ranks N``
  serves one endpoint of N data-parallel ranks (a request runs on the rank it names, else
  round robin; a flush, an update, a pause or a continue goes to every rank and is
  answered once, merged); ``--pd`` serves a prefill server (endpoint 0) and a decode
  server (endpoint 1) on two ports of one session, each with its own sync routes, a
  ``/generate`` on the decode server being the deployment's request. The handlers build
  their actions on endpoint 0; ``Session.step`` moves them to the endpoint of the listener
  the request came in on.
* In-flight requests: serve answers each request whole (ServeRequest), so none is in flight
  when a pause arrives: vLLM's ``mode=wait`` (drain, then pause) is a pause with nothing to
  drain, modelled as ``abort`` with nothing to abort.
"""

from .routes import PENDING, Route
from .session import (
    APIS,
    ROUTE_TABLES,
    SESSION_BOUNDS,
    Session,
    by_checkpoint,
    default_engine,
    deployment_configs,
    endpoint_config,
    prefix_name,
    tokens_of,
)
from .sglang import SGLANG_FLUSHED
from .vllm import SERVED_MODEL, TWO_PHASE_METHODS
from .wire import HttpError, PendingRoute, make_server, run_server

ROUTES: tuple[Route, ...] = ROUTE_TABLES["sglang"] + ROUTE_TABLES["vllm"]
"""Every route ``kvfence serve`` answers, both APIs' tables."""

__all__ = [
    "APIS",
    "PENDING",
    "ROUTES",
    "ROUTE_TABLES",
    "SERVED_MODEL",
    "SESSION_BOUNDS",
    "SGLANG_FLUSHED",
    "TWO_PHASE_METHODS",
    "HttpError",
    "PendingRoute",
    "Route",
    "Session",
    "by_checkpoint",
    "default_engine",
    "deployment_configs",
    "endpoint_config",
    "make_server",
    "prefix_name",
    "run_server",
    "tokens_of",
]
