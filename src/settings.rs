//! The plugin configuration Envoy hands the filter (`configuration` of the wasm filter):
//! gateway keys, the custom-host allow-list, stored provider credentials and cluster names.

use crate::errors::GatewayError;
use hashbrown::HashMap;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Accepted `x-gateway-api-key` values; each key is its own tenant.
    pub api_keys: Vec<String>,
    /// Hosts a `custom_host` may name. `loopback` stands for 127.0.0.0/8, ::1 and
    /// localhost; `*.example.com` matches subdomains; `*` allows any host.
    #[serde(default = "default_allowed_custom_hosts")]
    pub allowed_custom_hosts: Vec<String>,
    /// Stored provider credentials, by `@slug` (without the `@`) or virtual key.
    #[serde(default)]
    pub credentials: HashMap<String, Credential>,
    /// Envoy clusters that reach any host over TLS and over plain HTTP.
    #[serde(default = "default_tls_cluster")]
    pub tls_cluster: String,
    #[serde(default = "default_plain_cluster")]
    pub plain_cluster: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub provider: String,
    #[serde(default)]
    pub api_key: Option<String>,
    #[serde(default)]
    pub custom_host: Option<String>,
    #[serde(default)]
    pub vendor_organization: Option<String>,
    #[serde(default)]
    pub vendor_project: Option<String>,
}

fn default_allowed_custom_hosts() -> Vec<String> {
    vec!["loopback".to_string()]
}

fn default_tls_cluster() -> String {
    "gateway_upstream_tls".to_string()
}

fn default_plain_cluster() -> String {
    "gateway_upstream_plain".to_string()
}

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        let settings: Settings =
            serde_json::from_slice(bytes).map_err(|e| format!("invalid plugin configuration: {e}"))?;
        if settings.api_keys.iter().any(|k| k.is_empty()) {
            return Err("invalid plugin configuration: api_keys must not contain empty keys".into());
        }
        Ok(settings)
    }

    /// Constant-time check of a gateway key: every configured key is compared in full, so
    /// the time taken says nothing about which key or how many bytes matched.
    pub fn authenticate(&self, presented: &str) -> bool {
        let mut matched = false;
        for key in &self.api_keys {
            matched |= constant_time_eq(key.as_bytes(), presented.as_bytes());
        }
        matched
    }

    /// Whether a custom host may be reached; `host` is lowercase, IPv6 without brackets.
    pub fn custom_host_allowed(&self, host: &str) -> bool {
        self.allowed_custom_hosts.iter().any(|rule| host_matches(rule, host))
    }

    pub fn credential(&self, name: &str) -> Result<&Credential, GatewayError> {
        self.credentials.get(name).ok_or_else(|| {
            GatewayError::new(401, "authentication_error", format!("unknown provider credential '{name}'"))
                .with_code("unknown_credential")
        })
    }
}

fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut diff = (expected.len() ^ presented.len()) as u64;
    for (i, byte) in expected.iter().enumerate() {
        // Compare against the presented byte at the same place, or a mismatch when it is
        // shorter; the loop length depends only on the configured key.
        let other = presented.get(i).copied().unwrap_or(!byte);
        diff |= u64::from(byte ^ other);
    }
    diff == 0
}

fn host_matches(rule: &str, host: &str) -> bool {
    let rule = rule.trim().to_ascii_lowercase();
    match rule.as_str() {
        "*" => true,
        "loopback" => is_loopback(host),
        _ => match rule.strip_prefix("*.") {
            Some(domain) => host.len() > domain.len() + 1 && host.ends_with(&format!(".{domain}")),
            None => rule == host,
        },
    }
}

fn is_loopback(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") || host == "::1" {
        return true;
    }
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    // The same tests run inside wasm (32-bit) under wasm-bindgen-test.
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    use super::*;

    fn settings(json: &str) -> Settings {
        Settings::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn authenticates_only_configured_keys() {
        let s = settings(r#"{"api_keys": ["gw-one", "gw-two"]}"#);
        assert!(s.authenticate("gw-one"));
        assert!(s.authenticate("gw-two"));
        assert!(!s.authenticate("gw-on"));
        assert!(!s.authenticate("gw-one-more"));
        assert!(!s.authenticate(""));
    }

    #[test]
    fn loopback_is_allowed_by_default_and_nothing_else() {
        let s = settings(r#"{"api_keys": ["k"]}"#);
        for host in ["127.0.0.1", "127.9.9.9", "localhost", "::1"] {
            assert!(s.custom_host_allowed(host), "{host}");
        }
        for host in ["10.0.0.1", "example.com", "169.254.169.254", "localhost.evil.com"] {
            assert!(!s.custom_host_allowed(host), "{host}");
        }
    }

    #[test]
    fn allow_list_rules() {
        let s = settings(r#"{"api_keys": ["k"], "allowed_custom_hosts": ["models.internal", "*.corp.example"]}"#);
        assert!(s.custom_host_allowed("models.internal"));
        assert!(s.custom_host_allowed("a.corp.example"));
        assert!(!s.custom_host_allowed("corp.example"));
        assert!(!s.custom_host_allowed("127.0.0.1"));
    }

    #[test]
    fn rejects_unknown_fields_and_empty_keys() {
        assert!(Settings::parse(br#"{"api_keys": ["k"], "bogus": 1}"#).is_err());
        assert!(Settings::parse(br#"{"api_keys": [""]}"#).is_err());
        assert!(Settings::parse(b"not json").is_err());
    }
}
