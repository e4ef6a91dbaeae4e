//! The client APIs besides OpenAI's chat completions (Anthropic's Messages, OpenAI's
//! Responses). A target that speaks the client's API natively gets the request as it came;
//! for any other the request becomes a chat request here, goes to the provider's translator as
//! any chat request does, and [`Reply`] brings the chat answer, stream and errors back in the
//! client's shapes.

pub(crate) mod messages;
pub(crate) mod responses;

use crate::errors::GatewayError;
use crate::providers::anthropic::error_from_openai;
use crate::providers::google::{sign_tool_call, thought_signature};
use crate::providers::{Outbound, Translator, UpstreamRequest, Usage};
use crate::request::endpoint::ClientApi;
use crate::stream::sse::SseParser;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use messages::stream::MessagesEvents;
use responses::answer::Echo;
use responses::stream::ResponsesEvents;
use serde_json::{json, Map, Value};

/// The gateway's own error (OpenAI's shape) in `api`'s shape, same status.
pub(crate) fn error_body(api: ClientApi, status: u16, openai: Vec<u8>) -> Vec<u8> {
    match api {
        ClientApi::Messages => error_from_openai(status, &openai),
        // The Responses API's errors are OpenAI's.
        ClientApi::Chat | ClientApi::Responses => openai,
    }
}

/// A whole stream in `api` as the answer it streamed (what the cache stores and the output
/// checks read): a Messages stream's `message`, a Responses stream's last `response`. None for
/// chat (its assembler is the cache's) or a stream that did not complete.
pub(crate) fn stream_answer(api: ClientApi, stream: &[u8]) -> Option<Value> {
    let mut parser = SseParser::new();
    let mut events = parser.push(stream);
    events.extend(parser.finish());
    match api {
        ClientApi::Chat => None,
        ClientApi::Messages => messages::replay::assemble(&events),
        ClientApi::Responses => {
            for event in events {
                let data: Value = serde_json::from_str(&event.data).ok()?;
                match data.get("type").and_then(Value::as_str).unwrap_or_default() {
                    "response.completed" | "response.incomplete" => return data.get("response").cloned(),
                    "error" | "response.failed" => return None,
                    _ => {}
                }
            }
            None
        }
    }
}

/// A stored answer in `api` (a `message`, a `response`) as the stream that would have
/// streamed it; None for chat or an answer of another shape.
pub(crate) fn replay_stream(api: ClientApi, answer: &[u8]) -> Option<Vec<u8>> {
    let answer: Value = serde_json::from_slice(answer).ok()?;
    match api {
        ClientApi::Chat => None,
        ClientApi::Messages => messages::replay::replay(&answer),
        ClientApi::Responses => responses::replay::replay(&answer),
    }
}

/// The client's request in `api` as a chat request, for a target that does not speak `api`.
pub(crate) fn to_chat(api: ClientApi, body: &Map<String, Value>) -> Result<Translated, GatewayError> {
    match api {
        ClientApi::Chat => Ok(Translated { body: body.clone(), dropped: Vec::new() }),
        ClientApi::Messages => messages::request::to_chat(body),
        ClientApi::Responses => responses::request::to_chat(body),
    }
}

/// `value` sealed in text a client gives back unchanged: `prefix`, then its JSON in URL-safe
/// base64 (letters, digits, `-` and `_` only).
pub(crate) fn seal(prefix: &str, value: &Value) -> String {
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(value.to_string()))
}

