//! OpenAI's Responses API (`POST /v1/responses`) for the providers that do not speak it: the
//! request becomes a chat request ([`request`]); the chat answer ([`answer`]) and stream
//! ([`stream`]) come back as a `response` object and the Responses event sequence. Errors keep
//! OpenAI's error shape, which both APIs share.

pub(crate) mod answer;
pub(crate) mod replay;
pub(crate) mod request;
pub(crate) mod stream;

use serde_json::{json, Value};

/// What marks a reasoning item's `encrypted_content` as the gateway's.
const SEAL: &str = "gw1.";

/// A translated provider's thinking as a reasoning item's `encrypted_content`: the thinking and
/// its signature together, since clients send back `encrypted_content` as they got it and may
/// drop the summary (Codex does), while the provider checks the signature against the text.
pub(crate) fn seal(thinking: &str, signature: &str) -> String {
    super::seal(SEAL, &json!({"thinking": thinking, "signature": signature}))
}

/// The thinking and signature of a sealed `encrypted_content`; None for anyone else's (another
/// provider's encrypted reasoning means nothing to the provider the request goes to).
pub(crate) fn unseal(encrypted: &str) -> Option<(String, String)> {
    let sealed: Value = super::unseal(SEAL, encrypted)?;
    let text = |name: &str| sealed.get(name).and_then(Value::as_str).map(str::to_string);
    Some((text("thinking")?, text("signature")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn sealed_thinking_comes_back_whole() {
        let sealed = seal("Use ls.", "sig-1");
        assert_eq!(unseal(&sealed), Some(("Use ls.".to_string(), "sig-1".to_string())));
        assert_eq!(unseal("gAAAAB-openai-encrypted"), None);
        assert_eq!(unseal("gw1.!!"), None);
    }
}
