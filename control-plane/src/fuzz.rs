//! The fuzz entry point of the control plane (`control_plane_bodies` in `fuzz/`, `./build.sh
//! fuzz`), built with `--cfg fuzzing` and with the unit tests (below): what a request to each
//! endpoint carries (its path id, query and body) read by the functions its handler reads it
//! with, before anything touches the database. What must hold for any input: no panic, and a
//! request refused is refused with a 400 in the OpenAI shape whose `param` names what is wrong.

use crate::api::{checked_item, version_query};
use crate::auth::Caller;
use crate::batches::{check_input, new_batch};
use crate::db::Kind;
use crate::errors::{ApiError, ApiResult};
use crate::limits::{
    acting_workspace, lease_call, limit_request, model_name, price_body, usage_query, workspace_parameter,
};
use crate::lists::provider_query;
use crate::logs;
use crate::mcp_servers;
use crate::responses::{items_query, kept_response, response_id, wait_ms};
use crate::validate::{json_object, key_request, prompt_version, put_target, query_pairs};
use axum::extract::Query;
use axum::http::Uri;
use gateway_schema as shared;
use serde_json::{json, Map, Value};

/// The endpoints, in the order the input's first byte picks them.
const ENDPOINTS: usize = 21;

/// A request as the fuzzer's bytes give it: the endpoint (first byte), the path's id and the
/// query (each a piece whose length the two bytes before it give, little-endian), the body
/// (the rest).
struct Request<'a> {
    endpoint: u8,
    id: &'a str,
    query: &'a str,
    body: &'a [u8],
}

impl<'a> Request<'a> {
    /// None when the path or query is not UTF-8 (axum's extractors would not pass it on).
    fn read(data: &'a [u8]) -> Option<Request<'a>> {
        let (&endpoint, rest) = data.split_first()?;
        let (id, rest) = piece(rest);
        let (query, body) = piece(rest);
        Some(Request { endpoint, id: std::str::from_utf8(id).ok()?, query: std::str::from_utf8(query).ok()?, body })
    }

    /// The query's pairs, as `Query<Vec<(String, String)>>` reads them (None: no such URI).
    fn pairs(&self) -> Option<ApiResult<Vec<(String, String)>>> {
        let uri = format!("/p?{}", self.query).parse::<Uri>().ok()?;
        Some(query_pairs(Query::try_from_uri(&uri)))
    }
}

fn piece(data: &[u8]) -> (&[u8], &[u8]) {
    let (length, rest) = data.split_at(data.len().min(2));
    let length = length.iter().rev().fold(0, |n, b| n << 8 | usize::from(*b));
    rest.split_at(length.min(rest.len()))
}

/// The stored prompt a render and a `patch: true` PUT read.
fn stored_prompt() -> Map<String, Value> {
    let prompt = json!({"string": "Hello {{name}}, {{#items}}{{.}} {{/items}}", "model": "gpt-4o",
        "parameters": {"temperature": 0.2}, "name": "p"});
    prompt.as_object().cloned().unwrap_or_default()
}

/// What a refusal must be: a 400 in the OpenAI shape naming the field (or the body, the query)
/// at fault, with a message saying why.
fn assert_named(result: ApiResult<impl Sized>) {
    let Err(ApiError(e)) = result else { return };
    let body: Value = serde_json::from_slice(&e.body).unwrap_or_default();
    assert_eq!(e.status, 400, "{e:?}");
    assert_eq!(body.pointer("/error/type").and_then(Value::as_str), Some("invalid_request_error"), "{e:?}");
    assert!(!e.message().is_empty(), "a refusal without a message: {e:?}");
    assert!(e.param().is_some_and(|p| !p.is_empty()), "a refusal naming no field: {e:?}");
}

/// One request to one endpoint, read as its handler reads it (see each handler).
pub fn request_bodies(data: &[u8]) {
    let Some(request) = Request::read(data) else { return };
    let Request { id, body, .. } = request;
    let admin = Caller { workspace: "w".into(), admin: true };
    match usize::from(request.endpoint) % ENDPOINTS {
        // PUT /v1/prompts/{id}: a `patch: true` of an existing prompt reads its latest version.
        0 => assert_named(put_target(id).and_then(|_| json_object(body)).and_then(|body| {
            let latest = stored_prompt();
            let patch = body.get("patch") == Some(&Value::Bool(true));
            prompt_version(&body, patch.then_some(&latest))
        })),
        // POST /v1/prompts/{id}/render
        1 => assert_named(
            json_object(body)
                .and_then(|request| shared::render(&Value::Object(stored_prompt()), &request).map_err(ApiError)),
        ),
        2 => assert_named(put_target(id).and_then(|_| checked_item(body, Kind::Guardrail, shared::check_guardrail))),
        3 => assert_named(put_target(id).and_then(|_| checked_item(body, Kind::Config, shared::check_config))),
        4 => assert_named(put_target(id).and_then(|_| checked_item(body, Kind::Provider, shared::check_provider))),
        // POST /v1/api-keys
        5 => assert_named(json_object(body).and_then(|body| key_request(&body))),
        // PUT /v1/limits/{id}
        6 => assert_named(limit_request(id, body)),
        // PUT /v1/prices/{model}?workspace=
        7 => {
            let Some(pairs) = request.pairs() else { return };
            assert_named(pairs.and_then(|pairs| {
                acting_workspace(&admin, workspace_parameter(&pairs)?)?;
                model_name(id)?;
                price_body(body)
            }))
        }
        // POST /internal/v1/leases
        8 => assert_named(json_object(body).and_then(|body| lease_call(&body))),
        // POST /internal/v1/records (the filter's records)
        9 => {
            let records = logs::batch(body);
            assert!(records.as_ref().map_or(0, Vec::len) <= logs::MAX_BATCH);
            assert_named(records)
        }
        // POST /v1/feedback
        10 => assert_named(json_object(body).and_then(|body| logs::feedback(&body))),
        // GET /v1/logs?...
        11 => {
            let Some(pairs) = request.pairs() else { return };
            assert_named(pairs.and_then(|pairs| logs::log_query(&pairs)))
        }
        // GET /v1/usage?...
        12 => {
            let Some(pairs) = request.pairs() else { return };
            assert_named(pairs.and_then(|pairs| {
                let query = usage_query(&pairs, 1_700_000_000)?;
                assert!(query.start <= query.end);
                acting_workspace(&admin, query.workspace)
            }))
        }
        // POST /internal/v1/batches
        13 => assert_named(new_batch(body)),
        // A managed batch's input file (JSONL), as its task checks it.
        14 => {
            let Ok(text) = std::str::from_utf8(body) else { return };
            match check_input(text, "/v1/chat/completions") {
                Ok(lines) => assert!(!lines.is_empty()),
                Err(errors) => {
                    assert!(!errors.is_empty());
                    for error in errors {
                        // A line's problem names its line; else it is the whole file's.
                        let whole_file = ["empty_file", "too_many_lines"].contains(&error.code);
                        assert!(!error.message.is_empty() && (error.line.is_some() || whole_file), "{error:?}");
                    }
                }
            }
        }
        // PUT /internal/v1/workspaces/{workspace}/responses/{id}
        15 => assert_named(response_id(id, "id").and_then(|id| kept_response(&json_object(body)?, id))),
        // GET /internal/v1/workspaces/{workspace}/responses/{id}?wait_ms=
        16 => {
            let Some(pairs) = request.pairs() else { return };
            assert_named(pairs.and_then(|pairs| wait_ms(&pairs)))
        }
        // GET /internal/v1/responses/{id}/input_items?...
        17 => {
            let Some(pairs) = request.pairs() else { return };
            assert_named(pairs.and_then(|pairs| items_query(&pairs)))
        }
        // GET /internal/v1/batches, /internal/v1/files: the provider's page asked with the
        // caller's query; the room left on the page is the id piece's length.
        18 => {
            let limit = (!id.is_empty()).then_some(id.len());
            let query = provider_query(Some(request.query), limit, body.first().is_some_and(|b| b & 1 == 1));
            let names = || query.split('&').map(|pair| pair.split('=').next().unwrap_or_default());
            assert!(names().all(|name| name != "before"), "{query}");
            if let Some(limit) = limit {
                let limits: Vec<&str> = query.split('&').filter(|pair| pair.starts_with("limit=")).collect();
                assert_eq!(limits, [format!("limit={limit}")], "{query}");
            }
        }
        // PUT /v1/mcp-servers/{id}
        19 => assert_named(mcp_servers::put_target(id).and_then(|_| mcp_servers::server_body(body))),
        // GET /v1/prompts/{id}?version=
        _ => {
            let Some(pairs) = request.pairs() else { return };
            assert_named(pairs.and_then(|pairs| version_query(&pairs).map(|_| ())))
        }
    }
}

/// The entry point over fixed inputs (every endpoint), so a harness that panics on its own
/// is caught by the unit tests too; an input a campaign crashed on is kept here once fixed
/// (fuzz/README.md).
#[cfg(test)]
mod tests {
    use super::*;

