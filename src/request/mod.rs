//! The client's request: gateway headers, authentication, chat validation.

pub mod chat;
