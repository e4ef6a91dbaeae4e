//! Rate limits, token limits and budgets as `PUT /v1/limits/{id}` gives them, read by the control
//! plane (which stores and grants them) and by the filter (which enforces them), and the
//! periods budgets are counted in.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What one limit counts, each with a ledger of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Requests admitted in any 60 seconds.
    Requests,
    /// Input plus output tokens in any 60 seconds.
    Tokens,
    /// Micro-USD spent in the budget's period.
    Budget,
}

impl LimitKind {
    pub const ALL: [LimitKind; 3] = [LimitKind::Requests, LimitKind::Tokens, LimitKind::Budget];

    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Requests => "requests",
            LimitKind::Tokens => "tokens",
            LimitKind::Budget => "budget",
        }
    }
}

/// The window of the rate and token limits.
pub const WINDOW_SECONDS: u64 = 60;

/// When a budget's spend starts again from zero (periods start at 00:00 UTC, months on the 1st).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    #[default]
    Month,
    Total,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
            Period::Total => "total",
        }
    }

    /// The start of the period holding `now` (Unix seconds).
    pub fn start(self, now: u64) -> u64 {
        match self {
            Period::Day => now - now % DAY,
            Period::Month => {
                let (year, month, _) = civil_from_days(now / DAY);
                days_from_civil(year, month, 1) * DAY
            }
            Period::Total => 0,
        }
    }

    /// The end of the period holding `now` (Unix seconds); `None`: it never ends.
    pub fn end(self, now: u64) -> Option<u64> {
        match self {
            Period::Day => Some(self.start(now) + DAY),
            Period::Month => {
                let (year, month, _) = civil_from_days(now / DAY);
                let (year, month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
                Some(days_from_civil(year, month, 1) * DAY)
            }
            Period::Total => None,
        }
    }
}

const DAY: u64 = 86_400;

/// Days since 1970-01-01 → (year, month 1-12, day 1-31), proleptic Gregorian (Howard Hinnant's
/// algorithm, for dates from 1970 on).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// (year, month 1-12, day 1-31) → days since 1970-01-01, for dates from 1970 on.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let yoe = year - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

/// Whom a limit applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Every request of a workspace.
    Workspace(String),
    /// Every request made with one gateway key (an id from `POST /v1/api-keys`).
    ApiKeyId(String),
}

/// One limit: its scope, optionally narrowed to a model (or, for MCP tool calls, to a server and
/// a tool), and what it bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    pub id: String,
    #[serde(flatten)]
    pub scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// An MCP limit: it counts the `tools/call` requests to this server (and no model request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<String>,
    /// ... to this tool of it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_usd: Option<f64>,
    #[serde(default)]
    pub budget_period: Period,
}

impl Limit {
    /// The bound of `kind` (micro-USD for a budget), when the limit has one.
    pub fn bound(&self, kind: LimitKind) -> Option<u64> {
        match kind {
            LimitKind::Requests => self.requests_per_minute,
            LimitKind::Tokens => self.tokens_per_minute,
            LimitKind::Budget => self.budget_usd.map(|usd| (usd * 1e6).floor() as u64),
        }
    }

    /// The kinds this limit bounds.
    pub fn kinds(&self) -> impl Iterator<Item = LimitKind> + '_ {
        LimitKind::ALL.into_iter().filter(|kind| self.bound(*kind).is_some())
    }

    /// Whether the limit applies to a model request of `workspace`, made with key `key_id` (none
    /// for the plugin configuration's keys), for `model`. An MCP limit never does.
    pub fn applies(&self, workspace: &str, key_id: Option<&str>, model: &str) -> bool {
        self.mcp_server.is_none() && self.scoped(workspace, key_id) && self.model.as_deref().is_none_or(|m| m == model)
    }

    /// Whether the limit applies to a call of MCP server `server`'s tool `tool`: an MCP limit of
    /// that server (and tool, when it names one).
    pub fn applies_to_tool(&self, workspace: &str, key_id: Option<&str>, server: &str, tool: &str) -> bool {
        self.mcp_server.as_deref() == Some(server)
            && self.mcp_tool.as_deref().is_none_or(|t| t == tool)
            && self.scoped(workspace, key_id)
    }

    fn scoped(&self, workspace: &str, key_id: Option<&str>) -> bool {
        match &self.scope {
            Scope::Workspace(name) => name == workspace,
            Scope::ApiKeyId(id) => key_id == Some(id.as_str()),
        }
    }
}

/// The largest budget: a trillion dollars is a mistake, and micro-USD must fit in 63 bits.
const MAX_BUDGET_USD: f64 = 1e12;

/// The most ids, names and models may be long.
const MAX_NAME: usize = 256;

