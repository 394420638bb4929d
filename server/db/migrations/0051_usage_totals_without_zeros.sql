-- A `usage` stub's totals without their zeros (docs/decisions/2051). The stub of a model call
-- kept in its ledger row (0046) also carried the run's totals whole, eleven keys of which
-- most are zero in most runs. A stub whose totals are a run's (their keys, each zero written
-- as the server writes it) now keeps the others as `nonzeroTotals`; reads put the zeros back.
-- Stubs stored before keep `totals` and read as they did.
CREATE FUNCTION agentrt_usage_totals(stub jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN stub ? 'nonzeroTotals' AND NOT stub ? 'totals'
            AND jsonb_typeof(stub -> 'nonzeroTotals') = 'object'
        THEN (stub - 'nonzeroTotals') || jsonb_build_object('totals',
            '{"inputTokens": 0, "outputTokens": 0, "cachedInputTokens": 0, "reasoningTokens": 0,
              "totalTokens": 0, "cost": "0", "knownCost": "0", "unpricedCalls": 0,
              "modelCalls": 0, "failedModelCalls": 0, "toolCalls": 0}'::jsonb
            || (stub -> 'nonzeroTotals'))
        ELSE stub
    END
$$;

-- A stored `usage` event's data with its call put back (0046), and its totals' zeros.
CREATE OR REPLACE FUNCTION agentrt_usage_data(stub jsonb, m model_calls) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (agentrt_usage_totals(stub) - 'storedIn' - 'callId')
        || jsonb_build_object('call', agentrt_model_call(m))
$$;
