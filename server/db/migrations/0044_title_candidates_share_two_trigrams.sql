-- A title is a candidate of the knowledge search's title list when it shares two of its kept
-- trigrams with the question, no longer one (docs/decisions/2040). A title passes at
-- `word_similarity` 0.6 only if the question holds at least 60 % of its n trigrams; keeping
-- n - floor(0.6 n) + 2 of them (all, for the shortest titles), the question then holds at
-- least two of the kept ones. One shared trigram was too weak: "Germany" holds "man", kept by
-- every title with "Manual", and a base of 10,000 such titles ran `word_similarity` on each.
-- Each title keeps one more row; the order that picks them is unchanged, so the rows kept
-- before are kept, and the insert below adds the new one.
CREATE OR REPLACE FUNCTION agentrt_kb_title_trigrams(title text) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    SELECT ARRAY(
        SELECT t FROM unnest(show_trgm(title)) AS t ORDER BY
            (t LIKE '  %')::int * 2 + (t LIKE ' %' OR t LIKE '% ')::int, md5(t), t
        LIMIT cardinality(show_trgm(title)) - floor(0.6 * cardinality(show_trgm(title)))::int + 2
    );
END;

INSERT INTO kb_title_trigrams (trigram, kb_id, document_id)
    SELECT DISTINCT t, d.kb_id, d.id FROM kb_documents d,
        unnest(agentrt_kb_title_trigrams(d.title)) AS t
    ON CONFLICT DO NOTHING;
