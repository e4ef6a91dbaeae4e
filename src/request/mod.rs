//! The client's request: endpoint, gateway headers, body limits, chat validation.

pub(crate) mod chat;
pub(crate) mod endpoint;
pub(crate) mod headers;
pub(crate) mod limits;
pub(crate) mod resources;
