"""Request bodies of the LangGraph API, as the official SDK sends them (snake_case).

Fields the SDK may send that agentrt does not use are accepted and ignored (`extra`), so a
newer client keeps working; a field of the wrong type is refused with 422 naming it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from server.timestamps import IsoTime
from tools.jsontypes import FlagNotNumber, JsonBool, JsonFloat, JsonInt, NotTextOrFlag

MAX_OFFSET = 1_000_000_000
"""The largest `offset` a listing accepts: past it there is nothing to page through."""

Strings = list[str] | Literal["*"]

StreamMode = Literal[
    "values",
    "updates",
    "messages-tuple",
    "messages",
    "custom",
    "debug",
    "tasks",
    "checkpoints",
    "events",
]
"""The stream modes a run serves."""
ThreadStreamMode = Literal["run_modes", "lifecycle"]
"""The modes of a thread's stream: its runs' parts, or only when each run starts and ends."""

LABEL_PATTERN = r"^[^.]+$"
Label = Annotated[str, Field(json_schema_extra={"pattern": LABEL_PATTERN, "minLength": 1})]
"""A namespace label of the store: not empty, no dots (the store joins them with dots).
Checked by the store, whose message names the rule; the schema says it too."""

MIN_TTL_MINUTES = 1 / 60
"""The shortest `ttl` accepted, one second: Postgres cannot hold a shorter interval's text."""
MAX_TTL_MINUTES = 366 * 24 * 60
"""The longest `ttl` accepted, a year."""

TtlMinutes = Annotated[JsonFloat, Field(ge=MIN_TTL_MINUTES, le=MAX_TTL_MINUTES)]
"""A time to live in minutes, between one second and a year."""


class Body(BaseModel):
    """A request body; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    def data(self) -> dict[str, Any]:
        """Return the fields sent, without those left empty."""
        return self.model_dump(exclude_none=True, mode="json")


class RunConfig(Body):
    """A run's `config`: what agentrt passes on to the graph."""

    model_config = ConfigDict(extra="allow")

    configurable: dict[str, Any] | None = None
    tags: list[str] | None = None
    recursion_limit: Annotated[int, Field(ge=1, le=100_000), NotTextOrFlag] | None = None
    metadata: dict[str, Any] | None = None


class RunCommand(Body):
    """`command`: resume an interrupt, update the state, go to nodes."""

    resume: Any = None
    update: Any = None
    goto: str | list[str] | None = None


class RunCreate(Body):
    """A run: its assistant, input or command, and how it runs and streams."""

    assistant_id: str = Field(min_length=1)
    input: Any = None
    command: RunCommand | None = None
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream_mode: StreamMode | list[StreamMode] | None = None
    stream_subgraphs: JsonBool | None = None
    stream_resumable: JsonBool | None = None
    interrupt_before: Strings | None = None
    interrupt_after: Strings | None = None
    checkpoint_id: str | None = None
    checkpoint: dict[str, Any] | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    multitask_strategy: Literal["reject", "interrupt", "rollback", "enqueue"] | None = None
    if_not_exists: Literal["reject", "create"] | None = None
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    webhook: str | None = Field(None, max_length=2048)
    after_seconds: Annotated[int, Field(ge=0, le=366 * 24 * 3600), NotTextOrFlag] | None = None


class ThreadTtl(Body):
    """When a thread is deleted: `ttl` minutes after it was last created, updated or read."""

    ttl: TtlMinutes
    strategy: Literal["delete"] = "delete"


class SuperstepUpdate(Body):
    """One write of a superstep: `values` as if node `as_node` returned them."""

    values: Any = None
    command: dict[str, Any] | None = None
    as_node: str | None = Field(None, max_length=200)


class Superstep(Body):
    """The writes applied together as one step of the graph."""

    updates: list[SuperstepUpdate] = Field(min_length=1, max_length=100)


class ThreadCreate(Body):
    """A new thread."""

    thread_id: str | None = Field(None, min_length=1, max_length=200)
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    ttl: ThreadTtl | TtlMinutes | None = None
    supersteps: list[Superstep] | None = Field(None, max_length=1000)


class ThreadPatch(Body):
    """A thread's new metadata (merged) and expiry."""

    metadata: dict[str, Any] | None = None
    ttl: ThreadTtl | TtlMinutes | None = None


class Page(Body):
    """`limit` and `offset` of a listing."""

    limit: JsonInt = Field(10, ge=0, le=1000)
    offset: JsonInt = Field(0, ge=0, le=MAX_OFFSET)


