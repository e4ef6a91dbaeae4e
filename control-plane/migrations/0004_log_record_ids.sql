-- Record ids made by the filter (issue 15): a batch the filter sends again (it timed out, yet the
-- control plane had stored it) adds no second copy. Portable DDL (SQLite and PostgreSQL through
-- sqlx Any). Records of older filters have no id (NULL): both databases let NULLs repeat in a
-- unique index, so they all insert.
ALTER TABLE log_records ADD COLUMN record_key TEXT;
CREATE UNIQUE INDEX log_records_key ON log_records (workspace, record_key);
