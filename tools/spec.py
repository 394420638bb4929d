"""What a tool declares: schema, executor, timeout, retry policy, risk, permissions, idempotency.

A `ToolSpec` wraps a langchain-core `BaseTool` (name, description, input schema derived from
the function signature and docstring, async executor) with the policy the runtime enforces.
Python tools are declared with `@agent_tool`; existing langchain tools and MCP tools are
wrapped with `ToolSpec(tool, ...)`.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args, get_origin, get_type_hints, overload

from langchain_core.tools import BaseTool, InjectedToolArg, StructuredTool
from pydantic import BaseModel

from tools.config import Risk

RISKS: tuple[Risk, ...] = ("low", "medium", "high")


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failed execution is tried again, for errors classified as retryable.

    `max_attempts` counts the first try. Backoff is exponential with full jitter.
    """

    max_attempts: int = 1
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    multiplier: float = 2.0

    def backoff(self, attempt: int) -> float:
        """Return the delay before try `attempt + 1` (attempt counts from 1)."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return random.uniform(0, ceiling)


@dataclass(frozen=True)
class ToolCallContext:
    """What a tool may know about the call it serves; injected, never shown to the model.

    Attributes:
        run_id: The run making the call.
        tool_call_id: The model's id for this call.
        idempotency_key: Stable across replays and re-runs of this call; pass it to the outside
            system so that a repeated request is recognised as the same one.
        tenant_id: The tenant of the run.
        user_id: The user who started the run.
        attempt: 1 for the first execution of this call, higher for retries and re-runs.
    """

    run_id: str
    tool_call_id: str
    idempotency_key: str
    tenant_id: str
    user_id: str
    attempt: int = 1


# Annotate a tool parameter with this to receive the ToolCallContext; it is left out of the
# schema the model sees.
CallContext = Annotated[ToolCallContext, InjectedToolArg]


@dataclass(frozen=True)
class ToolSpec:
    """A tool and the policy around it.

    Attributes:
        tool: The langchain-core tool: name, description (a prompt for the model), input
            schema, and the async executor.
        risk: `low | medium | high`; the tenant's policy decides which levels need approval.
        permissions: Permissions the caller must hold, e.g. `{"email:send"}`.
        timeout_s: Per execution; None uses the run's default.
        retry: Retry policy for retryable errors (timeouts, connection errors).
        idempotent: Running it twice has the same effect as once.
        dedupes: For a non-idempotent tool: it passes `ToolCallContext.idempotency_key` to an
            outside system that drops repeats, so it is safe to re-run with the same key.
        output_schema: Optional pydantic model or JSON schema the result must satisfy.
        redact: Argument names whose values never appear in events or approval listings.
        source: Where it comes from: `python`, `mcp:<server>`, `http`.
        max_output_chars: Budget for the result the model sees; None uses the run's default.
        context_arg: Name of the parameter receiving the ToolCallContext, if any.
        cpu_heavy: Runs in a separate process that is killed at the timeout, so that work
            holding the GIL (big-integer arithmetic, regular expressions, parsing) cannot
            stall the server. The tool must be importable by name (defined at module level).
    """

    tool: BaseTool
    risk: Risk = "low"
    permissions: frozenset[str] = frozenset()
    timeout_s: float | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    idempotent: bool = True
    dedupes: bool = False
    output_schema: type[BaseModel] | dict[str, Any] | None = None
    redact: frozenset[str] = frozenset()
    source: str = "python"
    max_output_chars: int | None = None
    context_arg: str | None = None
    cpu_heavy: bool = False

    @property
    def name(self) -> str:
        """The name the model calls the tool by."""
        return self.tool.name

    @property
    def description(self) -> str:
        """The description the model reads."""
        return self.tool.description

    @property
    def safe_to_rerun(self) -> bool:
        """Say whether an execution whose outcome is unknown may simply be run again."""
        return self.idempotent or self.dedupes

    def input_schema(self) -> dict[str, Any]:
        """Return the JSON schema of the arguments the model provides."""
        schema = self.tool.tool_call_schema
        if isinstance(schema, dict):
            return dict(schema)
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return schema.model_json_schema()
        return dict(schema.schema())

    def replace(self, **changes: Any) -> ToolSpec:
        """Return a copy with `changes` applied."""
        return dataclasses.replace(self, **changes)


def find_context_arg(fn: Callable[..., Any]) -> str | None:
    """Return the name of `fn`'s ToolCallContext parameter, if it has one."""
    hints = get_type_hints(fn, include_extras=True)
    for name in inspect.signature(fn).parameters:
        hint = hints.get(name)
        if get_origin(hint) is Annotated:
            hint = get_args(hint)[0]
        if hint is ToolCallContext:
            return name
    return None


