//! OpenAI chat completion requests as Gemini `GenerateContentRequest`s.

use super::thought_signature;
use crate::errors::GatewayError;
use crate::providers::chat_input::{
    content_error, function_tools, part_param, read_tool_call, role_error, stop_sequences, tool_call_id, tool_calls,
    tool_choice, ToolChoice,
};
use crate::providers::str_field;
use hashbrown::HashMap;
use serde_json::{json, Map, Value};

/// Request fields named as Gemini names them, passed through when a user sets them.
const NATIVE_FIELDS: &[&str] = &["safetySettings", "cachedContent", "labels"];

/// Schema keywords Gemini's OpenAPI-subset schemas reject; they only narrow what is valid,
/// so dropping them keeps every answer the schema allowed.
const UNSUPPORTED_SCHEMA_KEYS: &[&str] = &["$schema", "$id", "additionalProperties", "strict"];

/// A request field; OpenAI reads null as "use the default".
fn field<'a>(req: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    req.get(name).filter(|v| !v.is_null())
}

/// The body to send. `provider` names the provider in errors.
pub(crate) fn convert_request(body: &Value, provider: &str) -> Result<Value, GatewayError> {
    let Value::Object(req) = body else {
        return Err(GatewayError::new(400, "invalid_request_error", "request body must be a JSON object"));
    };
    reject_unsupported(req, provider)?;

    let mut out = Map::new();
    let (system, contents) = convert_messages(field(req, "messages"), provider)?;
    out.insert("contents".into(), contents);
    if let Some(system) = system {
        out.insert("systemInstruction".into(), system);
    }
    if let Some(tools) = field(req, "tools") {
        let declarations = convert_tools(tools, provider)?;
        if !declarations.is_empty() {
            out.insert("tools".into(), json!([{"functionDeclarations": declarations}]));
        }
    }
    if let Some(choice) = field(req, "tool_choice") {
        out.insert("toolConfig".into(), json!({"functionCallingConfig": convert_tool_choice(choice)?}));
    }
    let config = generation_config(req)?;
    if !config.is_empty() {
        out.insert("generationConfig".into(), Value::Object(config));
    }
    for name in NATIVE_FIELDS {
        if let Some(value) = field(req, name) {
            out.insert((*name).into(), value.clone());
        }
    }
    Ok(Value::Object(out))
}

fn reject_unsupported(req: &Map<String, Value>, provider: &str) -> Result<(), GatewayError> {
    if field(req, "logprobs") == Some(&Value::Bool(true)) {
        return Err(GatewayError::invalid_param(
            "logprobs",
            format!("'logprobs' is not supported by provider '{provider}' through this gateway"),
        ));
    }
    for name in ["functions", "function_call"] {
        if field(req, name).is_some() {
            return Err(GatewayError::invalid_param(
                name,
                format!("'{name}' is not supported by provider '{provider}'; use 'tools' and 'tool_choice'"),
            ));
        }
    }
    Ok(())
}

/// OpenAI's sampling fields as Gemini's `generationConfig`; a `generationConfig` the user
/// wrote in Gemini's terms is kept under the computed fields.
fn generation_config(req: &Map<String, Value>) -> Result<Map<String, Value>, GatewayError> {
    let mut config = match field(req, "generationConfig") {
        Some(Value::Object(config)) => config.clone(),
        _ => Map::new(),
    };
    let renamed = [
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("top_k", "topK"),
        ("n", "candidateCount"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ];
    for (openai, gemini) in renamed {
        if let Some(value) = field(req, openai) {
            config.insert(gemini.into(), value.clone());
        }
    }
    if let Some(tokens) = field(req, "max_completion_tokens").or_else(|| field(req, "max_tokens")) {
        config.insert("maxOutputTokens".into(), tokens.clone());
    }
    if let Some(stop) = field(req, "stop") {
        config.insert("stopSequences".into(), stop_sequences(stop.clone())?);
    }
    if let Some(format) = field(req, "response_format") {
        match str_field(Some(format), "type") {
            Some("json_object") => {
                config.insert("responseMimeType".into(), "application/json".into());
            }
            Some("json_schema") => {
                config.insert("responseMimeType".into(), "application/json".into());
                if let Some(schema) = format.get("json_schema").and_then(|s| s.get("schema")) {
                    config.insert("responseSchema".into(), gemini_schema(schema));
                }
            }
            Some("text") => {}
            _ => {
                return Err(GatewayError::invalid_param(
                    "response_format.type",
                    "response_format type must be 'text', 'json_object' or 'json_schema'",
                ))
            }
        }
    }
    Ok(config)
}

/// A JSON schema without the keywords Gemini rejects, at any depth.
fn gemini_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !UNSUPPORTED_SCHEMA_KEYS.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), gemini_schema(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(gemini_schema).collect()),
        other => other.clone(),
    }
}

