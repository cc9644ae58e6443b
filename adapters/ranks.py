"""The reference endpoint with data-parallel ranks: one endpoint, several schedulers.

``RankedEndpoint`` stands where SGLang's DP controller stands (``--dp-size`` N,
``python/sglang/srt/managers/data_parallel_controller.py``): it places each request on the
rank it names (``GenerateReqInput.data_parallel_rank``), fans a flush or a weight update out
to every rank, and answers with the merge of their replies. Each rank is a
``ReferenceEndpoint`` with its own weights, radix cache and in-flight requests.

The reference merges as the spec asks: a flush runs only if every rank can flush, so it is
all or nothing (RNK-001); an update succeeds only if every rank installed it, and one that
failed on some rank while others moved closes the endpoint, reporting no version, until an
update completes on every rank (RNK-002, RNK-003). The merges and the closing are hooks, so
that a design or a mutant changes one decision: ``_every_rank_can_flush``,
``_merge_flush``, ``_merge_update``, ``_closed``.

Ranks are modelled with the radix cache and lanes alone: a ranked endpoint takes requests,
flushes, raw updates and the rank fault (``model.semantics.RANKED_ACTIONS``); any other call
raises ``Unsupported``, and the checker reports it as ERROR, never a verdict.
"""

from __future__ import annotations

from typing import ClassVar

from ..model.capabilities import Capability
from ..model.fast import evolve
from ..model.observation import View
from ..model.state import Config
from ..model.vocabulary import Funnel, Lane, PauseMode, Phase
from .protocol import Unsupported
from .reference import PROBED_SCHEDULER, ReferenceEndpoint, Reply

RANKS_CONFIGS: tuple[Config, ...] = (Config(lane=Lane.EXACT, ranks=2), Config(ranks=2))
"""The endpoints a ranked engine is checked on: an exact lane and a standard lane, each with
two data-parallel ranks (the explorer's ``ranks`` setup)."""


RANKS_CAPABILITIES: frozenset[Capability] = PROBED_SCHEDULER | frozenset(
    {
        Capability.FAULTS,
        Capability.INFLIGHT,
        Capability.EXACT_LANE,
        Capability.RESTART_ORACLE,
        Capability.RANKS,
    }
)
"""What a ranked in-process endpoint can be probed for and driven by: the ranks vocabulary
(requests, flushes, updates, pauses, the rank fault), completely probed. Rules whose
evidence needs more (sleep, restart, tiers, windows, publishing) are SKIP on it."""


