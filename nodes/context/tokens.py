"""Token counting: the model's tokenizer where one is known, a documented estimate otherwise.

OpenAI models are counted with tiktoken, whose BPE files come from the copy bundled with
litellm (no download at run time). Any other model is counted by a counter the server hands
in (litellm's), or estimated at one token per four characters, rounded up.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

# Role, separators and name around every message in a chat request (OpenAI's cookbook figure).
MESSAGE_OVERHEAD = 4
ESTIMATE_CHARS_PER_TOKEN = 4
# OpenAI model names that tiktoken maps to an encoding.
_OPENAI_PREFIXES = ("gpt-", "o1", "o3", "o4", "chatgpt-", "text-embedding-", "ft:gpt-")


class TokenCounter(Protocol):
    """Count the tokens of a text for one model."""

    @property
    def name(self) -> str:
        """The tokenizer's name, recorded in the manifest."""
        ...

    def count(self, text: str) -> int:
        """Return the number of tokens of `text`."""
        ...


@dataclass(frozen=True)
class EstimateCounter:
    """One token per four characters, rounded up: close for English prose and JSON."""

    name: str = "estimate:chars/4"

    def count(self, text: str) -> int:
        """Return the estimated number of tokens of `text`."""
        return math.ceil(len(text) / ESTIMATE_CHARS_PER_TOKEN)


@dataclass(frozen=True)
class FunctionCounter:
    """A counter made of a function (litellm's `token_counter`, say)."""

    name: str
    function: Callable[[str], int]

    def count(self, text: str) -> int:
        """Return the number of tokens of `text`."""
        return int(self.function(text))


@dataclass(frozen=True)
class TiktokenCounter:
    """An OpenAI tokenizer (tiktoken), loaded from litellm's bundled BPE files."""

    encoding_name: str
    encoding: Any = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        """The encoding's name, e.g. `tiktoken:o200k_base`."""
        return f"tiktoken:{self.encoding_name}"

    def count(self, text: str) -> int:
        """Return the number of tokens of `text`."""
        return len(self.encoding.encode(text, disallowed_special=()))


def _bundled_bpe_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


@cache
def _tiktoken(model: str) -> TiktokenCounter | None:
    try:
        import tiktoken
    except ImportError:
        return None
    bundled = _bundled_bpe_dir()
    if bundled is None and "TIKTOKEN_CACHE_DIR" not in os.environ:
        return None  # tiktoken would download its files: never at run time
    # tiktoken reads its cache folder from the environment only; litellm sets it the same way.
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(bundled))
    try:
        encoding_name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        encoding_name = "o200k_base"
    try:
        return TiktokenCounter(encoding_name, tiktoken.get_encoding(encoding_name))
    except Exception:  # the bundled files are missing or a download was attempted
        return None


def is_openai_model(name: str) -> bool:
    """Say whether tiktoken knows the tokenizer of model `name` (`gpt-4o-mini`, `o3`...)."""
    return name.lower().startswith(_OPENAI_PREFIXES)


def counter_for(model_name: str, fallback: TokenCounter | None = None) -> TokenCounter:
    """Return the counter of a model: tiktoken for OpenAI models, else `fallback` or estimate."""
    if is_openai_model(model_name):
        found = _tiktoken(model_name)
        if found is not None:
            return found
    return fallback or EstimateCounter()


def message_text(message: BaseMessage) -> str:
    """Return what a message sends to the model as text (content, then tool calls)."""
    content = message.content
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]
        text += json.dumps(calls, ensure_ascii=False)
    return text


def message_tokens(message: BaseMessage, counter: TokenCounter) -> int:
    """Return the tokens a message costs in a request, its framing included."""
    return counter.count(message_text(message)) + MESSAGE_OVERHEAD


# The JSON text of a tool's schema as a model is shown it, by tool. Converting a tool walks
# its argument model (about a tenth of a millisecond for a small one) and every step of every
# run counts the same tools again. Tools are built by their registry and not changed after
# (a tool that changes, an MCP server's after a refresh, is a new object); the entry keeps
# its tool, so a reused `id` never matches another tool's.
_SCHEMA_TEXTS: dict[int, tuple[BaseTool, str]] = {}
_SCHEMA_TEXTS_MAX = 4096


def _schema_text(tool: BaseTool) -> str:
    kept = _SCHEMA_TEXTS.get(id(tool))
    if kept is not None and kept[0] is tool:
        return kept[1]
    text = json.dumps(convert_to_openai_tool(tool), ensure_ascii=False, sort_keys=True)
    if len(_SCHEMA_TEXTS) >= _SCHEMA_TEXTS_MAX:
        _SCHEMA_TEXTS.clear()
    _SCHEMA_TEXTS[id(tool)] = (tool, text)
    return text


def tools_tokens(tools: Sequence[BaseTool], counter: TokenCounter) -> int:
    """Return the tokens the tools' JSON schemas (as a model is shown them) cost in a request."""
    if not tools:
        return 0
    return counter.count("[" + ", ".join(_schema_text(t) for t in tools) + "]")
