"""The NOTIFY channels of agentrt and what their payloads say.

A notification means "look again": listeners read the tables themselves, except that a live
feed takes a small batch carried by the events channel when it follows on from what it holds.
"""

from __future__ import annotations

# payload: "<run id>:<last seq>", then maybe the batch (server/events/carry.py); a log grew
EVENTS_CHANNEL = "agentrt_events"
# payload: "queued:<run id>", a ticket: the run is queued, for the worker it names and every
# busy worker (server/runs/tickets.py); "queued": there is work to claim, for every worker
RUNS_CHANNEL = "agentrt_runs"
TICKET = "queued:"
CANCEL_CHANNEL = "agentrt_cancel"  # payload: run id; its worker cancels it
PAUSE_CHANNEL = "agentrt_pause"  # payload: run id; its worker pauses it
CHANNELS = (EVENTS_CHANNEL, RUNS_CHANNEL, CANCEL_CHANNEL, PAUSE_CHANNEL)
# What a worker-only process listens to: it serves no event streams, so not the log's.
WORKER_CHANNELS = (RUNS_CHANNEL, CANCEL_CHANNEL, PAUSE_CHANNEL)
