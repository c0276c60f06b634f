"""Tests only: eventually() waits, with a deadline, for a condition that
another thread or process makes true, instead of sleeping a fixed time
(the Python twin of common/eventually.h)."""

import time


def eventually(pred, timeout=20.0, max_interval=0.05):
    """Polls `pred` until it returns a true value and returns that value;
    at the deadline `timeout` seconds from now it is asked once more and its
    (false) answer is returned. Polls after 1 ms, then backs off to at most
    every `max_interval` seconds, so a fast condition is seen at once and a
    slow one costs little CPU."""
    deadline = time.monotonic() + timeout
    interval = 0.001
    while True:
        got = pred()
        if got:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            return pred()
        time.sleep(min(interval, left))
        interval = min(interval * 2, max_interval)
