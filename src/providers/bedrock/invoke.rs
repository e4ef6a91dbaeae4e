//! Anthropic's Messages API on Bedrock, for a Messages client asking for Claude: the client's
//! request goes to `InvokeModel` (`/model/{id}/invoke`), `InvokeModelWithResponseStream`
//! (`/invoke-with-response-stream`) or `CountTokens` (`/count-tokens`) with only Bedrock's body
//! differences applied (no `model` or `stream`, an `anthropic_version`, the beta features in
//! the body); everything else (thinking and its signatures, `cache_control`, tool ids, unknown
//! fields) goes as sent. Answers pass as Anthropic's own; the event stream's chunks become the
//! server-sent events Anthropic's API sends; errors take Anthropic's shape.

use super::eventstream::{Decoder, Frame};
use super::{error, exception_message, invalid_stream, model_path};
use crate::errors::GatewayError;
use crate::providers::anthropic::{error_body, error_from_openai, write_event};
use crate::providers::{str_field, Outbound, Translator, UpstreamRequest, Usage};
use crate::request::endpoint::Endpoint;
use crate::request::headers;
use crate::stream::cut_short;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// The Messages API version Bedrock serves, sent in the body.
const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// The status of the stream errors the gateway itself reports (Anthropic's `api_error`).
const BAD_STREAM: u16 = 502;

#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Operation {
    #[default]
    Invoke,
    Stream,
    CountTokens,
}

/// One Messages request to Claude on Bedrock.
#[derive(Default)]
pub(crate) struct Invoke {
    operation: Operation,
    chunks: Chunks,
    usage: Option<Usage>,
}

impl Translator for Invoke {
    fn request(&mut self, outbound: Outbound) -> Result<UpstreamRequest, GatewayError> {
        let Some(Value::Object(mut body)) = outbound.body.map(Cow::into_owned) else {
            return Err(GatewayError::new(400, "invalid_request_error", "request body must be a JSON object"));
        };
        let model = body.remove("model");
        let streams = body.remove("stream") == Some(Value::Bool(true));
        body.entry("anthropic_version").or_insert_with(|| BEDROCK_ANTHROPIC_VERSION.into());
        // Bedrock takes the beta features in the body, not as a header.
        let betas = headers::find(outbound.headers, "anthropic-beta").map(String::from_utf8_lossy);
        let betas: Vec<Value> =
            betas.iter().flat_map(|b| b.split(',')).map(str::trim).filter(|b| !b.is_empty()).map(Value::from).collect();
        if !betas.is_empty() {
            body.entry("anthropic_beta").or_insert(Value::Array(betas));
        }
        self.operation = match (outbound.endpoint, streams) {
            (Endpoint::MessagesCountTokens, _) => Operation::CountTokens,
            (_, true) => Operation::Stream,
            (_, false) => Operation::Invoke,
        };
        let (action, sent) = match self.operation {
            Operation::Invoke => ("invoke", Value::Object(body)),
            Operation::Stream => ("invoke-with-response-stream", Value::Object(body)),
            Operation::CountTokens => ("count-tokens", count_tokens_input(body)),
        };
        let path = model_path(model.as_ref(), action)?;
        Ok(UpstreamRequest { path, query: None, headers: Vec::new(), body: Some(sent.to_string().into_bytes()) })
    }

    /// An answer passes as Bedrock sent it (Anthropic's `message`, whose usage the gateway
    /// reads as it passes); a stream and a token count are rewritten.
    fn translates_responses(&self) -> bool {
        self.operation != Operation::Invoke
    }

    fn response(&mut self, body: &[u8]) -> Result<Vec<u8>, GatewayError> {
        let answer: Value = serde_json::from_slice(body).map_err(|_| invalid_response())?;
        if self.operation == Operation::CountTokens {
            let tokens = answer.get("inputTokens").and_then(Value::as_u64).ok_or_else(invalid_response)?;
            return Ok(json!({"input_tokens": tokens}).to_string().into_bytes());
        }
        self.usage = answer.get("usage").and_then(Usage::of_openai);
        Ok(body.to_vec())
    }

    fn stream(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.chunks.push(chunk, out);
    }

    fn stream_end(&mut self, out: &mut Vec<u8>) {
        self.chunks.finish(out);
        self.usage = self.chunks.usage;
    }

