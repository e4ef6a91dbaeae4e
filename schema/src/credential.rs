//! A stored provider (a credential): written and checked as a config target that names a
//! provider.

use crate::cloud::CloudFields;
use crate::config::parse_config;
use crate::json_check::shorten;
use crate::value_check::ConfigError;
use serde::Deserialize;
use serde_json::Value;

/// The providers the filter ships (its registry, `providers::PROVIDERS`, names exactly these, in
/// this order: a unit test of the filter holds them together).
pub const PROVIDER_NAMES: &[&str] = &[
    "openai",
    "anthropic",
    "azure-openai",
    "azure-ai",
    "google",
    "vertex-ai",
    "bedrock",
    "openai-compatible",
    "groq",
    "mistral-ai",
    "together-ai",
    "deepseek",
    "fireworks-ai",
    "openrouter",
    "perplexity-ai",
    "x-ai",
    "cerebras",
    "deepinfra",
    "ollama",
    "vllm",
];

/// A stored provider: its name, key, custom host, vendor ids and cloud fields, written and
/// checked as a config target that names a provider (so the same errors, JSON paths included).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(try_from = "Value")]
pub struct Credential {
    pub provider: String,
    pub api_key: Option<String>,
    pub custom_host: Option<String>,
    pub vendor_organization: Option<String>,
    pub vendor_project: Option<String>,
    pub cloud: CloudFields,
}

impl TryFrom<Value> for Credential {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        Credential::parse(&value).map_err(|e| e.to_string())
    }
}

impl Credential {
    /// Reads a stored credential; the error names the field at fault (its JSON path).
    pub fn parse(value: &Value) -> Result<Credential, ConfigError> {
        const OWN_KEYS: [&str; 5] = ["provider", "api_key", "custom_host", "vendor_organization", "vendor_project"];
        let known = |key: &str| OWN_KEYS.contains(&key) || CloudFields::KEYS.contains(&key);
        if let Some(key) = value.as_object().and_then(|fields| fields.keys().find(|key| !known(key))) {
            let key = shorten(key);
            return Err(ConfigError::new(key.clone(), format!("unknown field `{key}` in a stored credential")));
        }
        if value.as_object().is_some_and(|fields| !fields.contains_key("provider")) {
            return Err(ConfigError::new("provider", "a stored credential needs `provider`, a provider name"));
        }
        let config = parse_config(value)?;
        let provider = config
            .provider
            .filter(|name| !name.starts_with('@'))
            .ok_or_else(|| ConfigError::new("provider", "a stored credential needs `provider`, a provider name"))?;
        // Checked when it is stored, not when a request first uses it.
        if !PROVIDER_NAMES.contains(&provider.as_str()) {
            return Err(ConfigError::new(
                "provider",
                format!("unknown provider '{}'; known providers: {}", shorten(&provider), PROVIDER_NAMES.join(", ")),
            ));
        }
        Ok(Credential {
            provider,
            api_key: config.api_key,
            custom_host: config.custom_host,
            vendor_organization: config.vendor_organization,
            vendor_project: config.vendor_project,
            cloud: config.cloud,
        })
    }
}
