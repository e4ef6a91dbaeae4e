//! Anthropic Messages API translator: OpenAI chat requests become `/v1/messages` requests;
//! Anthropic messages, streams and errors come back in OpenAI's shapes.

use super::openai::normalize_error;
use super::{Endpoint, ResponseContext, StreamTranslator, Translator};
use crate::errors::{error_json, GatewayError};
use crate::stream::sse::{write_data, SseEvent, SseParser, MAX_EVENT_BYTES};
use hashbrown::HashMap;
use serde_json::{json, Map, Value};

pub(crate) struct Anthropic;

const API_VERSION: &str = "2023-06-01";
/// Anthropic requires `max_tokens`; OpenAI lets it default.
const DEFAULT_MAX_TOKENS: u64 = 4096;
/// OpenAI-only request fields with no Anthropic counterpart. Anthropic rejects unknown fields,
/// so these are dropped (values that would change the answer were rejected before).
const DROPPED_FIELDS: &[&str] = &[
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "response_format",
    "stream_options",
    "functions",
    "function_call",
    "store",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "verbosity",
    "web_search_options",
    "prompt_cache_key",
    "safety_identifier",
];

impl Translator for Anthropic {
    fn upstream_path(&self, endpoint: Endpoint, openai_path: &str) -> Result<String, GatewayError> {
        match endpoint {
            Endpoint::ChatCompletions => Ok("/messages".to_string()),
            _ => Err(GatewayError::new(
                400,
                "invalid_request_error",
                format!("provider 'anthropic' does not support /v1{openai_path}"),
            )
            .with_code("unsupported_endpoint")),
        }
    }

    fn auth_headers(&self, api_key: Option<&str>) -> Vec<(&'static str, String)> {
        // The version header goes even without a key (a local server behind custom_host).
        let key = api_key.map(|key| ("x-api-key", key.to_string()));
        key.into_iter().chain([("anthropic-version", API_VERSION.to_string())]).collect()
    }

    // `thinking` under strict_vendor_compliance is rejected by the pipeline before this call.
    fn chat_request(&self, body: Value, _strict_vendor_compliance: bool) -> Result<Value, GatewayError> {
        convert_request(body)
    }

    fn translates_responses(&self) -> bool {
        true
    }

    fn chat_response(&self, body: &[u8], ctx: &ResponseContext) -> Result<Vec<u8>, GatewayError> {
        convert_response(body, ctx)
    }

    fn chat_stream(&self, ctx: ResponseContext) -> Box<dyn StreamTranslator> {
        Box::new(AnthropicStream::new(ctx))
    }

    // Anthropic's `{"type":"error","error":{"type","message"}}` has the `error.type` and
    // `error.message` of OpenAI's shape, so the generic reshaping covers it.
    fn error_body(&self, status: u16, body: &[u8]) -> Vec<u8> {
        normalize_error(status, body)
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

fn str_field<'a>(value: Option<&'a Value>, field: &str) -> Option<&'a str> {
    value.and_then(|v| v.get(field)).and_then(Value::as_str)
}

fn u64_field(value: Option<&Value>, field: &str) -> u64 {
    value.and_then(|v| v.get(field)).and_then(Value::as_u64).unwrap_or(0)
}

/// Anthropic's `stop_reason` as an OpenAI `finish_reason`.
fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        // end_turn, stop_sequence, pause_turn, unknown or missing.
        _ => "stop",
    }
}

/// OpenAI counts cached prompt tokens as prompt tokens; Anthropic reports them apart.
fn prompt_tokens(usage: Option<&Value>) -> u64 {
    u64_field(usage, "input_tokens")
        .saturating_add(u64_field(usage, "cache_read_input_tokens"))
        .saturating_add(u64_field(usage, "cache_creation_input_tokens"))
}

fn usage_json(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens.saturating_add(completion_tokens),
    })
}

// ---------------------------------------------------------------------------------------------
// Request: OpenAI chat completion -> Anthropic message

fn convert_request(body: Value) -> Result<Value, GatewayError> {
    let Value::Object(mut req) = body else {
        return Err(GatewayError::new(400, "invalid_request_error", "request body must be a JSON object"));
    };
    // OpenAI reads null as "use the default"; Anthropic rejects nulls.
    req.retain(|_, v| !v.is_null());
    reject_unsupported(&req)?;
    for field in DROPPED_FIELDS {
        req.remove(*field);
    }

    let mut out = Map::new();
    let max_tokens = match (req.remove("max_completion_tokens"), req.remove("max_tokens")) {
        (Some(tokens), _) | (None, Some(tokens)) => tokens,
        (None, None) => json!(DEFAULT_MAX_TOKENS),
    };
    out.insert("max_tokens".into(), max_tokens);

    let (system, messages) = convert_messages(req.remove("messages").as_ref())?;
    if let Some(system) = system {
        out.insert("system".into(), system);
    }
    out.insert("messages".into(), messages);

    let tools = match req.remove("tools") {
        Some(tools) => convert_tools(&tools)?,
        None => Vec::new(),
    };
    let tool_choice = req.remove("tool_choice").map(|c| convert_tool_choice(&c)).transpose()?;
    let parallel_tool_calls = req.remove("parallel_tool_calls");
    // Anthropic accepts tool_choice only together with tools.
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
        let tool_choice = match parallel_tool_calls {
            Some(Value::Bool(false)) => Some(disable_parallel_tool_use(tool_choice)),
            _ => tool_choice,
        };
        if let Some(tool_choice) = tool_choice {
            out.insert("tool_choice".into(), tool_choice);
        }
    }

    if let Some(stop) = req.remove("stop") {
        out.insert("stop_sequences".into(), convert_stop(stop)?);
    }
    let user = req.remove("user");

    // What is left is named alike in both APIs (model, temperature, top_p, stream, thinking)
    // or provider-specific (top_k, metadata, ...) forced by the user; computed fields win.
    for (key, value) in req {
        out.entry(key).or_insert(value);
    }
    if let Some(Value::String(user)) = user {
        if let Value::Object(metadata) = out.entry("metadata").or_insert_with(|| json!({})) {
            metadata.entry("user_id").or_insert(Value::String(user));
        }
    }
    Ok(Value::Object(out))
}

