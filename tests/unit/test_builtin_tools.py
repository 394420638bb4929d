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


async def test_fetch_url_refuses_hosts_off_the_allow_list() -> None:
    fetch = make_fetch_url(["example.com"])
    with pytest.raises(ToolException, match="not on the allow-list"):
        await fetch.ainvoke({"url": "http://169.254.169.254/latest/meta-data"})
    with pytest.raises(ToolException, match="not an absolute"):
        await fetch.ainvoke({"url": "file:///etc/passwd"})
