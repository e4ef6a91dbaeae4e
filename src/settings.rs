//! The plugin configuration Envoy hands the filter (`configuration` of the wasm filter):
//! gateway keys, the custom-host allow-list, stored provider credentials and cluster names.

use crate::cache::store::Layout;
use crate::credential::Credential;
use crate::errors::GatewayError;
use crate::mcp::Servers;
use crate::upstream::Upstream;
use hashbrown::HashMap;
use serde::Deserialize;
use subtle::ConstantTimeEq;

/// Envoy routes on this header to the cluster that reaches the provider (the default
/// `upstream.route_header`).
pub(crate) const CLUSTER_HEADER: &str = "x-gateway-upstream-cluster";

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settings {
    /// Accepted `x-gateway-api-key` values; each key is its own tenant. With a control plane
    /// its keys are accepted too, so this may be empty.
    #[serde(default)]
    pub(crate) api_keys: Vec<String>,
    /// Hosts a `custom_host` may name. `loopback` stands for 127.0.0.0/8, ::1 and
    /// localhost; `*.example.com` matches subdomains; `*` allows any host.
    #[serde(default = "default_allowed_custom_hosts")]
    pub(crate) allowed_custom_hosts: Vec<String>,
    /// Stored provider credentials, by `@slug` (without the `@`) or virtual key.
    #[serde(default)]
    pub(crate) credentials: HashMap<String, Credential>,
    /// Envoy clusters that reach any host over TLS and over plain HTTP.
    #[serde(default = "default_tls_cluster")]
    pub(crate) tls_cluster: String,
    #[serde(default = "default_plain_cluster")]
    pub(crate) plain_cluster: String,
    /// The cluster that carries dispatched calls (retries, fallback) to an internal listener
    /// whose router reaches the two clusters above, resolving new hosts on the way.
    #[serde(default = "default_recovery_cluster")]
    pub(crate) recovery_cluster: String,
    /// In a host Envoy the gateway did not configure (a service mesh, an API gateway): the
    /// clusters its control plane names per provider host, which replace the three above.
    #[serde(default)]
    pub(crate) upstream: Option<HostClusters>,
    /// The response cache's memory and its embeddings provider.
    #[serde(default)]
    pub(crate) cache: CacheSettings,
    /// Bounds on the metrics' labels.
    #[serde(default)]
    pub(crate) metrics: MetricsSettings,
    /// Where saved configs, stored providers and guardrails and gateway keys are read from;
    /// without it only the plugin configuration's keys and credentials exist.
    #[serde(default)]
    pub(crate) control_plane: Option<ControlPlaneSettings>,
    /// The request records shipped to the control plane.
    #[serde(default)]
    pub(crate) records: RecordsSettings,
    /// This instance of the filter only reads the control-plane entries a request needs (its
    /// key, saved config, stored providers) before the main instance sees it, and never answers,
    /// changes or records a request. Envoy holds a request its headers paused with flow control
    /// here (no `allow_on_headers_stop_iteration`), so a large upload waits for the read
    /// instead of filling Envoy's buffer (413).
    #[serde(default)]
    pub(crate) lookup_gate: bool,
    /// MCP servers behind `/mcp/{server}`, by id (docs/mcp.md).
    #[serde(default, deserialize_with = "crate::mcp::deserialize_servers")]
    pub(crate) mcp_servers: Servers,
    /// Browser origins (`scheme://host[:port]`) whose pages may call the MCP endpoints, besides
    /// the gateway's own pages on loopback names (docs/mcp.md); normalized once.
    #[serde(default, deserialize_with = "deserialize_origins")]
    pub(crate) mcp_allowed_origins: Vec<String>,
    /// The MCP endpoints as an OAuth resource server: access tokens of this issuer are taken
    /// besides gateway keys (docs/mcp.md).
    #[serde(default, deserialize_with = "crate::mcp::oauth::deserialize")]
    pub(crate) mcp_oauth: Option<crate::mcp::oauth::OAuth>,
    /// The key that seals the servers' sessions in the aggregate's session ids (32 bytes,
    /// base64), the same on every replica (docs/mcp.md); none: a key of this Envoy's own.
    #[serde(default, deserialize_with = "crate::mcp::sealed::deserialize")]
    pub(crate) mcp_session_key: Option<crate::mcp::sealed::SessionKey>,
}