/// OpenAI fields whose requested behaviour Anthropic cannot provide.
fn reject_unsupported(req: &Map<String, Value>) -> Result<(), GatewayError> {
    if req.get("n").and_then(Value::as_f64).is_some_and(|n| n > 1.0) {
        return Err(GatewayError::invalid_param("n", "provider 'anthropic' returns a single choice; 'n' must be 1"));
    }
    if req.get("logprobs") == Some(&Value::Bool(true)) {
        return Err(GatewayError::invalid_param("logprobs", "'logprobs' is not supported by provider 'anthropic'"));
    }
    for field in ["functions", "function_call"] {
        if req.get(field).is_some_and(|v| !is_empty(v)) {
            return Err(GatewayError::invalid_param(
                field,
                format!("'{field}' is not supported by provider 'anthropic'; use 'tools' and 'tool_choice'"),
            ));
        }
    }
    // `text` is Anthropic's only output; it is dropped with the other OpenAI-only fields.
    if matches!(str_field(req.get("response_format"), "type"), Some("json_object" | "json_schema")) {
        return Err(GatewayError::invalid_param(
            "response_format",
            "provider 'anthropic' has no JSON mode through this gateway yet; \
             only response_format type 'text' is supported",
        ));
    }
    Ok(())
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// OpenAI `messages` into Anthropic's top-level `system` and its `messages`, where roles
/// alternate and tool results are user content.
fn convert_messages(messages: Option<&Value>) -> Result<(Option<Value>, Value), GatewayError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(GatewayError::invalid_param("messages", "'messages' must be an array"));
    };
    let mut system = Vec::new();
    let mut system_is_plain = true;
    let mut turns: Vec<(&'static str, Value)> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let content = message.get("content").filter(|c| !c.is_null());
        match str_field(Some(message), "role").unwrap_or_default() {
            "system" | "developer" => {
                system_is_plain &= matches!(content, Some(Value::String(_)));
                system.extend(system_blocks(content, i)?);
            }
            "user" => push_turn(&mut turns, "user", convert_content(content, i)?),
            "assistant" => push_turn(&mut turns, "assistant", assistant_content(message, content, i)?),
            "tool" => push_turn(&mut turns, "user", tool_result(message, content, i)?),
            "function" => {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].role"),
                    "role 'function' is not supported by provider 'anthropic'; use 'tools' and 'tool' messages",
                ))
            }
            role => {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("unknown role '{role}'"),
                ))
            }
        }
    }

    let system = if system.is_empty() {
        None
    } else if system_is_plain {
        let texts: Vec<&str> = system.iter().filter_map(|block| str_field(Some(block), "text")).collect();
        Some(Value::String(texts.join("\n\n")))
    } else {
        Some(Value::Array(system))
    };
    let messages = turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    Ok((system, Value::Array(messages)))
}

/// Appends a turn, merging it into the previous one of the same role (Anthropic wants
/// user and assistant to alternate; consecutive tool results become one user turn).
fn push_turn(turns: &mut Vec<(&'static str, Value)>, role: &'static str, content: Value) {
    if let Some((last_role, last_content)) = turns.last_mut() {
        if *last_role == role {
            let mut blocks = into_blocks(std::mem::take(last_content));
            blocks.extend(into_blocks(content));
            *last_content = Value::Array(blocks);
            return;
        }
    }
    turns.push((role, content));
}

/// Anthropic content as a list of blocks; an empty string is no block (Anthropic rejects
/// empty text blocks).
fn into_blocks(content: Value) -> Vec<Value> {
    match content {
        Value::Array(blocks) => blocks,
        Value::String(text) if text.is_empty() => Vec::new(),
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        _ => Vec::new(),
    }
}

fn system_blocks(content: Option<&Value>, i: usize) -> Result<Vec<Value>, GatewayError> {
    match content {
        Some(Value::String(text)) => Ok(vec![json!({"type": "text", "text": text})]),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| match str_field(Some(part), "type") {
                Some("text") => text_block(part, i, j),
                _ => Err(GatewayError::invalid_param(
                    part_param(i, j, "type"),
                    "system and developer messages accept only text parts with provider 'anthropic'",
                )),
            })
            .collect(),
        _ => Err(content_error(i)),
    }
}

/// User, assistant or tool content: a string stays a string, parts become blocks.
fn convert_content(content: Option<&Value>, i: usize) -> Result<Value, GatewayError> {
    match content {
        Some(Value::String(text)) => Ok(Value::String(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| convert_part(part, i, j))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        _ => Err(content_error(i)),
    }
}

fn content_error(i: usize) -> GatewayError {
    GatewayError::invalid_param(
        format!("messages[{i}].content"),
        "content must be a string or an array of content parts",
    )
}

fn part_param(i: usize, j: usize, field: &str) -> String {
    format!("messages[{i}].content[{j}].{field}")
}

fn convert_part(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    match str_field(Some(part), "type") {
        Some("text") => text_block(part, i, j),
        Some("image_url") => image_block(part, i, j),
        other => Err(GatewayError::invalid_param(
            part_param(i, j, "type"),
            format!("content part type '{}' is not supported by provider 'anthropic'", other.unwrap_or_default()),
        )),
    }
}

fn text_block(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    let text = str_field(Some(part), "text")
        .ok_or_else(|| GatewayError::invalid_param(part_param(i, j, "text"), "text must be a string"))?;
    let mut block = Map::new();
    block.insert("type".into(), "text".into());
    block.insert("text".into(), text.into());
    // Prompt caching hints written for Anthropic are honoured.
    if let Some(cache_control) = part.get("cache_control") {
        block.insert("cache_control".into(), cache_control.clone());
    }
    Ok(Value::Object(block))
}

fn image_block(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    let bad_url = |message: &str| GatewayError::invalid_param(part_param(i, j, "image_url.url"), message);
    let url = str_field(part.get("image_url"), "url").ok_or_else(|| bad_url("image_url.url must be a string"))?;
    let source = if let Some(data_url) = url.strip_prefix("data:") {
        let (media_type, data) = data_url
            .split_once(";base64,")
            .ok_or_else(|| bad_url("data URLs must have the form data:<media type>;base64,<data>"))?;
        json!({"type": "base64", "media_type": media_type, "data": data})
    } else if url.starts_with("https://") || url.starts_with("http://") {
        json!({"type": "url", "url": url})
    } else {
        return Err(bad_url("image URLs must be http(s) URLs or base64 data URLs"));
    };
    Ok(json!({"type": "image", "source": source}))
}

/// Assistant content followed by its tool calls as `tool_use` blocks.
fn assistant_content(message: &Value, content: Option<&Value>, i: usize) -> Result<Value, GatewayError> {
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(_) => {
            return Err(GatewayError::invalid_param(format!("messages[{i}].tool_calls"), "tool_calls must be an array"))
        }
    };
    if calls.is_empty() {
        return convert_content(content, i);
    }
    let mut blocks = match content {
        Some(_) => into_blocks(convert_content(content, i)?),
        None => Vec::new(),
    };
    for (j, call) in calls.iter().enumerate() {
        blocks.push(tool_use_block(call, i, j)?);
    }
    Ok(Value::Array(blocks))
}

