-- The console (issue 47). Portable DDL (SQLite and PostgreSQL through sqlx Any).
-- The request log's values its charts and filters read, as columns (records shipped before
-- have them NULL): the client API (`chat`, `messages`, `responses`, `mcp`, ...), the duration,
-- the cache status, and the guardrails' verdict (`pass` when every item passed, `fail` when one
-- did not, NULL when none ran).
ALTER TABLE log_records ADD COLUMN client_api TEXT;
ALTER TABLE log_records ADD COLUMN duration_ms BIGINT;
ALTER TABLE log_records ADD COLUMN cache_status TEXT;
ALTER TABLE log_records ADD COLUMN guardrail_verdict TEXT;

-- A signed-in console: the SHA-256 (hex) of its cookie's value (the cookie is the only copy of
-- the value; the key it signed in with is kept nowhere), who it is, the token its writes carry,
-- and when it ends.
CREATE TABLE console_sessions (
    id_hash TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    admin BIGINT NOT NULL,
    csrf_token TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX console_sessions_age ON console_sessions (expires_at_ms);