fn deserialize_origins<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let texts = Vec::<String>::deserialize(deserializer)?;
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            crate::mcp::normalized_origin(text).ok_or_else(|| {
                let shown: String = text.chars().take(80).collect();
                serde::de::Error::custom(format!(
                    "mcp_allowed_origins[{i}]: '{shown}' is not an origin (scheme://host[:port])"
                ))
            })
        })
        .collect()
}

/// A host's clusters, one per provider host: the routed request names its cluster in
/// `route_header` (a route of the host's that matches it picks the cluster), and dispatched
/// calls (retries, fallback, token endpoints) go to it directly. TLS is the cluster's business.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostClusters {
    /// The cluster name of a host: `{host}` and `{port}` stand for the target's (Istio:
    /// `outbound|{port}||{host}`).
    cluster: ClusterTemplate,
    #[serde(default = "default_route_header")]
    route_header: String,
}

impl HostClusters {
    /// The cluster of `upstream`'s host.
    pub(crate) fn cluster(&self, upstream: &Upstream) -> String {
        self.cluster.render(&upstream.host, upstream.port())
    }
}

/// A cluster name with `{host}` and `{port}` in it, split once where they stand.
#[derive(Debug, Clone, PartialEq)]
struct ClusterTemplate(Vec<TemplatePart>);

#[derive(Debug, Clone, PartialEq)]
enum TemplatePart {
    Text(String),
    Host,
    Port,
}

impl ClusterTemplate {
    fn parse(template: &str) -> Result<ClusterTemplate, String> {
        let invalid = |why: &str| Err(format!("invalid plugin configuration: upstream.cluster {why}"));
        if template.is_empty() || template.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return invalid("must be a non-empty name without whitespace");
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find(['{', '}']) {
            let (text, from) = rest.split_at(open);
            if !text.is_empty() {
                parts.push(TemplatePart::Text(text.to_string()));
            }
            let (part, after) = if let Some(after) = from.strip_prefix("{host}") {
                (TemplatePart::Host, after)
            } else if let Some(after) = from.strip_prefix("{port}") {
                (TemplatePart::Port, after)
            } else {
                return invalid("may hold only {host} and {port} in braces");
            };
            parts.push(part);
            rest = after;
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Text(rest.to_string()));
        }
        Ok(ClusterTemplate(parts))
    }

    fn render(&self, host: &str, port: u16) -> String {
        let mut name = String::new();
        for part in &self.0 {
            match part {
                TemplatePart::Text(text) => name.push_str(text),
                TemplatePart::Host => name.push_str(host),
                TemplatePart::Port => name.push_str(&port.to_string()),
            }
        }
        name
    }
}

impl<'de> Deserialize<'de> for ClusterTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let template = String::deserialize(deserializer)?;
        ClusterTemplate::parse(&template).map_err(serde::de::Error::custom)
    }
}

fn default_route_header() -> String {
    CLUSTER_HEADER.to_string()
}

/// How request records wait for the control plane and what they carry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordsSettings {
    /// At most this many records wait per worker (past it they are dropped and counted).
    #[serde(default = "default_max_queued")]
    pub(crate) max_queued: usize,
    /// Request and response bodies go with the shipped record (never to the access log).
    #[serde(default)]
    pub(crate) bodies: bool,
    /// Each body is cut to this many bytes (at a UTF-8 boundary).
    #[serde(default = "default_max_body_bytes")]
    pub(crate) max_body_bytes: usize,
}

impl Default for RecordsSettings {
    fn default() -> Self {
        RecordsSettings { max_queued: default_max_queued(), bodies: false, max_body_bytes: default_max_body_bytes() }
    }
}

/// Bounds of `records`: a record with both bodies stays under the control plane's 64 KiB.
const MAX_QUEUED_BOUND: usize = 10_000;
const MAX_BODY_BYTES_BOUND: usize = 32 << 10;

fn default_max_queued() -> usize {
    2000
}

fn default_max_body_bytes() -> usize {
    16 << 10
}

