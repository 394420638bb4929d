"""Request fields that take their JSON type only: a number for a number, a boolean for a flag.

Pydantic's lax mode takes `"5"` or `true` where a body's schema says a number, and `1` or
`"yes"` where it says a boolean. The API's bodies are JSON and their OpenAPI schema names the
type, so a client that sends otherwise has a bug better told at once (422) than guessed at.
An integer still takes `5.0`, which JSON Schema counts as an integer. Query parameters are
text by nature and keep pydantic's own types.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Strict
from pydantic_core import PydanticCustomError


def _not_text_or_flag(value: Any) -> Any:
    """Refuse text and booleans before pydantic's integer parsing (which takes both)."""
    if isinstance(value, (bool, str, bytes)):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def _flag_not_number(value: Any) -> Any:
    """Refuse a number where only `false` is taken (a `Literal[False]` matches `0` too)."""
    if value is not None and not isinstance(value, (bool, list)):
        raise PydanticCustomError("bool_type", "Input should be a valid boolean")
    return value


NotTextOrFlag = BeforeValidator(_not_text_or_flag)
"""For an integer: refuse text and booleans. Constraints go before it in an `Annotated`
(`Annotated[int, Field(ge=1), NotTextOrFlag] | None`): after it, in a union, pydantic writes
them into the OpenAPI schema as `ge` and `le` instead of `minimum` and `maximum`."""

JsonInt = Annotated[int, NotTextOrFlag]
"""An integer sent as a JSON number (`5` or `5.0`), never as text or a boolean."""

JsonFloat = Annotated[float, Strict()]
"""A JSON number, never text or a boolean."""

JsonBool = Annotated[bool, Strict()]
"""A JSON boolean, never a number or text."""

FlagNotNumber = BeforeValidator(_flag_not_number)
"""For a field that is `false` or a list: refuse `0`, which `Literal[False]` matches."""
