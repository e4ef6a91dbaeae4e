-- Request logs and feedback (issue 15). Portable DDL (SQLite and PostgreSQL through sqlx Any).
-- The filter columns hold the record's values as given, except that a value longer than 256
-- bytes (or one starting with U+0001) is held as U+0001 + "sha256:" + its hex digest, so no
-- index entry outgrows PostgreSQL's B-tree limit; queries key their values the same way.

-- One row per shipped record; `record` is the record's JSON text as the filter sent it.
CREATE TABLE log_records (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    span_id TEXT,
    provider TEXT,
    model TEXT,
    status BIGINT,
    timestamp_ms BIGINT NOT NULL,
    record TEXT NOT NULL,
    received_at BIGINT NOT NULL
);
CREATE INDEX log_records_time ON log_records (workspace, timestamp_ms, id);
CREATE INDEX log_records_trace ON log_records (workspace, trace_id);

-- A record's metadata, one row per key, for `metadata.<key>=<value>` filters: strings as
-- they are, other JSON values as their JSON text.
CREATE TABLE log_metadata (
    record_id TEXT NOT NULL REFERENCES log_records (id),
    meta_key TEXT NOT NULL,
    meta_value TEXT NOT NULL,
    PRIMARY KEY (record_id, meta_key)
);
CREATE INDEX log_metadata_value ON log_metadata (meta_key, meta_value, record_id);

-- Feedback on a trace of a workspace (the trace may not be logged yet). `value` and
-- `weight` are the JSON number texts as given; `metadata` JSON text or NULL.
CREATE TABLE log_feedback (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    value TEXT NOT NULL,
    weight TEXT NOT NULL,
    metadata TEXT,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX log_feedback_trace ON log_feedback (workspace, trace_id, created_at_ms);
