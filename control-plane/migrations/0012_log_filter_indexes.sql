-- The request table's filters (issue 47): each an index that holds the filter's records in time
-- order, so that a page of them is read in order however rare they are (a filter that matched one
-- record in a million read every record of the workspace before). Portable DDL (SQLite and
-- PostgreSQL through sqlx Any). The status class is `status / 100`, as the filter writes it.
CREATE INDEX log_records_model ON log_records (workspace, model, timestamp_ms, id);
CREATE INDEX log_records_provider ON log_records (workspace, provider, timestamp_ms, id);
CREATE INDEX log_records_api_key ON log_records (workspace, api_key_id, timestamp_ms, id);
CREATE INDEX log_records_api ON log_records (workspace, client_api, timestamp_ms, id);
CREATE INDEX log_records_cache ON log_records (workspace, cache_status, timestamp_ms, id);
CREATE INDEX log_records_guardrail ON log_records (workspace, guardrail_verdict, timestamp_ms, id);
CREATE INDEX log_records_status_class ON log_records (workspace, (status / 100), timestamp_ms, id);
-- A trace's records in time order too (the planner read the whole workspace by time rather than
-- sort the few records of one trace).
DROP INDEX log_records_trace;
CREATE INDEX log_records_trace ON log_records (workspace, trace_id, timestamp_ms, id);
