"""A LangGraph agent written as LangGraph's own examples are: nothing in it knows agentrt.

A `StateGraph` whose model node calls an OpenAI chat model with tools, a prebuilt `ToolNode`
that runs them, and a state key of its own (`tool_rounds`). `book_table` asks a human first
with `interrupt()`; `check_weather` reports progress on the custom stream. The model is the run
context's `model` (default `gpt-4o-mini`) at `OPENAI_BASE_URL` with `OPENAI_API_KEY`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime
from langgraph.types import interrupt


@dataclass
class Context:
    """What a run may choose: the chat model."""

    model: str = "gpt-4o-mini"


class State(TypedDict):
    """The conversation, and how many times the model asked for tools."""

    messages: Annotated[list[AnyMessage], add_messages]
    tool_rounds: int


@tool
def check_weather(city: str) -> str:
    """Return today's weather in a city."""
    get_stream_writer()({"progress": f"looking up {city}"})
    return f"It is sunny in {city}, 21 degrees."


@tool
def book_table(restaurant: str, people: int) -> str:
    """Book a table at a restaurant; a human confirms first."""
    answer = interrupt({"question": f"Book {restaurant} for {people}?"})
    if answer != "yes":
        return f"The booking at {restaurant} was declined."
    return f"Booked {restaurant} for {people}."


TOOLS = [check_weather, book_table]


async def call_model(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Ask the model for the next step."""
    name = runtime.context.model if runtime.context else Context.model
    model = ChatOpenAI(model=name).bind_tools(TOOLS)
    prompt = SystemMessage("You help plan an evening out. Use the tools.")
    response = await model.ainvoke([prompt, *state["messages"]])
    rounds = state.get("tool_rounds", 0) + (1 if response.tool_calls else 0)
    return {"messages": [response], "tool_rounds": rounds}


def route_after_model(state: State) -> str:
    """Go to the tools when the model asked for any, else finish."""
    last = state["messages"][-1]
    return "tools" if getattr(last, "tool_calls", None) else END


builder = StateGraph(State, context_schema=Context)
builder.add_node("agent", call_model)
builder.add_node("tools", ToolNode(TOOLS))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", route_after_model, ["tools", END])
builder.add_edge("tools", "agent")
graph = builder.compile()
