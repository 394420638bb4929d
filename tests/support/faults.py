"""Database faults for process-level tests, armed per conversation from the test process.

Triggers make the real Postgres refuse or hold one kind of write for one conversation, so a
worker process meets the fault exactly where a test needs it (between a model turn and its
tool call, or while it stores a run's outcome) without any change to the code under test.
A refused write raises SQLSTATE 08006 (connection failure), as when the server goes away.
"""

from __future__ import annotations

from typing import Any

# Advisory lock a held write waits on; the test holds it to keep the write pending.
HOLD_LOCK = 7_262_616_099

_INSTALL = """
CREATE TABLE IF NOT EXISTS test_faults (thread_id text NOT NULL, kind text NOT NULL);

CREATE OR REPLACE FUNCTION test_fault_armed(thread text, fault text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM test_faults WHERE thread_id = thread AND kind = fault)
$$;

CREATE OR REPLACE FUNCTION test_first_attempt(thread text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT attempt = 1 FROM runs WHERE conversation_id = thread
                     ORDER BY created_at DESC LIMIT 1), false)
$$;

-- 'checkpoint': on the run's first attempt, refuse every checkpoint write from the model
-- turn that asks for bump_counter on (its messages, and the checkpoint routing to the tool).
CREATE OR REPLACE FUNCTION test_fault_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF test_fault_armed(NEW.thread_id, 'checkpoint') AND test_first_attempt(NEW.thread_id)
       AND NEW.channel = 'messages' AND position('bump_counter'::bytea IN NEW.blob) > 0 THEN
        RAISE EXCEPTION 'test fault: checkpoint store unavailable' USING ERRCODE = '08006';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION test_fault_checkpoint_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF test_fault_armed(NEW.thread_id, 'checkpoint') AND test_first_attempt(NEW.thread_id)
       AND NEW.checkpoint -> 'channel_versions' ? 'branch:to:dispatch_tools' THEN
        RAISE EXCEPTION 'test fault: checkpoint store unavailable' USING ERRCODE = '08006';
    END IF;
    RETURN NEW;
END $$;

-- 'events': on the run's first attempt, refuse to log message and tool events (the
-- checkpoints are stored; the log never learns of the answer).
CREATE OR REPLACE FUNCTION test_fault_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.attempt = 1 AND (NEW.type LIKE 'message.%' OR NEW.type LIKE 'tool.%')
       AND EXISTS (SELECT 1 FROM runs r JOIN test_faults f ON f.thread_id = r.conversation_id
                   WHERE r.id = NEW.run_id AND f.kind = 'events') THEN
        RAISE EXCEPTION 'test fault: event log unavailable' USING ERRCODE = '08006';
    END IF;
    RETURN NEW;
END $$;

-- 'hold_spans': storing the run's spans waits until the test releases HOLD_LOCK.
CREATE OR REPLACE FUNCTION test_fault_spans() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM runs r JOIN test_faults f ON f.thread_id = r.conversation_id
               WHERE r.id = NEW.run_id AND f.kind = 'hold_spans') THEN
        PERFORM pg_advisory_xact_lock_shared(%(hold)s);
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS test_fault ON checkpoint_blobs;

CREATE TRIGGER test_fault BEFORE INSERT ON checkpoint_blobs
    FOR EACH ROW EXECUTE FUNCTION test_fault_checkpoint();

DROP TRIGGER IF EXISTS test_fault ON checkpoint_writes;

CREATE TRIGGER test_fault BEFORE INSERT OR UPDATE ON checkpoint_writes
    FOR EACH ROW EXECUTE FUNCTION test_fault_checkpoint();

DROP TRIGGER IF EXISTS test_fault ON checkpoints;

CREATE TRIGGER test_fault BEFORE INSERT OR UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION test_fault_checkpoint_row();

DROP TRIGGER IF EXISTS test_fault ON run_events;

CREATE TRIGGER test_fault BEFORE INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION test_fault_events();

DROP TRIGGER IF EXISTS test_fault ON trace_span_sets;

CREATE TRIGGER test_fault BEFORE INSERT ON trace_span_sets
    FOR EACH ROW EXECUTE FUNCTION test_fault_spans()
"""


async def install_faults(conn: Any) -> None:
    """Create the fault triggers (idempotent); the schema must be migrated already."""
    script = _INSTALL.replace("%(hold)s", str(HOLD_LOCK))
    # One statement per execute: the extended protocol takes no multi-statement strings.
    for statement in script.split(";\n\n"):
        if statement.strip():
            await conn.execute(statement)


async def arm(conn: Any, conversation_id: str, kind: str) -> None:
    """Arm fault `kind` ('checkpoint', 'events' or 'hold_spans') for one conversation."""
    await conn.execute(
        "INSERT INTO test_faults (thread_id, kind) VALUES (%s, %s)", (conversation_id, kind)
    )


async def held_writes(conn: Any) -> int:
    """Return how many sessions are waiting on HOLD_LOCK."""
    cur = await conn.execute(
        "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND objid = %s",
        (HOLD_LOCK % 2**32,),
    )
    row = await cur.fetchone()
    return int(row["n"])
