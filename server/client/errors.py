"""Errors the `agentrt` command reports as one line (kept light: imported by every command)."""

from __future__ import annotations


class ClientError(Exception):
    """A request failed; the message is what to tell the person at the terminal."""
