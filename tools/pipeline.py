"""Execute prepared tool calls: ledger, timeout, retries, output normalisation, events.

The steps before execution (lookup, validation, access, risk) are in `tools.policy.prepare`.
Here a call is claimed in the ledger (a recorded outcome is replayed, never re-executed),
executed with its timeout and retry policy, its result checked and rendered, recorded, and
reported through `tool.*` events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp

from graphs.events import (
    Emit,
    EventType,
    ToolCompleted,
    ToolFailed,
    ToolFinished,
    ToolStarted,
)
from tools.errors import RETRYABLE, ErrorType, ToolCallError, describe, error_type_of
from tools.isolation import forkserver_ready, run_in_process
from tools.ledger import Claim, LedgerEntry, Outcome, idempotency_key
from tools.policy import PreparedCall, Toolbox
from tools.spec import ToolCallContext, ToolSpec
from tools.validation import check_output, cut_output, redact, render_output

log = logging.getLogger(__name__)

EVENT_OUTPUT_CHARS = 2000


@dataclass
class ToolResult:
    """The outcome of one tool call, as the model and the event log see it."""

    call_id: str
    name: str
    status: Literal["completed", "failed"]
    output: str
    error_type: ErrorType | None = None
    duration_ms: float = 0.0
    attempts: int = 0
    replayed: bool = False
    notes: list[str] = field(default_factory=list)

    def to_message(self, budget: int) -> ToolMessage:
        """Return the ToolMessage for the model: the output cut to `budget`, notes first."""
        if self.status == "failed":
            text = f"Error ({self.error_type}): {self.output}"
            truncated = False
        else:
            text, truncated = cut_output(self.output, budget)
        content = "\n".join([*self.notes, text]) if self.notes else text
        return ToolMessage(
            content=content,
            tool_call_id=self.call_id,
            name=self.name,
            status="error" if self.status == "failed" else "success",
            artifact={
                "errorType": self.error_type,
                "attempts": self.attempts,
                "replayed": self.replayed,
                "truncated": truncated,
                "outputChars": len(self.output),
            },
        )


def started_event(
    toolbox: Toolbox,
    call: PreparedCall,
    *,
    attempt: int | None = None,
    refused: bool = False,
    replayed: bool = False,
) -> ToolStarted:
    """Return the `tool.started` event of a call (arguments redacted)."""
    spec = call.spec
    event: ToolStarted = {
        "event": EventType.TOOL_STARTED,
        "toolCallId": call.call_id,
        "name": call.name,
        "args": redact(call.args, toolbox.redact_keys(spec)),
        "risk": spec.risk if spec else None,
        "source": spec.source if spec else None,
    }
    if attempt is not None:
        event["attempt"] = attempt
    if refused:
        event["refused"] = True
    if replayed:
        event["replayed"] = True
    return event


def finished_event(result: ToolResult, budget: int) -> ToolCompleted | ToolFailed:
    """Return the `tool.completed` or `tool.failed` event of a result."""
    common: ToolFinished = {
        "toolCallId": result.call_id,
        "name": result.name,
        "durationMs": round(result.duration_ms, 3),
        "attempts": result.attempts,
        "replayed": result.replayed,
        "outcome": result.error_type or "success",
    }
    if result.status == "failed":
        return {
            "event": EventType.TOOL_FAILED,
            **common,
            "errorType": result.error_type,
            "retryable": result.error_type in RETRYABLE,
            "error": result.output,
        }
    shown, truncated = cut_output(result.output, min(budget, EVENT_OUTPUT_CHARS))
    return {
        "event": EventType.TOOL_COMPLETED,
        **common,
        "output": shown,
        "outputChars": len(result.output),
        "truncated": truncated,
    }


def refuse(toolbox: Toolbox, call: PreparedCall, error: ToolCallError, emit: Emit) -> ToolResult:
    """Report a call that is not executed (refused by the checks or by a reviewer)."""
    emit(started_event(toolbox, call, refused=True))
    result = ToolResult(call.call_id, call.name, "failed", error.message, error.error_type)
    emit(finished_event(result, toolbox.max_output_chars))
    return result


def ledger_entry(toolbox: Toolbox, call: PreparedCall) -> LedgerEntry:
    """Return the ledger row this attempt would start for `call`."""
    return LedgerEntry(
        run_id=toolbox.run_id,
        tool_call_id=call.call_id,
        tool_name=call.name,
        args=call.args,
        idempotency_key=idempotency_key(toolbox.run_id, call.call_id),
        status="started",
        generation=toolbox.generation,
    )


def replay(toolbox: Toolbox, call: PreparedCall, entry: LedgerEntry, emit: Emit) -> ToolResult:
    """Report a recorded outcome again, without executing anything."""
    emit(started_event(toolbox, call, replayed=True))
    ok = entry.status == "completed"
    result = ToolResult(
        call.call_id,
        call.name,
        "completed" if ok else "failed",
        (entry.output or "") if ok else (entry.error or "failed"),
        None if ok else (entry.error_type or "error"),  # type: ignore[arg-type]
        duration_ms=entry.duration_ms or 0.0,
        attempts=entry.attempts,
        replayed=True,
    )
    emit(finished_event(result, toolbox.max_output_chars))
    return result


async def _invoke(spec: ToolSpec, args: dict[str, Any], context: ToolCallContext) -> Any:
    payload = dict(args)
    if spec.context_arg:
        payload[spec.context_arg] = context
    if spec.cpu_heavy:
        return await run_in_process(spec.tool, payload)
    # langchain-core runs a synchronous tool in the loop's default executor, off the loop.
    return await spec.tool.ainvoke(payload)


async def execute(
    toolbox: Toolbox,
    call: PreparedCall,
    emit: Emit,
    *,
    prior_attempts: int = 0,
    notes: list[str] | None = None,
) -> ToolResult:
    """Execute a claimed call with timeout and retries, record the outcome, emit events.

    A tool that is neither idempotent nor deduplicating is never retried: a timeout or a
    dropped connection leaves its outcome unknown, and that is what the model is told.
    """
    spec = call.spec
    assert spec is not None and call.error is None
    emit(started_event(toolbox, call, attempt=prior_attempts + 1))
    began = time.perf_counter()
    if spec.cpu_heavy:
        # Outside the timeout: the first call in a process waits for the forkserver to start.
        await forkserver_ready()
    result, attempts = await _attempts(toolbox, call, spec, emit, prior_attempts)
    result.duration_ms = (time.perf_counter() - began) * 1000
    result.attempts = prior_attempts + attempts
    result.notes = list(notes or [])
    stored = await toolbox.ledger.store(
        toolbox.run_id, call.call_id, toolbox.generation, outcome_of(result, attempts)
    )
    if not stored:
        log.warning(
            "run %s: ledger row of %s belongs to a newer attempt", toolbox.run_id, call.call_id
        )
    emit(finished_event(result, toolbox.max_output_chars))
    return result


async def _attempts(
    toolbox: Toolbox, call: PreparedCall, spec: ToolSpec, emit: Emit, prior_attempts: int
) -> tuple[ToolResult, int]:
    """Run the call's attempts until one succeeds or no retry is left; return the attempts."""
    timeout = spec.timeout_s or toolbox.default_timeout_s
    max_attempts = max(1, spec.retry.max_attempts) if spec.safe_to_rerun else 1
    attempt = 0
    while True:
        attempt += 1
        context = ToolCallContext(
            run_id=toolbox.run_id,
            tool_call_id=call.call_id,
            idempotency_key=idempotency_key(toolbox.run_id, call.call_id),
            tenant_id=toolbox.tenant_id,
            user_id=toolbox.user_id,
            attempt=prior_attempts + attempt,
        )
        try:
            async with asyncio.timeout(timeout):
                value = await _invoke(spec, call.args, context)
            check_output(spec, value)
            return ToolResult(call.call_id, call.name, "completed", render_output(value)), attempt
        except GraphBubbleUp:
            raise
        except Exception as exc:  # every tool failure becomes a result the model reads
            error_type = error_type_of(exc)
            message = describe(exc)
            if isinstance(exc, TimeoutError) and error_type == "timeout":
                message = f"{call.name} did not finish within {timeout:g} s"
            if error_type not in RETRYABLE or attempt >= max_attempts:
                if not spec.safe_to_rerun and error_type in RETRYABLE:
                    message += (
                        "; the outcome is unknown: the call may or may not have taken effect, "
                        "and it was not retried because the tool cannot be run twice safely"
                    )
                return ToolResult(call.call_id, call.name, "failed", message, error_type), attempt
            delay = spec.retry.backoff(attempt)
            emit(
                {
                    "event": EventType.TOOL_RETRYING,
                    "toolCallId": call.call_id,
                    "name": call.name,
                    "attempt": attempt,
                    "errorType": error_type,
                    "error": message,
                    "delayMs": round(delay * 1000, 1),
                }
            )
            await asyncio.sleep(delay)


def outcome_of(result: ToolResult, attempts: int) -> Outcome:
    """Return the ledger outcome of a result reached in `attempts` attempts."""
    ok = result.status == "completed"
    return Outcome(
        result.status,
        attempts,
        result.duration_ms,
        output=result.output if ok else None,
        error=None if ok else result.output,
        error_type=result.error_type,
    )


async def claim(toolbox: Toolbox, call: PreparedCall) -> tuple[Claim, LedgerEntry]:
    """Claim `call` in the ledger for this attempt."""
    rerunnable = call.spec is not None and call.spec.safe_to_rerun
    return await toolbox.ledger.claim(ledger_entry(toolbox, call), rerunnable=rerunnable)


def budget_for(toolbox: Toolbox, spec: ToolSpec | None) -> int:
    """Return the output budget (characters) for a tool's results."""
    return (spec.max_output_chars if spec else None) or toolbox.max_output_chars