class RankedEndpoint:
    """One endpoint of ``config.ranks`` data-parallel ranks (``ranks[k]``, each a
    ``ReferenceEndpoint`` of the same config with one rank).

    State of its own: ``label`` (the version the endpoint reports), ``torn`` (closed until
    an update completes on every rank), ``placed`` (request ID -> its rank), ``failing``
    (ranks whose next update fails: FaultRankUpdateFails) and ``served_on`` (the rank of the
    last ``generate``, whose weights a cold prefill of the same prompt uses).
    """

    exact_cache: ClassVar[bool] = False
    profile: ClassVar[dict[str, bool]] = {}
    fixed_configs: ClassVar[tuple[Config, ...]] = RANKS_CONFIGS
    capabilities: ClassVar[frozenset[Capability]] = RANKS_CAPABILITIES
    rank_cls: type[ReferenceEndpoint] = ReferenceEndpoint
    """The scheduler each rank runs (``InProcessAdapter`` passes its own class, so the
    reference engine on a ranked config is this controller over reference schedulers)."""

    def __init__(self, config: Config, rank_cls: type[ReferenceEndpoint] | None = None) -> None:
        self.config = config
        one = evolve(config, ranks=1)
        scheduler = rank_cls or type(self).rank_cls
        self.ranks = [scheduler(one) for _ in range(config.ranks)]
        self.label: int | None = 0
        self.torn = False
        self.placed: dict[str, int] = {}
        self.failing: set[int] = set()
        self.served_on = 0
        self.lora_rev = 0

    # ----- probes -----------------------------------------------------------------------

    def get_server_info(self) -> dict[str, object] | None:
        """SGLang ``GET /get_server_info`` (the controller's own, the same for every rank)."""
        return None if self.config.info is None else dict(self.config.info)

    @property
    def split(self) -> bool:
        """The ranks are not all at one weight version."""
        return len({r.weights for r in self.ranks}) > 1

    def weight_info(self) -> View:
        """The endpoint's probe: one version only while every rank is at it and the endpoint
        is open; the cache is every rank's entries."""
        views = [r.weight_info() for r in self.ranks]
        whole = not self.torn and not self.split and all(v.weights is not None for v in views)
        cache = frozenset().union(*(v.cache or frozenset() for v in views))
        return View(weights=views[0].weights if whole else None, label=self.label, cache=cache)

    # ----- requests ---------------------------------------------------------------------

    def _closed(self) -> bool:
        """RNK-003: refuse to serve while a failed update left the ranks torn."""
        return self.torn

    def generate(
        self, prefix: str, lora: bool = False, namespace: int | None = None, rank: int = 0
    ) -> Reply:
        """``POST /generate`` with ``data_parallel_rank``: served by that rank."""
        if self._closed():
            return Reply(False, message="ranks torn by a failed update: closed")
        self.served_on = rank
        return self.ranks[rank].generate(prefix, lora, namespace)

    def cold_output(self, prefix: str, lora: bool = False) -> tuple[object, ...]:
        """A cold prefill under the weights of the rank that served last."""
        return self.ranks[self.served_on].cold_output(prefix, lora)

    def start(
        self, rid: str, prefix: str, lora: bool = False, namespace: int | None = None, rank: int = 0
    ) -> Reply:
        """Admit a streaming request on ``rank``; it and its KV stay there."""
        if self._closed():
            return Reply(False, message="ranks torn by a failed update: closed")
        self.placed[rid] = rank
        return self.ranks[rank].start(rid, prefix, lora, namespace)

    def finish(self, rid: str) -> Reply:
        """The request finishes on its rank; aborted while the ranks are torn."""
        rank = self.ranks[self.placed.pop(rid)]
        if self._closed():
            rank.requests.pop(rid)
            return Reply(False, aborted=frozenset({rid}), message="aborted: ranks torn")
        return rank.finish(rid)

    # ----- pause -----------------------------------------------------------------------

    def pause_generation(self, mode: PauseMode) -> Reply:
        """``POST /pause_generation`` fanned out: each rank deals with its own requests."""
        replies = [r.pause_generation(mode) for r in self.ranks]
        aborted = frozenset().union(*(r.aborted for r in replies))
        for rid in aborted:
            self.placed.pop(rid, None)
        return Reply(all(r.ok for r in replies), aborted=aborted)

    def continue_generation(self) -> Reply:
        """``POST /continue_generation`` fanned out; nothing recomputes while torn."""
        for rank in self.ranks:
            if self._closed():
                rank.phase = Phase.SERVING
            else:
                rank.continue_generation()
        return Reply(True)

    # ----- flush ------------------------------------------------------------------------

    def flush_cache(self) -> Reply:
        """``POST /flush_cache`` fanned out to every rank, merged (RNK-001)."""
        if not self._every_rank_can_flush():
            return Reply(False, flushed=False, message="a rank holds KV; no rank flushed")
        return self._merge_flush([r.flush_cache() for r in self.ranks])

    def _every_rank_can_flush(self) -> bool:
        """The controller asks every rank first, so the flush is all or nothing."""
        return all(r._can_flush() for r in self.ranks)

    def _merge_flush(self, replies: list[Reply]) -> Reply:
        """Success only if every rank's flush succeeded."""
        refused = [k for k, r in enumerate(replies) if not r.ok]
        if refused:
            return Reply(False, flushed=False, message=f"rank(s) {refused} refused the flush")
        return Reply(True, flushed=True)

    # ----- weights ----------------------------------------------------------------------

    def fail_rank_update(self, rank: int) -> Reply:
        """FaultRankUpdateFails: the next update fails on ``rank`` alone."""
        self.failing.add(rank)
        return Reply(True)

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        """``POST /update_weights_from_{funnel}`` fanned out to every rank, merged (RNK-002)."""
        replies = []
        for k, rank in enumerate(self.ranks):
            if k in self.failing:
                replies.append(Reply(False, message=f"rank {k}: update raised"))
            else:
                replies.append(rank.update_weights(version, funnel, flush_cache))
        self.failing.clear()
        return self._merge_update(version, replies)

    def _merge_update(self, version: int, replies: list[Reply]) -> Reply:
        """Every rank installed it: success, labelled, open. Some rank failed: failure, and
        if the other ranks moved, closed with no label until a whole update (CD-17)."""
        failed = [k for k, r in enumerate(replies) if not r.ok]
        if not failed:
            self.torn, self.label = False, version
            return Reply(True)
        if self.split:
            self.torn, self.label = True, None
            return Reply(False, message=f"rank(s) {failed} failed; ranks torn: closed")
        return Reply(False, message=f"rank(s) {failed} failed; no rank moved")

    def fail_update_midway(self, version: int) -> Reply:
        """A bucketed update that breaks midway on every rank: each rolls back (FC-004)."""
        replies = [r.fail_update_midway(version) for r in self.ranks]
        return Reply(False, message="; ".join(r.message for r in replies))

    def _install(self, version: int, funnel: Funnel) -> None:
        """Load ``version`` on every rank (a fresh engine for the restart oracle)."""
        for rank in self.ranks:
            rank._install(version, funnel)
        self.label = version

    def __getattr__(self, name: str) -> object:
        """Any other engine call (pause, sleep, restart, windows, publish, LoRA, tiers) is
        not modelled across ranks: it exists, and raises ``Unsupported`` when made."""
        if name.startswith("_"):
            raise AttributeError(name)

        def unsupported(*args: object, **kwargs: object) -> Reply:
            raise Unsupported(f"{name} is not modelled on an endpoint with data-parallel ranks")

        return unsupported


__all__ = ["RANKS_CONFIGS", "RankedEndpoint"]
