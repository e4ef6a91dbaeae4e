-- Files uploaded to the gateway itself (`POST /v1/files` for a provider without a files API),
-- kept in the database so that control planes sharing PostgreSQL all serve them. A file's row
-- is in `managed_files` (its `content` empty); its bytes are here, in order of `seq`, each
-- chunk base64 TEXT (portable: no blob type common to SQLite and PostgreSQL through sqlx Any).
-- A file's bytes are its `content` (UTF-8, the batches' own output files) followed by its
-- chunks.
CREATE TABLE managed_file_chunks (
    file_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (file_id, seq)
);
