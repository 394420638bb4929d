-- The analysts' views over memories (docs/memory.md). Stable column names; they read
-- LangGraph's store tables, whose layout the views hide. Expired memories are left out.
CREATE OR REPLACE VIEW analytics_memories AS
SELECT
    s.key                                   AS memory_id,
    s.value ->> 'tenantId'                  AS tenant_id,
    s.value ->> 'userId'                    AS user_id,
    s.value ->> 'scope'                     AS scope,
    s.value ->> 'kind'                      AS kind,
    s.value ->> 'text'                      AS text,
    (s.value ->> 'confidence')::double precision AS confidence,
    s.value ->> 'sourceRunId'               AS source_run_id,
    s.value ->> 'sourceMessageId'           AS source_message_id,
    s.value ->> 'createdBy'                 AS created_by,
    s.created_at,
    s.updated_at,
    (s.value ->> 'expiresAt')::timestamptz  AS expires_at,
    v.embedding
FROM store s
LEFT JOIN store_vectors v ON v.prefix = s.prefix AND v.key = s.key AND v.field_name = 'text'
WHERE s.prefix LIKE '%.memories'
  AND (s.value ->> 'expiresAt' IS NULL OR (s.value ->> 'expiresAt')::timestamptz > now());

CREATE OR REPLACE VIEW analytics_memory_jobs AS
SELECT j.id AS job_id, j.run_id, j.tenant_id, j.user_id, j.status, j.attempts,
       j.result -> 'counts' AS counts, j.created_at, j.finished_at
FROM memory_jobs j;

CREATE OR REPLACE VIEW analytics_embedding_calls AS
SELECT id AS call_id, tenant_id, user_id, run_id, purpose, model_id, inputs, input_tokens,
       cost, status, latency_ms, created_at
FROM embedding_calls;
