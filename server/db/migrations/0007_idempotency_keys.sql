-- Idempotency keys of `POST /api/conversations/{id}/messages`: a retried request with the same
-- key gets the response stored here instead of creating a second message and run.

CREATE TABLE idempotency_keys (
    conversation_id  text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    key              text NOT NULL,
    tenant_id        text NOT NULL,
    fingerprint      text NOT NULL,
    run_id           text NOT NULL,
    response         jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, key)
);
