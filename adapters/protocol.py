"""The adapter contract: how kvfence drives a system under test (SUT).

An *engine adapter* applies one model action to the SUT's endpoints and returns an
``Observation``; a *client adapter* resolves a sync plan from a policy and an endpoint's
server info. Adapters translate and classify (OK / REJECTED / STOPPED / INDETERMINATE); they never
assert a spec property and never retry silently (ADP-001, ADP-002).

Capabilities say what an adapter can observe. A rule whose evidence needs a capability the
adapter lacks is SKIP with that reason, never PASS:

========================  ===============================================================
``weights_probe``         ``View.weights/draft/scales/label`` after each action
``cache_probe``           ``View.cache``: every cache entry with its version and tier
``exact_cache``           the SUT never evicts on its own, so a miss is as telling as a hit
                          (opt-in strictness: an entry dropped unasked is then ENG-011)
``provenance``            ``Response.uses``: the versions the reused KV was computed under
``attribution``           ``Response.sampled``: the versions the SUT attributes to a response
``byte_oracle``           ``Response.output`` and ``Response.cold`` (a cold prefill's bytes)
``flush_result``          ``Observation.flushed``: the flush call's reported result
``faults``                FaultRefuseFlush and FaultUpdateFailsMidway can be injected
``inflight``              StartRequest/FinishRequest: requests can stay in flight
``pause``/``sleep``       PauseGeneration/ContinueGeneration, Sleep/WakeUp are supported
``restart``               Restart is supported
``exact_lane``            endpoints can run an exact lane (``rl_on_policy_target``)
``tiers``/``draft``/...   config features the SUT can be started with (``tiers``,
                          ``draft``, ``encoder``, ``fp8_kv``, ``lora``)
``namespaces``            requests may carry a namespace (``cache_salt`` / ``extra_key``)
``memory_tags``           Sleep/WakeUp with ``tags`` (``kv_cache``, ``weights``): partial
                          release and resume, and updates with the KV released
``publish``               PublishVersion: a label-only ``/update_weight_version``
``pause_clear``           PauseGeneration with ``clear_cache`` (vLLM ``/pause?clear_cache=``)
``two_phase``             BeginWeightUpdate, UpdateWeightChunk, FinishWeightUpdate and
                          AbortWeightUpdate (FaultChunkFails with ``faults``)
``derived``               a config feature: state derived from the weights at load time
                          (``View.derived`` when the engine can show it)
``restart_oracle``        ``Response.fresh``: the same prompt's output from an engine freshly
                          started at the version the endpoint claims (its label)
``encoder_reset``         an update leaves the encoder cache to the client, which resets it
                          with FlushEncoderCache (profile ``encoder_reset_separate``)
``ranks``                 endpoints with data-parallel ranks (``Config.ranks``): a request
                          placed on a rank, replies merged, FaultRankUpdateFails
``store``                 endpoints on a shared KV store (``Config.store``):
                          ``Response.stored``, the store entry a prefill loaded, with the
                          lineage, version and KV format that computed it
``roles``                 prefill/decode deployments (``Config.role``): a request on a
                          decode endpoint whose KV the prefill endpoint computes and
                          transfers, live until it finishes (PD-001, FC-005)
``router``                workers behind a router (``Config.router``): LeaveRotation and
                          EnterRotation, the router's answer to putting a worker back,
                          traffic only to workers in rotation (RTR-001)
========================  ===============================================================

Without ``pause``, a SyncWeights drives only UpdateWeights on each endpoint. An engine
adapter may declare a ``profile``: ``Config`` fields applied to every endpoint
(``flush_default``: what an omitted ``flush_cache`` means; ``versioned_keys``: every prefix
keyed by the version in force; ``misreports``: its server info may lie about the radix
cache; ``encoder_reset_separate``: the client owes the encoder-cache reset, CLI-009).
STOPPED means the adapter saw the engine process exit, not merely a lost reply.

An engine adapter may declare ``logprob_tolerance`` (a float >= 0, absolute, in nats;
default 0.0, exact): how far a response's logprobs may drift from a cold prefill of the
same prompt under the same weights through the engine's own numerics (a different kernel
or batch on the prefix-hit path). The byte oracle then takes outputs with the same token
ids and logprobs within it as the same bytes (``kvfence.model.checks.same_output``): float
noise is never stale reuse, while KV of other weights, which moves logprobs by far more,
still is. ``tolerance`` reads it; a negative or non-numeric one is an adapter error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from ..model.actions import Action
from ..model.capabilities import Capability
from ..model.client import Plan
from ..model.observation import Observation
from ..model.state import Config, Policy

CAPABILITIES = frozenset(c.value for c in Capability)
"""Every capability name the checker knows; any other name is an adapter error."""


class Unsupported(Exception):
    """The adapter cannot apply this action or start with this config. The checker only
    sends what the capabilities allow, so raising it during a run is an ERROR (ADP-001):
    declare the capability correctly instead."""


class AdapterFailure(Exception):
    """The SUT or its adapter broke (crash, dead endpoint, malformed answer): ERROR."""


def tolerance(engine: object) -> float:
    """The ``logprob_tolerance`` ``engine`` declares (0.0 when none). ``ValueError`` names
    a value that is not a finite number >= 0."""
    value = getattr(engine, "logprob_tolerance", 0.0)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0.0 <= float(value) < float("inf"):
        raise ValueError(f"logprob_tolerance {value!r:.40} is not a finite number >= 0")
    return float(value)


@runtime_checkable
class EngineAdapter(Protocol):
    """Drives one SUT made of ``len(configs)`` endpoints.

    ``name``: shown in reports. ``capabilities``: see the module table. ``fixed_configs``:
    the endpoint configs this SUT *is* (a real engine), or ``None`` if it can be started
    with any config the machine draws. An optional ``engine_version`` attribute (a string,
    or ``None`` when unknown), read when the check ends: the release of the engine that
    answered (vLLM's ``vllm.__version__``, the SGLang the scheduler hosts imported); the
    check's result and its JSON report carry it.
    """

    name: str
    capabilities: frozenset[str]
    fixed_configs: tuple[Config, ...] | None

    def start(self, configs: tuple[Config, ...]) -> None:
        """(Re)start fresh: every endpoint at version 0, empty cache, nothing in flight.
        Called once per example: reset a running engine rather than relaunch it. An
        optional ``start_timeout`` attribute (seconds) lets a slow first start through.

        Raises ``Unsupported`` for a config it cannot provide, ``AdapterFailure`` if the SUT
        cannot be brought up."""

    def apply(self, action: Action) -> Observation:
        """Apply one engine action (never SyncWeights) and observe. Raises ``Unsupported``
        if the action is outside its capabilities, ``AdapterFailure`` on a broken SUT."""

    def server_info(self, endpoint: int) -> Mapping[str, object] | None:
        """The decoded ``/get_server_info`` body, or ``None`` if it could not be fetched."""

    def close(self) -> None:
        """Release every resource (processes, ports, memory)."""


@runtime_checkable
class ClientAdapter(Protocol):
    """A client resolver under test: policy + server info -> plan for one endpoint. A
    client *program* (``sync(endpoints, version, policy)``, ``adapters/programs.py``) is
    accepted wherever a client is: it has ``name`` and ``sync`` instead of ``resolve``."""

    name: str

    def resolve(self, policy: Policy, info: Mapping[str, object] | None) -> Plan:
        """The plan it would execute. ``info`` is ``None`` when server info was unreachable."""