fn tool_use_block(call: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    let bad = |field: &str, message: &str| {
        GatewayError::invalid_param(format!("messages[{i}].tool_calls[{j}].{field}"), message)
    };
    if str_field(Some(call), "type").is_some_and(|t| t != "function") {
        return Err(bad("type", "only function tool calls are supported by provider 'anthropic'"));
    }
    let id = str_field(Some(call), "id").ok_or_else(|| bad("id", "id must be a string"))?;
    let function = call.get("function");
    let name = str_field(function, "name").ok_or_else(|| bad("function.name", "name must be a string"))?;
    let input = match function.and_then(|f| f.get("arguments")) {
        None => Some(json!({})),
        Some(Value::String(arguments)) => parse_arguments(arguments),
        Some(_) => None,
    }
    .ok_or_else(|| bad("function.arguments", "arguments must be a JSON object encoded as a string"))?;
    Ok(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
}

/// Tool call arguments as a JSON object; models emit "" for tools without parameters.
fn parse_arguments(arguments: &str) -> Option<Value> {
    if arguments.trim().is_empty() {
        return Some(json!({}));
    }
    serde_json::from_str::<Value>(arguments).ok().filter(Value::is_object)
}

fn tool_result(message: &Value, content: Option<&Value>, i: usize) -> Result<Value, GatewayError> {
    let id = str_field(Some(message), "tool_call_id").ok_or_else(|| {
        GatewayError::invalid_param(format!("messages[{i}].tool_call_id"), "tool_call_id must be a string")
    })?;
    let mut block = Map::new();
    block.insert("type".into(), "tool_result".into());
    block.insert("tool_use_id".into(), id.into());
    if content.is_some() {
        block.insert("content".into(), convert_content(content, i)?);
    }
    Ok(Value::Array(vec![Value::Object(block)]))
}

fn convert_tools(tools: &Value) -> Result<Vec<Value>, GatewayError> {
    let Value::Array(tools) = tools else {
        return Err(GatewayError::invalid_param("tools", "tools must be an array"));
    };
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            if str_field(Some(tool), "type") != Some("function") {
                return Err(GatewayError::invalid_param(
                    format!("tools[{i}].type"),
                    "only function tools are supported by provider 'anthropic'",
                ));
            }
            let function = tool.get("function");
            let name = str_field(function, "name").ok_or_else(|| {
                GatewayError::invalid_param(format!("tools[{i}].function.name"), "name must be a string")
            })?;
            let mut out = Map::new();
            out.insert("name".into(), name.into());
            if let Some(description) = str_field(function, "description") {
                out.insert("description".into(), description.into());
            }
            let schema = function
                .and_then(|f| f.get("parameters"))
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            out.insert("input_schema".into(), schema);
            Ok(Value::Object(out))
        })
        .collect()
}

fn convert_tool_choice(choice: &Value) -> Result<Value, GatewayError> {
    let named = (str_field(Some(choice), "type"), str_field(choice.get("function"), "name"));
    match (choice.as_str(), named) {
        (Some("auto"), _) => Ok(json!({"type": "auto"})),
        (Some("required"), _) => Ok(json!({"type": "any"})),
        (Some("none"), _) => Ok(json!({"type": "none"})),
        (None, (Some("function"), Some(name))) => Ok(json!({"type": "tool", "name": name})),
        _ => Err(GatewayError::invalid_param(
            "tool_choice",
            "tool_choice must be 'auto', 'required', 'none' or {\"type\":\"function\",\"function\":{\"name\":...}}",
        )),
    }
}

fn disable_parallel_tool_use(tool_choice: Option<Value>) -> Value {
    let mut tool_choice = tool_choice.unwrap_or_else(|| json!({"type": "auto"}));
    // `none` allows no tool call at all, and Anthropic accepts no flag on it.
    if let Value::Object(choice) = &mut tool_choice {
        if choice.get("type").and_then(Value::as_str) != Some("none") {
            choice.insert("disable_parallel_tool_use".into(), Value::Bool(true));
        }
    }
    tool_choice
}

fn convert_stop(stop: Value) -> Result<Value, GatewayError> {
    match stop {
        Value::String(stop) => Ok(json!([stop])),
        Value::Array(stops) if stops.iter().all(Value::is_string) => Ok(Value::Array(stops)),
        _ => Err(GatewayError::invalid_param("stop", "stop must be a string or an array of strings")),
    }
}

// ---------------------------------------------------------------------------------------------
// Response: Anthropic message -> OpenAI chat.completion

fn invalid_response() -> GatewayError {
    GatewayError::new(502, "api_error", "invalid response from provider anthropic")
}

