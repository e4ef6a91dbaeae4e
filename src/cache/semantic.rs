//! Semantic mode's pure parts: the text that is embedded, the embeddings call's body and
//! answer, and the similarity of two embeddings.

use super::Body;
use serde_json::{json, Value};

/// The text whose meaning decides a semantic hit: the whole conversation, because the system
/// prompt and earlier turns change the answer. One line per chat message, `<role>: <text>`
/// (text parts only); the prompt of a completion. None when the body has neither.
pub(crate) fn conversation(body: &Body) -> Option<String> {
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        let lines: Vec<String> = messages
            .iter()
            .map(|m| format!("{}: {}", m.get("role").and_then(Value::as_str).unwrap_or(""), text_of(m.get("content"))))
            .collect();
        return Some(lines.join("\n"));
    }
    match body.get("prompt") {
        Some(Value::String(prompt)) => Some(prompt.clone()),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            Some(items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"))
        }
        _ => None,
    }
}

/// A message's text: the string itself, or its text parts joined by newlines.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The body of the embeddings call.
pub(crate) fn embeddings_request(model: &str, text: &str) -> Vec<u8> {
    json!({"model": model, "input": text}).to_string().into_bytes()
}

/// The first embedding of an OpenAI embeddings answer; None for anything else.
pub(crate) fn embedding_of(answer: &[u8]) -> Option<Vec<f32>> {
    let value: Value = serde_json::from_slice(answer).ok()?;
    let numbers = value.get("data")?.get(0)?.get("embedding")?.as_array()?;
    let vector: Option<Vec<f32>> = numbers.iter().map(|n| n.as_f64().map(|f| f as f32)).collect();
    vector.filter(|v| !v.is_empty() && v.iter().all(|f| f.is_finite()))
}

/// Cosine similarity of a query embedding and a stored (quantised) one; None when their
/// dimensions differ or either has no direction.
pub(crate) fn cosine(query: &[f32], stored: &[i8]) -> Option<f32> {
    if query.len() != stored.len() {
        return None;
    }
    let (mut dot, mut query_norm, mut stored_norm) = (0f32, 0f32, 0f32);
    for (&q, &s) in query.iter().zip(stored) {
        let s = f32::from(s);
        dot += q * s;
        query_norm += q * q;
        stored_norm += s * s;
    }
    let norms = (query_norm * stored_norm).sqrt();
    (norms > 0.0 && norms.is_finite()).then(|| dot / norms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn conversation_of(body: Value) -> Option<String> {
        let overrides = serde_json::Map::new();
        conversation(&Body { fields: body.as_object().unwrap(), overrides: &overrides })
    }

    #[test]
    fn the_whole_conversation_is_embedded() {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": [{"type": "text", "text": "Capital of"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "Italy?"}]},
            {"role": "assistant", "content": null, "tool_calls": []},
        ]});
        assert_eq!(conversation_of(body).unwrap(), "system: Answer in French.\nuser: Capital of\nItaly?\nassistant: ");
        assert_eq!(conversation_of(json!({"prompt": "Once upon"})).unwrap(), "Once upon");
        assert_eq!(conversation_of(json!({"prompt": ["a", "b"]})).unwrap(), "a\nb");
        assert_eq!(conversation_of(json!({"prompt": [1, 2]})), None);
        assert_eq!(conversation_of(json!({"input": "x"})), None);
    }

    #[test]
    fn reads_openai_embeddings_answers() {
        let answer =
            br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-1,2]}],"model":"e"}"#;
        assert_eq!(embedding_of(answer), Some(vec![0.5, -1.0, 2.0]));
        for bad in [
            &b"{}"[..],
            b"not json",
            br#"{"data":[]}"#,
            br#"{"data":[{"embedding":[]}]}"#,
            br#"{"data":[{"embedding":["a"]}]}"#,
            br#"{"data":[{"embedding":"AAAA"}]}"#,
        ] {
            assert_eq!(embedding_of(bad), None);
        }
        let request: Value = serde_json::from_slice(&embeddings_request("e", "user: hi")).unwrap();
        assert_eq!(request, json!({"model": "e", "input": "user: hi"}));
    }

    #[test]
    fn cosine_similarity() {
        assert!((cosine(&[1.0, 0.0], &[127, 0]).unwrap() - 1.0).abs() < 1e-6);
        assert!(cosine(&[1.0, 0.0], &[0, 127]).unwrap().abs() < 1e-6);
        assert!((cosine(&[1.0, 0.0], &[-127, 0]).unwrap() + 1.0).abs() < 1e-6);
        assert_eq!(cosine(&[1.0], &[1, 2]), None);
        assert_eq!(cosine(&[0.0, 0.0], &[1, 2]), None);
    }
}