const FIELDS: [&str; 9] = [
    "workspace",
    "api_key_id",
    "model",
    "mcp_server",
    "mcp_tool",
    "requests_per_minute",
    "tokens_per_minute",
    "budget_usd",
    "budget_period",
];

/// A limit as `PUT /v1/limits/{id}` gives it (the id comes from the path). Err: the field at
/// fault (empty: the body) and why.
pub fn parse_limit(id: &str, body: &Value) -> Result<Limit, (String, String)> {
    let fail = |field: &str, message: String| Err((field.to_string(), message));
    let Some(object) = body.as_object() else {
        return fail("", "the body must be a JSON object".to_string());
    };
    if let Some(key) = object.keys().find(|key| !FIELDS.contains(&key.as_str())) {
        return fail(key, format!("unknown field {key}: a limit has {}", FIELDS.join(", ")));
    }
    let text = |field: &str| -> Result<Option<String>, (String, String)> {
        match object.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control) => {
                Ok(Some(s.clone()))
            }
            Some(_) => Err((field.to_string(), format!("{field} must be a string of 1 to {MAX_NAME} characters"))),
        }
    };
    let scope = match (text("workspace")?, text("api_key_id")?) {
        (Some(workspace), None) => Scope::Workspace(workspace),
        (None, Some(key)) => Scope::ApiKeyId(key),
        (Some(_), Some(_)) => return fail("api_key_id", "give exactly one of workspace and api_key_id".to_string()),
        (None, None) => return fail("workspace", "a limit needs a scope: workspace or api_key_id".to_string()),
    };
    let count = |field: &str| -> Result<Option<u64>, (String, String)> {
        match object.get(field) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Ok(Some(n)),
                _ => Err((field.to_string(), format!("{field} must be an integer of at least 1"))),
            },
        }
    };
    let budget_usd = match object.get("budget_usd") {
        None => None,
        Some(v) => match v.as_f64() {
            Some(usd) if usd > 0.0 && usd <= MAX_BUDGET_USD => Some(usd),
            _ => {
                return fail("budget_usd", format!("budget_usd must be a number above 0 and at most {MAX_BUDGET_USD}"))
            }
        },
    };
    let budget_period = match object.get("budget_period") {
        None => Period::default(),
        Some(_) if budget_usd.is_none() => {
            return fail("budget_period", "budget_period needs budget_usd".to_string());
        }
        Some(Value::String(p)) if p == "day" => Period::Day,
        Some(Value::String(p)) if p == "month" => Period::Month,
        Some(Value::String(p)) if p == "total" => Period::Total,
        Some(_) => return fail("budget_period", "budget_period must be \"day\", \"month\" or \"total\"".to_string()),
    };
    let (model, mcp_server, mcp_tool) = (text("model")?, text("mcp_server")?, text("mcp_tool")?);
    match (&model, &mcp_server, &mcp_tool) {
        (Some(_), Some(_), _) => return fail("mcp_server", "give model or mcp_server, not both".to_string()),
        (_, None, Some(_)) => return fail("mcp_tool", "mcp_tool needs mcp_server".to_string()),
        _ => {}
    }
    if mcp_server.as_deref().is_some_and(|id| !crate::mcp_servers::is_server_id(id)) {
        return fail("mcp_server", "mcp_server must be a server id: 1 to 32 of a-z, 0-9 and -".to_string());
    }
    if mcp_server.is_some() {
        if let Some(field) =
            ["tokens_per_minute", "budget_usd", "budget_period"].into_iter().find(|f| object.contains_key(*f))
        {
            return fail(field, format!("an MCP limit counts tool calls: give requests_per_minute, not {field}"));
        }
    }
    let limit = Limit {
        id: id.to_string(),
        scope,
        model,
        mcp_server,
        mcp_tool,
        requests_per_minute: count("requests_per_minute")?,
        tokens_per_minute: count("tokens_per_minute")?,
        budget_usd,
        budget_period,
    };
    if limit.kinds().next().is_none() {
        return fail(
            "",
            "a limit needs at least one of requests_per_minute, tokens_per_minute and budget_usd".to_string(),
        );
    }
    Ok(limit)
}

