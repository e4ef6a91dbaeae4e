-- A key's name (issue 47: the console's keys page names keys), as `POST /v1/api-keys` takes it;
-- NULL for a key made without one. Portable DDL (SQLite and PostgreSQL through sqlx Any).
ALTER TABLE api_keys ADD COLUMN name TEXT;
