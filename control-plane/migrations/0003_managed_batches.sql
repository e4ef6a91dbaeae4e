-- Gateway-managed batches (issue 16, `completion_window: "immediate"`). Portable DDL (SQLite
-- and PostgreSQL through sqlx Any). Timestamps are Unix seconds; JSON is stored as TEXT.

-- One row per batch. `headers` is the caller's gateway headers (a JSON object, with the
-- client's Authorization) SEALED with the master key: they hold provider secrets. The control
-- plane running the batch holds a lease (`lease_owner`, `lease_until` in Unix ms) that it
-- renews; another one (several may share a PostgreSQL database) takes the batch over only
-- once the lease expired.
CREATE TABLE managed_batches (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    in_progress_at BIGINT,
    finalizing_at BIGINT,
    completed_at BIGINT,
    failed_at BIGINT,
    cancelling_at BIGINT,
    cancelled_at BIGINT,
    total BIGINT NOT NULL,
    completed BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    output_file_id TEXT,
    error_file_id TEXT,
    errors TEXT,
    metadata TEXT,
    headers TEXT NOT NULL,
    lease_owner TEXT,
    lease_until BIGINT
);
CREATE INDEX managed_batches_workspace ON managed_batches (workspace, created_at, id);
CREATE INDEX managed_batches_status ON managed_batches (status);

-- The batch's input lines (1-based `line`), once validated. `status`: `pending`, then
-- `succeeded` (a 2xx answer: output file) or `failed` (error file); `result` is the line of
-- the output or error file (OpenAI batch output JSONL), written when the line finished.
CREATE TABLE managed_batch_lines (
    batch_id TEXT NOT NULL REFERENCES managed_batches (id),
    line BIGINT NOT NULL,
    custom_id TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX managed_batch_lines_status ON managed_batch_lines (batch_id, status, line);

-- Files the control plane makes (a batch's output and error files); `content` is UTF-8 text.
CREATE TABLE managed_files (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    content TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
