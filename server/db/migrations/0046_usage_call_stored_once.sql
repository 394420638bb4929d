-- A model call's record is stored once: in its ledger row (docs/decisions/2042). A `usage`
-- event carried the call's 23 fields, and the ledger row the same again; the event's copy
-- was the largest part of the event log beside the manifests. The append now writes the
-- ledger row of a `usage` event in its transaction, and the log keeps a stub in the call's
-- place: the event's other keys, with `"storedIn": "model_calls"` and the call's id. Reads
-- of the log put the call back, built from the row by `agentrt_model_call`; live frames
-- carry the call with its numbers as the row gives them back, so a live stream and a replay
-- stay byte-identical (server/events/calls.py).
--
-- The two fields the ledger lacked come with it: the answer's item id and the error's text.
-- Both are NULL for the rows before, whose events are stored whole.
ALTER TABLE model_calls ADD COLUMN item_id text, ADD COLUMN error text;

-- A ledger row as a `usage` event's `call`. Money is the decimal text without trailing zeros
-- (`money` in nodes/models/usage.py); latencies are the numbers the row holds.
CREATE FUNCTION agentrt_model_call(m model_calls) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
        'callId', m.id, 'step', m.step, 'attempt', m.attempt, 'modelId', m.model_id,
        'provider', m.provider, 'model', m.model, 'requestedModel', m.requested_model,
        'fallbackIndex', m.fallback_index, 'status', m.status, 'latencyMs', m.latency_ms,
        'ttftMs', m.ttft_ms, 'itemId', m.item_id, 'finishReason', m.finish_reason,
        'inputTokens', m.input_tokens, 'outputTokens', m.output_tokens,
        'cachedInputTokens', m.cached_input_tokens, 'reasoningTokens', m.reasoning_tokens,
        'totalTokens', m.total_tokens, 'cost', trim_scale(m.cost)::text,
        'priceSource', m.price_source, 'errorClass', m.error_class,
        'statusCode', m.status_code, 'error', m.error)
$$;

-- A stored `usage` event's data with its call put back: the stub's keys but the marker and
-- the id, and the call built from the row.
CREATE FUNCTION agentrt_usage_data(stub jsonb, m model_calls) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (stub - 'storedIn' - 'callId') || jsonb_build_object('call', agentrt_model_call(m))
$$;