/// Which turn a content belongs to: tool results have their own `user` turn, so a user's
/// text after them starts a new one.
#[derive(Clone, Copy, PartialEq)]
enum Turn {
    User,
    Model,
    FunctionResults,
}

/// OpenAI `messages` into Gemini's `systemInstruction` and `contents`.
fn convert_messages(messages: Option<&Value>, provider: &str) -> Result<(Option<Value>, Value), GatewayError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(GatewayError::invalid_param("messages", "'messages' must be an array"));
    };
    let mut system = Vec::new();
    let mut turns: Vec<(Turn, Vec<Value>)> = Vec::new();
    // The function each tool call id called, for the `functionResponse` that answers it.
    let mut called: HashMap<&str, &str> = HashMap::new();
    for (i, message) in messages.iter().enumerate() {
        let content = message.get("content").filter(|c| !c.is_null());
        let (turn, parts) = match str_field(Some(message), "role").unwrap_or_default() {
            "system" | "developer" => {
                system.extend(text_parts(content, i, provider)?);
                continue;
            }
            "user" => (Turn::User, convert_content(content, i, provider)?),
            "assistant" => (Turn::Model, assistant_parts(message, content, i, &mut called, provider)?),
            "tool" => (Turn::FunctionResults, vec![function_response(message, content, i, &called, provider)?]),
            role => return Err(role_error(i, role, provider)),
        };
        match turns.last_mut() {
            Some((last, last_parts)) if *last == turn => last_parts.extend(parts),
            _ => turns.push((turn, parts)),
        }
    }
    let system = (!system.is_empty()).then(|| json!({"parts": system}));
    let contents = turns
        .into_iter()
        // Gemini rejects contents without parts (an assistant turn of "" and no calls).
        .filter(|(_, parts)| !parts.is_empty())
        .map(|(turn, parts)| {
            let role = if turn == Turn::Model { "model" } else { "user" };
            json!({"role": role, "parts": parts})
        })
        .collect();
    Ok((system, Value::Array(contents)))
}

/// A text part, or none for an empty string (Gemini rejects empty text parts).
fn text_part(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"text": text}))
}

