//! Incremental stream parsers.

pub mod sse;