fn convert_response(body: &[u8], ctx: &ResponseContext) -> Result<Vec<u8>, GatewayError> {
    let message: Value = serde_json::from_slice(body).map_err(|_| invalid_response())?;
    let blocks = message.get("content").and_then(Value::as_array).ok_or_else(invalid_response)?;

    let mut text: Option<String> = None;
    let mut tool_calls = Vec::new();
    let mut content_blocks = Vec::new();
    for block in blocks {
        match str_field(Some(block), "type") {
            Some("text") => {
                let part = str_field(Some(block), "text").unwrap_or_default();
                text.get_or_insert_with(String::new).push_str(part);
                content_blocks.push(json!({"type": "text", "text": part}));
            }
            Some("thinking") => content_blocks.push(json!({
                "type": "thinking",
                "thinking": str_field(Some(block), "thinking").unwrap_or_default(),
                "signature": str_field(Some(block), "signature").unwrap_or_default(),
            })),
            Some("tool_use") => tool_calls.push(json!({
                "id": str_field(Some(block), "id").unwrap_or_default(),
                "type": "function",
                "function": {
                    "name": str_field(Some(block), "name").unwrap_or_default(),
                    "arguments": block.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
                },
            })),
            // redacted_thinking and blocks unknown to OpenAI are kept as they are.
            _ => content_blocks.push(block.clone()),
        }
    }

    let mut reply = Map::new();
    reply.insert("role".into(), "assistant".into());
    reply.insert("content".into(), text.map_or(Value::Null, Value::String));
    if !tool_calls.is_empty() {
        reply.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    if !ctx.strict_vendor_compliance {
        reply.insert("content_blocks".into(), Value::Array(content_blocks));
    }

    let usage = message.get("usage");
    let response = json!({
        "id": str_field(Some(&message), "id").unwrap_or_default(),
        "object": "chat.completion",
        "created": ctx.created,
        "model": str_field(Some(&message), "model").unwrap_or(&ctx.model),
        "choices": [{
            "index": 0,
            "message": reply,
            "logprobs": null,
            "finish_reason": finish_reason(str_field(Some(&message), "stop_reason")),
        }],
        "usage": usage_json(prompt_tokens(usage), u64_field(usage, "output_tokens")),
    });
    Ok(response.to_string().into_bytes())
}

// ---------------------------------------------------------------------------------------------
// Stream: Anthropic SSE events -> OpenAI chat.completion.chunk SSE

struct AnthropicStream {
    ctx: ResponseContext,
    parser: SseParser,
    /// Message id and model, from `message_start`.
    id: String,
    model: String,
    prompt_tokens: u64,
    completion_tokens: u64,
    /// OpenAI tool call index of each Anthropic `tool_use` content block index.
    tool_blocks: HashMap<u64, usize>,
    /// `[DONE]` was sent; the client stream is over.
    done: bool,
}

impl AnthropicStream {
    fn new(ctx: ResponseContext) -> Self {
        AnthropicStream {
            model: ctx.model.clone(),
            ctx,
            parser: SseParser::new(),
            id: String::new(),
            prompt_tokens: 0,
            completion_tokens: 0,
            tool_blocks: HashMap::new(),
            done: false,
        }
    }

    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return;
        };
        // The JSON `type` repeats the SSE event name and is always sent.
        let kind = str_field(Some(&data), "type").or(event.event.as_deref()).unwrap_or_default();
        match kind {
            "message_start" => self.on_message_start(&data, out),
            "content_block_start" => self.on_block_start(&data, out),
            "content_block_delta" => self.on_block_delta(&data, out),
            "message_delta" => {
                if let Some(tokens) = data.get("usage").and_then(|u| u.get("output_tokens")).and_then(Value::as_u64) {
                    self.completion_tokens = tokens;
                }
                let reason = finish_reason(str_field(data.get("delta"), "stop_reason"));
                self.emit_delta(json!({}), Some(reason), out);
            }
            "message_stop" => {
                if self.ctx.include_usage {
                    let usage = usage_json(self.prompt_tokens, self.completion_tokens);
                    write_data(out, self.chunk(json!([]), usage).to_string().as_bytes());
                }
                self.end(out);
            }
            "error" => {
                let error = data.get("error");
                let message = str_field(error, "message").unwrap_or("provider stream error");
                let kind = str_field(error, "type").unwrap_or("api_error");
                self.end_with_error(message, kind, out);
            }
            // ping, content_block_stop and future events carry nothing for the client.
            _ => {}
        }
    }

    fn on_message_start(&mut self, data: &Value, out: &mut Vec<u8>) {
        let message = data.get("message");
        self.id = str_field(message, "id").unwrap_or_default().to_string();
        if let Some(model) = str_field(message, "model") {
            self.model = model.to_string();
        }
        self.prompt_tokens = prompt_tokens(message.and_then(|m| m.get("usage")));
        self.emit_delta(json!({"role": "assistant", "content": ""}), None, out);
    }

    fn on_block_start(&mut self, data: &Value, out: &mut Vec<u8>) {
        let block = data.get("content_block");
        let Some(index) = data.get("index").and_then(Value::as_u64) else {
            return;
        };
        // Text and thinking arrive as deltas; a repeated start would announce the call twice.
        if str_field(block, "type") != Some("tool_use") || self.tool_blocks.contains_key(&index) {
            return;
        }
        let tool_index = self.tool_blocks.len();
        self.tool_blocks.insert(index, tool_index);
        let call = json!({
            "index": tool_index,
            "id": str_field(block, "id").unwrap_or_default(),
            "type": "function",
            "function": {"name": str_field(block, "name").unwrap_or_default(), "arguments": ""},
        });
        self.emit_delta(json!({"tool_calls": [call]}), None, out);
    }

    fn on_block_delta(&mut self, data: &Value, out: &mut Vec<u8>) {
        let Some(index) = data.get("index").and_then(Value::as_u64) else {
            return;
        };
        let delta = data.get("delta");
        match str_field(delta, "type") {
            Some("text_delta") => {
                if let Some(text) = str_field(delta, "text") {
                    self.emit_delta(json!({"content": text}), None, out);
                }
            }
            Some("input_json_delta") => {
                let tool_index = self.tool_blocks.get(&index);
                if let (Some(tool_index), Some(json)) = (tool_index, str_field(delta, "partial_json")) {
                    let call = json!({"index": tool_index, "function": {"arguments": json}});
                    self.emit_delta(json!({"tool_calls": [call]}), None, out);
                }
            }
            Some("thinking_delta") => self.emit_block_delta(index, "thinking", str_field(delta, "thinking"), out),
            Some("signature_delta") => self.emit_block_delta(index, "signature", str_field(delta, "signature"), out),
            _ => {}
        }
    }

    /// Thinking is not part of OpenAI's chunk; it is sent only to clients that accept extras.
    fn emit_block_delta(&self, index: u64, field: &str, value: Option<&str>, out: &mut Vec<u8>) {
        if self.ctx.strict_vendor_compliance {
            return;
        }
        if let Some(value) = value {
            let block = json!({"index": index, "delta": {field: value}});
            self.emit_delta(json!({"content_blocks": [block]}), None, out);
        }
    }

    fn emit_delta(&self, delta: Value, finish_reason: Option<&str>, out: &mut Vec<u8>) {
        let choices = json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]);
        // With include_usage OpenAI sends `"usage": null` on every chunk but the last.
        write_data(out, self.chunk(choices, Value::Null).to_string().as_bytes());
    }

    fn chunk(&self, choices: Value, usage: Value) -> Value {
        let mut chunk = Map::new();
        chunk.insert("id".into(), self.id.as_str().into());
        chunk.insert("object".into(), "chat.completion.chunk".into());
        chunk.insert("created".into(), self.ctx.created.into());
        chunk.insert("model".into(), self.model.as_str().into());
        chunk.insert("choices".into(), choices);
        if self.ctx.include_usage {
            chunk.insert("usage".into(), usage);
        }
        Value::Object(chunk)
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        write_data(out, b"[DONE]");
        self.done = true;
    }

    /// OpenAI's in-stream error chunk, then the end of the stream.
    fn end_with_error(&mut self, message: &str, kind: &str, out: &mut Vec<u8>) {
        write_data(out, &error_json(message, kind, None, None));
        self.end(out);
    }

    fn end_if_overflowed(&mut self, out: &mut Vec<u8>) {
        if self.parser.overflowed() && !self.done {
            let message = format!("provider 'anthropic' sent a stream event larger than {MAX_EVENT_BYTES} bytes");
            self.end_with_error(&message, "api_error", out);
        }
    }
}