impl RecordsSettings {
    fn check(&self) -> Result<(), String> {
        let invalid = |what: &str| Err(format!("invalid plugin configuration: records.{what}"));
        if !(1..=MAX_QUEUED_BOUND).contains(&self.max_queued) {
            return invalid("max_queued must be between 1 and 10000");
        }
        if !(1..=MAX_BODY_BYTES_BOUND).contains(&self.max_body_bytes) {
            return invalid("max_body_bytes must be between 1 and 32768");
        }
        Ok(())
    }
}

/// The control plane the filter reads from (dispatched calls to its internal endpoints).
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ControlPlaneSettings {
    /// The Envoy cluster that reaches the control plane.
    pub(crate) cluster: String,
    /// `:authority` of the calls.
    pub(crate) authority: String,
    /// The bearer token of the internal endpoints (a secret: never logged).
    pub(crate) token: String,
    /// What was read is used without asking again for this long.
    #[serde(default = "default_fresh_ms")]
    pub(crate) fresh_ms: u64,
    /// When the control plane cannot answer, what was read is used for this long after it
    /// was read.
    #[serde(default = "default_grace_ms")]
    pub(crate) grace_ms: u64,
    /// Each call's timeout.
    #[serde(default = "default_cp_timeout_ms")]
    pub(crate) timeout_ms: u64,
}

/// The token never shows in a debug print.
impl std::fmt::Debug for ControlPlaneSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlaneSettings")
            .field("cluster", &self.cluster)
            .field("authority", &self.authority)
            .field("fresh_ms", &self.fresh_ms)
            .field("grace_ms", &self.grace_ms)
            .field("timeout_ms", &self.timeout_ms)
            .finish_non_exhaustive()
    }
}

fn default_fresh_ms() -> u64 {
    5000
}

fn default_grace_ms() -> u64 {
    600_000
}

fn default_cp_timeout_ms() -> u64 {
    3000
}

/// How many distinct `model` label values the metrics may carry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetricsSettings {
    /// The models that get a label of their own; any other is `other`. Without a list, the
    /// first `max_models` distinct models a worker sees get one.
    #[serde(default)]
    pub(crate) models: Option<Vec<String>>,
    #[serde(default = "default_max_models")]
    pub(crate) max_models: usize,
    /// For streams from OpenAI-shaped providers whose client did not ask for usage: ask for
    /// it (`stream_options.include_usage`), count it, and strip it from the client's stream.
    /// On unless turned off (for a server that refuses `stream_options`).
    #[serde(default = "asks_stream_usage")]
    pub(crate) stream_usage: bool,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings { models: None, max_models: default_max_models(), stream_usage: asks_stream_usage() }
    }
}

fn default_max_models() -> usize {
    50
}

fn asks_stream_usage() -> bool {
    true
}

/// Where the response cache may keep answers (shared data) and how semantic mode embeds.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct CacheSettings {
    /// Bytes of values the cache may hold in shared data, index included.
    #[serde(default = "default_byte_budget")]
    pub(crate) byte_budget: u64,
    /// Larger entries (request key plus answer) are not cached.
    #[serde(default = "default_max_entry_bytes")]
    pub(crate) max_entry_bytes: u64,
    /// The embeddings provider of semantic mode; without it semantic mode matches exactly.
    #[serde(default)]
    pub(crate) semantic: Option<SemanticSettings>,
    /// How the byte budget is cut into shared-data keys, computed once when the settings load.
    #[serde(skip)]
    pub(crate) layout: Layout,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SemanticSettings {
    /// An OpenAI-compatible API base URL; the gateway posts to `<base_url>/embeddings`.
    pub(crate) base_url: String,
    #[serde(default)]
    pub(crate) api_key: Option<String>,
    pub(crate) model: String,
    /// The cosine similarity from which a stored conversation answers a new one.
    #[serde(default = "default_threshold")]
    pub(crate) threshold: f32,
    /// How long a lookup waits for the embedding before matching exactly.
    #[serde(default = "default_embedding_timeout_ms")]
    pub(crate) timeout_ms: u64,
    #[serde(skip)]
    pub(crate) upstream: Option<Upstream>,
}

impl Default for CacheSettings {
    fn default() -> Self {
        let (byte_budget, max_entry_bytes) = (default_byte_budget(), default_max_entry_bytes());
        let layout = Layout::new(byte_budget, max_entry_bytes, false);
        CacheSettings { byte_budget, max_entry_bytes, semantic: None, layout }
    }
}