/// What [`seal`] sealed with `prefix`; None for any other text.
pub(crate) fn unseal(prefix: &str, sealed: &str) -> Option<Value> {
    let bytes = URL_SAFE_NO_PAD.decode(sealed.strip_prefix(prefix)?).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// What marks a client's call id that carries a thought signature.
const SIGNED_CALL: &str = "gwsig_";

/// A chat tool call's id as the client's call id (a Messages `tool_use` id, a Responses
/// `call_id`). Gemini's thinking models need each call's thought signature back with the call
/// on the next turn; chat carries it in `extra_content.google.thought_signature` (as Gemini's
/// own OpenAI-compatible API does), but Messages and Responses have no field for it that
/// clients are sure to keep. Every client sends a call's id back as it got it (Claude Code and
/// the SDKs in the `tool_use` block and as its result's `tool_use_id`; Codex as the
/// `function_call`'s and its output's `call_id`: Codex does not send item ids back), so the
/// signature travels sealed in the id, in the characters Anthropic allows in ids.
pub(crate) fn client_call_id(call: &Value) -> String {
    let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
    match thought_signature(call) {
        Some(signature) => seal(SIGNED_CALL, &json!({"id": id, "thought_signature": signature})),
        None => id.to_string(),
    }
}

/// A client's call id as chat's (what [`client_call_id`] made of it), for a tool result.
pub(crate) fn chat_call_id(id: &str) -> String {
    signed_call(id).map_or_else(|| id.to_string(), |(id, _)| id)
}

/// A client's call as a chat tool call, with the thought signature its id carries.
pub(crate) fn chat_tool_call(id: &str, name: &str, arguments: String) -> Value {
    let (id, signature) = signed_call(id).map_or_else(|| (id.to_string(), None), |(id, s)| (id, Some(s)));
    let mut call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    if let Some(signature) = signature {
        sign_tool_call(&mut call, &signature);
    }
    call
}

/// The chat id and thought signature sealed in a client's call id.
fn signed_call(id: &str) -> Option<(String, String)> {
    let sealed = unseal(SIGNED_CALL, id)?;
    let text = |name: &str| sealed.get(name).and_then(Value::as_str).map(str::to_string);
    Some((text("id")?, text("thought_signature")?))
}

/// What a client API makes of a translated chat stream's chunks, and the error event that ends
/// the client's stream.
pub(crate) trait ChatEvents {
    /// One chat chunk (a JSON value that is no error).
    fn on_chunk(&mut self, chunk: &Value, out: &mut Vec<u8>);
    /// `[DONE]`: the chat stream is complete.
    fn end(&mut self, out: &mut Vec<u8>);
    /// Ends the client's stream with an error event; nothing follows it.
    fn fail(&mut self, message: &str, out: &mut Vec<u8>);
    fn is_done(&self) -> bool;
}

/// What a chat stream's chunks said of the whole answer so far: the provider's model, the usage
/// and why the (first) choice finished.
#[derive(Default)]
pub(crate) struct Told {
    pub(crate) model: Option<String>,
    pub(crate) usage: Option<Value>,
    pub(crate) finish_reason: Option<String>,
}

impl Told {
    pub(crate) fn read(&mut self, chunk: &Value) {
        if let Some(model) = chunk.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()) {
            self.model = Some(model.to_string());
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        if let Some(reason) = chunk.pointer("/choices/0/finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
    }

    /// The token counts the chat stream reported, once it did.
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.usage.as_ref().and_then(Usage::of_openai)
    }
}

/// A chat stream (a translated provider's, as its translator wrote it) in a client API: the
/// framing, the bound on event size and the end are the same for every client API; the chunks
/// may end anywhere, even inside a UTF-8 sequence. A stream that ends before its events say it
/// is complete ends with an error event, so no client takes it for a complete answer.
pub(crate) struct ChatStream<E> {
    parser: SseParser,
    events: E,
}

impl<E: ChatEvents> ChatStream<E> {
    pub(crate) fn new(events: E) -> Self {
        ChatStream { parser: SseParser::new(), events }
    }

    pub(crate) fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.events.is_done() {
            return;
        }
        for event in self.parser.push(chunk) {
            self.on_data(&event.data, out);
        }
        if self.parser.overflowed() {
            self.events.fail("the provider's stream sent an event too large to read", out);
        }
    }

    /// The chat stream ended.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        for event in self.parser.finish() {
            self.on_data(&event.data, out);
        }
        if !self.events.is_done() {
            self.events.fail("the provider ended the stream before it was complete", out);
        }
    }

    pub(crate) fn events(&self) -> &E {
        &self.events
    }

    /// One chat event: `[DONE]`, an error chunk (which ends the client's stream with it) or a
    /// chunk.
    fn on_data(&mut self, data: &str, out: &mut Vec<u8>) {
        if self.events.is_done() {
            return;
        }
        if data == "[DONE]" {
            return self.events.end(out);
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return self.events.fail("the provider's stream sent a chunk that is not JSON", out);
        };
        match chunk.get("error") {
            Some(error) => {
                let message = error.get("message").and_then(Value::as_str).unwrap_or("provider stream error");
                self.events.fail(message, out);
            }
            None => self.events.on_chunk(&chunk, out),
        }
    }
}

