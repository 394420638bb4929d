"""One run's toolbox, and the checks before execution: lookup, validation, access, risk."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.tools import BaseTool

from tools.config import ResolvedConfig, ToolConfig, ToolOverride
from tools.errors import ToolCallError
from tools.ledger import InMemoryToolLedger, ToolLedger
from tools.spec import RetryPolicy, ToolSpec, spec_mapping
from tools.validation import validate_args


def apply_override(spec: ToolSpec, override: ToolOverride | None) -> ToolSpec:
    """Return `spec` with the tenant's policy for it applied."""
    if override is None:
        return spec
    changes: dict[str, Any] = {}
    if override.risk is not None:
        changes["risk"] = override.risk
    if override.permissions is not None:
        changes["permissions"] = frozenset(override.permissions)
    if override.timeout_s is not None:
        changes["timeout_s"] = override.timeout_s
    if override.max_attempts is not None:
        changes["retry"] = RetryPolicy(
            max_attempts=override.max_attempts,
            initial_backoff_s=spec.retry.initial_backoff_s,
            max_backoff_s=spec.retry.max_backoff_s,
            multiplier=spec.retry.multiplier,
        )
    if override.idempotent is not None:
        changes["idempotent"] = override.idempotent
    if override.dedupes is not None:
        changes["dedupes"] = override.dedupes
    if override.redact is not None:
        changes["redact"] = spec.redact | frozenset(override.redact)
    if override.max_output_chars is not None:
        changes["max_output_chars"] = override.max_output_chars
    return spec.replace(**changes) if changes else spec


@dataclass(frozen=True)
class Toolbox:
    """Everything the tool runtime needs for one run attempt.

    Attributes:
        specs: The tenant's tools by name (tenant overrides applied).
        allowed: Names the tenant and the run admit (before permissions).
        permissions: What the run's caller holds (`*` = everything).
        config: The tenant's effective tool config.
        ledger: Where outcomes are recorded (exactly-once).
        unavailable: Tool-name patterns of providers that are down -> the reason.
        generation: The run's lease generation (fences ledger writes).
    """

    run_id: str = "local"
    tenant_id: str = "default"
    user_id: str = "local"
    specs: Mapping[str, ToolSpec] = field(default_factory=dict)
    allowed: frozenset[str] = frozenset()
    permissions: frozenset[str] = frozenset({"*"})
    config: ResolvedConfig = field(default_factory=lambda: ToolConfig().for_tenant("default"))
    ledger: ToolLedger = field(default_factory=InMemoryToolLedger)
    unavailable: Mapping[str, str] = field(default_factory=dict)
    generation: int = 1
    default_timeout_s: float = 30.0
    max_output_chars: int = 16_000

    @classmethod
    def of(cls, tools: list[BaseTool] | list[ToolSpec], **kwargs: Any) -> Toolbox:
        """Build a toolbox that admits every given tool (for tests and `langgraph dev`)."""
        specs = spec_mapping([t if isinstance(t, ToolSpec) else ToolSpec(tool=t) for t in tools])
        return cls(specs=specs, allowed=frozenset(specs), **kwargs)

    def permitted(self, spec: ToolSpec) -> bool:
        """Say whether the caller holds every permission `spec` requires."""
        return "*" in self.permissions or spec.permissions <= self.permissions

    def visible(self) -> list[BaseTool]:
        """Return the tools the model is shown: allowed and permitted."""
        return [
            s.tool
            for name, s in sorted(self.specs.items())
            if name in self.allowed and self.permitted(s)
        ]

    def unavailable_reason(self, name: str) -> str | None:
        """Return why `name` cannot be reached, if it belongs to a provider that is down."""
        for pattern, reason in self.unavailable.items():
            if fnmatch.fnmatchcase(name, pattern):
                return reason
        return None

    def override(self, name: str) -> ToolOverride | None:
        """Return the tenant's override for tool `name`."""
        return self.config.tools.get(name)

    def redact_keys(self, spec: ToolSpec | None) -> frozenset[str]:
        """Return the argument names to redact for `spec` (tenant-wide and the tool's own)."""
        return self.config.redact | (spec.redact if spec else frozenset())


@dataclass(frozen=True)
class PreparedCall:
    """A tool call after the checks: ready to execute, refused, or waiting for approval."""

    call_id: str
    name: str
    args: dict[str, Any]
    spec: ToolSpec | None = None
    error: ToolCallError | None = None
    needs_approval: bool = False
    approval_reason: str = ""


def approval_reason(toolbox: Toolbox, spec: ToolSpec) -> str | None:
    """Return why a call of `spec` needs a human's approval, or None if it does not."""
    override = toolbox.override(spec.name)
    mode = override.approval if override else "risk"
    if mode == "never":
        return None
    if mode == "always":
        return f"the tenant requires approval for every call of {spec.name}"
    if spec.risk in toolbox.config.approval_risks:
        return f"{spec.name} is a {spec.risk}-risk tool"
    return None


def prepare(toolbox: Toolbox, call_id: str, name: str, args: Any) -> PreparedCall:
    """Run lookup, input validation and normalisation, tenant and permission checks, risk policy.

    Never raises: a refusal is returned as `PreparedCall.error`, for the model to read.
    """
    raw = dict(args) if isinstance(args, Mapping) else {}
    spec = toolbox.specs.get(name)
    if spec is None:
        reason = toolbox.unavailable_reason(name)
        if reason is not None:
            error = ToolCallError("unavailable", f"{name} is unavailable: {reason}")
        else:
            names = ", ".join(t.name for t in toolbox.visible()) or "none"
            error = ToolCallError("unknown_tool", f"unknown tool {name!r}; available: {names}")
        return PreparedCall(call_id, name, raw, error=error)
    try:
        normalised = validate_args(spec, args)
    except ToolCallError as exc:
        return PreparedCall(call_id, name, raw, spec, error=exc)
    if name not in toolbox.allowed:
        error = ToolCallError(
            "forbidden", f"{name} is not enabled for this tenant or run; do not call it again"
        )
        return PreparedCall(call_id, name, normalised, spec, error=error)
    if not toolbox.permitted(spec):
        missing = ", ".join(sorted(spec.permissions - toolbox.permissions))
        error = ToolCallError(
            "permission_denied", f"the user lacks the permission(s) {missing} needed for {name}"
        )
        return PreparedCall(call_id, name, normalised, spec, error=error)
    reason = approval_reason(toolbox, spec)
    return PreparedCall(
        call_id,
        name,
        normalised,
        spec,
        needs_approval=reason is not None,
        approval_reason=reason or "",
    )
