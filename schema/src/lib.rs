//! What the filter and the control plane both read: the config and guardrail schemas and their
//! validation (every error naming its JSON path), stored providers, prompt templates, the
//! error shape and the names on the wire between them. Plain Rust: no proxy-wasm, no I/O.
//!
//! The control plane calls the checks of `stored` (re-exported here) on what it stores; the
//! filter reads configs and guardrails with the very same parsers.

pub mod cache;
pub mod cloud;
pub mod config;
pub mod credential;
pub mod errors;
pub mod guardrails;
pub mod json_check;
pub mod limits;
pub mod mcp_servers;
pub mod memo;
pub mod prices;
pub mod prompts;
pub mod query;
pub mod stored;
pub mod upstream;
pub mod value_check;
pub mod wire_names;

pub use errors::SharedError;
pub use prompts::{apply_to_chat, render};
pub use stored::{check_config, check_guardrail, check_provider, config_nested_too_deep, nested_too_deep};
pub use wire_names::{
    control_plane_fetch_marker, CLIENT_AUTHORIZATION_HEADER, CONTROL_PLANE_FETCH_HEADER, WORKSPACE_HEADER,
};

/// The one mark of a unit test, as in the filter: every test module imports it (`use
/// crate::unit_tests::test;`) so that its `#[test]`s run natively and again inside wasm
/// (32-bit) under wasm-bindgen-test (build.sh's `wasm_unit_tests`).
#[cfg(test)]
mod unit_tests {
    #[cfg(not(target_arch = "wasm32"))]
    pub use std::prelude::v1::test;
    #[cfg(target_arch = "wasm32")]
    pub use wasm_bindgen_test::wasm_bindgen_test as test;
}