/// A client API's request as a chat request, and the JSON paths of what chat could not carry
/// (for the log line that says what a translating target dropped).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Translated {
    pub(crate) body: Map<String, Value>,
    pub(crate) dropped: Vec<String>,
}

/// What a translated answer needs of the client's request.
pub(crate) enum Shape {
    /// A `message`, named with the client's model until the provider names its own.
    Messages { model: String },
    /// A `response` with the gateway's id, echoing the client's request.
    Responses { id: String, created_at: u64, request: Map<String, Value> },
    /// A Messages `count_tokens` answer, which the counting translator writes itself.
    Count,
}

/// The answers of a provider that got a translated request, in the client's API: the
/// provider's translator brings them to chat's shape first (an OpenAI-compatible provider's
/// pass as they are), then they become the client's.
pub(crate) struct Reply {
    inner: Box<dyn Translator>,
    shape: Shape,
    stream: Option<ClientStream>,
    usage: Option<Usage>,
    /// What the gateway keeps of a completed Responses answer (its id, and the response with
    /// the conversation it answered), unless the client said `store: false`.
    kept: Option<(String, Value)>,
}

enum ClientStream {
    Messages(Box<ChatStream<MessagesEvents>>),
    Responses(Box<ChatStream<ResponsesEvents>>),
}

impl ClientStream {
    fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        match self {
            ClientStream::Messages(stream) => stream.push(chunk, out),
            ClientStream::Responses(stream) => stream.push(chunk, out),
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        match self {
            ClientStream::Messages(stream) => stream.finish(out),
            ClientStream::Responses(stream) => stream.finish(out),
        }
    }

    fn usage(&self) -> Option<Usage> {
        match self {
            ClientStream::Messages(stream) => stream.events().told.usage(),
            ClientStream::Responses(stream) => stream.events().told.usage(),
        }
    }
}

impl Reply {
    pub(crate) fn new(inner: Box<dyn Translator>, shape: Shape) -> Reply {
        Reply { inner, shape, stream: None, usage: None, kept: None }
    }

    /// What a Responses request keeps of its answer: the response id and the request, unless
    /// the client said `store: false`.
    fn keeps(&self) -> Option<(&str, &Map<String, Value>)> {
        match &self.shape {
            Shape::Responses { id, request, .. } if request.get("store") != Some(&Value::Bool(false)) => {
                Some((id, request))
            }
            _ => None,
        }
    }

    /// Keeps `response` with the conversation it answered (so `previous_response_id` can
    /// continue it).
    fn keep(&mut self, response: Value) {
        if let Some((id, request)) = self.keeps() {
            let kept = json!({"response": response, "input": responses::request::input_items(request)});
            self.kept = Some((id.to_string(), kept));
        }
    }

    fn api(&self) -> ClientApi {
        match self.shape {
            Shape::Messages { .. } | Shape::Count => ClientApi::Messages,
            Shape::Responses { .. } => ClientApi::Responses,
        }
    }

    /// The client's stream converter, made at the first chunk.
    fn client_stream(&mut self) -> &mut ClientStream {
        let shape = &self.shape;
        self.stream.get_or_insert_with(|| match shape {
            Shape::Messages { model } => ClientStream::Messages(Box::new(ChatStream::new(MessagesEvents::new(model)))),
            // (A count never streams: its stream would be an empty message.)
            Shape::Count => ClientStream::Messages(Box::new(ChatStream::new(MessagesEvents::new("")))),
            Shape::Responses { id, created_at, request } => {
                let echo = Echo { id, created_at: *created_at, request };
                ClientStream::Responses(Box::new(ChatStream::new(ResponsesEvents::new(&echo))))
            }
        })
    }

