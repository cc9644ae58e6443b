"""The reference engines of a prefill/decode (P/D) deployment.

A P/D deployment splits every request across two engines (SGLang's
``--disaggregation-mode prefill|decode`` with a transfer backend such as Mooncake or NIXL,
``python/sglang/srt/disaggregation/``; vLLM's KV connectors): the prefill engine computes
the prompt's KV (hit or miss on its own radix cache) and transfers it, the decode engine
receives it and decodes under its own weights. ``PrefillEndpoint`` and ``DecodeEndpoint``
are reference schedulers in those roles; the adapter attaches every decode endpoint to the
deployment's prefill endpoint (``attach``).

Each side has its own weights and is updated by its own call, so the two may be at two
versions. The reference decode engine checks the version the transferred KV was computed
under against its own (a handshake on the KV's version tag) and refuses a request, or
aborts a live one at its finish, when they differ (PD-001). A request admitted with
``start`` is a live transfer until it finishes: the prefill engine holds its KV too, so its
flush (asked, or inside an update) is refused while one lives (FC-005).

A P/D endpoint is modelled with requests (on the decode side), flushes, updates, pauses and
continues (``model.semantics.PREFILL_ACTIONS``, ``DECODE_ACTIONS``); the adapter never
sends it any other call.
"""

from __future__ import annotations

from typing import ClassVar

from ..model.capabilities import Capability
from ..model.state import Config, Use, server_info
from ..model.vocabulary import PauseMode, Role
from .reference import PROBED_SCHEDULER, ReferenceEndpoint, Reply, Request

PD_CONFIGS: tuple[Config, ...] = (
    Config(role=Role.PREFILL),
    Config(role=Role.DECODE, radix=False, info=server_info(radix_cache_enabled=False)),
)
"""The endpoints a P/D engine is checked on: endpoint 0 the prefill engine (standard lane,
radix cache on), endpoint 1 the decode engine (its own radix cache off, and reported so:
every prefix it decodes arrives by transfer)."""

PD_CAPABILITIES: frozenset[Capability] = PROBED_SCHEDULER | frozenset(
    {
        Capability.INFLIGHT,
        Capability.ROLES,
    }
)
"""What an in-process P/D engine can be probed for and driven by: the P/D vocabulary
(requests on the decode side, live transfers, flushes, updates, pauses), completely probed.
Rules whose evidence needs more (restarts, faults, sleep, tiers, windows, publishing, the
exact lane) are SKIP on it."""


class PrefillEndpoint(ReferenceEndpoint):
    """The reference prefill engine: a scheduler whose radix cache computes the KV of every
    request its decode endpoints admit (``prefill``), and whose flush waits for (here:
    refuses during) every live transfer (``_can_flush``). ``transfers`` are the request
    IDs whose transferred KV a decode endpoint still holds (kept by the decode endpoints).
    ``decode_cls`` is the decode engine it is deployed with."""

    fixed_configs: ClassVar[tuple[Config, ...]] = PD_CONFIGS
    capabilities: ClassVar[frozenset[Capability]] = PD_CAPABILITIES
    decode_cls: ClassVar[type[DecodeEndpoint]]
    prefill_cls: ClassVar[type[PrefillEndpoint]]

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.transfers: set[str] = set()

    def prefill(self, prefix: str) -> tuple[set[Use], bool] | None:
        """Compute ``prefix``'s KV for a transfer: what it depends on and whether the radix
        cache hit; ``None`` while this engine is closed."""
        if self.closed:
            return None
        return self._prefill(prefix, False)

    def live_transfers(self) -> int:
        """How many transfers still hold KV this engine computed: every request a decode
        endpoint admitted that still holds its KV."""
        return len(self.transfers)

    def _can_flush(self) -> bool:
        """LIV-001 and FC-005: a live transfer holds KV of this engine's pool as a running
        request does, so the flush waits for it (here: is refused)."""
        return super()._can_flush() and not self.live_transfers()


