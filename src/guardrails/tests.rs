use super::calls::{CallSpec, Continuation, JwksUpdate, Reply};
use super::jwt::Failure as JwtFailure;
use super::params::{Params, Rules as JwtRules};
use super::spec::{Feedback, Guardrail, Hook, HookOutcome, InlineGuardrail};
use super::verdict::*;
use super::*;
use crate::unit_tests::test;
use serde_json::json;

const NOW: u64 = 1_700_000_000;

fn no_jwks(_: &str) -> Option<CachedJwks> {
    None
}

fn params(v: Value) -> Params {
    v.as_object().unwrap().clone()
}

fn check(id: &str, p: Value) -> Check {
    Check::new(id.to_string(), params(p)).unwrap()
}

fn before<'a>(text: &'a str, request: &'a Value) -> Input<'a> {
    Input { stage: Stage::Before, text, request, response: None, metadata: None, headers: &[], model: "gpt-4o" }
}

fn done(e: Evaluation) -> CheckResult {
    match e {
        Evaluation::Done(r) => r,
        other => panic!("expected a decided check, got {other:?}"),
    }
}

/// Runs a check that decides alone on `text` before the request.
fn run(id: &str, p: Value, text: &str) -> CheckResult {
    let request = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]});
    done(evaluated(id, p, &before(text, &request), &Env { now_s: NOW, jwks: &no_jwks }))
}

/// What a check does with what it sees; parameters its config would refuse (`Check::new`, when
/// the config is read) come back as that refusal, as a failed check.
fn evaluated(id: &str, p: Value, input: &Input, env: &Env) -> Evaluation {
    match Check::new(id.to_string(), params(p)) {
        Ok(check) => evaluate(&check, input, env),
        Err(refused) => Evaluation::Done(CheckResult::failed(id, refused, Value::Null)),
    }
}

fn verdict(id: &str, p: Value, text: &str) -> bool {
    let r = run(id, p, text);
    assert_eq!(r.error, None, "{id}: {r:?}");
    r.verdict
}

fn error(id: &str, p: Value, text: &str) -> String {
    let r = run(id, p, text);
    assert!(!r.verdict);
    r.error.clone().unwrap_or_else(|| panic!("{id}: expected an error, got {r:?}"))
}

#[test]
fn texts_checks_see() {
    let parts = json!({"messages": [{"role": "system", "content": "be nice"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}]}]});
    assert_eq!(request_text(&parts), "a\nb");
    assert_eq!(request_text(&json!({"messages": [{"role": "user", "content": "hi"}]})), "hi");
    assert_eq!(request_text(&json!({"prompt": "p"})), "p");
    assert_eq!(request_text(&json!({"input": ["x", "y"]})), "x\ny");
    assert_eq!(request_text(&json!({"messages": []})), "");
    let answer = json!({"choices": [{"message": {"content": "first"}}, {"message": {"content": "second"}}]});
    assert_eq!(response_text(&answer), "first");
    assert_eq!(response_text(&json!({"choices": [{"text": "done"}]})), "done");
    assert_eq!(response_text(&json!({"choices": [{"message": {"content": null}}]})), "");
    assert_eq!(response_text(&json!({"error": {}})), "");
    // The client APIs besides chat: a Responses request's last input message, a Messages
    // answer's text blocks, a Responses answer's output messages.
    let items = json!({"input": [{"role": "user", "content": "old"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
        {"role": "user", "content": [{"type": "input_text", "text": "new"}]},
        {"type": "reasoning", "summary": []}]});
    assert_eq!(request_text(&items), "new");
    let message = json!({"type": "message", "content": [{"type": "thinking", "thinking": "t"},
        {"type": "text", "text": "said"}, {"type": "tool_use", "id": "t", "name": "n", "input": {}}]});
    assert_eq!(response_text(&message), "said");
    let response = json!({"object": "response", "output": [{"type": "reasoning", "summary": []},
        {"type": "message", "content": [{"type": "output_text", "text": "out"}]},
        {"type": "function_call", "arguments": "{}"}]});
    assert_eq!(response_text(&response), "out");
}

#[test]
fn regex_match() {
    assert!(verdict("default.regexMatch", json!({"rule": "\\d{3}-\\d{4}"}), "call 555-1234"));
    assert!(!verdict("default.regexMatch", json!({"rule": "\\d{3}-\\d{4}"}), "no number"));
    assert!(!verdict("default.regexMatch", json!({"rule": "(?i)secret", "not": true}), "a SECRET"));
    assert!(verdict("default.regexMatch", json!({"rule": "secret", "not": true}), "nothing"));
    // Empty text is text: it matches what matches the empty string.
    assert!(verdict("default.regexMatch", json!({"rule": "^$"}), ""));
    // The engine is linear: a classic catastrophic pattern is quick.
    assert!(!verdict("default.regexMatch", json!({"rule": "(a*)*b"}), &"a".repeat(5000)));
    assert!(error("default.regexMatch", json!({}), "x").contains("`rule`"));
    assert!(error("default.regexMatch", json!({"rule": "(a"}), "x").contains("not a valid pattern"));
    assert!(error("default.regexMatch", json!({"rule": 5}), "x").contains("must be a string"));
    assert!(error("default.regexMatch", json!({"rule": "a", "not": "yes"}), "x").contains("`not`"));
    let r = run("default.regexMatch", json!({"rule": "b"}), "abc");
    assert_eq!(r.data["regexPattern"], "b");
    assert_eq!(r.data["textExcerpt"], "abc");
}

#[test]
fn contains() {
    let p = |op: &str| json!({"words": ["apple", "pear"], "operator": op});
    assert!(verdict("default.contains", p("any"), "an apple"));
    assert!(!verdict("default.contains", p("all"), "an apple"));
    assert!(verdict("default.contains", p("all"), "an apple and a pear"));
    assert!(!verdict("default.contains", p("none"), "an apple"));
    assert!(verdict("default.contains", p("none"), "a plum"));
    // Case-sensitive, as in the reference gateway.
    assert!(!verdict("default.contains", p("any"), "APPLE"));
    let r = run("default.contains", p("any"), "a pear");
    assert_eq!(r.data["foundWords"], json!(["pear"]));
    assert_eq!(r.data["missingWords"], json!(["apple"]));
    assert!(error("default.contains", json!({"words": ["a"], "operator": "some"}), "a").contains("operator"));
    assert!(error("default.contains", json!({"words": ["a"]}), "a").contains("operator"));
    assert!(error("default.contains", json!({"words": [], "operator": "any"}), "a").contains("`words`"));
    assert!(error("default.contains", json!({"words": [1], "operator": "any"}), "a").contains("`words`"));
}