/// 32 MiB: thousands of typical answers (1-4 KB each) in a sidecar-sized footprint.
fn default_byte_budget() -> u64 {
    32 << 20
}

/// 512 KiB: far above a typical answer, small enough that one entry is a small share.
fn default_max_entry_bytes() -> u64 {
    512 << 10
}

/// 0.95: with OpenAI's text-embedding-3 models, rewordings of one question score about
/// 0.95-0.99 while different questions on the same topic mostly stay below 0.9; a wrong
/// answer costs more than a miss, so the default leans to precision.
fn default_threshold() -> f32 {
    0.95
}

fn default_embedding_timeout_ms() -> u64 {
    3000
}

const MIN_BYTE_BUDGET: u64 = 1 << 20;
const MIN_ENTRY_BYTES: u64 = 4096;

/// No keys: every request is refused until a configuration loads.
impl Default for Settings {
    fn default() -> Self {
        Settings {
            api_keys: Vec::new(),
            allowed_custom_hosts: default_allowed_custom_hosts(),
            credentials: HashMap::new(),
            tls_cluster: default_tls_cluster(),
            plain_cluster: default_plain_cluster(),
            recovery_cluster: default_recovery_cluster(),
            upstream: None,
            cache: CacheSettings::default(),
            metrics: MetricsSettings::default(),
            control_plane: None,
            records: RecordsSettings::default(),
            lookup_gate: false,
            mcp_servers: Servers::default(),
            mcp_allowed_origins: Vec::new(),
            mcp_oauth: None,
            mcp_session_key: None,
        }
    }
}

fn default_allowed_custom_hosts() -> Vec<String> {
    vec!["loopback".to_string()]
}

fn default_tls_cluster() -> String {
    "gateway_upstream_tls".to_string()
}

fn default_recovery_cluster() -> String {
    "gateway_recovery".into()
}

fn default_plain_cluster() -> String {
    "gateway_upstream_plain".to_string()
}

