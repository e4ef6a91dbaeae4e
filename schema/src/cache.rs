//! A config's `cache` (spec 2.4): its mode and how long an answer is kept, and how it is read.

use crate::value_check::{integer, one_of, ConfigError, Obj};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    pub mode: CacheMode,
    /// Seconds.
    pub max_age: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    Simple,
    Semantic,
}

impl CacheMode {
    const ALL: [CacheMode; 2] = [Self::Simple, Self::Semantic];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Simple => "simple",
            Self::Semantic => "semantic",
        }
    }
}

/// `cache`: `{"mode": "simple" | "semantic", "max_age": <seconds>}`.
pub fn cache_config(v: &Value, path: &str) -> Result<CacheConfig, ConfigError> {
    let obj = Obj::new(v, path, &["mode", "max_age"])?;
    Ok(CacheConfig {
        mode: obj.req("mode", |v, p| one_of(v, p, &CacheMode::ALL, CacheMode::as_str))?,
        max_age: obj.opt("max_age", |v, p| integer(v, p, 1, u64::MAX))?,
    })
}
