-- Coarse cells of each knowledge base's chunk vectors: an IVF index in plain SQL for servers
-- whose pgvector cannot run HNSW (docs/knowledge.md "The vector index", docs/decisions/1402).
-- Centroids are trained per knowledge base (server/knowledge/cells.py); a chunk stored after
-- training goes to its nearest cell; a chunk without a cell is always scanned exactly.
ALTER TABLE kb_chunks ADD COLUMN cell integer;

CREATE TABLE kb_cells (
    kb_id    text NOT NULL REFERENCES knowledge_bases (id) ON DELETE CASCADE,
    cell     integer NOT NULL,
    centroid halfvec NOT NULL,
    PRIMARY KEY (kb_id, cell)
);

-- One row per trained knowledge base: how many chunks the centroids were trained on.
CREATE TABLE kb_cell_trainings (
    kb_id      text PRIMARY KEY REFERENCES knowledge_bases (id) ON DELETE CASCADE,
    cells      integer NOT NULL,
    chunks     bigint NOT NULL,
    trained_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION agentrt_kb_chunk_cell() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.cell := (SELECT k.cell FROM kb_cells k WHERE k.kb_id = NEW.kb_id
                 ORDER BY k.centroid <=> NEW.embedding LIMIT 1);
    RETURN NEW;
END $$;

CREATE TRIGGER kb_chunks_cell BEFORE INSERT ON kb_chunks
    FOR EACH ROW EXECUTE FUNCTION agentrt_kb_chunk_cell();
