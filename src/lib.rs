//! Model gateway: an OpenAI-compatible gateway as an Envoy proxy-wasm filter.
//!
//! Everything except `host` is plain Rust that knows nothing of proxy-wasm and is tested
//! natively; `host` is the thin adapter that owns every host call.

pub mod cache;
pub mod config;
pub mod errors;
pub mod exchange;
mod hash;
mod json_check;
pub mod pipeline;
pub mod ports;
pub mod providers;
pub mod query;
pub mod request;
pub mod routing;
pub mod settings;
pub mod stream;
pub mod upstream;

// Checked by native clippy too, though only the wasm build runs it.
#[cfg(any(target_os = "wasi", clippy))]
mod host;

// The host layer's byte formats are pure: natively they are compiled for their tests alone.
#[cfg(all(test, not(any(target_os = "wasi", clippy))))]
#[path = "host/wire.rs"]
mod wire;
