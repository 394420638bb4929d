"""Arguments in, results out: schema validation, normalisation, redaction and output budgets."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from tools.errors import ToolCallError
from tools.spec import ToolSpec

REDACTED = "[redacted]"


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts)


def _unknown_keys(args: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    extra = schema.get("additionalProperties")
    if extra is True or isinstance(extra, dict):
        return []
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return []
    return sorted(k for k in args if k not in properties)


def validate_args(spec: ToolSpec, args: Any) -> dict[str, Any]:
    """Validate the model's arguments against the tool's schema and return them normalised.

    Normalised means: types coerced where the schema allows (pydantic lax mode), defaults
    filled in, JSON-compatible values. Unknown argument names are refused rather than dropped,
    so the model learns the right names instead of silently losing an argument.

    Raises:
        ToolCallError: `invalid_arguments`, with a message the model can act on.
    """
    if not isinstance(args, Mapping):
        raise ToolCallError("invalid_arguments", "the arguments must be a JSON object")
    schema = spec.input_schema()
    unknown = _unknown_keys(args, schema)
    if unknown:
        known = ", ".join(sorted(schema.get("properties", {}))) or "none"
        raise ToolCallError(
            "invalid_arguments",
            f"unexpected argument(s) {', '.join(unknown)} for {spec.name}; "
            f"its arguments are: {known}",
        )
    model = spec.tool.tool_call_schema
    if isinstance(model, type) and issubclass(model, BaseModel):
        try:
            validated = model.model_validate(dict(args))
        except ValidationError as exc:
            raise ToolCallError(
                "invalid_arguments", f"invalid arguments for {spec.name}: {_pydantic_message(exc)}"
            ) from exc
        return dict(validated.model_dump(mode="json"))
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(dict(args)), key=lambda e: list(e.absolute_path))
    if errors:
        parts = [
            f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}"
            for e in errors
        ]
        raise ToolCallError(
            "invalid_arguments", f"invalid arguments for {spec.name}: {'; '.join(parts)}"
        )
    normalised = dict(args)
    for name, prop in schema.get("properties", {}).items():
        if name not in normalised and isinstance(prop, Mapping) and "default" in prop:
            normalised[name] = prop["default"]
    return json.loads(json.dumps(normalised, default=str))  # type: ignore[no-any-return]


def redact(value: Any, keys: Collection[str], *, json_text: bool = False) -> Any:
    """Return `value` with the values of `keys` (case-insensitive, at any depth) replaced.

    With `json_text`, strings holding a JSON object or array that mention a key are redacted
    inside too (traces record streamed tool arguments as JSON text).
    """
    lowered = {k.lower() for k in keys}
    if not lowered:
        return value

    def walk(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: REDACTED if str(k).lower() in lowered else walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if json_text and isinstance(v, str) and v[:1] in ("{", "[") and _mentions(v, lowered):
            try:
                return json.dumps(walk(json.loads(v)))
            except ValueError:
                return v
        return v

    return walk(value)


def _mentions(text: str, lowered: Collection[str]) -> bool:
    folded = text.lower()
    return any(key in folded for key in lowered)


def render_output(value: Any) -> str:
    """Turn a tool's return value into the text the model reads.

    A NUL character (a binary file's, say) becomes U+FFFD: Postgres text and jsonb cannot
    hold one, and the result is stored in the tool ledger and in the run's events.
    """
    return _render(value).replace("\x00", "\ufffd")


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, tuple) and len(value) == 2:  # (content, artifact) tools
        return _render(value[0])
    if (
        isinstance(value, list)
        and value
        and all(isinstance(b, Mapping) and b.get("type") == "text" for b in value)
    ):  # content blocks (MCP text results)
        return "\n".join(str(b.get("text", "")) for b in value)
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    content = getattr(value, "content", None)  # a ToolMessage
    if content is not None and not isinstance(value, Mapping):
        return _render(content)
    return json.dumps(value, default=str, ensure_ascii=False)


def check_output(spec: ToolSpec, value: Any) -> None:
    """Check the result against the tool's output schema, if it declares one.

    Raises:
        ToolCallError: `invalid_output`.
    """
    schema = spec.output_schema
    if schema is None:
        return
    data = value
    if isinstance(value, str):
        try:
            data = json.loads(value)
        except ValueError:
            data = value
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    try:
        if isinstance(schema, dict):
            jsonschema.validate(data, schema)
        else:
            schema.model_validate(data)
    except (jsonschema.ValidationError, ValidationError) as exc:
        message = exc.message if isinstance(exc, jsonschema.ValidationError) else str(exc)
        raise ToolCallError(
            "invalid_output", f"{spec.name} returned a result that breaks its schema: {message}"
        ) from exc


def cut_output(text: str, budget: int) -> tuple[str, bool]:
    """Cut `text` to about `budget` characters with a note saying what was left out.

    A JSON array keeps whole leading items; anything else keeps its first characters.
    Returns the text for the model and whether anything was cut.
    """
    if len(text) <= budget:
        return text, False
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except ValueError:
            items = None
        if isinstance(items, list):
            kept: list[Any] = []
            size = 2
            for item in items:
                size += len(json.dumps(item, default=str, ensure_ascii=False)) + 2
                if size > budget:
                    break
                kept.append(item)
            shown = json.dumps(kept, default=str, ensure_ascii=False)
            note = (
                f"\n[cut: showing the first {len(kept)} of {len(items)} items "
                f"({len(shown)} of {len(text)} characters); the full result is kept in the "
                "run's tool ledger]"
            )
            return shown + note, True
    note = (
        f"\n[cut: showing the first {budget} of {len(text)} characters; the full result is "
        "kept in the run's tool ledger]"
    )
    return text[:budget] + note, True
