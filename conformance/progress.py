"""Progress on long runs: a rich progress bar with the total on a terminal, else one line
on stderr at most every ``PERIOD`` seconds (a CI log gets a heartbeat, not a redraw)."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

PERIOD = 10.0
"""Seconds between two progress lines when stderr is not a terminal."""


class Progress:
    """``total`` units of work named ``what`` (``"runs"``, ``"examples"``): ``advance()``
    once per unit done, with a ``label`` for the last one. On a terminal (``stream`` is a
    TTY) a rich bar shows ``done/total`` and the elapsed time, and is gone when the block
    ends; otherwise a line ``kvfence mutants: 12/64 runs, 31 s (last: NAME)`` goes to
    ``stream`` at most every ``period`` seconds, and once when the block ends. ``enabled=False``
    prints nothing."""

    def __init__(
        self,
        title: str,
        total: int,
        what: str,
        stream: TextIO | None = None,
        enabled: bool = True,
        period: float = PERIOD,
    ) -> None:
        self.title, self.total, self.what = title, total, what
        self.stream = sys.stderr if stream is None else stream
        self.enabled, self.period = enabled, period
        self.done = 0
        self.started = self.last_line = time.monotonic()
        self._bar: RichProgress | None = None
        self._task = None

    def __enter__(self) -> Progress:
        if self.enabled and self.stream.isatty():
            self._bar = RichProgress(
                TextColumn(f"{self.title}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.what),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def advance(self, label: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, advance=1, total=self.total, description=label)
            return
        now = time.monotonic()
        if now - self.last_line >= self.period:
            self.last_line = now
            self._line(label)

    def _line(self, label: str) -> None:
        last = f" (last: {label})" if label else ""
        seconds = time.monotonic() - self.started
        print(
            f"{self.title}: {self.done}/{self.total} {self.what}, {seconds:.0f} s{last}",
            file=self.stream,
            flush=True,
        )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.enabled and self.done and error is None:
            self._line("")  # the last count, once
