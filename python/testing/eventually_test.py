"""eventually(): returns as soon as the condition holds, and gives up
(false) at its deadline."""

import threading
import time
import unittest

from eventually import eventually


class EventuallyTest(unittest.TestCase):
    def test_a_condition_that_holds_returns_its_value_at_once(self):
        start = time.monotonic()
        self.assertEqual(eventually(lambda: 7, timeout=10), 7)
        self.assertLess(time.monotonic() - start, 1.0)

    def test_a_condition_another_thread_makes_true_is_seen(self):
        done = threading.Event()
        t = threading.Timer(0.05, done.set)
        t.start()
        try:
            self.assertTrue(eventually(done.is_set, timeout=10))
        finally:
            t.join()

    def test_a_condition_that_never_holds_is_false_after_the_deadline(self):
        calls = []

        def never():
            calls.append(1)
            return False

        start = time.monotonic()
        self.assertFalse(eventually(never, timeout=0.2))
        self.assertGreaterEqual(time.monotonic() - start, 0.2)
        self.assertGreater(len(calls), 2)  # polled, and once more at the end


if __name__ == "__main__":
    unittest.main()
