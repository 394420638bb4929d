"""A circuit breaker per model (provider + model), shared by every run in the process."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class CircuitState(StrEnum):
    """Closed: calls go through. Open: calls fail fast. Half-open: one probe call decides."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class Circuit:
    """The health of one model as this process has seen it."""

    key: str
    state: CircuitState = CircuitState.CLOSED
    consecutive_failures: int = 0
    opened_at: float | None = None
    probe_started_at: float | None = None
    opened_count: int = 0


class CircuitBreakers:
    """Count consecutive retryable failures per model; open after `threshold`.

    An open circuit refuses calls for `cooldown_s`; then one caller is admitted as the probe
    (half-open). Its success closes the circuit, its failure opens it for another cool-down.
    A probe that never reports back (its run was cancelled) is replaced after a cool-down.

    Safe without a lock: every method runs on the event loop thread and never awaits.
    """

    def __init__(
        self,
        threshold: int,
        cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._circuits: dict[str, Circuit] = {}

    def _circuit(self, key: str) -> Circuit:
        circuit = self._circuits.get(key)
        if circuit is None:
            circuit = self._circuits[key] = Circuit(key)
        return circuit

    def state(self, key: str) -> CircuitState:
        """Return the circuit's state now (an open circuit past its cool-down is half-open)."""
        circuit = self._circuit(key)
        if circuit.state == CircuitState.OPEN and self._cooled(circuit.opened_at):
            return CircuitState.HALF_OPEN
        return circuit.state

    def _cooled(self, since: float | None) -> bool:
        return since is not None and self._clock() - since >= self.cooldown_s

    def admit(self, key: str) -> bool:
        """Say whether a call to `key` may go out now; a half-open circuit admits one probe."""
        circuit = self._circuit(key)
        if circuit.state == CircuitState.CLOSED:
            return True
        if circuit.state == CircuitState.OPEN:
            if not self._cooled(circuit.opened_at):
                return False
        elif not self._cooled(circuit.probe_started_at):
            return False  # half-open with a probe in flight
        circuit.state = CircuitState.HALF_OPEN
        circuit.probe_started_at = self._clock()
        return True

    def succeeded(self, key: str) -> None:
        """Record a successful call: the circuit closes."""
        circuit = self._circuit(key)
        circuit.state = CircuitState.CLOSED
        circuit.consecutive_failures = 0
        circuit.opened_at = circuit.probe_started_at = None

    def failed(self, key: str) -> None:
        """Record a retryable failure: open at the threshold, or at once if it was the probe."""
        circuit = self._circuit(key)
        circuit.consecutive_failures += 1
        if (
            circuit.state == CircuitState.HALF_OPEN
            or circuit.consecutive_failures >= self.threshold
        ):
            if circuit.state != CircuitState.OPEN:
                circuit.opened_count += 1
            circuit.state = CircuitState.OPEN
            circuit.opened_at = self._clock()
            circuit.probe_started_at = None

    def retry_in(self, key: str) -> float | None:
        """Seconds until an open circuit admits a probe; None when it is not open."""
        circuit = self._circuit(key)
        if circuit.state != CircuitState.OPEN or circuit.opened_at is None:
            return None
        return max(0.0, circuit.opened_at + self.cooldown_s - self._clock())

    def snapshot(self) -> list[dict[str, Any]]:
        """Describe every circuit seen so far, for the API and metrics."""
        rows = []
        for key, circuit in sorted(self._circuits.items()):
            retry_in = self.retry_in(key)
            rows.append(
                {
                    "model": key,
                    "state": self.state(key).value,
                    "consecutiveFailures": circuit.consecutive_failures,
                    "openedCount": circuit.opened_count,
                    "retryInS": None if retry_in is None else round(retry_in, 3),
                }
            )
        return rows
