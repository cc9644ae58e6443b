"""How a peer driver reports its calls: one JSON line per record on standard output, in one
write, so that a framework's logger writing to the same stream from another thread (AReaL's
colour log of its GLOO group, seen landing between ``print``'s text and its newline) cannot
split a record; ``tests/peer_lane.py`` reads every line naming a ``call``."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(record: dict[str, Any]) -> None:
    """Write ``record`` as one JSON line, newline included, in a single write, and flush."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()
