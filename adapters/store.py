"""The reference endpoints on a KV store shared by several endpoints and surviving restarts.

``SharedStore`` stands where an L3 KV store stands (LMCache's remote backend, Mooncake's
store, SGLang HiCache's storage backend, lmdeploy's cache server): one keyspace that
several endpoints write and read, and that outlives their processes. ``StoreEndpoint`` is
a reference scheduler attached to it: every response it computes is written there, and a
prefill that misses its own radix cache looks the prefix up there and, on a match, loads
the entry's KV into its tree (a hit).

What the store matches on is what its keys carry, one hook (``_store_key``). The
reference keys an entry by the prompt, the weight lineage, the weight version and the KV
format (CD-20), so an entry of older weights, of another model or of another KV layout is
never matched again, across endpoints and restarts, and the store needs no flush. A
response reports the entry it loaded (``Reply.stored``, shown as ``Response.stored``) with
what computed it: the evidence STO-001 is judged by.

A store endpoint is modelled with requests, flushes, updates, pauses and restarts
(``model.semantics.STORE_ACTIONS``); the adapter never sends it any other call.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

from ..model.capabilities import Capability
from ..model.state import Config, StoreEntry
from ..model.vocabulary import Kind, Lane
from .reference import PROBED_SCHEDULER, CachedKV, ReferenceEndpoint, Reply

STORE_CONFIGS: tuple[Config, ...] = (
    Config(store=True, lane=Lane.EXACT),
    Config(store=True, kv_format="fp8"),
    Config(store=True, lineage="sft-b"),
)
"""The endpoints a store engine is checked on, all attached to one store: an exact lane
(lineage ``base``, bf16 KV), a standard lane of the same lineage storing fp8 KV, and a
standard lane of another lineage (``sft-b``, bf16)."""

STORE_CAPABILITIES: frozenset[Capability] = PROBED_SCHEDULER | frozenset(
    {
        Capability.RESTART,
        Capability.EXACT_LANE,
        Capability.RESTART_ORACLE,
        Capability.STORE,
    }
)
"""What an in-process store endpoint can be probed for and driven by: the store's
vocabulary (requests, flushes, updates, pauses, restarts), completely probed, and the entry
each prefill loaded. Rules whose evidence needs more (in-flight requests, faults, sleep,
tiers, windows, publishing) are SKIP on it."""


class SharedStore:
    """The deployment's KV store: ``entries`` (key -> the ``StoreEntry`` it holds, with
    what computed it) and ``namespaces`` (the namespaces handed out so far, for a design
    that rotates its namespace). One object shared by every attached endpoint."""

    def __init__(self) -> None:
        self.entries: dict[Hashable, StoreEntry] = {}
        self.namespaces = 0

    def fresh_namespace(self) -> int:
        """A namespace no endpoint has used before."""
        self.namespaces += 1
        return self.namespaces


class StoreEndpoint(ReferenceEndpoint):
    """A reference scheduler attached to a ``SharedStore`` (``attach``), keyed by prompt,
    lineage, version and KV format (CD-20). ``store`` is ``None`` until attached (the
    restart oracle's fresh engines never are); ``restart`` keeps it."""

    fixed_configs: ClassVar[tuple[Config, ...]] = STORE_CONFIGS
    capabilities: ClassVar[frozenset[Capability]] = STORE_CAPABILITIES

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.store: SharedStore | None = None

    def attach(self, store: SharedStore | None) -> None:
        """Join ``store`` (the adapter attaches every endpoint with ``Config.store``)."""
        self.store = store

    def _store_key(self, prefix: str) -> Hashable:
        """What the store's key of ``prefix`` carries: the prompt, the weight lineage,
        the weight version in force and the KV format (CD-20)."""
        c = self.config
        return (prefix, c.lineage, self.weights, c.kv_format)

    def generate(self, prefix: str, lora: bool = False, namespace: int | None = None) -> Reply:
        """``POST /generate``: the radix cache first; on a miss, the store (a match loads
        its KV into the tree); a computed prefix is written back to the store."""
        if self.closed or self.store is None or not self.config.radix:
            return super().generate(prefix, lora, namespace)
        local = any(k in self.cache for k in self._keys(prefix, lora, namespace))
        loaded = None if local else self.store.entries.get(self._store_key(prefix))
        if loaded is not None:
            key = (prefix, Kind.TARGET, None, namespace)
            self.cache[key] = CachedKV(loaded.version)
        reply = super().generate(prefix, lora, namespace)
        reply.stored = loaded
        if reply.ok and not reply.hit:
            c = self.config
            computed = StoreEntry(prefix, c.lineage, self.weights, c.kv_format)
            self.store.entries[self._store_key(prefix)] = computed
        return reply

    def restart(self) -> None:
        """A new process: the local tree is gone, the shared store is not."""
        store = self.store
        super().restart()
        self.attach(store)


__all__ = ["STORE_CAPABILITIES", "STORE_CONFIGS", "SharedStore", "StoreEndpoint"]
