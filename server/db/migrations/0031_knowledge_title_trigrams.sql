-- Candidate titles for the title list of knowledge search (server/knowledge/search.py,
-- docs/decisions/1404). The list keeps a title when `word_similarity(title, query)` is at
-- least 0.6, which needs at least 60 % of the title's n trigrams in the query. Then the query
-- holds at least one of any n - floor(0.6 n) + 1 of them: each title keeps that many in
-- kb_title_trigrams, and the search runs `word_similarity` only on the titles sharing one
-- with the query. The 0.6 is `TITLE_SIMILARITY` in search.py. Which ones are kept only changes
-- how many titles are checked, never which match: the kept ones are those least likely in a
-- question, trigrams inside a word before those at a word's edge, and last the first letter
-- of a word ("  m" is in every question with a word starting with m), then by md5.
CREATE FUNCTION agentrt_kb_title_trigrams(title text) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    SELECT ARRAY(
        SELECT t FROM unnest(show_trgm(title)) AS t ORDER BY
            (t LIKE '  %')::int * 2 + (t LIKE ' %' OR t LIKE '% ')::int, md5(t), t
        LIMIT cardinality(show_trgm(title)) - floor(0.6 * cardinality(show_trgm(title)))::int + 1
    );
END;

CREATE TABLE kb_title_trigrams (
    trigram     text NOT NULL,
    kb_id       text NOT NULL,
    document_id text NOT NULL REFERENCES kb_documents (id) ON DELETE CASCADE,
    PRIMARY KEY (trigram, kb_id, document_id)
);
CREATE INDEX kb_title_trigrams_document ON kb_title_trigrams (document_id);

CREATE FUNCTION agentrt_kb_title_trigrams_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM kb_title_trigrams WHERE document_id = OLD.id;
    END IF;
    INSERT INTO kb_title_trigrams (trigram, kb_id, document_id)
        SELECT DISTINCT t, NEW.kb_id, NEW.id FROM unnest(agentrt_kb_title_trigrams(NEW.title)) AS t;
    RETURN NULL;
END $$;

CREATE TRIGGER kb_documents_title_trigrams AFTER INSERT OR UPDATE OF title, kb_id ON kb_documents
    FOR EACH ROW EXECUTE FUNCTION agentrt_kb_title_trigrams_sync();

INSERT INTO kb_title_trigrams (trigram, kb_id, document_id)
    SELECT DISTINCT t, d.kb_id, d.id FROM kb_documents d,
        unnest(agentrt_kb_title_trigrams(d.title)) AS t;
