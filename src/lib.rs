//! Model gateway: an OpenAI-compatible gateway as an Envoy proxy-wasm filter.
//!
//! Everything except `host` is plain Rust that knows nothing of proxy-wasm and is tested
//! natively; `host` is the thin adapter that owns every host call.

// Only the adapter uses the core, so without it (a plain native build) everything looks
// unused; clippy compiles the adapter too, and its dead-code warnings are the gate.
#![cfg_attr(not(any(target_os = "wasi", clippy)), allow(dead_code, unused_imports))]

mod cache;
mod catalog;
mod client_api;
mod entropy;
// The metrics, the shipped config's stats_tags and the metrics table of docs/observability.md, tied.
#[cfg(test)]
mod envoy_stats_tags;
mod exchange;
// Fuzz entry points (`./build.sh fuzz`), compiled with the unit tests too, which run them on fixed inputs.
#[cfg(any(test, fuzzing))]
pub mod fuzz;
mod guardrails;
mod hash;
mod mcp;
mod percent;
mod pipeline;
mod ports;
mod providers;
mod request;
mod routing;
mod settings;
mod stream;
mod usage_limits;

// What the control plane reads too lives in the shared crate; the filter names it as its own.
use gateway_schema::{cloud, config, credential, errors, json_check, memo, prompts, query, upstream, wire_names};

/// The one mark of a unit test: every test module imports it (`use crate::unit_tests::test;`)
/// so that its `#[test]`s run natively and again inside wasm (32-bit) under wasm-bindgen-test
/// (build.sh's `wasm_unit_tests`).
#[cfg(test)]
mod unit_tests {
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) use std::prelude::v1::test;
    #[cfg(target_arch = "wasm32")]
    pub(crate) use wasm_bindgen_test::wasm_bindgen_test as test;
}

// Checked by native clippy too, though only the wasm build runs it.
#[cfg(any(target_os = "wasi", clippy))]
mod host;

// The same core as an Envoy dynamic module (issue 29).
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
mod native;

// The host layer's byte formats are pure: natively they are compiled for their tests alone.
#[cfg(all(test, not(any(target_os = "wasi", clippy))))]
#[path = "host/wire.rs"]
mod wire;