/// What the filter reads of one workspace's limits and prices (the control plane's internal
/// `policy` entry).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default)]
    pub limits: Vec<Limit>,
    /// The workspace's own prices by model (they override the catalog's).
    #[serde(default)]
    pub prices: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    #[test]
    fn periods_start_at_midnight_utc_and_months_on_the_first() {
        // 2026-11-26T16:13:20Z
        let now = 1_795_709_600;
        assert_eq!(Period::Day.start(now), 1_795_651_200); // 2026-11-26T00:00:00Z
        assert_eq!(Period::Day.end(now), Some(1_795_737_600));
        assert_eq!(Period::Month.start(now), 1_793_491_200); // 2026-11-01
        assert_eq!(Period::Month.end(now), Some(1_796_083_200)); // 2026-12-01
                                                                 // December rolls into the next year; a leap February has 29 days.
        assert_eq!(Period::Month.end(1_798_675_200), Some(1_798_761_600)); // 2026-12-31 → 2027-01-01
        assert_eq!(Period::Month.end(1_709_164_800), Some(1_709_251_200)); // 2024-02-29 → 2024-03-01
        assert_eq!((Period::Total.start(now), Period::Total.end(now)), (0, None));
    }

    #[test]
    fn a_limit_is_read_field_by_field() {
        let limit = parse_limit("team", &json!({"workspace": "team-a", "requests_per_minute": 60, "budget_usd": 12.5}))
            .unwrap();
        assert_eq!(limit.scope, Scope::Workspace("team-a".into()));
        assert_eq!(limit.bound(LimitKind::Requests), Some(60));
        assert_eq!(limit.bound(LimitKind::Budget), Some(12_500_000));
        assert_eq!(limit.bound(LimitKind::Tokens), None);
        assert_eq!(limit.budget_period, Period::Month);
        assert_eq!(serde_json::to_value(&limit).unwrap()["workspace"], "team-a");

        let field = |body: Value| parse_limit("x", &body).unwrap_err().0;
        assert_eq!(field(json!({"requests_per_minute": 1})), "workspace");
        assert_eq!(field(json!({"workspace": "a", "api_key_id": "k", "requests_per_minute": 1})), "api_key_id");
        assert_eq!(field(json!({"workspace": "a"})), "");
        assert_eq!(field(json!({"workspace": "a", "requests_per_minute": 0})), "requests_per_minute");
        assert_eq!(field(json!({"workspace": "a", "tokens_per_minute": 1.5})), "tokens_per_minute");
        assert_eq!(field(json!({"workspace": "a", "budget_usd": 0})), "budget_usd");
        assert_eq!(field(json!({"workspace": "a", "budget_usd": 1, "budget_period": "week"})), "budget_period");
        assert_eq!(field(json!({"workspace": "a", "requests_per_minute": 1, "budget_period": "day"})), "budget_period");
        assert_eq!(field(json!({"workspace": "a", "requests_per_minute": 1, "rpm": 1})), "rpm");
    }

    #[test]
    fn a_limit_applies_to_its_scope_and_model() {
        let key_model =
            parse_limit("k", &json!({"api_key_id": "key_1", "model": "gpt-4o", "tokens_per_minute": 9})).unwrap();
        assert!(key_model.applies("any", Some("key_1"), "gpt-4o"));
        assert!(!key_model.applies("any", Some("key_1"), "gpt-4o-mini"));
        assert!(!key_model.applies("any", None, "gpt-4o"));
        let workspace = parse_limit("w", &json!({"workspace": "default", "requests_per_minute": 9})).unwrap();
        assert!(workspace.applies("default", None, "m") && !workspace.applies("other", None, "m"));
        assert!(!workspace.applies_to_tool("default", None, "files", "read"), "a model limit counts no tool call");
    }

    #[test]
    fn an_mcp_limit_counts_its_servers_tool_calls_and_no_model_request() {
        let server =
            parse_limit("s", &json!({"workspace": "w", "mcp_server": "files", "requests_per_minute": 2})).unwrap();
        assert!(
            server.applies_to_tool("w", None, "files", "read") && server.applies_to_tool("w", None, "files", "write")
        );
        assert!(
            !server.applies_to_tool("w", None, "web", "read") && !server.applies_to_tool("x", None, "files", "read")
        );
        assert!(!server.applies("w", None, "gpt-4o"), "never a model request");
        let tool = parse_limit(
            "t",
            &json!({"api_key_id": "k", "mcp_server": "files", "mcp_tool": "write", "requests_per_minute": 1}),
        )
        .unwrap();
        assert!(
            tool.applies_to_tool("any", Some("k"), "files", "write")
                && !tool.applies_to_tool("any", Some("k"), "files", "read")
        );
        let refused = |body: Value| parse_limit("x", &body).unwrap_err().0;
        assert_eq!(
            refused(json!({"workspace": "w", "model": "m", "mcp_server": "f", "requests_per_minute": 1})),
            "mcp_server"
        );
        assert_eq!(refused(json!({"workspace": "w", "mcp_tool": "t", "requests_per_minute": 1})), "mcp_tool");
        assert_eq!(refused(json!({"workspace": "w", "mcp_server": "f", "tokens_per_minute": 1})), "tokens_per_minute");
        assert_eq!(refused(json!({"workspace": "w", "mcp_server": "f", "budget_usd": 1})), "budget_usd");
        assert_eq!(refused(json!({"workspace": "w", "mcp_server": "Files", "requests_per_minute": 1})), "mcp_server");
    }
}