impl Settings {
    /// Parses and normalises the plugin configuration. Errors never quote values: the
    /// configuration holds keys, and serde's messages would echo them into Envoy's log.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Settings, String> {
        let mut settings: Settings = serde_json::from_slice(bytes).map_err(|e| {
            let message = e.to_string();
            // serde's words on a value's type, value, length or variant quote the value, which
            // may be a key: those are told by position only.
            const QUOTING: [&str; 4] = ["invalid type", "invalid value", "invalid length", "unknown variant"];
            if QUOTING.iter().any(|p| message.starts_with(p)) {
                format!(
                    "invalid plugin configuration ({:?} error at line {} column {})",
                    e.classify(),
                    e.line(),
                    e.column()
                )
            } else {
                format!("invalid plugin configuration ({message})")
            }
        })?;
        if settings.api_keys.is_empty() && settings.control_plane.is_none() {
            return Err("invalid plugin configuration: api_keys is empty and there is no control_plane, \
                        so no gateway key could be accepted"
                .into());
        }
        if settings.api_keys.iter().any(|k| k.is_empty()) {
            return Err("invalid plugin configuration: api_keys must not contain empty keys".into());
        }
        for rule in &mut settings.allowed_custom_hosts {
            *rule = rule.trim().to_ascii_lowercase();
            let domain_ok = |d: &str| !d.is_empty() && !d.starts_with('.') && !d.contains('*');
            let valid = match rule.strip_prefix("*.") {
                Some(domain) => domain_ok(domain),
                None => rule == "*" || domain_ok(rule),
            };
            if !valid {
                return Err(format!("invalid plugin configuration: allowed_custom_hosts rule '{rule}'"));
            }
        }
        for (id, server) in settings.mcp_servers.iter() {
            if !settings.custom_host_allowed(&server.upstream.host) {
                return Err(format!(
                    "invalid plugin configuration: mcp_servers.{id}.url: host '{}' is not in allowed_custom_hosts",
                    server.upstream.host
                ));
            }
        }
        if let Some(oauth) = &settings.mcp_oauth {
            if !settings.custom_host_allowed(&oauth.jwks.host) {
                return Err(format!(
                    "invalid plugin configuration: mcp_oauth.jwks_uri: host '{}' is not in allowed_custom_hosts",
                    oauth.jwks.host
                ));
            }
        }
        settings.cache.check()?;
        settings.records.check()?;
        if let Some(upstream) = &mut settings.upstream {
            upstream.route_header = upstream.route_header.to_ascii_lowercase();
            let token = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_';
            if upstream.route_header.is_empty() || !upstream.route_header.bytes().all(token) {
                return Err("invalid plugin configuration: upstream.route_header must be a header name".into());
            }
        }
        if let Some(cp) = &settings.control_plane {
            let invalid = |what: &str| Err(format!("invalid plugin configuration: control_plane.{what}"));
            if cp.cluster.is_empty() || cp.authority.is_empty() {
                return invalid("cluster and authority must not be empty");
            }
            if cp.token.is_empty() || cp.token.contains(['\r', '\n']) {
                return invalid("token must be a non-empty single line");
            }
            if !(1..=60_000).contains(&cp.timeout_ms) {
                return invalid("timeout_ms must be between 1 and 60000");
            }
            if cp.fresh_ms == 0 || cp.grace_ms < cp.fresh_ms {
                return invalid("fresh_ms must be above 0 and grace_ms at least fresh_ms");
            }
        }
        Ok(settings)
    }

    /// The request header that names the routed request's cluster to the host's routes.
    pub(crate) fn route_header(&self) -> &str {
        self.upstream.as_ref().map_or(CLUSTER_HEADER, |u| u.route_header.as_str())
    }

    /// The cluster the routed request to `upstream` goes to.
    pub(crate) fn routed_cluster(&self, upstream: &Upstream) -> String {
        match &self.upstream {
            Some(host) => host.cluster(upstream),
            None if upstream.tls => self.tls_cluster.clone(),
            None => self.plain_cluster.clone(),
        }
    }

    /// Where a dispatched call to `upstream` goes: the cluster, and the route header its
    /// router reads (the recovery listener's; none when the call goes to the host's cluster).
    pub(crate) fn dispatch_cluster(&self, upstream: &Upstream) -> (String, Option<(&str, String)>) {
        match &self.upstream {
            Some(host) => (host.cluster(upstream), None),
            None => (self.recovery_cluster.clone(), Some((CLUSTER_HEADER, self.routed_cluster(upstream)))),
        }
    }

    /// Constant-time check of a gateway key: every configured key is compared in full, so
    /// the time taken says nothing about which key or how many bytes matched.
    pub(crate) fn authenticate(&self, presented: &[u8]) -> bool {
        let mut matched = false;
        for key in &self.api_keys {
            // subtle: no early exit on a differing byte (only the lengths may tell).
            matched |= bool::from(key.as_bytes().ct_eq(presented));
        }
        matched
    }

    /// Whether a custom host may be reached; `host` is lowercase, IPv6 without brackets.
    pub(crate) fn custom_host_allowed(&self, host: &str) -> bool {
        self.allowed_custom_hosts.iter().any(|rule| host_matches(rule, host))
    }

    /// A 403 unless `host` may be reached; `what` names the host in the message (e.g.
    /// "custom host").
    pub(crate) fn require_allowed(&self, what: &str, host: &str) -> Result<(), GatewayError> {
        if self.custom_host_allowed(host) {
            return Ok(());
        }
        Err(GatewayError::new(403, "permission_error", format!("{what} '{host}' is not in this gateway's allow-list"))
            .with_code("custom_host_not_allowed"))
    }

    /// A stored credential by slug or virtual key. The error does not echo the name: a
    /// virtual key is itself a secret.
    pub(crate) fn credential(&self, name: &str) -> Result<&Credential, GatewayError> {
        self.credentials.get(name).ok_or_else(|| {
            GatewayError::new(401, "authentication_error", "unknown virtual key or provider slug")
                .with_code("unknown_credential")
        })
    }
}