#[test]
fn counts() {
    let words = |min: u64, max: u64| json!({"minWords": min, "maxWords": max});
    assert!(verdict("default.wordCount", words(2, 3), "one two three"));
    assert!(!verdict("default.wordCount", words(4, 9), "one two three"));
    assert!(verdict("default.wordCount", json!({"minWords": 4, "maxWords": 9, "not": true}), "one two three"));
    assert!(verdict("default.wordCount", json!({"maxWords": 0}), "  \n "));
    assert!(verdict("default.wordCount", json!({"minWords": 1.0}), "x"));
    assert!(error("default.wordCount", json!({}), "x").contains("minWords"));
    assert!(error("default.wordCount", json!({"minWords": -1}), "x").contains("non-negative integer"));
    assert!(error("default.wordCount", json!({"minWords": 1.5}), "x").contains("non-negative integer"));
    assert!(error("default.wordCount", json!({"maxWords": "3"}), "x").contains("got a string"));

    let sentences = |min: u64, max: u64| json!({"minSentences": min, "maxSentences": max});
    assert_eq!(run("default.sentenceCount", sentences(0, 9), "Hi. How are you?! Fine").data["sentenceCount"], 3);
    assert_eq!(run("default.sentenceCount", sentences(0, 9), "...!?").data["sentenceCount"], 0);
    assert_eq!(run("default.sentenceCount", sentences(0, 9), "").data["sentenceCount"], 0);
    assert!(verdict("default.sentenceCount", sentences(2, 2), "One. Two."));
    assert!(!verdict("default.sentenceCount", json!({"minSentences": 2, "maxSentences": 2, "not": true}), "One. Two."));

    let chars = |min: u64, max: u64| json!({"minCharacters": min, "maxCharacters": max});
    // Characters, not bytes.
    assert!(verdict("default.characterCount", chars(3, 3), "héé"));
    assert!(!verdict("default.characterCount", chars(4, 10), "abc"));
    assert!(verdict("default.characterCount", json!({"minCharacters": 4, "not": true}), "abc"));
}

