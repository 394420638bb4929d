"""The calculator tool: exact arithmetic without `eval`, with every intermediate result bounded.

Big-integer arithmetic holds the GIL and allocates without limit, so a size check after the
fact comes too late: each operation's result size is estimated from its operands and refused
before it is computed. The tool is also declared CPU-heavy (see `tools.isolation`).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from langchain_core.tools import ToolException, tool

MAX_DIGITS = 4000
"""Largest result, in decimal digits (below Python's 4300-digit string-conversion limit)."""
MAX_BITS = math.ceil(MAX_DIGITS * math.log2(10))
MAX_EXPRESSION_CHARS = 2000
MAX_ROUND_DIGITS = 1000

Number = int | float


class ResultTooLargeError(ValueError):
    """An operation would produce a number larger than the calculator allows."""

    def __init__(self) -> None:
        super().__init__(f"result too large (the limit is {MAX_DIGITS} digits)")


def _bits(value: Number) -> float:
    """Return the size of `value` in bits (of its integer part for a float)."""
    if isinstance(value, int):
        return float(abs(value).bit_length())
    if math.isinf(value) or math.isnan(value) or abs(value) < 1:
        return 0.0
    return math.log2(abs(value)) + 1


def _check_power(base: Number, exponent: Number) -> None:
    whole = isinstance(base, int) and isinstance(exponent, int)
    if whole and exponent > 0 and abs(base) > 1 and exponent * math.log2(abs(base)) > MAX_BITS:
        raise ResultTooLargeError


def _check_product(left: Number, right: Number) -> None:
    if isinstance(left, int) and isinstance(right, int) and _bits(left) + _bits(right) > MAX_BITS:
        raise ResultTooLargeError


def _power(base: Number, exponent: Number) -> Number:
    _check_power(base, exponent)
    result = operator.pow(base, exponent)
    if isinstance(result, complex):
        raise ValueError("the result is not a real number")
    return result  # type: ignore[no-any-return]


def _multiply(left: Number, right: Number) -> Number:
    _check_product(left, right)
    return left * right


def _round(value: Number, ndigits: int | None = None) -> Number:
    if ndigits is not None and (not isinstance(ndigits, int) or abs(ndigits) > MAX_ROUND_DIGITS):
        raise ValueError(f"round() takes a whole number of digits up to {MAX_ROUND_DIGITS}")
    return round(value, ndigits)


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _multiply,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
    "log": math.log,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def _walk(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        result = _BINARY[type(node.op)](_walk(node.left), _walk(node.right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        result = _UNARY[type(node.op)](_walk(node.operand))
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        result = _FUNCTIONS[node.func.id](*(_walk(arg) for arg in node.args))
    else:
        raise ValueError(f"unsupported element {ast.dump(node)[:60]!r}")
    # Sums and differences grow by a bit per step; this keeps long chains of them bounded too.
    if isinstance(result, int) and _bits(result) > MAX_BITS:
        raise ResultTooLargeError
    return result


def evaluate(expression: str) -> int | float:
    """Evaluate arithmetic without `eval`: numbers, + - * / // % **, a few functions.

    Raises:
        ToolException: the expression is not arithmetic, cannot be computed, or its result (or
            a step on the way) would be larger than `MAX_DIGITS` digits.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolException(
            f"the expression is {len(expression)} characters long; the limit is "
            f"{MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except (MemoryError, RecursionError):  # the parser's own depth limits
        raise ToolException(f"cannot evaluate {expression!r}: it is nested too deeply") from None
    except SyntaxError as exc:
        raise ToolException(f"cannot evaluate {expression!r}: {exc.msg}") from None
    try:
        return _walk(tree)  # type: ignore[no-any-return]
    except ResultTooLargeError as exc:
        raise ToolException(f"cannot evaluate {expression!r}: {exc}") from None
    except (OverflowError, MemoryError):
        raise ToolException(f"cannot evaluate {expression!r}: result too large") from None
    except RecursionError:
        raise ToolException(f"cannot evaluate {expression!r}: it is nested too deeply") from None
    except ZeroDivisionError:
        raise ToolException(f"cannot evaluate {expression!r}: division by zero") from None
    except (ValueError, TypeError) as exc:
        raise ToolException(f"cannot evaluate {expression!r}: {exc}") from None


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports + - * / // % ** (or ^), parentheses, pi, e and sqrt, abs, round, min, max, log.
    Results are limited to 4000 digits.

    Args:
        expression: The expression, for example "12 * (3 + 4) / 2".
    """
    result = evaluate(expression)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)