@overload
def agent_tool(fn: Callable[..., Any], /) -> ToolSpec: ...


@overload
def agent_tool(
    *,
    name: str | None = None,
    risk: Risk = "low",
    permissions: frozenset[str] | set[str] | tuple[str, ...] = (),
    timeout_s: float | None = None,
    retry: RetryPolicy | None = None,
    idempotent: bool = True,
    dedupes: bool = False,
    output_schema: type[BaseModel] | dict[str, Any] | None = None,
    redact: tuple[str, ...] = (),
    max_output_chars: int | None = None,
    cpu_heavy: bool = False,
) -> Callable[[Callable[..., Any]], ToolSpec]: ...


def agent_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    risk: Risk = "low",
    permissions: frozenset[str] | set[str] | tuple[str, ...] = (),
    timeout_s: float | None = None,
    retry: RetryPolicy | None = None,
    idempotent: bool = True,
    dedupes: bool = False,
    output_schema: type[BaseModel] | dict[str, Any] | None = None,
    redact: tuple[str, ...] = (),
    max_output_chars: int | None = None,
    cpu_heavy: bool = False,
) -> ToolSpec | Callable[[Callable[..., Any]], ToolSpec]:
    """Declare a Python function as a tool; its schema comes from its signature and docstring.

    The docstring is the description the model reads (Google style, with an `Args:` section
    describing each parameter). A parameter annotated `CallContext` receives the call's
    `ToolCallContext` (with the idempotency key) and is hidden from the model. Synchronous
    functions run in a thread; with `cpu_heavy=True` they run in a separate process that is
    killed at the timeout (the function must be defined at module level).

    Example:
        @agent_tool(risk="high", permissions={"email:send"}, idempotent=False, dedupes=True)
        async def send_email(to: str, subject: str, body: str, call: CallContext) -> str:
            '''Send an email. ...'''
    """

    def wrap(func: Callable[..., Any]) -> ToolSpec:
        if cpu_heavy and "<locals>" in func.__qualname__:
            raise ValueError(
                f"{func.__qualname__} is cpu_heavy, so it must be defined at module level: "
                "its process imports it by name"
            )
        is_async = inspect.iscoroutinefunction(func)
        lc_tool = StructuredTool.from_function(
            func=None if is_async else func,
            coroutine=func if is_async else None,
            name=name or func.__name__,
            parse_docstring=True,
            error_on_invalid_docstring=False,
        )
        lc_tool.handle_tool_error = False
        lc_tool.handle_validation_error = False
        return ToolSpec(
            tool=lc_tool,
            risk=risk,
            permissions=frozenset(permissions),
            timeout_s=timeout_s,
            retry=retry or RetryPolicy(),
            idempotent=idempotent,
            dedupes=dedupes,
            output_schema=output_schema,
            redact=frozenset(redact),
            max_output_chars=max_output_chars,
            context_arg=find_context_arg(func),
            cpu_heavy=cpu_heavy,
        )

    return wrap(fn) if fn is not None else wrap


def from_langchain(tool: BaseTool, **policy: Any) -> ToolSpec:
    """Wrap a langchain-core tool; errors must raise so that the pipeline classifies them."""
    tool.handle_tool_error = False
    tool.handle_validation_error = False
    return ToolSpec(tool=tool, **policy)


def spec_mapping(specs: Mapping[str, ToolSpec] | list[ToolSpec]) -> dict[str, ToolSpec]:
    """Index specs by name, refusing duplicates."""
    items = list(specs.values()) if isinstance(specs, Mapping) else list(specs)
    out: dict[str, ToolSpec] = {}
    for spec in items:
        if spec.name in out:
            raise ValueError(f"two tools are named {spec.name!r}")
        out[spec.name] = spec
    return out
