"""The built-in tools do what their descriptions promise, and refuse what they must."""

from __future__ import annotations

import pytest
from langchain_core.tools import ToolException

from tools.builtin import calculator, evaluate, make_fetch_url


@pytest.mark.parametrize(
    ("expression", "result"),
    [("12*(3+4)", "84"), ("2^10", "1024"), ("7/2", "3.5"), ("sqrt(16)", "4"), ("-3+1", "-2")],
)
def test_calculator_evaluates_arithmetic(expression: str, result: str) -> None:
    assert calculator.invoke({"expression": expression}) == result


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('true')", "open('/etc/passwd')", "1/0", "9**99999", "a+1"],
)
def test_calculator_refuses_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(ToolException):
        evaluate(expression)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "expression",
    [
        "((9**999)**999)**8",
        "9**999**999",
        "2**2**2**2**2",
        "(10**3000)*(10**3000)",
        "(10**2000)**2 * 10",
        "10**3999 + 10**3999 * 9",
        "round(5, -10**20)",
        "10.0**400",
        "sqrt(10**1000)",
        "(10**400)/1e-300",
    ],
)
def test_calculator_refuses_huge_results_quickly_and_plainly(expression: str) -> None:
    with pytest.raises(ToolException) as caught:
        evaluate(expression)
    message = str(caught.value)
    assert "result too large" in message or "round() takes" in message, message
    for internal in ("set_int_max_str_digits", "MemoryError", "RecursionError", "Exceeds"):
        assert internal not in message


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("-" * 1990 + "1", "nested too deeply"),
        ("2**" * 600 + "2", "nested too deeply|result too large"),
        ("1+" * 1100 + "1", "characters long; the limit is 2000"),
        ("(-8)**0.5", "not a real number"),
        ("1/0", "division by zero"),
    ],
)
def test_calculator_errors_say_what_is_wrong(expression: str, message: str) -> None:
    with pytest.raises(ToolException, match=message):
        evaluate(expression)


def test_calculator_still_computes_results_up_to_the_limit() -> None:
    assert calculator.invoke({"expression": "9**999"}) == str(9**999)
    assert len(calculator.invoke({"expression": "10**3999"})) == 4000
    assert calculator.invoke({"expression": "2**-2"}) == "0.25"


async def test_fetch_url_refuses_hosts_off_the_allow_list() -> None:
    fetch = make_fetch_url(["example.com"])
    with pytest.raises(ToolException, match="not on the allow-list"):
        await fetch.ainvoke({"url": "http://169.254.169.254/latest/meta-data"})
    with pytest.raises(ToolException, match="not an absolute"):
        await fetch.ainvoke({"url": "file:///etc/passwd"})
