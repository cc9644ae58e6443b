"""Keep vLLM's own output (loggers, weight-loading progress bars, C++ warnings) out of
kvfence's terminal: it goes to a log file whose path the report prints.

:func:`quiet_vllm` redirects file descriptors 1 and 2 to the log for the block (the
adapter wraps each engine start, reset and action in it) and swaps ``sys.stdout`` and
``sys.stderr`` for it too: vLLM configures its ``vllm`` logger on import with a stream
handler on stdout, ``tqdm`` writes to ``sys.stderr``, torch's C++ warnings to descriptor
2. After the block every handler of the ``vllm`` logger points at the same file for the
rest of the run (reloads and refused resets log at INFO/WARNING). ``VLLM_LOGGING_LEVEL``
still sets how much vLLM writes there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def quiet_vllm(log_path: Path) -> Iterator[Path]:
    """Send everything written to stdout/stderr inside the block, and vLLM's logger after
    it, to ``log_path`` (appended; parent directories created)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log, open(log_path, "a", buffering=1) as text:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            # sys.stdout/sys.stderr may not be descriptors 1 and 2 (pytest's capture, a
            # host application's own streams): swap the Python-level streams too.
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield log_path
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
    route_vllm_logger(log_path)


def route_vllm_logger(log_path: Path) -> None:
    """Replace the stream handlers of the ``vllm`` logger (and a file handler this function
    set for another log) by one file handler on ``log_path`` (idempotent)."""
    logger = logging.getLogger("vllm")
    target = str(Path(log_path).resolve())
    for handler in list(logger.handlers):
        ours = getattr(handler, "kvfence_log", False)
        if ours and handler.baseFilename == target:
            return
        if ours or isinstance(handler, logging.StreamHandler):
            logger.removeHandler(handler)
            if ours:
                handler.close()
    handler = logging.FileHandler(target)
    handler.kvfence_log = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s"))
    logger.addHandler(handler)
