//! The client's request: endpoint, gateway headers, chat validation.

pub mod chat;
pub mod endpoint;
pub mod headers;
