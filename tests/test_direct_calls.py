"""Direct adapter calls: an in-process adapter is called on the main thread, and a call
that hangs is still stopped (the watchdog's SIGALRM, ADP-001), even one that swallows the
alarm; off the main thread a call goes through the worker thread."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from kvfence.conformance import calls
from kvfence.conformance.calls import call_with_timeout, is_direct
from kvfence.conformance.errors import AdapterError

# ----- direct adapter calls ----------------------------------------------------------------


def test_in_process_adapters_are_called_directly():
    from kvfence.adapters import registry

    assert is_direct(registry.engine("reference")) and is_direct(registry.client("reference"))
    seen = []
    assert call_with_timeout(lambda: seen.append(threading.current_thread()), 5, "x", True) is None
    assert seen == [threading.main_thread()]


def test_a_hanging_direct_call_is_stopped_by_the_watchdog():
    """No worker thread to abandon: the watchdog's SIGALRM interrupts the call (ADP-001),
    and it is disarmed afterwards."""
    t = time.monotonic()
    with pytest.raises(AdapterError, match=r"did not answer within 0\.2 s"):
        call_with_timeout(lambda: threading.Event().wait(), 0.2, "apply", direct=True)
    assert time.monotonic() - t < 5
    assert calls._DOG and calls._DOG[0].deadline is None  # disarmed
    assert call_with_timeout(lambda: 7, 1, "after", direct=True) == 7


def test_a_direct_call_that_swallows_the_alarm_is_stopped_by_the_next():
    def stubborn():
        for _ in range(3):
            with contextlib.suppress(BaseException):
                threading.Event().wait()
        threading.Event().wait()

    with pytest.raises(AdapterError, match="did not answer"):
        call_with_timeout(stubborn, 0.1, "apply", direct=True)


def test_direct_calls_off_the_main_thread_use_the_worker():
    out = []

    def run():
        try:
            call_with_timeout(lambda: threading.Event().wait(), 0.2, "apply", direct=True)
        except AdapterError as e:
            out.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert out and "did not answer within 0.2 s" in out[0]