    fn error(&self, status: u16, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
        error_from_openai(status, &error(status, headers, body))
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

/// `CountTokens`' input: the `InvokeModel` body, base64 (a blob in AWS's JSON protocol).
/// `InvokeModel` requires `max_tokens`, which a count request has no use for: without one, the
/// least the body allows stands in (above a thinking budget); it changes no input token.
fn count_tokens_input(mut body: Map<String, Value>) -> Value {
    let budget = body.get("thinking").and_then(|t| t.get("budget_tokens")).and_then(Value::as_u64);
    body.entry("max_tokens").or_insert_with(|| budget.unwrap_or(0).saturating_add(1).into());
    let invoke_body = Value::Object(body).to_string();
    json!({"input": {"invokeModel": {"body": STANDARD.encode(invoke_body)}}})
}

fn invalid_response() -> GatewayError {
    GatewayError::new(502, "api_error", "invalid response from provider bedrock").with_code("invalid_provider_response")
}

/// `InvokeModelWithResponseStream`'s event stream as Anthropic's server-sent events: each
/// `chunk` event carries one Anthropic event (`{"bytes": "<base64 of its JSON>"}`), written as
/// Anthropic's API writes it, when its frame is complete.
#[derive(Default)]
struct Chunks {
    decoder: Decoder,
    /// Input tokens from `message_start`, output tokens from `message_delta`.
    usage: Option<Usage>,
    /// `message_stop` arrived: the answer is complete.
    stopped: bool,
    /// The client stream is over (an `error` event was sent).
    done: bool,
}

impl Chunks {
    /// Consumes one upstream chunk (which may end anywhere, even mid-frame).
    fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let mut frames = Vec::new();
        let decoded = self.decoder.push(chunk, &mut frames);
        for frame in &frames {
            self.on_frame(frame, out);
        }
        if let Err(error) = decoded {
            self.fail(BAD_STREAM, &invalid_stream(&error), out);
        }
    }

    /// The upstream stream ended: one cut inside a frame or before `message_stop` ends with an
    /// `error` event, so no client takes it for a complete answer.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        match self.decoder.finish() {
            Ok(()) if self.stopped => {}
            Ok(()) => self.fail(BAD_STREAM, &cut_short("bedrock"), out),
            Err(error) => self.fail(BAD_STREAM, &invalid_stream(&error), out),
        }
    }

    fn on_frame(&mut self, frame: &Frame, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        match frame.message_type() {
            Some("exception") => {
                let message = exception_message(frame);
                let status = exception_status(frame.exception_type().unwrap_or_default());
                self.fail(status, message.as_deref().unwrap_or("provider stream error"), out);
            }
            Some("error") => {
                let message = frame.header(":error-message").unwrap_or("provider stream error");
                self.fail(BAD_STREAM, message, out);
            }
            // Events other than `chunk` carry nothing for the client.
            _ if frame.event_type() == Some("chunk") => self.on_chunk(&frame.payload, out),
            _ => {}
        }
    }

    fn on_chunk(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        let bytes = serde_json::from_slice::<Value>(payload)
            .ok()
            .and_then(|chunk| str_field(Some(&chunk), "bytes").and_then(|b| STANDARD.decode(b).ok()));
        let event = bytes.as_deref().and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok());
        let (Some(bytes), Some(event)) = (&bytes, event) else {
            return self.fail(BAD_STREAM, "provider 'bedrock' sent a stream chunk that is not an event", out);
        };
        // Anthropic's events name their type; one without is no event a client could read.
        let Some(kind) = str_field(Some(&event), "type") else {
            return;
        };
        let usage = match kind {
            "message_start" => event.get("message").and_then(|m| m.get("usage")),
            "message_delta" => event.get("usage"),
            _ => None,
        };
        if let Some(usage) = usage.and_then(Usage::of_openai) {
            self.usage = Some(self.usage.map_or(usage, |seen| seen.merged(usage)));
        }
        // The provider's own bytes, unless a line break in them would end the SSE line.
        let data = match bytes.iter().any(|b| matches!(b, b'\n' | b'\r')) {
            true => Cow::Owned(event.to_string().into_bytes()),
            false => Cow::Borrowed(bytes.as_slice()),
        };
        write_event(out, kind, &data);
        match kind {
            "message_stop" => self.stopped = true,
            "error" => self.done = true,
            _ => {}
        }
    }

    /// Anthropic's `error` event; nothing follows it.
    fn fail(&mut self, status: u16, message: &str, out: &mut Vec<u8>) {
        write_event(out, "error", &error_body(status, message));
        self.done = true;
    }
}

