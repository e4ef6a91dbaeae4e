//! The client's request: endpoint, gateway headers, body limits, chat validation.

pub mod chat;
pub mod endpoint;
pub mod headers;
pub mod limits;
