-- A message posted to a conversation its API process has met before is stored in one round
-- trip (docs/decisions/2017). The process remembers the conversation's agent and model (set
-- when it was created) and the latest version of that agent's profile; this check goes out,
-- unread, first in the transaction that stores the message and its run. It takes the
-- conversation's lock, as the read it replaces did, and raises (SQLSTATE AR003, the whole
-- transaction rolls back) when any of it no longer holds; the process then forgets what it
-- remembered and posts again the long way, reading both.
CREATE FUNCTION agentrt_expect_post(
    conv text, tenant text, conv_agent text, conv_model text, agent_name text, agent_version int
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    latest int;
BEGIN
    PERFORM 1 FROM conversations
     WHERE id = conv AND tenant_id = tenant
       AND agent IS NOT DISTINCT FROM conv_agent AND model IS NOT DISTINCT FROM conv_model
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'conversation % is not as remembered', conv USING ERRCODE = 'AR003';
    END IF;
    SELECT version INTO latest FROM agent_profiles
     WHERE tenant_id = tenant AND name = agent_name AND deleted_at IS NULL
     ORDER BY version DESC LIMIT 1;
    -- None stored: the built-in default profile, version 0.
    IF coalesce(latest, 0) <> agent_version THEN
        RAISE EXCEPTION 'agent % is no longer at version %', agent_name, agent_version
            USING ERRCODE = 'AR003';
    END IF;
END
$$;
