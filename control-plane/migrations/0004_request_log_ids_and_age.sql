-- Request logs (issue 15): record ids, and indexes for the retention sweep.
-- Record ids made by the filter: a batch the filter sends again (it timed out, yet the
-- control plane had stored it) adds no second copy. Portable DDL (SQLite and PostgreSQL through
-- sqlx Any). Records of older filters have no id (NULL): both databases let NULLs repeat in a
-- unique index, so they all insert.
ALTER TABLE log_records ADD COLUMN record_key TEXT;
CREATE UNIQUE INDEX log_records_key ON log_records (workspace, record_key);

-- The retention sweep (GATEWAY_LOG_RETENTION_DAYS) deletes by age across workspaces.
CREATE INDEX log_records_age ON log_records (timestamp_ms);
CREATE INDEX log_feedback_age ON log_feedback (created_at_ms);
