"""The circuit breaker: open after N consecutive failures, one probe after the cool-down."""

from __future__ import annotations

from nodes.models.breaker import CircuitBreakers


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_threshold_consecutive_failures_only() -> None:
    breakers = CircuitBreakers(threshold=3, cooldown_s=10, clock=Clock())
    breakers.failed("m")
    breakers.failed("m")
    breakers.succeeded("m")  # a success resets the count
    breakers.failed("m")
    breakers.failed("m")
    assert breakers.state("m") == "closed" and breakers.admit("m")
    breakers.failed("m")
    assert breakers.state("m") == "open"
    assert not breakers.admit("m")
    assert breakers.admit("other")  # circuits are per model


def test_one_probe_after_cooldown_and_its_result_decides() -> None:
    clock = Clock()
    breakers = CircuitBreakers(threshold=1, cooldown_s=10, clock=clock)
    breakers.failed("m")
    clock.now = 9.9
    assert not breakers.admit("m")
    assert breakers.retry_in("m") is not None
    clock.now = 10.0
    assert breakers.state("m") == "half_open"
    assert breakers.admit("m")  # the probe
    assert not breakers.admit("m")  # nobody else while it is in flight
    breakers.failed("m")  # the probe failed: open again for a full cool-down
    assert breakers.state("m") == "open"
    clock.now = 19.9
    assert not breakers.admit("m")
    clock.now = 20.0
    assert breakers.admit("m")
    breakers.succeeded("m")
    assert breakers.state("m") == "closed" and breakers.admit("m") and breakers.admit("m")


def test_a_probe_that_never_reports_is_replaced_after_a_cooldown() -> None:
    clock = Clock()
    breakers = CircuitBreakers(threshold=1, cooldown_s=10, clock=clock)
    breakers.failed("m")
    clock.now = 10.0
    assert breakers.admit("m")  # this probe's run is cancelled and never reports
    clock.now = 15.0
    assert not breakers.admit("m")
    clock.now = 20.0
    assert breakers.admit("m")


def test_snapshot_describes_each_circuit() -> None:
    clock = Clock()
    breakers = CircuitBreakers(threshold=2, cooldown_s=30, clock=clock)
    breakers.failed("a")
    breakers.failed("b")
    breakers.failed("b")
    clock.now = 5.0
    rows = {r["model"]: r for r in breakers.snapshot()}
    assert rows["a"]["state"] == "closed" and rows["a"]["consecutiveFailures"] == 1
    assert rows["b"]["state"] == "open" and rows["b"]["retryInS"] == 25.0
    assert rows["b"]["openedCount"] == 1