/// System, developer and tool content: text only.
fn text_parts(content: Option<&Value>, i: usize, provider: &str) -> Result<Vec<Value>, GatewayError> {
    match content {
        Some(Value::String(text)) => Ok(text_part(text).into_iter().collect()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (j, part) in parts.iter().enumerate() {
                match (str_field(Some(part), "type"), str_field(Some(part), "text")) {
                    (Some("text"), Some(text)) => out.extend(text_part(text)),
                    _ => {
                        return Err(GatewayError::invalid_param(
                            part_param(i, j, "type"),
                            format!("only text parts are accepted here by provider '{provider}'"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(content_error(i)),
    }
}

/// User or assistant content as Gemini parts.
fn convert_content(content: Option<&Value>, i: usize, provider: &str) -> Result<Vec<Value>, GatewayError> {
    match content {
        Some(Value::String(text)) => Ok(text_part(text).into_iter().collect()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (j, part) in parts.iter().enumerate() {
                out.extend(convert_part(part, i, j, provider)?);
            }
            Ok(out)
        }
        _ => Err(content_error(i)),
    }
}

fn convert_part(part: &Value, i: usize, j: usize, provider: &str) -> Result<Option<Value>, GatewayError> {
    match str_field(Some(part), "type") {
        Some("text") => {
            let text = str_field(Some(part), "text")
                .ok_or_else(|| GatewayError::invalid_param(part_param(i, j, "text"), "text must be a string"))?;
            Ok(text_part(text))
        }
        Some("image_url") => image_part(part, i, j).map(Some),
        Some("input_audio") => {
            let audio = part.get("input_audio");
            let bad = || GatewayError::invalid_param(part_param(i, j, "input_audio"), "needs 'data' and 'format'");
            let data = str_field(audio, "data").ok_or_else(bad)?;
            let format = str_field(audio, "format").ok_or_else(bad)?;
            Ok(Some(json!({"inlineData": {"mimeType": format!("audio/{format}"), "data": data}})))
        }
        other => Err(GatewayError::invalid_param(
            part_param(i, j, "type"),
            format!("content part type '{}' is not supported by provider '{provider}'", other.unwrap_or_default()),
        )),
    }
}

/// A data URL's bytes go inline; an http(s) URL goes by reference.
fn image_part(part: &Value, i: usize, j: usize) -> Result<Value, GatewayError> {
    let bad_url = |message: &str| GatewayError::invalid_param(part_param(i, j, "image_url.url"), message);
    let url = str_field(part.get("image_url"), "url").ok_or_else(|| bad_url("image_url.url must be a string"))?;
    if let Some(data_url) = url.strip_prefix("data:") {
        let (mime_type, data) = data_url
            .split_once(";base64,")
            .ok_or_else(|| bad_url("data URLs must have the form data:<media type>;base64,<data>"))?;
        Ok(json!({"inlineData": {"mimeType": mime_type, "data": data}}))
    } else if url.starts_with("https://") || url.starts_with("http://") || url.starts_with("gs://") {
        let mut file = Map::new();
        // Vertex requires the type of a referenced file; it is known from common extensions.
        if let Some(mime_type) = mime_type_of(url) {
            file.insert("mimeType".into(), mime_type.into());
        }
        file.insert("fileUri".into(), url.into());
        Ok(json!({"fileData": file}))
    } else {
        Err(bad_url("image URLs must be http(s) or gs:// URLs or base64 data URLs"))
    }
}

fn mime_type_of(url: &str) -> Option<&'static str> {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let extension = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
    Some(match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "heic" => "image/heic",
        "heif" => "image/heif",
        "pdf" => "application/pdf",
        _ => return None,
    })
}

/// Assistant content followed by its tool calls as `functionCall` parts; the calls are
/// remembered for the tool messages that answer them.
fn assistant_parts<'a>(
    message: &'a Value,
    content: Option<&Value>,
    i: usize,
    called: &mut HashMap<&'a str, &'a str>,
    provider: &str,
) -> Result<Vec<Value>, GatewayError> {
    let mut parts = match content {
        Some(_) => convert_content(content, i, provider)?,
        None => Vec::new(),
    };
    for (j, raw) in tool_calls(message, i)?.iter().enumerate() {
        let call = read_tool_call(raw, i, j, provider)?;
        if let Some(id) = call.id {
            called.insert(id, call.name);
        }
        let mut part = json!({"functionCall": {"name": call.name, "args": call.arguments}});
        if let (Some(signature), Value::Object(fields)) = (thought_signature(raw), &mut part) {
            fields.insert("thoughtSignature".into(), signature.into());
        }
        parts.push(part);
    }
    Ok(parts)
}

/// A tool message as a `functionResponse`: the name is the one the answered call used, and
/// an output that is not a JSON object is wrapped as `{"content": <output>}` (Gemini's
/// `response` must be an object).
fn function_response(
    message: &Value,
    content: Option<&Value>,
    i: usize,
    called: &HashMap<&str, &str>,
    provider: &str,
) -> Result<Value, GatewayError> {
    let id = tool_call_id(message, i)?;
    let name = called.get(id).copied().or_else(|| str_field(Some(message), "name")).ok_or_else(|| {
        GatewayError::invalid_param(
            format!("messages[{i}].tool_call_id"),
            format!("tool_call_id '{id}' answers no tool call of an earlier assistant message"),
        )
    })?;
    let output: String = text_parts(content, i, provider)?
        .iter()
        .filter_map(|part| str_field(Some(part), "text"))
        .collect::<Vec<_>>()
        .join("\n");
    let response = match serde_json::from_str::<Value>(&output) {
        Ok(object @ Value::Object(_)) => object,
        _ => json!({"content": output}),
    };
    Ok(json!({"functionResponse": {"name": name, "response": response}}))
}

fn convert_tools(tools: &Value, provider: &str) -> Result<Vec<Value>, GatewayError> {
    let tools = function_tools(tools, provider)?;
    Ok(tools
        .into_iter()
        .map(|tool| {
            let mut out = tool.declaration();
            // Gemini rejects an object schema without properties: a tool without parameters
            // has none.
            let parameters = tool.parameters.filter(|p| {
                p.get("properties").and_then(Value::as_object).is_some_and(|props| !props.is_empty())
                    || p.get("type").and_then(Value::as_str).is_some_and(|t| t != "object")
            });
            if let Some(parameters) = parameters {
                out.insert("parameters".into(), gemini_schema(parameters));
            }
            Value::Object(out)
        })
        .collect())
}

fn convert_tool_choice(choice: &Value) -> Result<Value, GatewayError> {
    Ok(match tool_choice(choice)? {
        ToolChoice::Auto => json!({"mode": "AUTO"}),
        ToolChoice::Required => json!({"mode": "ANY"}),
        ToolChoice::None => json!({"mode": "NONE"}),
        ToolChoice::Function(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
    })
}