    /// Chat stream bytes of the provider's chunk (translated by the provider's translator
    /// when it translates).
    fn chat_stream(&mut self, chunk: &[u8], end: bool) -> Vec<u8> {
        if !self.inner.translates_responses() {
            return chunk.to_vec();
        }
        let mut chat = Vec::with_capacity(chunk.len() + 256);
        self.inner.stream(chunk, &mut chat);
        if end {
            self.inner.stream_end(&mut chat);
        }
        chat
    }
}

impl Translator for Reply {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        self.inner.request(outbound)
    }

    fn translates_responses(&self) -> bool {
        true
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        let chat = match self.inner.translates_responses() {
            true => self.inner.response(body)?,
            false => body.to_vec(),
        };
        let chat: Value = serde_json::from_slice(&chat).map_err(|_| {
            GatewayError::new(502, "api_error", "the provider's answer is not valid JSON")
                .with_code("invalid_provider_response")
        })?;
        self.usage = self.inner.usage().or_else(|| chat.get("usage").and_then(Usage::of_openai));
        let answer = match &self.shape {
            // The counting translator wrote the client's answer itself.
            Shape::Count => chat,
            Shape::Messages { model } => messages::answer::from_chat(&chat, model),
            Shape::Responses { id, created_at, request } => {
                responses::answer::from_chat(&chat, &Echo { id, created_at: *created_at, request })
            }
        };
        if self.keeps().is_some() {
            self.keep(answer.clone());
        }
        Ok(answer.to_string().into_bytes())
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let chat = self.chat_stream(chunk, false);
        self.client_stream().push(&chat, out);
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        let chat = self.chat_stream(&[], true);
        let stream = self.client_stream();
        stream.push(&chat, out);
        stream.finish(out);
        self.usage = self.inner.usage().or_else(|| self.stream.as_ref().and_then(ClientStream::usage));
        let finished = match (&self.stream, self.keeps()) {
            (Some(ClientStream::Responses(stream)), Some(_)) => stream.events().finished(),
            _ => None,
        };
        if let Some(response) = finished {
            self.keep(response);
        }
    }

    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        error_body(self.api(), status, self.inner.error(status, headers, body))
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn kept(&mut self) -> Option<(String, Value)> {
        self.kept.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn a_thought_signature_travels_sealed_in_the_call_id() {
        let function = json!({"name": "f", "arguments": "{}"});
        let signed = json!({"id": "call_0", "type": "function", "function": function,
                            "extra_content": {"google": {"thought_signature": "c2ln+/=="}}});
        let id = client_call_id(&signed);
        let anthropic_id = |id: &str| id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        assert!(id.starts_with("gwsig_") && anthropic_id(&id), "{id}");
        assert_eq!(chat_call_id(&id), "call_0");
        assert_eq!(chat_tool_call(&id, "f", "{}".into()), signed);
        // Without a signature an id goes as it is, both ways; so does one that only looks sealed.
        let plain = json!({"id": "toolu_1", "type": "function", "function": function});
        assert_eq!(client_call_id(&plain), "toolu_1");
        assert_eq!(chat_tool_call("toolu_1", "f", "{}".into()), plain);
        assert_eq!(chat_call_id("gwsig_!!"), "gwsig_!!");
    }

    #[test]
    fn a_whole_stream_as_its_answer() {
        let messages = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let answer = stream_answer(ClientApi::Messages, messages.as_bytes()).unwrap();
        assert_eq!(answer["content"][0]["thinking"], "hm");
        assert_eq!(answer["content"][1]["text"], "Hello");
        // Cut before message_stop: no answer.
        let cut = messages.get(..messages.len() - 60).unwrap();
        assert_eq!(stream_answer(ClientApi::Messages, cut.as_bytes()), None);
        let responses = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"status\":\"in_progress\"}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"status\":\"completed\",\"output\":[]}}\n\n",
        );
        let answer = stream_answer(ClientApi::Responses, responses.as_bytes()).unwrap();
        assert_eq!(answer["status"], "completed");
        assert_eq!(stream_answer(ClientApi::Chat, b"data: [DONE]\n\n"), None);
    }
}
