-- Limits, budgets and cost (issue 26). Portable DDL (SQLite and PostgreSQL through sqlx Any).

-- One row per limit (ids are global). `spec` is the limit's JSON as `gateway_schema::limits::Limit`
-- reads it; `workspace` is the workspace it belongs to (its own scope, or its key's workspace).
-- A lease call that grants from a limit first bumps its `ledger_seq`: that update is the limit's
-- write lock (a row lock on PostgreSQL, the database's write lock on SQLite).
CREATE TABLE limits (
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL,
    spec TEXT NOT NULL,
    ledger_seq BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX limits_workspace ON limits (workspace, id);

-- A workspace's own price of a model (`PUT /v1/prices/{model}`), over the shipped catalog's;
-- `price` is the JSON of `gateway_schema::prices::Price`.
CREATE TABLE workspace_prices (
    workspace TEXT NOT NULL,
    model TEXT NOT NULL,
    price TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (workspace, model)
);

-- The ledger: each allowance granted to a replica (a lease) of one limit and kind
-- (`requests`, `tokens`, `budget`). `amount` is what was granted, `used` what its replica
-- reported (NULL until then). `counts_until_ms` is when the grant stops counting: for the
-- window kinds the end of its window (reported: `reported_at_ms` + 60 s; else `active_until_ms`
-- + the drain time + 60 s), for a budget the end of its period (`period_start`, Unix seconds).
CREATE TABLE limit_grants (
    id TEXT PRIMARY KEY,
    limit_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    amount BIGINT NOT NULL,
    used BIGINT,
    granted_at_ms BIGINT NOT NULL,
    active_until_ms BIGINT NOT NULL,
    reported_at_ms BIGINT,
    period_start BIGINT NOT NULL,
    counts_until_ms BIGINT NOT NULL
);
CREATE INDEX limit_grants_counted ON limit_grants (limit_id, kind, counts_until_ms);
CREATE INDEX limit_grants_age ON limit_grants (counts_until_ms);

-- What `GET /v1/usage` adds up, from each record as the filter sends it (`prompt_tokens`,
-- `completion_tokens`, `cost_usd` in micro-USD, `api_key_id`); NULL for older records.
ALTER TABLE log_records ADD COLUMN input_tokens BIGINT;
ALTER TABLE log_records ADD COLUMN output_tokens BIGINT;
ALTER TABLE log_records ADD COLUMN cost_micro_usd BIGINT;
ALTER TABLE log_records ADD COLUMN api_key_id TEXT;
