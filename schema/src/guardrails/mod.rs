//! Guardrails and hooks as a config or a stored guardrail gives them (`spec`), and their
//! checks' parameters (`params`); the filter runs them.

pub mod params;
pub mod spec;
