//! The client APIs besides OpenAI's chat completions, for the providers that do not speak
//! them: each converts its requests to chat and chat's answers, streams and errors back.

pub(crate) mod messages;
pub(crate) mod responses;

use serde_json::{Map, Value};

/// A client API's request as a chat request, and the JSON paths of what chat could not carry
/// (for the log line that says what a translating target dropped).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Translated {
    pub(crate) body: Map<String, Value>,
    pub(crate) dropped: Vec<String>,
}
