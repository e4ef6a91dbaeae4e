-- The console's rollups (issue 47): the request log added up per minute and per hour, so that an
-- overview of a month of a busy workspace reads thousands of rows, not millions. Portable DDL
-- (SQLite and PostgreSQL through sqlx Any).
--
-- One row per (bucket length, workspace, dimension, bucket start, value): the records of that
-- bucket whose `dimension` had that value, added up. Dimensions: `model`, `provider`, `api_key`
-- (the key's id), `api` (the client API) and `duration` (the class of the record's duration,
-- by the bounds of `DURATION_BOUNDS_MS` in control-plane/src/db/console.rs, as its index). A
-- value is `=` and the column's value, or `` when the record had none (so a key holds no NULL,
-- which both databases let repeat in a unique index). Every record is in exactly one row of
-- each dimension per bucket length, so the `duration` rows also give each bucket's and each
-- workspace's totals. The control plane adds to them in the transaction that stores a batch.
CREATE TABLE log_rollups (
    bucket_len BIGINT NOT NULL,
    workspace TEXT NOT NULL,
    dimension TEXT NOT NULL,
    bucket_ms BIGINT NOT NULL,
    value TEXT NOT NULL,
    requests BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_micro_usd BIGINT NOT NULL,
    PRIMARY KEY (bucket_len, workspace, dimension, bucket_ms, value)
);
-- An admin's overview of every workspace.
CREATE INDEX log_rollups_all ON log_rollups (bucket_len, dimension, bucket_ms);
-- The retention sweep.
CREATE INDEX log_rollups_age ON log_rollups (bucket_ms);

-- The records stored before this migration, added up as the control plane adds new ones: each
-- record once per bucket length and dimension.
INSERT INTO log_rollups (bucket_len, workspace, dimension, bucket_ms, value, requests, errors, input_tokens,
    output_tokens, cost_micro_usd)
SELECT lengths.bucket_len, workspace, dimensions.dimension, timestamp_ms / lengths.bucket_len * lengths.bucket_len,
    CASE dimensions.dimension
        WHEN 'model' THEN COALESCE('=' || model, '')
        WHEN 'provider' THEN COALESCE('=' || provider, '')
        WHEN 'api_key' THEN COALESCE('=' || api_key_id, '')
        WHEN 'api' THEN COALESCE('=' || client_api, '')
        ELSE CASE
            WHEN duration_ms IS NULL THEN ''
            WHEN duration_ms <= 1 THEN '=0'
            WHEN duration_ms <= 2 THEN '=1'
            WHEN duration_ms <= 5 THEN '=2'
            WHEN duration_ms <= 10 THEN '=3'
            WHEN duration_ms <= 20 THEN '=4'
            WHEN duration_ms <= 30 THEN '=5'
            WHEN duration_ms <= 50 THEN '=6'
            WHEN duration_ms <= 75 THEN '=7'
            WHEN duration_ms <= 100 THEN '=8'
            WHEN duration_ms <= 150 THEN '=9'
            WHEN duration_ms <= 200 THEN '=10'
            WHEN duration_ms <= 300 THEN '=11'
            WHEN duration_ms <= 400 THEN '=12'
            WHEN duration_ms <= 500 THEN '=13'
            WHEN duration_ms <= 750 THEN '=14'
            WHEN duration_ms <= 1000 THEN '=15'
            WHEN duration_ms <= 1500 THEN '=16'
            WHEN duration_ms <= 2000 THEN '=17'
            WHEN duration_ms <= 3000 THEN '=18'
            WHEN duration_ms <= 5000 THEN '=19'
            WHEN duration_ms <= 7500 THEN '=20'
            WHEN duration_ms <= 10000 THEN '=21'
            WHEN duration_ms <= 20000 THEN '=22'
            WHEN duration_ms <= 30000 THEN '=23'
            WHEN duration_ms <= 60000 THEN '=24'
            WHEN duration_ms <= 120000 THEN '=25'
            ELSE '=26'
        END
    END,
    COUNT(*), SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END), COALESCE(SUM(input_tokens), 0),
    COALESCE(SUM(output_tokens), 0), COALESCE(SUM(cost_micro_usd), 0)
FROM log_records
CROSS JOIN (SELECT 60000 AS bucket_len UNION ALL SELECT 3600000) AS lengths
CROSS JOIN (SELECT 'model' AS dimension UNION ALL SELECT 'provider' UNION ALL SELECT 'api_key' UNION ALL SELECT 'api'
    UNION ALL SELECT 'duration') AS dimensions
GROUP BY 1, 2, 3, 4, 5;