class DecodeEndpoint(ReferenceEndpoint):
    """The reference decode engine: a request's KV comes from the attached prefill engine
    (``prefill``), and is accepted only if it was computed under this engine's weight
    version (``_accepts``, the handshake on the KV's version tag), else the request is
    refused; a live request whose KV was computed under other weights than those now in
    force here is aborted at its finish. ``prefill_cls`` is the prefill engine it is
    deployed with."""

    fixed_configs: ClassVar[tuple[Config, ...]] = PD_CONFIGS
    capabilities: ClassVar[frozenset[Capability]] = PD_CAPABILITIES
    prefill_cls: ClassVar[type[PrefillEndpoint]] = PrefillEndpoint
    decode_cls: ClassVar[type[DecodeEndpoint]]

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.prefill: PrefillEndpoint | None = None

    def attach(self, prefill: PrefillEndpoint) -> None:
        """Deploy behind ``prefill`` (the adapter attaches every decode endpoint)."""
        self.prefill = prefill

    def _accepts(self, uses: set[Use]) -> bool:
        """PD-001: the transferred KV was computed under this engine's weight version."""
        return all(u.version == self.live() for u in uses if u.component == "target")

    def _transfer(self, prefix: str) -> tuple[set[Use], bool] | None:
        """The prefill engine computes ``prefix``'s KV and transfers it; ``None``: refused
        (the prefill engine is closed, or the KV is of another version)."""
        if self.prefill is None:
            raise RuntimeError("a decode endpoint runs attached to a prefill endpoint")
        got = self.prefill.prefill(prefix)
        if got is None or not self._accepts(got[0]):
            return None
        return got

    def generate(self, prefix: str, lora: bool = False, namespace: int | None = None) -> Reply:
        """A whole request: the transfer, then the decode under this engine's weights."""
        if self.closed:
            return Reply(False, message="endpoint closed")
        got = self._transfer(prefix)
        if got is None:
            return Reply(False, message="transferred KV of another weight version")
        uses, hit = got
        uses |= self.current_uses()
        output = self._numerics(prefix, uses, hit)
        return Reply(True, hit, frozenset(uses), frozenset({self.live()}), output=output)

    def start(
        self, rid: str, prefix: str, lora: bool = False, namespace: int | None = None
    ) -> Reply:
        """Admit a request: its KV is transferred and it stays live, holding it."""
        if self.closed:
            return Reply(False, message="endpoint closed")
        got = self._transfer(prefix)
        if got is None:
            return Reply(False, message="transferred KV of another weight version")
        uses, hit = got
        self.requests[rid] = Request(prefix, False, {self.live()}, uses)
        self._sync_transfers()
        return Reply(True, hit=hit)

    def finish(self, rid: str) -> Reply:
        """Decode a live request to its end; aborted when its transferred KV is of other
        weights than those now in force here (an update landed during the transfer)."""
        req = self.requests[rid]
        if not self.closed and not req.retracted and not self._accepts(req.uses):
            del self.requests[rid]
            self._sync_transfers()
            return Reply(False, aborted=frozenset({rid}), message="KV of another version")
        reply = super().finish(rid)
        self._sync_transfers()
        return reply

    def pause_generation(self, mode: PauseMode, clear_cache: bool = False) -> Reply:
        """A pause: an abort ends the live transfers, a retract frees their KV."""
        reply = super().pause_generation(mode, clear_cache)
        self._sync_transfers()
        return reply

    def continue_generation(self) -> Reply:
        """Retracted requests recompute their KV here and hold it again."""
        reply = super().continue_generation()
        self._sync_transfers()
        return reply

    def _sync_transfers(self) -> None:
        """Tell the prefill engine which transfers are live: the requests that still hold
        their KV here (its pages stay pinned there until then)."""
        if self.prefill is not None:
            self.prefill.transfers = {k for k, r in self.requests.items() if not r.retracted}


PrefillEndpoint.prefill_cls = PrefillEndpoint
PrefillEndpoint.decode_cls = DecodeEndpoint
DecodeEndpoint.decode_cls = DecodeEndpoint

PD_CLASSES = (PrefillEndpoint, DecodeEndpoint)
"""The classes of the reference P/D engines: a class that is neither runs, on a P/D
config, as these."""


def pd_endpoint(cls: type, config: Config) -> ReferenceEndpoint:
    """The endpoint of ``config`` (``Config.role`` set) an engine of class ``cls`` runs: its
    own class in its own role, the role's class it names otherwise (``prefill_cls``,
    ``decode_cls``), the reference P/D engine's where ``cls`` is no P/D engine."""
    ours = issubclass(cls, PD_CLASSES)
    if config.role is Role.PREFILL:
        if ours and issubclass(cls, PrefillEndpoint):
            return cls(config)
        return (cls.prefill_cls if ours else PrefillEndpoint)(config)  # type: ignore[attr-defined]
    if ours and issubclass(cls, DecodeEndpoint):
        return cls(config)
    return (cls.decode_cls if ours else DecodeEndpoint)(config)  # type: ignore[attr-defined]


def attach_roles(endpoints: list[ReferenceEndpoint]) -> None:
    """Attach every decode endpoint to the first prefill endpoint of ``endpoints``."""
    prefill = next((e for e in endpoints if isinstance(e, PrefillEndpoint)), None)
    for e in endpoints:
        if isinstance(e, DecodeEndpoint) and prefill is not None:
            e.attach(prefill)


__all__ = [
    "PD_CAPABILITIES",
    "PD_CLASSES",
    "PD_CONFIGS",
    "DecodeEndpoint",
    "PrefillEndpoint",
    "attach_roles",
    "pd_endpoint",
]
