-- Portable DDL: runs unchanged on SQLite and PostgreSQL (TEXT, BIGINT; JSON as TEXT).
CREATE TABLE workspaces (
    name TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL REFERENCES workspaces (name),
    key_hash TEXT NOT NULL UNIQUE,
    admin BIGINT NOT NULL,
    last_four TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

-- Prompts, guardrails, configs and providers: one row per item, slugs unique per workspace and kind.
CREATE TABLE items (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    kind TEXT NOT NULL,
    slug TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (workspace, kind, slug)
);

-- Every version of an item; `value` is JSON text (for providers: the AEAD-sealed JSON, base64).
CREATE TABLE versions (
    id TEXT PRIMARY KEY,
    item_id TEXT NOT NULL REFERENCES items (id),
    seq BIGINT NOT NULL,
    value TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (item_id, seq)
);
