"""Errors the `agentrt` command reports as one line (kept light: imported by every command)."""

from __future__ import annotations


class StartupError(Exception):
    """A start-up check failed; the message names the problem and the fix."""


class ClientError(Exception):
    """A request failed; the message is what to tell the person at the terminal."""
