//! The client APIs besides OpenAI's chat completions, for the providers that do not speak
//! them: each converts its requests to chat and chat's answers, streams and errors back.

pub(crate) mod messages;