impl StreamTranslator for AnthropicStream {
    fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        // After `[DONE]` nothing is sent, so nothing needs parsing or buffering.
        if self.done {
            return;
        }
        for event in self.parser.push(chunk) {
            self.on_event(&event, out);
        }
        self.end_if_overflowed(out);
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        for event in self.parser.finish() {
            self.on_event(&event, out);
        }
        self.end_if_overflowed(out);
        // An upstream that ended without message_stop still ends the client stream cleanly.
        if !self.done {
            self.end(out);
        }
    }
}

#[cfg(test)]
mod tests {
    // The same tests run inside wasm (32-bit) under wasm-bindgen-test.
    use super::*;
    use crate::stream::testing::payloads;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn request(body: Value) -> Value {
        Anthropic.chat_request(body, true).unwrap()
    }

    fn request_error(body: Value, strict: bool) -> GatewayError {
        Anthropic.chat_request(body, strict).unwrap_err()
    }

    fn with_messages(messages: Value) -> Value {
        json!({"model": "claude-sonnet-4-5", "messages": messages})
    }

    fn ctx(strict: bool, include_usage: bool) -> ResponseContext {
        ResponseContext {
            model: "asked-model".into(),
            created: 1_700_000_000,
            include_usage,
            strict_vendor_compliance: strict,
        }
    }

    // --- endpoints and headers ------------------------------------------------------------

