-- Objects in the artifact storage whose records an erasure deleted. The erasure runs in the
-- database's transactions; the housekeeping job deletes the objects and then these rows.
CREATE TABLE artifact_objects_erased (
    object_key  text PRIMARY KEY,
    erased_at   timestamptz NOT NULL DEFAULT now()
);
