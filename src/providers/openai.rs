//! OpenAI and OpenAI-compatible providers. (Being written.)
pub struct OpenAi;