    #[test]
    fn upstream_path_is_messages_for_chat_only() {
        assert_eq!(Anthropic.upstream_path(Endpoint::ChatCompletions, "/chat/completions").unwrap(), "/messages");
        let e = Anthropic.upstream_path(Endpoint::Embeddings, "/embeddings").unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.kind, "invalid_request_error");
        assert_eq!(e.code, Some("unsupported_endpoint"));
        assert_eq!(e.message, "provider 'anthropic' does not support /v1/embeddings");
        assert!(Anthropic.upstream_path(Endpoint::Resource, "/batches/b1/cancel").is_err());
    }

    #[test]
    fn auth_headers_carry_key_and_version() {
        assert_eq!(
            Anthropic.auth_headers(Some("sk-ant")),
            vec![("x-api-key", "sk-ant".to_string()), ("anthropic-version", "2023-06-01".to_string())]
        );
        assert_eq!(Anthropic.auth_headers(None), vec![("anthropic-version", "2023-06-01".to_string())]);
        assert!(Anthropic.translates_responses());
    }

    // --- request ----------------------------------------------------------------------------

    #[test]
    fn minimal_request() {
        let out = request(with_messages(json!([{"role": "user", "content": "Hi"}])));
        assert_eq!(
            out,
            json!({"model": "claude-sonnet-4-5", "max_tokens": 4096, "messages": [{"role": "user", "content": "Hi"}]})
        );
    }

    #[test]
    fn max_tokens_sources() {
        let mut body = with_messages(json!([{"role": "user", "content": "Hi"}]));
        body["max_tokens"] = json!(100);
        assert_eq!(request(body.clone())["max_tokens"], 100);
        body["max_completion_tokens"] = json!(200);
        assert_eq!(request(body.clone())["max_tokens"], 200);
        body["max_completion_tokens"] = Value::Null;
        assert_eq!(request(body.clone())["max_tokens"], 100);
        body["max_tokens"] = Value::Null;
        let out = request(body);
        assert_eq!(out["max_tokens"], 4096);
        assert!(out.get("max_completion_tokens").is_none());
    }

    #[test]
    fn system_and_developer_strings_join() {
        let out = request(with_messages(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "developer", "content": "Use French."},
        ])));
        assert_eq!(out["system"], "Be brief.\n\nUse French.");
        assert_eq!(out["messages"], json!([{"role": "user", "content": "Hi"}]));
    }

    #[test]
    fn system_parts_become_blocks() {
        let out = request(with_messages(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": [
                {"type": "text", "text": "Cached.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "More."},
            ]},
            {"role": "user", "content": "Hi"},
        ])));
        assert_eq!(
            out["system"],
            json!([
                {"type": "text", "text": "Be brief."},
                {"type": "text", "text": "Cached.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "More."},
            ])
        );
    }

    #[test]
    fn system_image_part_is_rejected() {
        let e = request_error(
            with_messages(json!([
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]},
            ])),
            true,
        );
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
    }

    #[test]
    fn user_parts_text_and_images() {
        let out = request(with_messages(json!([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "high"}},
        ]}])));
        assert_eq!(
            out["messages"][0]["content"],
            json!([
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            ])
        );
    }

    #[test]
    fn bad_parts_are_rejected_with_their_path() {
        let e = request_error(
            with_messages(json!([
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}]},
            ])),
            true,
        );
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("messages[2].content[1].type"));
        assert!(e.message.contains("input_audio"), "{}", e.message);

        let e = request_error(
            with_messages(
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]),
            ),
            true,
        );
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image_url.url"));
        let e = request_error(
            with_messages(
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,AAA"}}]}]),
            ),
            true,
        );
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image_url.url"));
    }

    #[test]
    fn assistant_tool_calls_become_tool_use_after_text() {
        let out = request(with_messages(json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": ""}},
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_3", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
            ]},
        ])));
        assert_eq!(
            out["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "time", "input": {}},
                {"type": "tool_use", "id": "call_3", "name": "noop", "input": {}},
            ]})
        );
    }

    #[test]
    fn assistant_without_content_and_empty_text() {
        let out = request(with_messages(json!([
            {"role": "user", "content": "Go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ]},
        ])));
        assert_eq!(out["messages"][1]["content"], json!([{"type": "tool_use", "id": "c", "name": "f", "input": {}}]));
    }

    #[test]
    fn invalid_tool_arguments_are_rejected() {
        for arguments in ["{not json", "[1,2]", "\"text\""] {
            let e = request_error(
                with_messages(json!([
                    {"role": "user", "content": "Go"},
                    {"role": "assistant", "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                        {"id": "b", "type": "function", "function": {"name": "f", "arguments": arguments}},
                    ]},
                ])),
                true,
            );
            assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[1].function.arguments"), "{arguments}");
        }
    }

    #[test]
    fn tool_messages_merge_into_one_user_turn() {
        let out = request(with_messages(json!([
            {"role": "user", "content": "Go"},
            {"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "noon"}]},
            {"role": "user", "content": "Thanks"},
        ])));
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(
            messages[2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "noon"}]},
                {"type": "text", "text": "Thanks"},
            ]})
        );
    }

    #[test]
    fn consecutive_same_role_messages_merge() {
        let out = request(with_messages(json!([
            {"role": "user", "content": "One"},
            {"role": "user", "content": [{"type": "text", "text": "Two"}]},
            {"role": "assistant", "content": "A"},
            {"role": "assistant", "content": "B"},
        ])));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "Two"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
            ])
        );
    }

    #[test]
    fn function_role_is_rejected() {
        let e = request_error(
            with_messages(
                json!([{"role": "user", "content": "Go"}, {"role": "function", "name": "f", "content": "x"}]),
            ),
            true,
        );
        assert_eq!(e.param.as_deref(), Some("messages[1].role"));
        assert!(e.message.contains("tools"), "{}", e.message);
    }

    #[test]
    fn tools_and_tool_choice() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        body["tools"] = json!([
            {"type": "function", "function": {"name": "weather", "description": "Get weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "time"}},
        ]);
        let out = request(body.clone());
        assert_eq!(
            out["tools"],
            json!([
                {"name": "weather", "description": "Get weather",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                {"name": "time", "input_schema": {"type": "object", "properties": {}}},
            ])
        );
        assert!(out.get("tool_choice").is_none());

        for (choice, expected) in [
            (json!("auto"), json!({"type": "auto"})),
            (json!("required"), json!({"type": "any"})),
            (json!("none"), json!({"type": "none"})),
            (json!({"type": "function", "function": {"name": "time"}}), json!({"type": "tool", "name": "time"})),
        ] {
            body["tool_choice"] = choice;
            assert_eq!(request(body.clone())["tool_choice"], expected);
        }
        body["tool_choice"] = json!("sometimes");
        assert_eq!(request_error(body, true).param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn parallel_tool_calls_false_disables_parallel_use() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        body["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        body["parallel_tool_calls"] = json!(false);
        let out = request(body.clone());
        assert_eq!(out["tool_choice"], json!({"type": "auto", "disable_parallel_tool_use": true}));
        assert!(out.get("parallel_tool_calls").is_none());

        body["tool_choice"] = json!("required");
        assert_eq!(request(body.clone())["tool_choice"], json!({"type": "any", "disable_parallel_tool_use": true}));
        body["tool_choice"] = json!("none");
        assert_eq!(request(body.clone())["tool_choice"], json!({"type": "none"}));
        body["parallel_tool_calls"] = json!(true);
        body["tool_choice"] = json!("auto");
        assert_eq!(request(body)["tool_choice"], json!({"type": "auto"}));
    }

    #[test]
    fn non_function_tool_is_rejected() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        body["tools"] = json!([{"type": "function", "function": {"name": "f"}}, {"type": "custom", "custom": {}}]);
        assert_eq!(request_error(body, true).param.as_deref(), Some("tools[1].type"));
    }

    #[test]
    fn sampling_stop_user_and_stream() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        body["stop"] = json!("END");
        body["temperature"] = json!(0.5);
        body["top_p"] = Value::Null;
        body["stream"] = json!(true);
        body["user"] = json!("u-42");
        let out = request(body.clone());
        assert_eq!(out["stop_sequences"], json!(["END"]));
        assert_eq!(out["temperature"], 0.5);
        assert!(out.get("top_p").is_none());
        assert_eq!(out["stream"], true);
        assert_eq!(out["metadata"], json!({"user_id": "u-42"}));
        assert!(out.get("user").is_none() && out.get("stop").is_none());

        body["stop"] = json!(["a", "b"]);
        body["top_p"] = json!(0.9);
        let out = request(body);
        assert_eq!(out["stop_sequences"], json!(["a", "b"]));
        assert_eq!(out["top_p"], 0.9);
    }

    #[test]
    fn unknown_fields_pass_through_and_merge_user() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        body["top_k"] = json!(5);
        body["metadata"] = json!({"user_id": "forced", "other": 1});
        body["user"] = json!("u-42");
        let out = request(body);
        assert_eq!(out["top_k"], 5);
        assert_eq!(out["metadata"], json!({"user_id": "forced", "other": 1}));
    }

    #[test]
    fn thinking_passes_through() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
        let out = Anthropic.chat_request(body, false).unwrap();
        assert_eq!(out["thinking"], json!({"type": "enabled", "budget_tokens": 1024}));
    }

    #[test]
    fn json_response_formats_are_rejected() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        for format in [json!({"type": "json_object"}), json!({"type": "json_schema", "json_schema": {"name": "n"}})] {
            body["response_format"] = format;
            let e = request_error(body.clone(), false);
            assert_eq!((e.status, e.param.as_deref()), (400, Some("response_format")));
            assert!(e.message.contains("no JSON mode"), "{}", e.message);
        }
        for format in [json!({"type": "text"}), Value::Null] {
            body["response_format"] = format;
            assert!(request(body.clone()).get("response_format").is_none());
        }
    }

    #[test]
    fn openai_only_fields_are_dropped_or_rejected() {
        let mut body = with_messages(json!([{"role": "user", "content": "Go"}]));
        for (field, value) in [
            ("n", json!(1)),
            ("logprobs", json!(false)),
            ("top_logprobs", json!(2)),
            ("logit_bias", json!({"1": 2})),
            ("presence_penalty", json!(0.1)),
            ("frequency_penalty", json!(0.1)),
            ("seed", json!(7)),
            ("response_format", json!({"type": "text"})),
            ("stream_options", json!({"include_usage": true})),
            ("functions", json!([])),
            ("function_call", Value::Null),
            ("store", json!(false)),
        ] {
            body[field] = value;
        }
        let out = request(body.clone());
        assert_eq!(
            out,
            json!({"model": "claude-sonnet-4-5", "max_tokens": 4096, "messages": [{"role": "user", "content": "Go"}]})
        );

        for (field, value) in [
            ("n", json!(2)),
            ("logprobs", json!(true)),
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!("auto")),
        ] {
            let mut bad = body.clone();
            bad[field] = value;
            let e = request_error(bad, false);
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)));
        }
    }

    #[test]
    fn malformed_messages_are_rejected() {
        assert_eq!(request_error(json!({"model": "m"}), true).param.as_deref(), Some("messages"));
        assert_eq!(request_error(json!("text"), true).status, 400);
        let e = request_error(with_messages(json!([{"role": "critic", "content": "x"}])), true);
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = request_error(with_messages(json!([{"role": "user", "content": null}])), true);
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        let e = request_error(with_messages(json!([{"role": "tool", "content": "x"}])), true);
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_call_id"));
    }

    // --- response ---------------------------------------------------------------------------

    fn sample_message() -> Value {
        json!({
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [
                {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Let me "},
                {"type": "text", "text": "check."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": null,
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2, "output_tokens": 7},
        })
    }

    fn response(message: &Value, ctx: &ResponseContext) -> Value {
        let out = Anthropic.chat_response(message.to_string().as_bytes(), ctx).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn response_with_tool_use_strict() {
        let out = response(&sample_message(), &ctx(true, false));
        assert_eq!(
            out,
            json!({
                "id": "msg_01",
                "object": "chat.completion",
                "created": 1_700_000_000u64,
                "model": "claude-sonnet-4-5-20250929",
                "choices": [{
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "Let me check.",
                        "tool_calls": [{"id": "toolu_1", "type": "function",
                            "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}],
                    },
                    "logprobs": null,
                    "finish_reason": "tool_calls",
                }],
                "usage": {"prompt_tokens": 17, "completion_tokens": 7, "total_tokens": 24},
            })
        );
    }

    #[test]
    fn response_content_blocks_when_not_strict() {
        let out = response(&sample_message(), &ctx(false, false));
        assert_eq!(
            out["choices"][0]["message"]["content_blocks"],
            json!([
                {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Let me "},
                {"type": "text", "text": "check."},
            ])
        );
        assert_eq!(out["choices"][0]["message"]["content"], "Let me check.");
    }

    #[test]
    fn response_without_text_has_null_content_and_ctx_model() {
        let message =
            json!({"id": "m", "content": [], "stop_reason": null, "usage": {"input_tokens": 1, "output_tokens": 0}});
        let out = response(&message, &ctx(true, false));
        assert_eq!(out["choices"][0]["message"], json!({"role": "assistant", "content": null}));
        assert_eq!(out["model"], "asked-model");
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn finish_reason_mapping() {
        for (stop, expected) in [
            (json!("end_turn"), "stop"),
            (json!("stop_sequence"), "stop"),
            (json!("max_tokens"), "length"),
            (json!("tool_use"), "tool_calls"),
            (json!("refusal"), "content_filter"),
            (json!("pause_turn"), "stop"),
            (Value::Null, "stop"),
        ] {
            let message = json!({"id": "m", "content": [{"type": "text", "text": "x"}], "stop_reason": stop});
            assert_eq!(response(&message, &ctx(true, false))["choices"][0]["finish_reason"], expected);
        }
    }

    #[test]
    fn unparseable_response_is_502() {
        for body in [&b"not json"[..], b"{\"type\":\"message\"}", b"[]", b""] {
            let e = Anthropic.chat_response(body, &ctx(true, false)).unwrap_err();
            assert_eq!((e.status, e.kind), (502, "api_error"));
            assert_eq!(e.message, "invalid response from provider anthropic");
        }
    }

    // --- stream -----------------------------------------------------------------------------

    const TRANSCRIPT: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",",
        "\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,",
        "\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me think.\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig==\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"H\u{e9}llo \u{1f600}\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"weather\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Par\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"is\\\"}\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":3,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_02\",\"name\":\"time\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":3}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":42}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );

    fn run_stream(ctx: ResponseContext, chunks: &[&[u8]]) -> Vec<u8> {
        let mut stream = Anthropic.chat_stream(ctx);
        let mut out = Vec::new();
        for chunk in chunks {
            stream.push(chunk, &mut out);
        }
        stream.finish(&mut out);
        out
    }

    fn deltas(payloads: &[Value]) -> Vec<Value> {
        payloads.iter().map(|p| p["choices"][0]["delta"].clone()).collect()
    }

    #[test]
    fn stream_transcript_not_strict() {
        let out = run_stream(ctx(false, true), &[TRANSCRIPT.as_bytes()]);
        let payloads = payloads(&out);
        let first = &payloads[0];
        assert_eq!(
            first,
            &json!({"id": "msg_01", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                "model": "claude-sonnet-4-5", "usage": null,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]})
        );
        assert_eq!(
            deltas(&payloads[..9]),
            vec![
                json!({"role": "assistant", "content": ""}),
                json!({"content_blocks": [{"index": 0, "delta": {"thinking": "Let me think."}}]}),
                json!({"content_blocks": [{"index": 0, "delta": {"signature": "sig=="}}]}),
                json!({"content": "H\u{e9}llo \u{1f600}"}),
                json!({"tool_calls": [{"index": 0, "id": "toolu_01", "type": "function", "function": {"name": "weather", "arguments": ""}}]}),
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": \"Par"}}]}),
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "is\"}"}}]}),
                json!({"tool_calls": [{"index": 1, "id": "toolu_02", "type": "function", "function": {"name": "time", "arguments": ""}}]}),
                json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
            ]
        );
        assert_eq!(payloads[9]["choices"][0]["delta"], json!({}));
        assert_eq!(payloads[9]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(payloads[10]["choices"], json!([]));
        assert_eq!(payloads[10]["usage"], json!({"prompt_tokens": 30, "completion_tokens": 42, "total_tokens": 72}));
        assert_eq!(payloads[10]["id"], "msg_01");
        assert_eq!(payloads[11], "[DONE]");
        assert_eq!(payloads.len(), 12);
    }

    #[test]
    fn stream_transcript_strict_drops_thinking_and_usage() {
        let out = run_stream(ctx(true, false), &[TRANSCRIPT.as_bytes()]);
        let payloads = payloads(&out);
        assert_eq!(payloads.len(), 9);
        assert_eq!(
            deltas(&payloads[..2]),
            vec![json!({"role": "assistant", "content": ""}), json!({"content": "H\u{e9}llo \u{1f600}"})]
        );
        assert!(payloads[0].get("usage").is_none());
        assert_eq!(payloads[7]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(payloads[8], "[DONE]");
    }

    #[test]
    fn stream_output_identical_at_every_split_and_byte_by_byte() {
        let input = TRANSCRIPT.as_bytes();
        for strict in [true, false] {
            let whole = run_stream(ctx(strict, true), &[input]);
            for at in 0..=input.len() {
                let (a, b) = input.split_at(at);
                assert_eq!(run_stream(ctx(strict, true), &[a, b]), whole, "split at {at}");
            }
            let bytes: Vec<&[u8]> = input.chunks(1).collect();
            assert_eq!(run_stream(ctx(strict, true), &bytes), whole);
        }
    }

    #[test]
    fn stream_error_event_ends_stream() {
        let input = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":1}}}\n\n",
            "event: error\n",
            "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
            "event: message_stop\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        let out = run_stream(ctx(true, true), &[input.as_bytes()]);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with(
            "data: {\"error\":{\"code\":null,\"message\":\"Overloaded\",\"param\":null,\"type\":\"overloaded_error\"}}\n\n\
             data: [DONE]\n\n"
        ));
        assert_eq!(text.matches("[DONE]").count(), 1);
    }

    #[test]
    fn stream_event_too_large_ends_stream_with_error() {
        let start = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n",
            "event: content_block_delta\n",
            "data: ",
        );
        let huge = vec![b'x'; MAX_EVENT_BYTES];
        let after = b"\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let out = run_stream(ctx(true, false), &[start.as_bytes(), &huge, after]);
        let payloads = payloads(&out);
        assert_eq!(deltas(&payloads[..1]), vec![json!({"role": "assistant", "content": ""})]);
        assert_eq!(
            payloads[1],
            json!({"error": {"message": "provider 'anthropic' sent a stream event larger than 16777216 bytes",
                "type": "api_error", "param": null, "code": null}})
        );
        assert_eq!(payloads[2], "[DONE]");
        assert_eq!(payloads.len(), 3);
    }

    #[test]
    fn stream_without_message_stop_still_ends() {
        let input = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"cut\"}}",
        );
        let payloads = payloads(&run_stream(ctx(true, false), &[input.as_bytes()]));
        assert_eq!(
            deltas(&payloads[..2]),
            vec![json!({"role": "assistant", "content": ""}), json!({"content": "cut"})]
        );
        assert_eq!(payloads[2], "[DONE]");
        assert_eq!(payloads.len(), 3);
        // An empty upstream still gets a clean end.
        assert_eq!(run_stream(ctx(true, false), &[]), b"data: [DONE]\n\n");
    }

    // --- errors -----------------------------------------------------------------------------

    fn error(status: u16, body: &[u8]) -> Value {
        serde_json::from_slice(&Anthropic.error_body(status, body)).unwrap()
    }

    #[test]
    fn error_body_variants() {
        assert_eq!(
            error(429, br#"{"type":"error","error":{"type":"rate_limit_error","message":"Slow down"}}"#),
            json!({"error": {"message": "Slow down", "type": "rate_limit_error", "param": null, "code": null}})
        );
        assert_eq!(
            error(
                400,
                br#"{"error":{"message":"Bad","type":"invalid_request_error","param":"model","code":"bad_model"}}"#
            ),
            json!({"error": {"message": "Bad", "type": "invalid_request_error", "param": "model", "code": "bad_model"}})
        );
        assert_eq!(
            error(503, b"upstream connect error\n"),
            json!({"error": {"message": "upstream connect error", "type": "api_error", "param": null, "code": null}})
        );
        assert_eq!(
            error(401, b""),
            json!({"error": {"message": "provider returned status 401", "type": "authentication_error", "param": null, "code": null}})
        );
        assert_eq!(error(404, br#"{"error":"nope"}"#)["error"]["message"], "nope");
        let long = vec![b'x'; 5000];
        assert_eq!(error(500, &long)["error"]["message"].as_str().unwrap().len(), 1000);
        assert_eq!(error(500, b"bad \xff byte")["error"]["message"], "bad \u{fffd} byte");
    }

    // --- nonsense input never panics ----------------------------------------------------------

    fn weird_values() -> Vec<Value> {
        vec![
            Value::Null,
            json!(true),
            json!(0),
            json!(-1),
            json!(2.5),
            json!(u64::MAX),
            json!(""),
            json!("x"),
            json!("data:"),
            json!([]),
            json!({}),
            json!([null, 1, "a", {}]),
            json!({"type": "text"}),
        ]
    }

    /// Copies of `value` with one node (at any depth) replaced by each weird value.
    fn mutations(value: &Value) -> Vec<Value> {
        let mut out = weird_values();
        match value {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    for replacement in mutations(item) {
                        let mut copy = items.clone();
                        copy[i] = replacement;
                        out.push(Value::Array(copy));
                    }
                }
            }
            Value::Object(fields) => {
                for (key, item) in fields {
                    for replacement in mutations(item) {
                        let mut copy = fields.clone();
                        copy.insert(key.clone(), replacement);
                        out.push(Value::Object(copy));
                    }
                }
            }
            _ => {}
        }
        out
    }

    fn garbage(len: usize, mut seed: u32) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (seed >> 16) as u8
            })
            .collect()
    }

    #[test]
    fn nonsense_never_panics() {
        let full_request = json!({
            "model": "m", "max_tokens": 5, "max_completion_tokens": 6, "n": 1, "logprobs": false,
            "functions": [], "function_call": null, "thinking": {"type": "enabled"}, "user": "u",
            "stop": ["s"], "metadata": {"k": "v"}, "parallel_tool_calls": false, "tool_choice": {"type": "function", "function": {"name": "f"}},
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "s"}]},
                {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
                {"role": "assistant", "content": "a", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "r"},
            ],
        });
        for body in mutations(&full_request) {
            for strict in [true, false] {
                let _ = Anthropic.chat_request(body.clone(), strict);
            }
        }

        for message in mutations(&sample_message()) {
            for strict in [true, false] {
                let _ = Anthropic.chat_response(message.to_string().as_bytes(), &ctx(strict, true));
            }
        }

        let events: Vec<(&str, Value)> = TRANSCRIPT
            .split_terminator("\n\n")
            .filter_map(|e| e.split_once("\ndata: "))
            .map(|(name, data)| (name.trim_start_matches("event: "), serde_json::from_str(data).unwrap()))
            .collect();
        for (i, (_, data)) in events.iter().enumerate() {
            for mutated in mutations(data) {
                let mut input = String::new();
                for (j, (other_name, other)) in events.iter().enumerate() {
                    let payload = if i == j { &mutated } else { other };
                    input.push_str(&format!("event: {other_name}\ndata: {payload}\n\n"));
                }
                let _ = run_stream(ctx(false, true), &[input.as_bytes()]);
            }
        }

        for seed in 0..20 {
            let bytes = garbage(2000, seed);
            let _ = Anthropic.chat_response(&bytes, &ctx(false, true));
            let _ = Anthropic.error_body(500, &bytes);
            let out = run_stream(ctx(false, true), &[&bytes]);
            assert!(out.ends_with(b"data: [DONE]\n\n"));
        }
        let _ = Anthropic.error_body(0, b"{\"error\":{\"message\":5,\"type\":[]}}");
    }
}