class ThreadSearch(Page):
    """Which threads to list."""

    metadata: dict[str, Any] | None = None
    ids: list[str] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    sort_by: Literal["thread_id", "status", "created_at", "updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None


class CheckpointRef(Body):
    """A checkpoint of a thread."""

    checkpoint_id: str | None = None
    checkpoint_ns: str | None = None


class StateAt(Body):
    """Which checkpoint's state to read."""

    checkpoint: CheckpointRef | None = None
    subgraphs: JsonBool | None = None


class StateUpdate(Body):
    """Values to write to a thread's state, as if `as_node` returned them."""

    values: Any = None
    as_node: str | None = None
    checkpoint_id: str | None = None
    checkpoint: CheckpointRef | None = None


class HistoryQuery(Body):
    """Which states of a thread to list."""

    limit: JsonInt = Field(10, ge=1, le=1000)
    before: str | CheckpointRef | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointRef | None = None


class Prune(Body):
    """Threads to prune, and how."""

    thread_ids: list[str] = Field(default_factory=list)
    strategy: Literal["delete", "keep_latest"] = "delete"


class CancelMany(Body):
    """Runs to cancel: by id, or a thread's runs by status."""

    run_ids: list[str] | None = None
    thread_id: str | None = None
    status: Literal["pending", "running", "all"] | None = None


class AssistantCreate(Body):
    """A new assistant of a graph."""

    graph_id: str = Field(min_length=1)
    assistant_id: str | None = Field(None, min_length=1, max_length=200)
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = Field(None, max_length=500)
    description: str | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None


class AssistantPatch(Body):
    """The fields of an assistant's next version."""

    graph_id: str | None = None
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = Field(None, max_length=500)
    description: str | None = None


class AssistantSearch(Page):
    """Which assistants to list."""

    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None


class VersionQuery(Page):
    """Which versions of an assistant to list."""

    metadata: dict[str, Any] | None = None


class LatestVersion(Body):
    """The version of an assistant to use."""

    version: JsonInt = Field(ge=1, le=2**31 - 1)


def _in_utc(value: datetime) -> datetime:
    """Return `value` in UTC (a time without an offset is taken as UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is out of range once converted to UTC") from None


# Stored as given, an offset Postgres refuses (beyond ±15:59) failed the write.
UtcTime = Annotated[IsoTime, AfterValidator(_in_utc)]


class CronCreate(Body):
    """A cron: a schedule and the run it starts."""

    assistant_id: str = Field(min_length=1)
    schedule: str = Field(min_length=1, max_length=200)
    timezone: str | None = Field(None, max_length=100)
    input: Any = None
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    interrupt_before: Strings | None = None
    interrupt_after: Strings | None = None
    webhook: str | None = Field(None, max_length=2048)
    multitask_strategy: Literal["reject", "interrupt", "rollback", "enqueue"] | None = None
    stream_mode: StreamMode | list[StreamMode] | None = None
    stream_subgraphs: JsonBool | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    end_time: UtcTime | None = None
    enabled: JsonBool | None = None
    on_run_completed: Literal["delete", "keep"] | None = None


class CronPatch(Body):
    """A cron's changes."""

    schedule: str | None = Field(None, min_length=1, max_length=200)
    timezone: str | None = Field(None, max_length=100)
    input: Any = None
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    webhook: str | None = Field(None, max_length=2048)
    end_time: UtcTime | None = None
    enabled: JsonBool | None = None


class CronSearch(Page):
    """Which crons to list."""

    assistant_id: str | None = None
    thread_id: str | None = None


def _once(paths: list[str]) -> list[str]:
    """The paths in their order, each kept at its first place."""
    return list(dict.fromkeys(paths))


class StorePut(Body):
    """An item to store."""

    namespace: list[Label] = Field(min_length=1)
    key: str = Field(min_length=1, max_length=1000)
    value: dict[str, Any]
    # Field paths to embed, each once: the store inserts a vector row per path listed.
    index: Annotated[
        Literal[False] | Annotated[list[str], AfterValidator(_once)] | None, FlagNotNumber
    ] = None
    ttl: TtlMinutes | None = None


class StoreDelete(Body):
    """An item to delete."""

    namespace: list[Label] = Field(min_length=1)
    key: str = Field(min_length=1, max_length=1000)


class StoreSearch(Page):
    """Items to find under a namespace prefix, by filter and meaning."""

    namespace_prefix: list[Label] | None = None
    filter: dict[str, Any] | None = None
    query: str | None = Field(None, max_length=10_000)
    refresh_ttl: JsonBool | None = None


class NamespaceQuery(Page):
    """Namespaces to list."""

    limit: JsonInt = Field(100, ge=0, le=1000)
    prefix: list[Label] | None = None
    suffix: list[Label] | None = None
    max_depth: Annotated[int, Field(ge=1, le=100), NotTextOrFlag] | None = None
