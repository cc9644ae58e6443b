"""The reference workers of a deployment behind a router.

A router (SGLang's model gateway, sgl-router; vLLM's router and production-stack) stands in
front of several engines, its workers: it routes each request to a worker in its rotation,
takes a worker out (``/remove_worker``) and puts it back (``/add_worker``, after a health
check: sgl-project/sglang PR #2392), and fans each control call (pause, update, flush,
continue) out to the workers. ``Rotation`` is the router's bookkeeping, one object shared by
every worker of the deployment (the adapter attaches it, ``attach_router``);
``RouterWorker`` is a reference scheduler behind it.

What a worker must show before it re-enters is one hook (``_settled``): the reference
router puts a worker back only once its sync settled: it serves again (continued), is not
closed, holds the newest weights of the deployment's workers, and its tree holds no KV of
other weights (RTR-001). On an update of a worker in rotation the reference router drains
a serving worker first (it leaves the rotation, then updates), and updates a paused one in
place (the whole rotation paused for the sync: no traffic is admitted).

The router's own prefix index (sgl-router's cache-aware policy) decides only which worker
a request goes to, so it is not modelled: it changes the hit rate, never which KV a worker
may reuse (docs/deployments.md says why). A worker is modelled with requests, flushes,
updates, pauses and continues (``model.semantics.ROUTER_ACTIONS``); the adapter never sends
it any other call.
"""

from __future__ import annotations

from typing import ClassVar

from ..model.capabilities import Capability
from ..model.state import Config
from ..model.vocabulary import Funnel, Kind, Phase
from .reference import PROBED_SCHEDULER, ReferenceEndpoint, Reply

ROUTER_CONFIGS: tuple[Config, ...] = (Config(router=True), Config(router=True))
"""The workers a router engine is checked on: two standard-lane workers with the radix
cache on, behind one router."""

ROUTER_CAPABILITIES: frozenset[Capability] = PROBED_SCHEDULER | frozenset(
    {
        Capability.INFLIGHT,
        Capability.ROUTER,
    }
)
"""What an in-process router deployment can be probed for and driven by: the router's
vocabulary (requests to workers in rotation, flushes, updates, pauses, continues, taking
a worker out and putting it back), completely probed. Rules whose evidence needs more
(restarts, faults, sleep, tiers, windows, publishing, the exact lane) are SKIP on it."""


class Rotation:
    """The router's bookkeeping shared by its workers: ``newest``, the newest whole weight
    version any worker installed (what a sync moved the deployment to so far). Each
    worker's ``rotation`` flag says whether the router sends it traffic. It holds no
    reference back to the workers (the explorer's fingerprint walks their fields)."""

    def __init__(self) -> None:
        self.newest = 0


class RouterWorker(ReferenceEndpoint):
    """A reference scheduler behind a router; ``rotation``: the router sends it traffic.
    ``router`` is ``None`` until attached."""

    fixed_configs: ClassVar[tuple[Config, ...]] = ROUTER_CONFIGS
    capabilities: ClassVar[frozenset[Capability]] = ROUTER_CAPABILITIES

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.rotation = True
        self.router: Rotation | None = None

    def attach(self, router: Rotation) -> None:
        """Deploy behind ``router`` (the adapter attaches every worker)."""
        self.router = router
        router.newest = max(router.newest, self.weights)

    def _install(self, version: int, funnel: Funnel) -> None:
        super()._install(version, funnel)
        if self.router is not None:
            self.router.newest = max(self.router.newest, self.weights)

    def _settled(self) -> bool:
        """RTR-001: serving again, not closed, at the deployment's newest weights, no KV of
        other weights in the tree."""
        newest = self.router.newest if self.router is not None else self.weights
        stale = any(
            kv.version != self.weights for key, kv in self.cache.items() if key[1] is Kind.TARGET
        )
        return (
            self.phase is Phase.SERVING
            and not self.closed
            and self.window is None
            and self.weights == newest
            and not stale
        )

    def leave_rotation(self) -> Reply:
        """The router's ``/remove_worker``: no more traffic here."""
        self.rotation = False
        return Reply(True)

    def enter_rotation(self) -> Reply:
        """The router's ``/add_worker``: back into rotation only once the sync settled."""
        if not self._settled():
            return Reply(False, message="worker's sync has not settled")
        self.rotation = True
        return Reply(True)

    def _drain_for_update(self) -> bool:
        """Whether the router takes the worker out of rotation before its update: a
        serving worker in rotation is drained; a paused one is updated in place."""
        return self.rotation and self.phase is Phase.SERVING

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        """The router's fan-out of an update to this worker, after draining it when it
        serves (``_drain_for_update``)."""
        if self._drain_for_update():
            self.rotation = False
        return super().update_weights(version, funnel, flush_cache)


def attach_router(endpoints: list[ReferenceEndpoint]) -> None:
    """Put every worker (``Config.router``) of ``endpoints`` behind one router; ``TypeError``
    names a worker whose class is not a ``RouterWorker``."""
    router = Rotation()
    for ep in endpoints:
        if not ep.config.router:
            continue
        if not isinstance(ep, RouterWorker):
            raise TypeError(f"{type(ep).__name__} is not a worker behind a router")
        ep.attach(router)


__all__ = ["ROUTER_CAPABILITIES", "ROUTER_CONFIGS", "Rotation", "RouterWorker", "attach_router"]
