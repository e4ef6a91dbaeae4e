-- The hash of the key a console session signed in with: each request of the session checks
-- that the key still works (a deleted key's sessions end with it). Sessions made before have
-- none and must sign in again. Portable DDL (SQLite and PostgreSQL through sqlx Any).
ALTER TABLE console_sessions ADD COLUMN key_hash TEXT;