    fn request(endpoint: usize, id: &str, query: &str, body: &str) -> Vec<u8> {
        let mut input = vec![u8::try_from(endpoint).unwrap()];
        for piece in [id, query] {
            input.extend(u16::try_from(piece.len()).unwrap().to_le_bytes());
            input.extend(piece.as_bytes());
        }
        input.extend(body.as_bytes());
        input
    }

    #[test]
    fn every_endpoint_takes_these_inputs() {
        let bodies = ["", "{}", "[]", "{\"a\": 1}", "null", "{\"records\": [{}]}"];
        for endpoint in 0..ENDPOINTS {
            for body in bodies {
                request_bodies(&request(endpoint, "greeting", "limit=5&after=x", body));
            }
        }
        for input in [Vec::new(), vec![0; 64], vec![0xff; 64]] {
            request_bodies(&input);
        }
    }

    /// What campaigns found (fuzz/regressions/control_plane_bodies/, fuzz/README.md), fixed.
    #[test]
    fn campaign_findings_stay_fixed() {
        // A usage query with a parameter without a name (`=value`): refused naming `` (nothing).
        request_bodies(include_bytes!("../../fuzz/regressions/control_plane_bodies/unnamed-query-parameter"));
        // An API key's body with a field whose name is empty: refused naming `` too.
        request_bodies(include_bytes!("../../fuzz/regressions/control_plane_bodies/unnamed-body-field"));
        // An MCP server's body with a field whose name is empty: refused naming `` as well.
        request_bodies(include_bytes!("../../fuzz/regressions/control_plane_bodies/unnamed-mcp-server-field"));
    }

    /// A refusal that names nothing fails the check (a harness whose check cannot fail would
    /// test nothing).
    #[test]
    fn a_refusal_must_name_what_is_wrong() {
        assert_named(Ok::<(), ApiError>(()));
        assert_named(Err::<(), _>(ApiError::invalid("body", "the body must be a JSON object")));
        let unnamed = std::panic::catch_unwind(|| {
            assert_named(Err::<(), _>(ApiError::new(400, "invalid_request_error", "bad", None, None)))
        });
        assert!(unnamed.is_err());
    }
}
