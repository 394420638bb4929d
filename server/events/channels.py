"""The NOTIFY channels of agentrt and what their payloads say.

A notification only means "look again": listeners always read the tables themselves.
"""

from __future__ import annotations

EVENTS_CHANNEL = "agentrt_events"  # payload: "<run id>:<last seq>"; a run's log grew
RUNS_CHANNEL = "agentrt_runs"  # payload: "queued": there is work to claim
CANCEL_CHANNEL = "agentrt_cancel"  # payload: run id; its worker cancels it
PAUSE_CHANNEL = "agentrt_pause"  # payload: run id; its worker pauses it
CHANNELS = (EVENTS_CHANNEL, RUNS_CHANNEL, CANCEL_CHANNEL, PAUSE_CHANNEL)
# What a worker-only process listens to: it serves no event streams, so not the log's.
WORKER_CHANNELS = (RUNS_CHANNEL, CANCEL_CHANNEL, PAUSE_CHANNEL)