#[test]
fn json_schema() {
    let schema = json!({"type": "object", "required": ["name", "age"], "additionalProperties": false,
        "properties": {"name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}});
    let p = json!({"schema": schema});
    assert!(verdict("default.jsonSchema", p.clone(), r#"{"name": "Ann", "age": 3}"#));
    assert!(verdict(
        "default.jsonSchema",
        p.clone(),
        "Here:\n```json\n{\"name\": \"Ann\", \"age\": 3, \"tags\": [\"a\"]}\n```"
    ));
    assert!(verdict("default.jsonSchema", p.clone(), "Sure! {\"name\": \"Ann\", \"age\": 3} Hope it helps."));
    let r = run("default.jsonSchema", p.clone(), r#"{"name": "", "age": -1, "x": 1, "tags": ["c", "a", "b"]}"#);
    assert!(!r.verdict);
    let errors: Vec<String> = serde_json::from_value(r.data["validationErrors"].clone()).unwrap();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(errors.iter().any(|e| e.starts_with("$.x:")));
    assert!(!verdict("default.jsonSchema", p.clone(), r#"{"name": "Ann"}"#));
    // No JSON does not match; `not` inverts both.
    assert!(!verdict("default.jsonSchema", p.clone(), "no json here"));
    assert!(verdict("default.jsonSchema", json!({"schema": schema, "not": true}), "no json here"));
    assert!(!verdict("default.jsonSchema", json!({"schema": schema, "not": true}), r#"{"name": "A", "age": 1}"#));
    assert!(error("default.jsonSchema", json!({}), "{}").contains("`schema`"));
    assert!(error("default.jsonSchema", json!({"schema": {"$ref": "#/x"}}), "{}").contains("$ref"));
    assert!(error("default.jsonSchema", json!({"schema": {"type": 5}}), "{}").contains("`type`"));
}

#[test]
fn json_schema_keywords() {
    let ok = |schema: Value, value: Value| schema::validate(&schema, &value).unwrap().is_empty();
    assert!(ok(json!({"type": ["string", "null"]}), json!(null)));
    assert!(!ok(json!({"type": "integer"}), json!(1.5)));
    assert!(ok(json!({"type": "integer"}), json!(2.0)));
    assert!(ok(json!({"const": 1}), json!(1.0)));
    assert!(!ok(json!({"const": {"a": [1]}}), json!({"a": [2]})));
    assert!(ok(json!({"exclusiveMinimum": 0, "maximum": 1}), json!(1)));
    assert!(!ok(json!({"exclusiveMinimum": 0}), json!(0)));
    assert!(ok(json!({"pattern": "^[a-z]+$", "maxLength": 3}), json!("abc")));
    assert!(!ok(json!({"pattern": "^[a-z]+$"}), json!("ab1")));
    assert!(ok(json!({"anyOf": [{"type": "string"}, {"type": "number"}]}), json!(3)));
    assert!(!ok(json!({"anyOf": [{"type": "string"}, {"type": "number"}]}), json!([])));
    assert!(!ok(json!({"oneOf": [{"type": "number"}, {"minimum": 0}]}), json!(3)));
    assert!(ok(json!({"oneOf": [{"type": "number"}, {"type": "string"}]}), json!(3)));
    assert!(ok(json!({"allOf": [{"type": "number"}, {"minimum": 0}]}), json!(3)));
    assert!(!ok(json!({"not": {"type": "number"}}), json!(3)));
    assert!(ok(json!({"additionalProperties": {"type": "number"}}), json!({"a": 1})));
    assert!(!ok(json!({"additionalProperties": {"type": "number"}}), json!({"a": "x"})));
    assert!(!ok(json!({"minProperties": 1}), json!({})));
    assert!(!ok(json!(false), json!(1)));
    assert!(ok(json!({"title": "ignored", "format": "email"}), json!("x")));
    let mut deep = json!({});
    for _ in 0..40 {
        deep = json!({"items": deep});
    }
    let mut value = json!(1);
    for _ in 0..40 {
        value = json!([value]);
    }
    assert!(schema::validate(&deep, &value).unwrap_err().contains("deeper"));
}

#[test]
fn json_keys() {
    let p = |op: &str| json!({"keys": ["a", "b"], "operator": op});
    assert!(verdict("default.jsonKeys", p("all"), r#"{"a": 1, "b": 2}"#));
    assert!(!verdict("default.jsonKeys", p("all"), r#"{"a": 1}"#));
    assert!(verdict("default.jsonKeys", p("any"), "```json\n{\"a\": 1}\n```"));
    assert!(verdict("default.jsonKeys", p("none"), r#"{"c": 1}"#));
    assert!(!verdict("default.jsonKeys", p("none"), r#"{"b": {"a": 1}}"#));
    // Nested keys are not top-level keys.
    assert!(!verdict("default.jsonKeys", p("any"), r#"{"c": {"a": 1}}"#));
    // The first fence that satisfies decides; the best one reports otherwise.
    let two = "```\n{\"a\": 1}\n```\nand\n```json\n{\"a\": 1, \"b\": 2}\n```";
    assert!(verdict("default.jsonKeys", p("all"), two));
    let r = run("default.jsonKeys", p("all"), "```\n{\"x\": 1}\n```\n```\n{\"a\": 1}\n```");
    assert!(!r.verdict);
    assert_eq!(r.data["presentKeys"], json!(["a"]));
    assert_eq!(r.data["missingKeys"], json!(["b"]));
    let none = run("default.jsonKeys", p("none"), "plain text");
    assert!(!none.verdict);
    assert_eq!(none.data["jsonFound"], false);
    assert!(error("default.jsonKeys", json!({"keys": ["a"]}), "{}").contains("operator"));
}

#[test]
fn valid_urls() {
    let urls = |text: &str| run("default.validUrls", json!({}), text);
    assert!(urls("no links at all").verdict);
    let ok = urls("See https://example.com/a?b=1#c, or (http://127.0.0.1:8080/x). And https://[::1]:9/ too.");
    assert!(ok.verdict, "{ok:?}");
    assert_eq!(
        ok.data["validUrls"],
        json!(["https://example.com/a?b=1#c", "http://127.0.0.1:8080/x", "https://[::1]:9/"])
    );
    assert!(urls("docs at https://de.wikipedia.org/wiki/Bücher_(Begriff).").verdict);
    for bad in [
        "http://",
        "https://exa mple.com",
        "https://-bad-.com",
        "http://999.1.1.1/",
        "http://host:99999/",
        "http://host:/",
        "https://a..b/",
        "https://ok.com/%zz",
        "https://[::g]/",
        "https://ok.com/a^b",
    ] {
        let r = urls(&format!("link: {bad} end"));
        // "exa mple.com" splits at the space: `https://exa` is fine, so only the others fail.
        if bad.contains(' ') {
            continue;
        }
        assert!(!r.verdict, "{bad}: {r:?}");
        assert_eq!(r.data["invalidUrls"].as_array().unwrap().len(), 1, "{bad}");
    }
    assert!(urls("HTTPS://EXAMPLE.COM").verdict);
    // `http` inside a word that is no URL is not one.
    assert!(urls("httpx is a library; https is a protocol").verdict);
}

#[test]
fn contains_code() {
    let text = "Try:\n```py\nprint(1)\n```\nor\n```SQL\nSELECT 1;\n```\n";
    assert!(verdict("default.containsCode", json!({"format": "Python"}), text));
    assert!(verdict("default.containsCode", json!({"format": "sql"}), text));
    assert!(verdict("default.containsCode", json!({"format": "python"}), text));
    assert!(!verdict("default.containsCode", json!({"format": "JavaScript"}), text));
    assert_eq!(
        run("default.containsCode", json!({"format": "Go"}), text).data["foundFormats"],
        json!(["Python", "SQL"])
    );
    // Untagged and unclosed fences do not count.
    assert!(!verdict("default.containsCode", json!({"format": "Python"}), "```\nprint(1)\n```"));
    assert!(!verdict("default.containsCode", json!({"format": "Python"}), "```python\nprint(1)"));
    assert!(error("default.containsCode", json!({}), text).contains("`format`"));
}

#[test]
fn model_whitelist() {
    assert!(verdict("default.modelWhitelist", json!({"models": ["gpt-4o", "o3"]}), ""));
    assert!(!verdict("default.modelWhitelist", json!({"models": ["o3"]}), ""));
    assert!(verdict("default.modelWhitelist", json!({"models": ["o3"], "not": true}), ""));
    assert!(!verdict("default.modelWhitelist", json!({"models": ["gpt-4o"], "not": true}), ""));
    assert!(error("default.modelWhitelist", json!({"models": "gpt-4o"}), "").contains("`models`"));
}

#[test]
fn required_metadata_keys() {
    let request = json!({});
    let metadata = params(json!({"_user": "u1", "team": "a"}));
    let with = |p: Value, metadata: Option<&Params>| {
        let input = Input { metadata, ..before("", &request) };
        done(evaluated("default.requiredMetadataKeys", p, &input, &Env { now_s: NOW, jwks: &no_jwks }))
    };
    let p = |op: &str| json!({"metadataKeys": ["_user", "env"], "operator": op});
    assert!(with(p("any"), Some(&metadata)).verdict);
    assert!(!with(p("all"), Some(&metadata)).verdict);
    assert!(!with(p("none"), Some(&metadata)).verdict);
    assert!(with(p("none"), None).verdict);
    assert!(!with(p("any"), None).verdict);
    let r = with(p("all"), Some(&metadata));
    assert_eq!(r.data["missing_metadata_keys"], json!(["env"]));
    assert_eq!(r.data["found_metadata_keys"], json!(["_user"]));
    assert!(with(json!({"metadataKeys": ["a"]}), None).error.unwrap().contains("operator"));
}

#[test]
fn unknown_checks_fail_with_an_error() {
    let r = run("default.nope", json!({}), "x");
    assert!(!r.verdict);
    assert!(r.error.unwrap().contains("unknown check"));
}

// ---- checks that call out ----

fn after<'a>(request: &'a Value, response: &'a Value) -> Input<'a> {
    Input { stage: Stage::After, response: Some(response), ..before("answer", request) }
}

fn needs(e: Evaluation) -> (CallSpec, Continuation) {
    match e {
        Evaluation::Needs(call, then) => (call, then),
        other => panic!("expected a call, got {other:?}"),
    }
}

#[test]
fn webhook_posts_request_and_response() {
    let request = json!({"model": "m", "messages": []});
    let response = json!({"choices": []});
    let env = Env { now_s: NOW, jwks: &no_jwks };
    let p = json!({"webhookURL": "http://127.0.0.1:9000/hook?k=v#frag", "headers": {"X-Team": "a"}, "timeout": 500});
    let (call, _) = needs(evaluated("default.webhook", p.clone(), &after(&request, &response), &env));
    assert_eq!(call.method, "POST");
    assert_eq!(call.upstream.authority, "127.0.0.1:9000");
    assert!(!call.upstream.tls);
    assert_eq!(call.path, "/hook?k=v");
    assert_eq!(call.timeout_ms, 500);
    assert_eq!(
        call.headers,
        vec![("content-type".to_string(), "application/json".to_string()), ("x-team".to_string(), "a".to_string())]
    );
    let body: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(body, json!({"request": request, "response": response}));
    // Before the request there is no response; headers may come as a JSON string; 3 s default.
    let p = json!({"webhookURL": "https://hooks.example.com", "headers": "{\"a\": \"b\"}"});
    let (call, _) = needs(evaluated("default.webhook", p, &before("x", &request), &env));
    assert_eq!(call.path, "/");
    assert_eq!(call.timeout_ms, 3000);
    assert_eq!(serde_json::from_slice::<Value>(&call.body).unwrap(), json!({"request": request}));
    assert_eq!(call.headers.get(1), Some(&("a".to_string(), "b".to_string())));
}

#[test]
fn webhook_parameter_errors() {
    let request = json!({});
    let env = Env { now_s: NOW, jwks: &no_jwks };
    let error = |p: Value| {
        let r = done(evaluated("default.webhook", p, &before("x", &request), &env));
        assert!(!r.verdict);
        r.error.unwrap()
    };
    assert!(error(json!({})).contains("webhookURL"));
    assert!(error(json!({"webhookURL": "ftp://x"})).contains("webhookURL"));
    assert!(error(json!({"webhookURL": "http://x/a b"})).contains("webhookURL"));
    assert!(error(json!({"webhookURL": "http://x", "timeout": 0})).contains("timeout"));
    assert!(error(json!({"webhookURL": "http://x", "timeout": 600_000})).contains("timeout"));
    assert!(error(json!({"webhookURL": "http://x", "headers": {"Host": "y"}})).contains("set by the gateway"));
    let cluster = json!({"webhookURL": "http://x", "headers": {"x-gateway-upstream-cluster": "y"}});
    assert!(error(cluster).contains("set by the gateway"));
    assert!(error(json!({"webhookURL": "http://x", "headers": {"a b": "y"}})).contains("not a valid header name"));
    assert!(error(json!({"webhookURL": "http://x", "headers": {"a": "y\r\nz: 1"}})).contains("control"));
    assert!(error(json!({"webhookURL": "http://x", "headers": {"a": 1}})).contains("string value"));
    assert!(error(json!({"webhookURL": "http://x", "headers": "nope"})).contains("JSON object"));
}

#[test]
fn webhook_answers() {
    let request = json!({});
    let env = Env { now_s: NOW, jwks: &no_jwks };
    let answer = |status: u16, body: &str| {
        let p = json!({"webhookURL": "http://hooks.local/v"});
        let (_, then) = needs(evaluated("default.webhook", p, &before("x", &request), &env));
        let finished = then.finish(Reply { status, body: body.as_bytes() }, NOW);
        assert_eq!(finished.jwks, None);
        finished.result
    };
    let pass = answer(200, r#"{"verdict": true, "why": "ok"}"#);
    assert!(pass.verdict && pass.error.is_none());
    assert_eq!(pass.data["responseData"]["why"], "ok");
    let fail = answer(200, r#"{"verdict": false}"#);
    assert!(!fail.verdict && fail.error.is_none());
    assert!(answer(500, r#"{"verdict": true}"#).error.unwrap().contains("status 500"));
    assert!(answer(0, "").error.unwrap().contains("timed out"));
    assert!(answer(200, "not json").error.unwrap().contains("verdict"));
    assert!(answer(200, r#"{"verdict": "yes"}"#).error.unwrap().contains("verdict"));
}

#[test]
fn log_passes_at_once_and_sends() {
    let request = json!({"model": "m"});
    let response = json!({"id": "r"});
    let env = Env { now_s: NOW, jwks: &no_jwks };
    let p = json!({"logURL": "https://logs.example.com/in"});
    match evaluated("default.log", p, &after(&request, &response), &env) {
        Evaluation::DoneAndSend(r, call) => {
            assert!(r.verdict);
            assert_eq!(call.path, "/in");
            assert_eq!(
                serde_json::from_slice::<Value>(&call.body).unwrap(),
                json!({"request": request, "response": response})
            );
        }
        other => panic!("{other:?}"),
    }
    let r = done(evaluated("default.log", json!({}), &after(&request, &response), &env));
    assert!(r.error.unwrap().contains("logURL"));
}

// ---- default.jwt ----

/// Keys and tokens made at test time (the MCP endpoints' OAuth tests sign with them too).
pub(crate) mod jwt_tests {
    use super::*;
    use crate::unit_tests::test;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use rsa::pkcs8::DecodePrivateKey;
    use rsa::signature::{RandomizedSigner, SignatureEncoding, Signer};
    use rsa::traits::PublicKeyParts;
    use sha2::{Digest, Sha256, Sha384};

    /// A throwaway key made for tests (see src/providers/google/testdata/README.md).
    const RSA_KEY: &str = include_str!("../providers/google/testdata/test_key.pem");

    /// PSS salts need randomness; any bytes do for a test.
    struct TestRng(u64);
    impl rand_core::RngCore for TestRng {
        fn next_u32(&mut self) -> u32 {
            self.next_u64() as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.0
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            dest.iter_mut().for_each(|b| *b = self.next_u64() as u8);
        }
        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
            self.fill_bytes(dest);
            Ok(())
        }
    }
    impl rand_core::CryptoRng for TestRng {}

    type Sign = Box<dyn Fn(&[u8]) -> Vec<u8>>;

    /// A signer: its algorithm, its public JWK (with `kid`), and a signing function.
    pub(crate) struct Key {
        alg: &'static str,
        jwk: Value,
        sign: Sign,
    }

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// An EC key made at test time from a seed: `$curve` is the crate, `$hash` sizes the scalar.
    macro_rules! ec_key {
        ($name:ident, $curve:ident, $hash:ty, $crv:literal, $alg:literal) => {
            pub(crate) fn $name(kid: &str, seed: &str) -> Key {
                let key = $curve::ecdsa::SigningKey::from_slice(&<$hash>::digest(seed)).unwrap();
                let point = key.verifying_key().to_encoded_point(false);
                let (x, y) = (b64(point.x().unwrap()), b64(point.y().unwrap()));
                let jwk = json!({"kty": "EC", "crv": $crv, "kid": kid, "x": x, "y": y});
                let sign = move |m: &[u8]| -> Vec<u8> {
                    let s: $curve::ecdsa::Signature = key.sign(m);
                    s.to_vec()
                };
                Key { alg: $alg, jwk, sign: Box::new(sign) }
            }
        };
    }
    ec_key!(es256, p256, Sha256, "P-256", "ES256");
    ec_key!(es384, p384, Sha384, "P-384", "ES384");

    fn rsa(kid: &str, alg: &'static str) -> Key {
        let key = rsa::RsaPrivateKey::from_pkcs8_pem(RSA_KEY).unwrap();
        let public = key.to_public_key();
        let jwk =
            json!({"kty": "RSA", "kid": kid, "n": b64(&public.n().to_bytes_be()), "e": b64(&public.e().to_bytes_be())});
        let sign = move |m: &[u8]| -> Vec<u8> {
            let key = key.clone();
            match alg {
                "RS256" => rsa::pkcs1v15::SigningKey::<Sha256>::new(key).sign(m).to_vec(),
                "RS512" => rsa::pkcs1v15::SigningKey::<sha2::Sha512>::new(key).sign(m).to_vec(),
                "PS256" => rsa::pss::SigningKey::<Sha256>::new(key).sign_with_rng(&mut TestRng(7), m).to_vec(),
                _ => unreachable!(),
            }
        };
        Key { alg, jwk, sign: Box::new(sign) }
    }

    pub(crate) fn token(key: &Key, claims: Value) -> String {
        token_with(key, json!({"alg": key.alg, "typ": "JWT", "kid": key.jwk["kid"]}), claims)
    }

    fn token_with(key: &Key, header: Value, claims: Value) -> String {
        let signed = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
        let signature = (key.sign)(signed.as_bytes());
        format!("{signed}.{}", b64(&signature))
    }

    pub(crate) fn jwks(keys: &[&Key]) -> Vec<u8> {
        json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string().into_bytes()
    }

    fn fresh() -> Value {
        json!({"sub": "u", "iat": NOW - 10, "exp": NOW + 600})
    }

    const URI: &str = "http://127.0.0.1:8081/jwks.json";

    /// Evaluates `default.jwt` with the token in `authorization` and `cache` as the cached JWKS.
    fn evaluate_jwt(p: Value, header: &str, cache: Option<CachedJwks>) -> Evaluation {
        let request = json!({});
        let headers = vec![("authorization".to_string(), header.as_bytes().to_vec())];
        let input = Input { headers: &headers, ..before("x", &request) };
        let lookup = move |uri: &str| {
            assert_eq!(uri, URI);
            cache.clone()
        };
        evaluated("default.jwt", p, &input, &Env { now_s: NOW, jwks: &lookup })
    }

    fn cached(json: Vec<u8>, age_s: u64) -> Option<CachedJwks> {
        Some(CachedJwks { json, fetched_at_s: NOW - age_s })
    }

    fn rules() -> JwtRules {
        JwtRules {
            algorithms: params::ALGORITHMS.iter().map(|a| a.to_string()).collect(),
            clock_tolerance_s: 5,
            max_token_age_s: None,
        }
    }

    fn verify(token: &str, jwks: &[u8], rules: &JwtRules) -> Result<(), JwtFailure> {
        jwt::verify(&jwt::parse(token).unwrap(), jwks, rules, NOW)
    }

    #[test]
    fn every_algorithm_verifies_and_a_wrong_key_does_not() {
        let keys = [es256("e1", "a"), es384("e2", "b"), rsa("r1", "RS256"), rsa("r2", "RS512"), rsa("p1", "PS256")];
        let set = jwks(&keys.iter().collect::<Vec<_>>());
        for key in &keys {
            assert_eq!(verify(&token(key, fresh()), &set, &rules()), Ok(()), "{}", key.alg);
        }
        // Same kid, another key.
        let impostor = es256("e1", "other seed");
        assert!(matches!(verify(&token(&impostor, fresh()), &set, &rules()), Err(JwtFailure::Invalid(_))));
        // A tampered payload.
        let good = token(&keys[0], fresh());
        let parts: Vec<&str> = good.split('.').collect();
        let forged = format!("{}.{}.{}", parts[0], b64(json!({"sub": "admin"}).to_string().as_bytes()), parts[2]);
        assert!(matches!(verify(&forged, &set, &rules()), Err(JwtFailure::Invalid(_))));
    }

    #[test]
    fn key_choice() {
        let key = es256("k1", "a");
        // A token without kid tries the keys that fit its algorithm.
        let no_kid = token_with(&key, json!({"alg": "ES256"}), fresh());
        assert_eq!(verify(&no_kid, &jwks(&[&rsa("r", "RS256"), &key]), &rules()), Ok(()));
        // A JWK declaring another alg, or another use, is not used.
        let mut other_alg = es256("k1", "a");
        other_alg.jwk["alg"] = json!("ES384");
        assert!(matches!(verify(&token(&key, fresh()), &jwks(&[&other_alg]), &rules()), Err(JwtFailure::Invalid(_))));
        let mut enc = es256("k1", "a");
        enc.jwk["use"] = json!("enc");
        assert!(verify(&token(&key, fresh()), &jwks(&[&enc]), &rules()).is_err());
        let mut declared = es256("k1", "a");
        declared.jwk["alg"] = json!("ES256");
        assert_eq!(verify(&token(&key, fresh()), &jwks(&[&declared]), &rules()), Ok(()));
        // An unknown kid is told apart, so the caller may refetch.
        assert!(matches!(
            verify(&token(&es256("k2", "a"), fresh()), &jwks(&[&key]), &rules()),
            Err(JwtFailure::UnknownKid(_))
        ));
        // Broken JWKS and keys fail without panicking.
        for bad in [
            &b"nope"[..],
            br#"{"keys": 1}"#,
            br#"{"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "x": "AA", "y": "AA"}]}"#,
        ] {
            assert!(matches!(verify(&token(&key, fresh()), bad, &rules()), Err(JwtFailure::Invalid(_))));
        }
    }

    #[test]
    fn lifetimes() {
        let key = es256("k", "a");
        let set = jwks(&[&key]);
        let at = |claims: Value, rules: &JwtRules| verify(&token(&key, claims), &set, rules);
        assert_eq!(at(json!({"exp": NOW - 3}), &rules()), Ok(()), "expired inside the tolerance");
        assert!(at(json!({"exp": NOW - 10}), &rules()).is_err(), "expired outside the tolerance");
        assert!(at(json!({"nbf": NOW + 60}), &rules()).is_err());
        assert_eq!(at(json!({"nbf": NOW + 4}), &rules()), Ok(()));
        assert!(at(json!({"iat": NOW + 60}), &rules()).is_err());
        assert!(at(json!({"exp": "soon"}), &rules()).is_err());
        let hour = JwtRules { max_token_age_s: Some(3600), ..rules() };
        assert_eq!(at(json!({"iat": NOW - 60}), &hour), Ok(()));
        assert!(at(json!({"iat": NOW - 7200}), &hour).is_err());
        assert!(at(json!({"sub": "no iat"}), &hour).is_err());
    }

    #[test]
    fn algorithms_allow_list() {
        let key = es256("k", "a");
        let only_rs = JwtRules { algorithms: vec!["RS256".to_string()], ..rules() };
        assert!(verify(&token(&key, fresh()), &jwks(&[&key]), &only_rs).is_err());
        // `none` and HMAC are never accepted.
        let none = format!("{}.{}.", b64(br#"{"alg":"none","kid":"k"}"#), b64(fresh().to_string().as_bytes()));
        assert!(verify(&none, &jwks(&[&key]), &rules()).is_err());
        // Through the check: refused before any JWKS is fetched.
        let p = json!({"jwksUri": URI, "algorithms": ["RS256"]});
        let r = done(evaluate_jwt(p, &format!("Bearer {}", token(&key, fresh())), None));
        assert!(!r.verdict && r.error.is_none());
        assert!(r.data["explanation"].as_str().unwrap().contains("not allowed"));
        let r = done(evaluate_jwt(json!({"jwksUri": URI, "algorithms": ["HS256"]}), "x", None));
        assert!(r.error.unwrap().contains("algorithms"));
    }

    #[test]
    fn the_check_uses_a_fresh_cache() {
        let key = es256("k", "a");
        let p = json!({"jwksUri": URI});
        let good = token(&key, fresh());
        let pass = done(evaluate_jwt(p.clone(), &format!("Bearer {good}"), cached(jwks(&[&key]), 60)));
        assert!(pass.verdict, "{pass:?}");
        // The prefix is optional and its case free.
        assert!(done(evaluate_jwt(p.clone(), &good, cached(jwks(&[&key]), 60))).verdict);
        assert!(done(evaluate_jwt(p.clone(), &format!("bearer  {good}"), cached(jwks(&[&key]), 60))).verdict);
        // The default maxTokenAge (1d) wants `iat`.
        let no_iat = token(&key, json!({"exp": NOW + 60}));
        assert!(!done(evaluate_jwt(p.clone(), &no_iat, cached(jwks(&[&key]), 60))).verdict);
        let aged = json!({"jwksUri": URI, "maxTokenAge": "30m"});
        let old = token(&key, json!({"iat": NOW - 3600}));
        assert!(!done(evaluate_jwt(aged, &old, cached(jwks(&[&key]), 60))).verdict);
        // Malformed tokens fail the check, without an error.
        for bad in ["Bearer ", "Bearer a.b", "Bearer !!.!!.!!", "Bearer e30.e30.e30"] {
            let r = done(evaluate_jwt(p.clone(), bad, cached(jwks(&[&key]), 60)));
            assert!(!r.verdict && r.error.is_none(), "{bad}: {r:?}");
        }
    }

    #[test]
    fn a_missing_header_fails_and_parameters_are_checked() {
        let request = json!({});
        let env = Env { now_s: NOW, jwks: &no_jwks };
        let r = done(evaluated("default.jwt", json!({"jwksUri": URI}), &before("x", &request), &env));
        assert!(!r.verdict && r.error.is_none());
        assert!(r.data["explanation"].as_str().unwrap().contains("authorization"));
        let headers = vec![("x-token".to_string(), b"t".to_vec())];
        let input = Input { headers: &headers, ..before("x", &request) };
        let r = done(evaluated("default.jwt", json!({"jwksUri": URI, "headerKey": "X-Token"}), &input, &env));
        assert!(r.data["explanation"].as_str().unwrap().contains("not three"), "{r:?}");
        for (p, wanted) in [
            (json!({}), "jwksUri"),
            (json!({"jwksUri": "file:///etc/passwd"}), "jwksUri"),
            (json!({"jwksUri": URI, "maxTokenAge": "soon"}), "maxTokenAge"),
            (json!({"jwksUri": URI, "clockTolerance": -1}), "clockTolerance"),
            (json!({"jwksUri": URI, "algorithms": "RS256"}), "algorithms"),
        ] {
            let r = done(evaluate_jwt(p, "t", None));
            assert!(r.error.as_deref().unwrap_or_default().contains(wanted), "{wanted}: {r:?}");
        }
    }

    #[test]
    fn the_jwks_is_fetched_when_missing_stale_or_lacking_the_kid() {
        let (old, new) = (es256("old", "a"), es256("new", "b"));
        let p = json!({"jwksUri": URI, "cacheMaxAge": 300});
        let rotated = token(&new, fresh());
        // Nothing cached, or stale: fetch.
        for cache in [None, cached(jwks(&[&new]), 301)] {
            let (call, _) = needs(evaluate_jwt(p.clone(), &rotated, cache));
            assert_eq!(
                (call.method, call.path.as_str(), call.upstream.authority.as_str()),
                ("GET", "/jwks.json", "127.0.0.1:8081")
            );
            assert!(call.body.is_empty());
        }
        // Unknown kid: refetch if the cache is over 30 s old, else fail (at 30 whole seconds it
        // may be 29.001 s old).
        for age_s in [10, 30] {
            let r = done(evaluate_jwt(p.clone(), &rotated, cached(jwks(&[&old]), age_s)));
            assert!(!r.verdict && r.data["explanation"].as_str().unwrap().contains("no key with kid"));
        }
        let (_, then) = needs(evaluate_jwt(p.clone(), &rotated, cached(jwks(&[&old]), 31)));
        // The fetched JWKS decides, and is handed back for the cache.
        let body = jwks(&[&old, &new]);
        let finished = then.clone().finish(Reply { status: 200, body: &body }, NOW);
        assert!(finished.result.verdict, "{finished:?}");
        assert_eq!(finished.jwks, Some(JwksUpdate { uri: URI.to_string(), json: body.clone(), max_age_s: 300 }));
        // A failed fetch fails the check with an error and caches nothing.
        for (status, body) in [(0, &b""[..]), (503, &b"{}"[..]), (200, &b"{\"no\": 1}"[..])] {
            let finished = then.clone().finish(Reply { status, body }, NOW);
            assert!(!finished.result.verdict && finished.result.error.is_some());
            assert_eq!(finished.jwks, None);
        }
    }
}

// ---- verdicts and bodies ----

fn feedback(value: f64) -> Option<HookOutcome> {
    Some(HookOutcome { feedback: Some(Feedback { value: Some(value), weight: None, metadata: None }), deny: None })
}

fn inline(checks: Value) -> InlineGuardrail {
    let checks = params(checks).into_iter().map(|(id, p)| check(&id, p)).collect();
    InlineGuardrail { checks, ..Default::default() }
}

#[test]
fn items_from_hooks_and_guardrails() {
    let hook = Hook {
        id: "h1".to_string(),
        kind: Some("guardrail".to_string()),
        checks: vec![check("default.contains", json!({"words": ["x"], "operator": "none"}))],
        on_fail: Some(HookOutcome { feedback: None, deny: Some(true) }),
        on_success: None,
        is_async: false,
    };
    let named =
        InlineGuardrail { id: Some("g".to_string()), deny: Some(true), ..inline(json!({"default.validUrls": {}})) };
    let by_on_fail =
        InlineGuardrail { on_fail: Some(HookOutcome { feedback: None, deny: Some(true) }), ..inline(json!({})) };
    let guardrails =
        vec![Guardrail::Inline(named), Guardrail::Inline(inline(json!({}))), Guardrail::Inline(by_on_fail)];
    let items = items(&[hook], &guardrails, Stage::After, &|_| None).unwrap();
    let summary: Vec<(&str, bool)> = items.iter().map(|i| (i.id.as_str(), i.deny)).collect();
    assert_eq!(summary, [("h1", true), ("g", true), ("output_guardrails[1]", false), ("output_guardrails[2]", true)]);
    assert_eq!(items[1].checks, vec![check("default.validUrls", json!({}))]);
    let stored = vec![Guardrail::Reference("pii".to_string())];
    assert_eq!(verdict::items(&[], &stored, Stage::Before, &|_| None), Err("pii".to_string()));
}

/// An item of inline checks, for the run tests.
fn item(id: &str, checks: Value, deny: bool, is_async: bool) -> Item {
    let guardrail = InlineGuardrail {
        id: Some(id.to_string()),
        deny: Some(deny),
        is_async: Some(is_async),
        on_fail: feedback(0.0),
        on_success: feedback(1.0),
        ..inline(checks)
    };
    Item::from_inline(&guardrail, String::new())
}

#[test]
fn a_stage_runs_its_checks_and_waits_for_calls() {
    let request = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]});
    let items = vec![
        item("words", json!({"default.contains": {"words": ["hello"], "operator": "any"}}), true, false),
        item(
            "hooked",
            json!({"default.webhook": {"webhookURL": "http://h/"}, "default.log": {"logURL": "http://l/"}}),
            false,
            false,
        ),
    ];
    let env = Env { now_s: NOW, jwks: &no_jwks };
    let ticks = std::cell::Cell::new(100);
    let clock = || {
        ticks.set(ticks.get() + 2);
        ticks.get()
    };
    let Started { mut run, pending, sends } = StageRun::start(items, &before("hello", &request), &env, clock(), &clock);
    assert_eq!(sends.len(), 1);
    assert_eq!(pending.len(), 1);
    assert!(!run.is_done());
    let PendingCall { slot, call, then } = pending.into_iter().next().unwrap();
    assert_eq!(slot, Slot { item: 1, check: 1 });
    assert_eq!(call.upstream.authority, "h:80");
    assert_eq!(run.answer(slot, then, Reply { status: 200, body: br#"{"verdict": false}"# }, NOW, 40), None);
    assert!(run.is_done());
    let results = run.finish();
    assert!(results[0].verdict);
    assert_eq!(results[0].execution_time, 2);
    assert_eq!(results[0].feedback, feedback(1.0).unwrap().feedback);
    assert!(!results[1].verdict);
    assert_eq!(results[1].execution_time, 40);
    assert_eq!(results[1].feedback, feedback(0.0).unwrap().feedback);
    // Checks of an inline guardrail come in key order: log, then webhook.
    let ids: Vec<&str> = results[1].checks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["default.log", "default.webhook"]);
    assert_eq!(outcome(&results), Outcome::Flag);
}

#[test]
fn a_check_whose_call_never_answered_fails() {
    let request = json!({});
    let items = vec![item("w", json!({"default.webhook": {"webhookURL": "http://h/"}}), true, false)];
    let env = Env { now_s: NOW, jwks: &no_jwks };
    let started = StageRun::start(items, &before("", &request), &env, 0, &|| 0);
    let results = started.run.finish();
    assert_eq!(results[0].checks[0].error.as_deref(), Some("no answer"));
    assert_eq!(outcome(&results), Outcome::Deny);
}

fn result(verdict: bool, deny: bool, is_async: bool) -> ItemResult {
    let check = CheckResult::new("default.contains", verdict, Value::Null);
    ItemResult::new(&item("i", json!({}), deny, is_async), vec![check])
}

#[test]
fn outcomes() {
    assert_eq!(outcome(&[]), Outcome::Pass);
    assert_eq!(outcome(&[result(true, true, false)]), Outcome::Pass);
    assert_eq!(outcome(&[result(true, false, false), result(false, false, false)]), Outcome::Flag);
    assert_eq!(outcome(&[result(false, false, false), result(false, true, false)]), Outcome::Deny);
    // Async items never change the answer.
    assert_eq!(outcome(&[result(false, true, true)]), Outcome::Pass);
    // Stages combine with max.
    assert_eq!(Outcome::Flag.max(Outcome::Pass), Outcome::Flag);
    assert_eq!((FLAG_STATUS, DENY_STATUS), (246, 446));
    // No checks: the verdict is true.
    assert!(ItemResult::new(&item("e", json!({}), true, false), vec![]).verdict);
}

#[test]
fn hook_results_shape() {
    let mut failed = CheckResult::failed("default.webhook", "the webhook answered status 500", json!({"a": 1}));
    failed.execution_time = 7;
    let mut with_metadata = item("x", json!({}), true, false);
    with_metadata.on_fail = Some(HookOutcome {
        feedback: Some(Feedback { value: Some(-1.0), weight: Some(0.5), metadata: Some(params(json!({"k": "v"}))) }),
        deny: Some(true),
    });
    let before = vec![ItemResult::new(&with_metadata, vec![failed])];
    let mut plain = item("y", json!({}), false, true);
    plain.on_success = None;
    let after = vec![ItemResult::new(&plain, vec![CheckResult::new("default.log", true, Value::Null)])];
    assert_eq!(
        serde_json::from_slice::<Value>(&hook_results(&before, &after)).unwrap(),
        json!({
            "before_request_hooks": [{
                "id": "x", "verdict": false, "deny": true, "async": false, "execution_time": 7,
                "checks": [{"id": "default.webhook", "verdict": false, "data": {"a": 1},
                    "error": {"message": "the webhook answered status 500"}, "execution_time": 7}],
                "feedback": {"value": -1.0, "weight": 0.5, "metadata": {"k": "v"}},
            }],
            "after_request_hooks": [{
                "id": "y", "verdict": true, "deny": false, "async": true, "execution_time": 0,
                "checks": [{"id": "default.log", "verdict": true, "data": null, "error": null, "execution_time": 0}],
                "feedback": null,
            }],
        })
    );
}

#[test]
fn bodies() {
    let results = json!({"before_request_hooks": [], "after_request_hooks": []});
    let results_json = results.to_string().into_bytes();
    let added = with_hook_results(br#" {"id": "c", "choices": []}  "#, &results_json).unwrap();
    let added: Value = serde_json::from_slice(&added).unwrap();
    assert_eq!(added, json!({"id": "c", "choices": [], "hook_results": results}));
    // The provider's bytes stay as they were.
    let spliced = with_hook_results(br#"{"z":1,"a":2}"#, b"1").unwrap();
    assert_eq!(spliced, br#"{"z":1,"a":2,"hook_results":1}"#);
    assert_eq!(with_hook_results(b"{ }", b"1").unwrap(), br#"{ "hook_results":1}"#);
    for not_an_object in [&b"[1]"[..], b"", b"{", b"{\"a\":1} x", b"\"{}\""] {
        assert_eq!(with_hook_results(not_an_object, b"1"), None);
    }
    let denied: Value = serde_json::from_slice(&denied_body(&results_json)).unwrap();
    assert_eq!(denied["error"]["type"], "hooks_failed");
    assert_eq!(denied["error"]["param"], Value::Null);
    assert_eq!(denied["error"]["code"], Value::Null);
    assert!(denied["error"]["message"].as_str().unwrap().contains("hook_results"));
    assert_eq!(denied["hook_results"], results);
}

#[test]
fn every_listed_check_id_is_one_evaluate_runs() {
    let request = json!({"messages": [{"role": "user", "content": "hi"}]});
    let env = Env { now_s: NOW, jwks: &no_jwks };
    for id in CHECK_IDS {
        let evaluation = evaluated(id, json!({}), &before("hi", &request), &env);
        if let Evaluation::Done(result) = evaluation {
            let error = result.error.unwrap_or_default();
            assert!(!error.starts_with("unknown check"), "{id}: {error}");
        }
    }
    let unknown = done(evaluated("default.nope", json!({}), &before("hi", &request), &env));
    assert!(unknown.error.unwrap_or_default().starts_with("unknown check"));
}

#[test]
fn a_tool_calls_text_is_its_arguments_values_and_its_results_its_text_parts() {
    let params = json!({"name": "send", "arguments": {"to": ["ann", "bob"], "body": {"text": "hi", "urgent": true}, "n": 3, "none": null}});
    // Object members in key order (serde_json's maps are sorted); names never count.
    assert_eq!(arguments_text(&params), "hi\ntrue\n3\nann\nbob");
    assert_eq!(arguments_text(&json!({"name": "ping"})), "");
    let result = json!({"content": [{"type": "text", "text": "one"}, {"type": "image", "data": "AAAA"}, {"type": "text", "text": "two"}], "isError": false});
    assert_eq!(response_text(&result), "one\ntwo");
}