impl CacheSettings {
    fn check(&mut self) -> Result<(), String> {
        let invalid = |what: &str| Err(format!("invalid plugin configuration: cache.{what}"));
        if self.byte_budget < MIN_BYTE_BUDGET {
            return invalid("byte_budget must be at least 1048576");
        }
        if self.max_entry_bytes < MIN_ENTRY_BYTES || self.max_entry_bytes > self.byte_budget / 4 {
            return invalid("max_entry_bytes must be at least 4096 and at most a quarter of byte_budget");
        }
        self.layout = Layout::new(self.byte_budget, self.max_entry_bytes, self.semantic.is_some());
        let Some(semantic) = &mut self.semantic else {
            return Ok(());
        };
        match Upstream::parse(&semantic.base_url) {
            Ok(upstream) => semantic.upstream = Some(upstream),
            Err(why) => return invalid(&format!("semantic.base_url {why}")),
        }
        if !(semantic.threshold > 0.0 && semantic.threshold <= 1.0) {
            return invalid("semantic.threshold must be above 0 and at most 1");
        }
        if !(1..=60_000).contains(&semantic.timeout_ms) {
            return invalid("semantic.timeout_ms must be between 1 and 60000");
        }
        if semantic.model.is_empty() {
            return invalid("semantic.model must not be empty");
        }
        Ok(())
    }
}

/// `rule` is normalised by `Settings::parse`.
fn host_matches(rule: &str, host: &str) -> bool {
    match rule {
        "*" => true,
        "loopback" => is_loopback(host),
        _ => match rule.strip_prefix("*.") {
            Some(domain) => host.strip_suffix(domain).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => rule == host,
        },
    }
}

