"""The weight versions of a ``kvfence serve`` endpoint, as the engine accounts for them.

One place tracks them: the newest version the trainer pushed, the version installed, where
each came from, the labels (``/update_weight_version``, an update's ``weight_version``) and
an open two-phase update. This is the engine's own account, kept apart from the model's
(which a FAIL freezes), so that a trainer's run goes on being answered after a verdict.
"""

from __future__ import annotations

from attrs import Factory, define

from ...model.observation import Observation
from ...model.vocabulary import Status


@define
class Weights:
    """Weight versions of the endpoint (versions are ints, 0 the initial weights)."""

    trainer: int = 0
    """The newest version the trainer pushed (a refused update still counts)."""
    installed: int = 0
    """The version installed, as the engine's observations show it."""
    sources: dict[int, str] = Factory(lambda: {0: "initial weights"})
    """Version -> what it was loaded from (a checkpoint path, a payload, a label)."""
    labels: dict[str, int] = Factory(dict)
    """Label -> the version it names (the version it was first given to)."""
    published: tuple[int, str] | None = None
    """The label published last, with its version."""
    window: tuple[int, str] | None = None
    """The version an open two-phase update installs, and its source."""

    def next_version(self) -> int:
        """The version the next update installs: the one a refused update left pending,
        else one past the trainer's newest."""
        return self.trainer if self.trainer > self.installed else self.trainer + 1

    def pushed(self, version: int) -> None:
        """The trainer sent ``version`` (accepted or not)."""
        self.trainer = max(self.trainer, version)

    def settle(self, version: int, source: str, obs: Observation) -> bool:
        """After an update of ``version`` the engine answered ``obs``: the version it shows
        installed (its view, else ``version`` on OK) becomes the installed one when it is
        ``version``; whether it did."""
        shown = obs.view.weights if obs.view is not None else None
        ok = obs.status is Status.OK
        if (shown if shown is not None else version if ok else None) != version:
            return False
        self.installed = version
        self.sources[version] = source
        return True

    def name(self, version: int, label: str) -> None:
        """``label`` names ``version`` (unless it named one before) and is published."""
        self.labels.setdefault(label, version)
        self.published = (version, label)

    def named(self, label: str) -> int:
        """The version ``label`` names: its own, else the trainer's newest."""
        return self.labels.get(label, self.trainer)

    def label(self) -> str:
        """The weight-version label the engine reports: the one published for the weights
        in force, else "default" at the start (as both engines until one is set), else the
        version number."""
        if self.published is not None and self.published[0] == self.installed:
            return self.published[1]
        return "default" if self.installed == 0 else str(self.installed)

    def latest_source(self) -> str:
        """What the newest installed version was loaded from."""
        return self.sources[max(self.sources)]
