//! Which OpenAI endpoint a request calls, and how its body is handled.

use crate::errors::GatewayError;
use crate::mcp;
use crate::request::resources;

/// The OpenAI endpoints the gateway serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    ImageGenerations,
    ImageEdits,
    ImageVariations,
    AudioSpeech,
    AudioTranscriptions,
    AudioTranslations,
    Moderations,
    /// Anthropic's Messages API.
    Messages,
    MessagesCountTokens,
    /// OpenAI's Responses API: `POST /v1/responses` creates a response; a stored one is read,
    /// deleted, cancelled or its input listed by id (`StoredResponse`).
    Responses,
    StoredResponse,
    /// Batches, files, fine-tuning jobs, assistants, threads, models: passed through.
    Resource,
}

impl Endpoint {
    /// The API the client speaks on this endpoint.
    pub(crate) fn client_api(self) -> ClientApi {
        match self {
            Endpoint::Messages | Endpoint::MessagesCountTokens => ClientApi::Messages,
            Endpoint::Responses | Endpoint::StoredResponse => ClientApi::Responses,
            _ => ClientApi::Chat,
        }
    }
}

/// The API a client speaks, by the endpoint it called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ClientApi {
    /// OpenAI's chat completions and the other OpenAI endpoints.
    #[default]
    Chat,
    /// Anthropic's Messages API (`/v1/messages`).
    Messages,
    /// OpenAI's Responses API (`/v1/responses`).
    Responses,
}

impl ClientApi {
    /// The client API's name in logs and request records.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ClientApi::Chat => "chat",
            ClientApi::Messages => "messages",
            ClientApi::Responses => "responses",
        }
    }
}

/// How the filter treats the request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyMode {
    /// JSON the gateway reads (validation, `override_params`, translation).
    Json,
    /// Streams to the provider untouched (multipart uploads, most resource endpoints).
    Passthrough,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Health,
    /// Under `/.well-known/oauth-protected-resource`: the MCP endpoints' OAuth metadata.
    McpMetadata,
    /// Under `/mcp`: an MCP server's endpoint (`src/mcp/`), with the query kept apart.
    Mcp {
        path: String,
        query: Option<String>,
    },
    Api {
        endpoint: Endpoint,
        body: BodyMode,
        /// The path after `/v1`, e.g. `/chat/completions`; the query string is kept apart.
        path: String,
        query: Option<String>,
        /// `POST /v1/prompts/{promptId}/completions`: the stored prompt to render (the request
        /// then goes on as a chat completion).
        prompt: Option<String>,
    },
}

/// Inference endpoints: exact path, method POST.
const INFERENCE: &[(&str, Endpoint, BodyMode)] = &[
    ("/chat/completions", Endpoint::ChatCompletions, BodyMode::Json),
    ("/completions", Endpoint::Completions, BodyMode::Json),
    ("/embeddings", Endpoint::Embeddings, BodyMode::Json),
    ("/images/generations", Endpoint::ImageGenerations, BodyMode::Json),
    ("/images/edits", Endpoint::ImageEdits, BodyMode::Passthrough),
    ("/images/variations", Endpoint::ImageVariations, BodyMode::Passthrough),
    ("/audio/speech", Endpoint::AudioSpeech, BodyMode::Json),
    ("/audio/transcriptions", Endpoint::AudioTranscriptions, BodyMode::Passthrough),
    ("/audio/translations", Endpoint::AudioTranslations, BodyMode::Passthrough),
    ("/moderations", Endpoint::Moderations, BodyMode::Json),
    ("/messages", Endpoint::Messages, BodyMode::Json),
    ("/messages/count_tokens", Endpoint::MessagesCountTokens, BodyMode::Json),
    ("/responses", Endpoint::Responses, BodyMode::Json),
];

/// A stored response's operations: what follows `/responses/{id}`, and its method.
const STORED_RESPONSE: &[(&str, &str)] = &[("", "GET"), ("", "DELETE"), ("/cancel", "POST"), ("/input_items", "GET")];

/// Resource collections passed through to the provider with any method.
const RESOURCES: &[&str] =
    &["/batches", "/files", "/fine_tuning", "/assistants", "/threads", "/models", "/vector_stores", "/uploads"];

