//! OpenAI's Responses API (`POST /v1/responses`) for the providers that do not speak it: the
//! request becomes a chat request ([`request`]); the chat answer ([`answer`]) and stream
//! ([`stream`]) come back as a `response` object and the Responses event sequence. Errors keep
//! OpenAI's error shape, which both APIs share.

pub(crate) mod answer;
pub(crate) mod request;
pub(crate) mod stream;
