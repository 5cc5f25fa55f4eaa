"""The summary table's PFC deadlock rows, from summary.json's deadlocks."""

from fabric_emu.results.table import _deadlock_rows


def test_a_deadlock_that_never_broke_and_one_the_watchdog_broke_twice():
    s = {"deadlocks": {"persistent": [
        {"length": 4, "first_formed_s": 41e-6, "formations": 1, "period_s": None, "unbroken_at_end": True},
        {"length": 6, "first_formed_s": 56e-6, "formations": 2, "period_s": 0.0015, "unbroken_at_end": False}]}}
    assert _deadlock_rows(s) == [("PFC deadlock: 4-buffer cycle", "at 41 us, never broke", ""),
                                 ("PFC deadlock: 6-buffer cycle", "at 56 us, formed 2x, every 1,500 us", "")]


def test_no_rows_without_a_persistent_cycle():
    assert _deadlock_rows({}) == [] and _deadlock_rows({"deadlocks": {"persistent": []}}) == []