pub(crate) fn classify(method: &str, full_path: &str) -> Result<Route, GatewayError> {
    let (path, query) = match full_path.split_once('?') {
        Some((path, query)) => (path, Some(query.to_string())),
        None => (full_path, None),
    };
    if path == "/health" {
        return Ok(Route::Health);
    }
    let not_found = || {
        GatewayError::new(404, "invalid_request_error", format!("unknown endpoint {method} {path}"))
            .with_code("unknown_endpoint")
    };
    let Some(rest) = path.strip_prefix("/v1").filter(|rest| rest.starts_with('/')) else {
        // Asked only outside /v1: model requests never pay for MCP.
        if mcp::is_mcp_path(path) {
            return Ok(Route::Mcp { path: path.to_string(), query });
        }
        let metadata = path.strip_prefix(mcp::oauth::METADATA_PREFIX);
        if metadata.is_some_and(|rest| rest.is_empty() || rest.starts_with('/')) {
            return Ok(Route::McpMetadata);
        }
        return Err(not_found());
    };
    let post_only =
        || GatewayError::method_not_allowed(format!("{method} is not allowed on /v1{rest}; use POST"), &["POST"]);
    let prompt = rest.strip_prefix("/prompts/").and_then(|r| r.strip_suffix("/completions"));
    if let Some(id) = prompt.filter(|id| !id.is_empty() && !id.contains('/')) {
        if method != "POST" {
            return Err(post_only());
        }
        let path = "/chat/completions".to_string();
        let prompt = Some(id.to_string());
        return Ok(Route::Api { endpoint: Endpoint::ChatCompletions, body: BodyMode::Json, path, query, prompt });
    }
    if let Some((_, endpoint, body)) = INFERENCE.iter().find(|(p, _, _)| *p == rest) {
        if method != "POST" {
            return Err(post_only());
        }
        return Ok(Route::Api { endpoint: *endpoint, body: *body, path: rest.to_string(), query, prompt: None });
    }
    if let Some(after) = rest.strip_prefix("/responses/") {
        let (id, operation) = match after.split_once('/') {
            Some((id, operation)) => (id, format!("/{operation}")),
            None => (after, String::new()),
        };
        let methods: Vec<&str> = STORED_RESPONSE.iter().filter(|(op, _)| *op == operation).map(|(_, m)| *m).collect();
        // Response ids are letters, digits, `_` and `-` (`resp_...`): nothing else reaches a path.
        let valid_id = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid_id || methods.is_empty() {
            return Err(not_found());
        }
        if !methods.contains(&method) {
            let message = format!("{method} is not allowed on /v1{rest}; use {}", methods.join(" or "));
            return Err(GatewayError::method_not_allowed(message, &methods));
        }
        let path = rest.to_string();
        return Ok(Route::Api {
            endpoint: Endpoint::StoredResponse,
            body: BodyMode::Passthrough,
            path,
            query,
            prompt: None,
        });
    }
    let is_resource = RESOURCES.iter().any(|r| rest == *r || rest.strip_prefix(r).is_some_and(|t| t.starts_with('/')));
    if is_resource {
        // The bodies the spec limits are read (and still sent as they came); uploads stream.
        let body = if resources::checked_body(method, rest).is_some() { BodyMode::Json } else { BodyMode::Passthrough };
        return Ok(Route::Api { endpoint: Endpoint::Resource, body, path: rest.to_string(), query, prompt: None });
    }
    Err(not_found())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn classifies_inference_endpoints() {
        let route = classify("POST", "/v1/chat/completions").unwrap();
        assert_eq!(
            route,
            Route::Api {
                endpoint: Endpoint::ChatCompletions,
                body: BodyMode::Json,
                path: "/chat/completions".into(),
                query: None,
                prompt: None
            }
        );
        let route = classify("POST", "/v1/prompts/pp-1/completions").unwrap();
        assert!(matches!(route, Route::Api { endpoint: Endpoint::ChatCompletions, ref path, prompt: Some(ref id), .. }
            if path == "/chat/completions" && id == "pp-1"));
        assert_eq!(classify("GET", "/v1/prompts/pp-1/completions").unwrap_err().status, 405);
        assert_eq!(classify("POST", "/v1/prompts/a/b/completions").unwrap_err().status, 404);
        assert_eq!(classify("POST", "/v1/prompts/pp-1/render").unwrap_err().status, 404);
        let route = classify("POST", "/v1/audio/transcriptions?x=1").unwrap();
        assert!(matches!(route, Route::Api { body: BodyMode::Passthrough, query: Some(ref q), .. } if q == "x=1"));
    }

    #[test]
    fn resources_pass_through_with_any_method() {
        for (method, path) in
            [("GET", "/v1/batches?limit=2"), ("POST", "/v1/batches/b1/cancel"), ("GET", "/v1/assistants/a1")]
        {
            let route = classify(method, path).unwrap();
            assert!(matches!(route, Route::Api { endpoint: Endpoint::Resource, .. }), "{path}");
        }
        // File uploads stream; the bodies the spec limits are read.
        let body = |method, path| match classify(method, path).unwrap() {
            Route::Api { body, .. } => body,
            _ => panic!("an API route"),
        };
        assert_eq!(body("POST", "/v1/files"), BodyMode::Passthrough);
        assert_eq!(body("POST", "/v1/uploads/u1/parts"), BodyMode::Passthrough);
        assert_eq!(body("POST", "/v1/batches"), BodyMode::Json);
        assert_eq!(body("POST", "/v1/assistants?x=1"), BodyMode::Json);
    }

    #[test]
    fn unknown_and_wrong_method() {
        assert_eq!(classify("POST", "/v1/nope").unwrap_err().status, 404);
        assert_eq!(classify("POST", "/v1/batchesX").unwrap_err().status, 404);
        assert_eq!(classify("POST", "/v2/chat/completions").unwrap_err().status, 404);
        assert_eq!(classify("POST", "/v1").unwrap_err().status, 404);
        assert_eq!(classify("GET", "/v1/chat/completions").unwrap_err().status, 405);
        assert_eq!(classify("GET", "/health").unwrap(), Route::Health);
        // MCP's endpoints, whatever the method (the MCP route decides, after the key check).
        let mcp = |path: &str, query: Option<&str>| Route::Mcp { path: path.into(), query: query.map(Into::into) };
        assert_eq!(classify("POST", "/mcp/files").unwrap(), mcp("/mcp/files", None));
        assert_eq!(classify("PUT", "/mcp?x=1").unwrap(), mcp("/mcp", Some("x=1")));
        assert_eq!(classify("POST", "/mcpx").unwrap_err().status, 404);
    }

    #[test]
    fn client_api_endpoints() {
        let endpoint = |method, path| match classify(method, path) {
            Ok(Route::Api { endpoint, body, .. }) => Ok((endpoint, body)),
            Ok(_) => panic!("an API route"),
            Err(e) => Err(e.status),
        };
        // Claude Code sends `?beta=true`.
        assert_eq!(endpoint("POST", "/v1/messages?beta=true"), Ok((Endpoint::Messages, BodyMode::Json)));
        assert_eq!(endpoint("POST", "/v1/messages/count_tokens"), Ok((Endpoint::MessagesCountTokens, BodyMode::Json)));
        assert_eq!(endpoint("GET", "/v1/messages"), Err(405));
        assert_eq!(endpoint("POST", "/v1/responses"), Ok((Endpoint::Responses, BodyMode::Json)));
        for (method, path) in [
            ("GET", "/v1/responses/resp_1"),
            ("DELETE", "/v1/responses/resp_1"),
            ("POST", "/v1/responses/resp_1/cancel"),
            ("GET", "/v1/responses/resp_1/input_items?limit=2"),
        ] {
            assert_eq!(endpoint(method, path), Ok((Endpoint::StoredResponse, BodyMode::Passthrough)), "{path}");
        }
        assert_eq!(endpoint("POST", "/v1/responses/resp_1"), Err(405));
        assert_eq!(endpoint("GET", "/v1/responses/resp_1/cancel"), Err(405));
        assert_eq!(endpoint("GET", "/v1/responses/resp_1/other"), Err(404));
        assert_eq!(endpoint("GET", "/v1/responses/"), Err(404));
        assert_eq!(endpoint("GET", "/v1/responses/.."), Err(404));
        assert_eq!(endpoint("GET", "/v1/responses/a%2Fb"), Err(404));
        assert_eq!(Endpoint::Messages.client_api(), ClientApi::Messages);
        assert_eq!(Endpoint::StoredResponse.client_api(), ClientApi::Responses);
        assert_eq!(Endpoint::ChatCompletions.client_api(), ClientApi::Chat);
    }
}
