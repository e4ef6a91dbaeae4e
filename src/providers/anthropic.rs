//! Anthropic Messages API translator. (Being written.)
pub struct Anthropic;