/// Loopback by address, not by DNS: `localhost` itself and IP literals only (Envoy's
/// resolver is not bound to map `*.localhost` to 127.0.0.1).
fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn settings(json: &str) -> Settings {
        Settings::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn host_clusters_name_each_provider_host_by_the_hosts_convention() {
        let openai = Upstream::parse("https://api.openai.com/v1").unwrap();
        let local = Upstream::parse("http://127.0.0.1:9000").unwrap();
        let mesh = settings(r#"{"api_keys": ["k"], "upstream": {"cluster": "outbound|{port}||{host}"}}"#);
        assert_eq!(mesh.routed_cluster(&openai), "outbound|443||api.openai.com");
        assert_eq!(mesh.route_header(), "x-gateway-upstream-cluster");
        // Dispatched calls go straight to the host's cluster, with no route header.
        assert_eq!(mesh.dispatch_cluster(&local), ("outbound|9000||127.0.0.1".to_string(), None));
        let named = settings(
            r#"{"api_keys": ["k"], "upstream": {"cluster": "{host}_{port}_{host}", "route_header": "X-Route"}}"#,
        );
        assert_eq!(
            (named.routed_cluster(&local).as_str(), named.route_header()),
            ("127.0.0.1_9000_127.0.0.1", "x-route")
        );
        // Without `upstream`: the forward-proxy clusters, dispatched calls through the recovery listener.
        let plain = settings(r#"{"api_keys": ["k"]}"#);
        assert_eq!(plain.routed_cluster(&openai), "gateway_upstream_tls");
        let route = Some(("x-gateway-upstream-cluster", "gateway_upstream_plain".to_string()));
        assert_eq!(plain.dispatch_cluster(&local), ("gateway_recovery".to_string(), route));
        for bad in [r#""{hostname}""#, r#""a{""#, r#""}""#, r#""""#, r#""a b""#] {
            let json = format!(r#"{{"api_keys": ["k"], "upstream": {{"cluster": {bad}}}}}"#);
            assert!(Settings::parse(json.as_bytes()).is_err(), "{bad}");
        }
        let bad_header = r#"{"api_keys": ["k"], "upstream": {"cluster": "c", "route_header": "x route"}}"#;
        assert!(Settings::parse(bad_header.as_bytes()).is_err());
    }

    #[test]
    fn a_bad_configuration_is_named_without_quoting_its_values() {
        let error = |json: &str| Settings::parse(json.as_bytes()).unwrap_err();
        let template = error(r#"{"api_keys": ["k"], "upstream": {"cluster": "{hostname}"}}"#);
        assert!(template.contains("upstream.cluster may hold only {host} and {port}"), "{template}");
        assert!(error(r#"{"api_keys": ["k"], "bogus": 1}"#).contains("unknown field `bogus`"));
        let secret = error(r#"{"api_keys": "sk-secret"}"#);
        assert!(!secret.contains("sk-secret") && secret.contains("line 1 column 24"), "{secret}");
        let keyless = error("{}");
        assert!(keyless.contains("api_keys is empty and there is no control_plane"), "{keyless}");
        let cp = r#"{"control_plane": {"cluster": "cp", "authority": "cp:1", "token": "t"}}"#;
        assert!(Settings::parse(cp.as_bytes()).is_ok_and(|s| s.api_keys.is_empty()), "the control plane's keys serve");
    }

    #[test]
    fn authenticates_only_configured_keys() {
        let s = settings(r#"{"api_keys": ["gw-one", "gw-two"]}"#);
        assert!(s.authenticate(b"gw-one"));
        assert!(s.authenticate(b"gw-two"));
        assert!(!s.authenticate(b"gw-on"));
        assert!(!s.authenticate(b"gw-one-more"));
        assert!(!s.authenticate(b""));
        assert!(!s.authenticate(b"gw-one\xff"));
    }

    #[test]
    fn loopback_is_allowed_by_default_and_nothing_else() {
        let s = settings(r#"{"api_keys": ["k"]}"#);
        for host in ["127.0.0.1", "127.9.9.9", "localhost", "::1"] {
            assert!(s.custom_host_allowed(host), "{host}");
        }
        for host in ["10.0.0.1", "example.com", "169.254.169.254", "localhost.evil.com", "a.localhost", "0.0.0.0"] {
            assert!(!s.custom_host_allowed(host), "{host}");
        }
    }

    #[test]
    fn allow_list_rules() {
        let s = settings(r#"{"api_keys": ["k"], "allowed_custom_hosts": [" Models.Internal ", "*.corp.example"]}"#);
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
        for rule in ["*.", "", "a.*.b", ".corp"] {
            let config = format!(r#"{{"api_keys": ["k"], "allowed_custom_hosts": ["{rule}"]}}"#);
            assert!(Settings::parse(config.as_bytes()).is_err(), "{rule}");
        }
    }

    #[test]
    fn cache_settings_have_defaults_and_limits() {
        let s = settings(r#"{"api_keys": ["k"]}"#);
        assert_eq!((s.cache.byte_budget, s.cache.max_entry_bytes, s.cache.semantic), (32 << 20, 512 << 10, None));
        let s = settings(
            r#"{"api_keys": ["k"], "cache": {"semantic": {"base_url": "http://127.0.0.1:9/v1", "model": "e"}}}"#,
        );
        let semantic = s.cache.semantic.unwrap();
        assert_eq!((semantic.threshold, semantic.timeout_ms), (0.95, 3000));
        assert_eq!(semantic.upstream.unwrap().authority, "127.0.0.1:9");
        for bad in [
            r#"{"byte_budget": 1000}"#,
            r#"{"max_entry_bytes": 100}"#,
            r#"{"byte_budget": 1048576, "max_entry_bytes": 524288}"#,
            r#"{"semantic": {"base_url": "ftp://x", "model": "e"}}"#,
            r#"{"semantic": {"base_url": "http://x", "model": "e", "threshold": 0}}"#,
            r#"{"semantic": {"base_url": "http://x", "model": "e", "threshold": 1.5}}"#,
            r#"{"semantic": {"base_url": "http://x", "model": ""}}"#,
            r#"{"semantic": {"base_url": "http://x", "model": "e", "timeout_ms": 0}}"#,
            r#"{"ttl": 5}"#,
        ] {
            let config = format!(r#"{{"api_keys": ["k"], "cache": {bad}}}"#);
            assert!(Settings::parse(config.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn control_plane_settings_have_defaults_and_limits() {
        assert_eq!(settings(r#"{"api_keys": ["k"]}"#).control_plane, None);
        let s = settings(
            r#"{"api_keys": ["k"], "control_plane": {"cluster": "cp", "authority": "127.0.0.1:8790", "token": "t0k3n"}}"#,
        );
        let cp = s.control_plane.unwrap();
        assert_eq!((cp.fresh_ms, cp.grace_ms, cp.timeout_ms), (5000, 600_000, 3000));
        assert!(!format!("{cp:?}").contains("t0k3n"), "the token is never printed");
        for bad in [
            r#"{"cluster": "", "authority": "a", "token": "t"}"#,
            r#"{"cluster": "c", "authority": "a", "token": ""}"#,
            r#"{"cluster": "c", "authority": "a", "token": "t", "timeout_ms": 0}"#,
            r#"{"cluster": "c", "authority": "a", "token": "t", "fresh_ms": 10, "grace_ms": 5}"#,
            r#"{"cluster": "c", "authority": "a", "token": "t", "other": 1}"#,
            r#"{"cluster": "c", "authority": "a"}"#,
        ] {
            let config = format!(r#"{{"api_keys": ["k"], "control_plane": {bad}}}"#);
            assert!(Settings::parse(config.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_settings_have_defaults_and_limits() {
        let records = settings(r#"{"api_keys": ["k"]}"#).records;
        assert_eq!((records.max_queued, records.bodies, records.max_body_bytes), (2000, false, 16384));
        let records =
            settings(r#"{"api_keys": ["k"], "records": {"max_queued": 3, "bodies": true, "max_body_bytes": 32768}}"#)
                .records;
        assert_eq!((records.max_queued, records.bodies, records.max_body_bytes), (3, true, 32768));
        for bad in [
            r#"{"max_queued": 0}"#,
            r#"{"max_queued": 10001}"#,
            r#"{"max_body_bytes": 0}"#,
            r#"{"max_body_bytes": 32769}"#,
            r#"{"bodies": "yes"}"#,
            r#"{"other": 1}"#,
        ] {
            let config = format!(r#"{{"api_keys": ["k"], "records": {bad}}}"#);
            assert!(Settings::parse(config.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_never_quote_keys() {
        let err = Settings::parse(br#"{"api_keys": "gw-secret-1,gw-secret-2"}"#).unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn mcp_allowed_origins_are_normalized_once() {
        let s = settings(r#"{"api_keys": ["k"], "mcp_allowed_origins": ["HTTPS://Console.example.com:443"]}"#);
        assert_eq!(s.mcp_allowed_origins, ["https://console.example.com"]);
        let bad =
            Settings::parse(br#"{"api_keys": ["k"], "mcp_allowed_origins": ["https://a.example/page"]}"#).unwrap_err();
        assert!(bad.contains("mcp_allowed_origins[0]: 'https://a.example/page' is not an origin"), "{bad}");
    }

    #[test]
    fn mcp_oauth_fetches_its_jwks_only_from_an_allowed_host() {
        let oauth = |jwks_uri: &str| {
            let config = serde_json::json!({"api_keys": ["k"], "mcp_oauth": {"issuer": "https://idp.example.com",
                                "jwks_uri": jwks_uri, "resource": "https://gw.example.com/mcp"}});
            Settings::parse(config.to_string().as_bytes())
        };
        assert!(oauth("http://127.0.0.1:9/jwks").unwrap().mcp_oauth.is_some());
        let refused = oauth("https://idp.example.com/jwks").unwrap_err();
        assert!(
            refused.contains("mcp_oauth.jwks_uri: host 'idp.example.com' is not in allowed_custom_hosts"),
            "{refused}"
        );
        assert!(oauth("not a url").unwrap_err().contains("mcp_oauth.jwks_uri"));
    }

    #[test]
    fn mcp_servers_are_parsed_once_and_held_to_the_allow_list() {
        let s = settings(r#"{"api_keys": ["k"], "mcp_servers": {"files": {"url": "http://127.0.0.1:9000/mcp"}}}"#);
        assert_eq!(s.mcp_servers.get("files").map(|server| server.upstream.authority.as_str()), Some("127.0.0.1:9000"));
        let error = |json: &str| Settings::parse(json.as_bytes()).unwrap_err();
        let far = error(r#"{"api_keys": ["k"], "mcp_servers": {"files": {"url": "https://mcp.example.com"}}}"#);
        assert_eq!(
            far,
            "invalid plugin configuration: mcp_servers.files.url: host 'mcp.example.com' is not in allowed_custom_hosts"
        );
        let missing = error(r#"{"api_keys": ["k"], "mcp_servers": {"files": {}}}"#);
        assert!(missing.starts_with("invalid plugin configuration (mcp_servers.files.url is required"), "{missing}");
        let secret = error(r#"{"api_keys": ["k"], "mcp_servers": {"f": {"url": "http://a", "headers": {"a": 1}}}}"#);
        assert!(secret.contains("mcp_servers.f.headers.a must be a string"), "{secret}");
    }
}
