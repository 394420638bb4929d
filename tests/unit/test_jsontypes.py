"""Body fields take their JSON type only: pydantic's lax mode would take "5" for a number."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

from tools.jsontypes import FlagNotNumber, JsonBool, JsonFloat, JsonInt, NotTextOrFlag


class Fields(BaseModel):
    count: JsonInt = 0
    ratio: JsonFloat = 0.0
    flag: JsonBool = False
    limit: Annotated[int, Field(ge=1, le=10), NotTextOrFlag] | None = None
    index: Annotated[Literal[False] | list[str] | None, FlagNotNumber] = None


@pytest.mark.parametrize(
    ("field", "value", "taken"),
    [
        ("count", 5, 5),
        ("count", 5.0, 5),  # JSON Schema counts 5.0 as an integer
        ("ratio", 5, 5.0),
        ("ratio", 0.25, 0.25),
        ("flag", True, True),
        ("limit", 10, 10),
        ("limit", None, None),
        ("index", False, False),
        ("index", ["a"], ["a"]),
    ],
)
def test_a_value_of_the_json_type_is_taken(field: str, value: Any, taken: Any) -> None:
    assert getattr(Fields.model_validate({field: value}), field) == taken


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("count", "5", "int_type"),
        ("count", True, "int_type"),
        ("count", 5.5, "int_from_float"),
        ("ratio", "0.5", "float_type"),
        ("ratio", False, "float_type"),
        ("flag", 1, "bool_type"),
        ("flag", "true", "bool_type"),
        ("limit", "3", "int_type"),
        ("limit", False, "int_type"),
        ("limit", 11, "less_than_equal"),
        ("index", 0, "bool_type"),
        ("index", 0.0, "bool_type"),
    ],
)
def test_a_value_of_another_json_type_is_refused(field: str, value: Any, kind: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Fields.model_validate({field: value})
    (error,) = refused.value.errors()
    assert error["type"] == kind
    assert error["loc"][0] == field


def test_the_schema_names_the_type_and_its_bounds() -> None:
    properties = Fields.model_json_schema()["properties"]
    assert properties["count"]["type"] == "integer"
    assert properties["ratio"]["type"] == "number"
    assert properties["flag"]["type"] == "boolean"
    assert properties["limit"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 10}