/// The status Anthropic answers for what a Bedrock stream exception says (its error type follows).
fn exception_status(exception: &str) -> u16 {
    match exception {
        "throttlingException" => 429,
        "validationException" => 400,
        "modelTimeoutException" => 504,
        "serviceUnavailableException" => 529,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::super::eventstream::{encode_frame, event_frame};
    use super::super::BedrockApi;
    use super::*;
    use crate::providers::testing::outbound;
    use crate::request::endpoint::ClientApi;
    use crate::unit_tests::test;

    const MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
    const ENCODED: &str = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0";

    fn messages_request() -> Value {
        json!({
            "model": MODEL,
            "max_tokens": 2048,
            "stream": false,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "top_k": 5,
            "future_field": {"kept": true},
            "tools": [{"name": "read_file", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "Read a.txt"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "The user wants it.", "signature": "EqMBsig"},
                    {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "a.txt"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "hi"}]},
            ],
        })
    }

    /// The request as Bedrock's translator makes it, with the client's headers.
    fn sent(endpoint: Endpoint, body: Value, headers: &[(String, Vec<u8>)]) -> (Box<BedrockApi>, UpstreamRequest) {
        let mut translator = Box::new(BedrockApi::Converse(super::super::Converse::new()));
        let path = if endpoint == Endpoint::Messages { "/messages" } else { "/messages/count_tokens" };
        let request = translator.request(Outbound { headers, ..outbound(endpoint, path, Some(body)) }).unwrap();
        (translator, request)
    }

    fn body_of(request: &UpstreamRequest) -> Value {
        serde_json::from_slice(request.body.as_deref().unwrap()).unwrap()
    }

    #[test]
    fn claude_ids_speak_messages_and_the_rest_converse() {
        let translator = BedrockApi::Converse(super::super::Converse::new());
        for model in [
            "anthropic.claude-3-5-haiku-20241022-v1:0",
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "global.anthropic.claude-opus-4-1-20250805-v1:0",
            "us-gov.anthropic.claude-3-5-sonnet-20240620-v1:0",
            "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-haiku-20240307-v1:0",
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.anthropic.claude-3-haiku-20240307-v1:0",
        ] {
            assert!(translator.speaks(ClientApi::Messages, model), "{model}");
            assert!(!translator.speaks(ClientApi::Chat, model), "chat stays on Converse: {model}");
        }
        for model in ["amazon.nova-pro-v1:0", "us.meta.llama3-2-1b-instruct-v1:0", "claude-3", "us.x.anthropic.c", ""] {
            assert!(!translator.speaks(ClientApi::Messages, model), "{model}");
        }
    }

    #[test]
    fn the_clients_body_goes_with_only_bedrocks_differences() {
        let headers = [("anthropic-beta".to_string(), b"interleaved-thinking-2025-05-14, context-1m".to_vec())];
        let (translator, request) = sent(Endpoint::Messages, messages_request(), &headers);
        assert_eq!(request.path, format!("{ENCODED}/invoke"));
        assert!(!translator.translates_responses(), "the answer passes as Bedrock sent it");
        let mut expected = messages_request();
        let fields = expected.as_object_mut().unwrap();
        fields.remove("model");
        fields.remove("stream");
        fields.insert("anthropic_version".into(), json!("bedrock-2023-05-31"));
        fields.insert("anthropic_beta".into(), json!(["interleaved-thinking-2025-05-14", "context-1m"]));
        assert_eq!(body_of(&request), expected);

        // A stream goes to its own operation; the client's own version and betas in the body win.
        let mut body = messages_request();
        body["stream"] = json!(true);
        body["anthropic_version"] = json!("bedrock-2099-01-01");
        body["anthropic_beta"] = json!(["mine"]);
        let (translator, request) = sent(Endpoint::Messages, body, &headers);
        assert_eq!(request.path, format!("{ENCODED}/invoke-with-response-stream"));
        assert!(translator.translates_responses());
        let sent = body_of(&request);
        assert_eq!(
            (&sent["anthropic_version"], &sent["anthropic_beta"]),
            (&json!("bedrock-2099-01-01"), &json!(["mine"]))
        );
        assert!(sent.get("stream").is_none() && sent.get("model").is_none());
    }

    #[test]
    fn a_request_without_a_model_or_body_is_a_400() {
        let mut translator = Invoke::default();
        let e =
            translator.request(outbound(Endpoint::Messages, "/messages", Some(json!({"messages": []})))).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("model")));
        let e = translator.request(outbound(Endpoint::Messages, "/messages", Some(json!([1])))).unwrap_err();
        assert_eq!(e.status, 400);
        let e = translator.request(outbound(Endpoint::Messages, "/messages", None)).unwrap_err();
        assert_eq!(e.status, 400);
    }

    #[test]
    fn count_tokens_sends_the_invoke_body_base64_and_answers_anthropics_count() {
        let mut body = messages_request();
        body.as_object_mut().unwrap().remove("max_tokens");
        let (mut translator, request) = sent(Endpoint::MessagesCountTokens, body, &[]);
        assert_eq!(request.path, format!("{ENCODED}/count-tokens"));
        let input = body_of(&request);
        let encoded = input["input"]["invokeModel"]["body"].as_str().unwrap();
        let invoke: Value = serde_json::from_slice(&STANDARD.decode(encoded).unwrap()).unwrap();
        assert_eq!(invoke["anthropic_version"], "bedrock-2023-05-31");
        assert_eq!(invoke["max_tokens"], 1025, "above the thinking budget");
        assert_eq!(invoke["messages"], messages_request()["messages"]);
        assert!(invoke.get("model").is_none());
        assert!(translator.translates_responses());
        assert_eq!(translator.response(br#"{"inputTokens": 42}"#).unwrap(), br#"{"input_tokens":42}"#);
        assert_eq!(translator.response(b"{}").unwrap_err().status, 502);

        let body = json!({"model": MODEL, "max_tokens": 7, "messages": [{"role": "user", "content": "Hi"}]});
        let (_, request) = sent(Endpoint::MessagesCountTokens, body, &[]);
        let encoded = body_of(&request)["input"]["invokeModel"]["body"].as_str().unwrap().to_string();
        let invoke: Value = serde_json::from_slice(&STANDARD.decode(encoded).unwrap()).unwrap();
        assert_eq!(invoke["max_tokens"], 7, "the client's own kept");
    }

    #[test]
    fn an_answer_passes_untouched_with_its_usage() {
        let (mut translator, _) = sent(Endpoint::Messages, messages_request(), &[]);
        let answer = br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":9,"output_tokens":2}}"#;
        assert_eq!(translator.response(answer).unwrap(), answer);
        assert_eq!(translator.usage(), Some(Usage { prompt_tokens: 9, completion_tokens: 2, ..Default::default() }));
    }

    #[test]
    fn errors_take_anthropics_shape_with_bedrocks_message() {
        let (translator, _) = sent(Endpoint::Messages, messages_request(), &[]);
        let headers = [("x-amzn-ErrorType".to_string(), b"ThrottlingException:http://internal.amazon.com/".to_vec())];
        let body: Value =
            serde_json::from_slice(&translator.error(429, &headers, br#"{"message":"Too many requests"}"#)).unwrap();
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Too many requests"}})
        );
        let body: Value = serde_json::from_slice(&translator.error(400, &[], br#"{"Message":"bad"}"#)).unwrap();
        assert_eq!(body, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}));
    }

    fn chunk(event: &Value) -> Vec<u8> {
        event_frame("chunk", &json!({"bytes": STANDARD.encode(event.to_string()), "p": "abcdef"}).to_string())
    }

    fn anthropic_events() -> Vec<Value> {
        vec![
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                   "model": "claude", "content": [], "stop_reason": null,
                   "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 3}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm é"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqMB"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"path\":\"a\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 30}}),
            json!({"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 12, "outputTokenCount": 30}}),
        ]
    }

    /// The client's stream and the reported usage of `frames` fed in `pieces`-byte pieces.
    fn streamed(frames: &[u8], pieces: usize) -> (String, Option<Usage>) {
        let (mut translator, _) = sent(Endpoint::Messages, json!({"model": MODEL, "stream": true}), &[]);
        let mut out = Vec::new();
        for piece in frames.chunks(pieces) {
            translator.stream(piece, &mut out);
        }
        translator.stream_end(&mut out);
        (String::from_utf8(out).unwrap(), translator.usage())
    }

    /// (event, data) of a Messages stream, each event's data naming its type.
    fn events(sse: &str) -> Vec<(String, Value)> {
        sse.split_terminator("\n\n")
            .map(|event| {
                let (name, data) = event.split_once('\n').unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_string();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], name.as_str());
                (name, data)
            })
            .collect()
    }

    #[test]
    fn chunks_become_anthropics_events_in_pieces_of_any_size() {
        let sent = anthropic_events();
        let mut frames: Vec<u8> = sent.iter().flat_map(chunk).collect();
        // Events that are not chunks carry nothing for the client.
        frames.splice(0..0, event_frame("ping", "{}"));
        let (whole, usage) = streamed(&frames, frames.len());
        let got = events(&whole);
        assert_eq!(got.into_iter().map(|(_, data)| data).collect::<Vec<_>>(), sent, "each event as Bedrock sent it");
        // Input from message_start (cache reads are prompt tokens, as on the chat path, and
        // count as cached), output from message_delta.
        assert_eq!(
            usage,
            Some(Usage { prompt_tokens: 15, cached_prompt_tokens: 3, completion_tokens: 30, ..Default::default() })
        );
        for size in 1..=3 {
            assert_eq!(streamed(&frames, size), (whole.clone(), usage), "pieces of {size} bytes");
        }
    }

    #[test]
    fn a_line_break_in_an_event_never_ends_its_data_line() {
        let pretty = serde_json::to_string_pretty(&json!({"type": "ping"})).unwrap();
        let frame = event_frame("chunk", &json!({"bytes": STANDARD.encode(pretty)}).to_string());
        let stop = chunk(&json!({"type": "message_stop"}));
        let (sse, _) = streamed(&[frame, stop].concat(), 2);
        assert_eq!(
            sse,
            "event: ping\ndata: {\"type\":\"ping\"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
    }

    #[test]
    fn an_exception_a_bad_chunk_or_a_cut_stream_ends_with_an_error_event() {
        let start = chunk(&anthropic_events()[0]);
        let exception = encode_frame(
            &[
                (":exception-type", "throttlingException"),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            br#"{"message":"slow down"}"#,
        );
        let after = chunk(&json!({"type": "message_stop"}));
        let (sse, usage) = streamed(&[start.clone(), exception, after].concat(), 3);
        let got = events(&sse);
        assert_eq!(got.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["message_start", "error"]);
        assert_eq!(got[1].1, json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}));
        assert_eq!(
            usage,
            Some(Usage { prompt_tokens: 15, cached_prompt_tokens: 3, completion_tokens: 1, ..Default::default() })
        );

        let error_frame = encode_frame(
            &[(":message-type", "error"), (":error-code", "InternalFailure"), (":error-message", "boom")],
            b"",
        );
        let (sse, _) = streamed(&[start.clone(), error_frame].concat(), 1);
        assert_eq!(events(&sse)[1].1["error"], json!({"type": "api_error", "message": "boom"}));

        let not_base64 = event_frame("chunk", r#"{"bytes":"@@@"}"#);
        let (sse, _) = streamed(&[start.clone(), not_base64].concat(), 2);
        assert_eq!(events(&sse)[1].1["error"]["type"], "api_error");

        // Cut before message_stop, or inside a frame.
        let (sse, _) = streamed(&start, 3);
        let got = events(&sse);
        assert_eq!(
            got.last().unwrap().1["error"]["message"],
            "provider 'bedrock' ended the stream before it was complete"
        );
        let (sse, _) = streamed(&start[..start.len() - 5], 1);
        let got = events(&sse);
        assert_eq!(got.len(), 1);
        assert!(got[0].1["error"]["message"].as_str().unwrap().contains("invalid event stream"), "{sse}");
        let (sse, _) = streamed(b"\x00\x00\x00\x10garbage-garbage", 1);
        assert_eq!(events(&sse).len(), 1);
    }

    #[test]
    fn an_anthropic_error_event_in_the_stream_is_the_last() {
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        let frames = [chunk(&anthropic_events()[0]), chunk(&error), chunk(&json!({"type": "message_stop"}))].concat();
        let got = events(&streamed(&frames, 3).0);
        assert_eq!(got.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["message_start", "error"]);
        assert_eq!(got[1].1, error);
    }
}
