//! AWS Bedrock (cloud C) through the Converse API.

pub(crate) mod eventstream;
pub(crate) mod sigv4;
