-- Responses the gateway keeps itself (issue 25): a Responses API answer translated from another
-- provider's, with its input (the whole conversation so far), so that `previous_response_id`,
-- `GET /v1/responses/{id}` and its `input_items` work whichever provider answered. Per
-- workspace: another workspace's id is not found. `response` (the response object) and `input`
-- (the array of input items) are JSON text; `created_at` is Unix seconds of the last write.
CREATE TABLE kept_responses (
    workspace TEXT NOT NULL,
    id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    response TEXT NOT NULL,
    input TEXT NOT NULL,
    PRIMARY KEY (workspace, id)
);
