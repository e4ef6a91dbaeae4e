//! The checks' parameters: the readers every check shares, and what is known of them when a
//! guardrail is read (the check ids, `default.jwt`'s parameters and `default.webhook`'s
//! headers, read by the same code that runs the check).

use crate::json_check::{kind_of, shorten};
use crate::query::regex::{self, Regex};
use crate::upstream::Upstream;
use crate::wire_names::is_header_value;
use serde_json::{Map, Value};
use std::rc::Rc;

/// The parameters of one check, as configured.
pub type Params = Map<String, Value>;

/// The check ids this gateway runs (`evaluate` knows each of them).
pub const CHECK_IDS: &[&str] = &[
    "default.regexMatch",
    "default.contains",
    "default.wordCount",
    "default.sentenceCount",
    "default.characterCount",
    "default.jsonSchema",
    "default.jsonKeys",
    "default.validUrls",
    "default.containsCode",
    "default.modelWhitelist",
    "default.requiredMetadataKeys",
    "default.webhook",
    "default.log",
    "default.jwt",
];

/// A stored check's parameters, read as `read` reads them, its id one this gateway runs
/// (nothing is fetched). `Err` says what is wrong.
pub fn read_known(id: &str, params: &Params) -> Result<CheckParams, String> {
    if !CHECK_IDS.contains(&id) {
        return Err(format!("unknown check `{}`; known checks: {}", shorten(id), CHECK_IDS.join(", ")));
    }
    read(id, params)
}

/// A check's parameters, read (patterns compiled) when the config or stored guardrail that
/// holds the check is read, and kept with it: the check runs them as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckParams {
    /// `rule` must match somewhere in the text; `not` inverts.
    RegexMatch {
        pattern: Pattern,
        not: bool,
    },
    Contains {
        words: Vec<String>,
        operator: Operator,
    },
    /// `wordCount`, `sentenceCount`, `characterCount`: a count of the text within `min..=max`
    /// (either bound may be left out, not both); `not` inverts.
    Count {
        counted: Counted,
        min: Option<u64>,
        max: Option<u64>,
        not: bool,
    },
    JsonSchema {
        schema: Value,
        not: bool,
    },
    JsonKeys {
        keys: Vec<String>,
        operator: Operator,
    },
    ContainsCode {
        format: String,
    },
    ModelWhitelist {
        models: Vec<String>,
        not: bool,
    },
    RequiredMetadataKeys {
        keys: Vec<String>,
        operator: Operator,
    },
    /// `validUrls` (no parameters), and the checks that call out (`webhook`, `log`, `jwt`),
    /// whose parameters were checked for form here and which read them as they run.
    AsGiven,
    /// A check id this gateway does not run: the check fails when it runs (a config may name
    /// one; a stored guardrail may not).
    Unknown,
}

/// A compiled `regexMatch` rule with its text (checks compare and report the text).
#[derive(Debug, Clone)]
pub struct Pattern {
    pub rule: String,
    pub regex: Rc<Regex>,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.rule == other.rule
    }
}

/// How a list of wanted things must be found: at least one, all, or none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Any,
    All,
    None,
}

impl Operator {
    fn read(p: &Params) -> Result<Operator, String> {
        match string(p, "operator")? {
            Some("any") => Ok(Operator::Any),
            Some("all") => Ok(Operator::All),
            Some("none") => Ok(Operator::None),
            _ => Err("parameter `operator` must be one of \"any\", \"all\", \"none\"".to_string()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Operator::Any => "any",
            Operator::All => "all",
            Operator::None => "none",
        }
    }

    /// The verdict from how many of `total` wanted things were found.
    pub fn holds(self, found: usize, total: usize) -> bool {
        match self {
            Operator::Any => found > 0,
            Operator::All => found == total,
            Operator::None => found == 0,
        }
    }
}

/// What a counting check counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    Words,
    Sentences,
    Characters,
}

impl Counted {
    fn of(id: &str) -> Option<Counted> {
        match id {
            "default.wordCount" => Some(Counted::Words),
            "default.sentenceCount" => Some(Counted::Sentences),
            "default.characterCount" => Some(Counted::Characters),
            _ => None,
        }
    }

    /// Its `min` and `max` parameters, and the count's name in the check's `data`.
    pub fn keys(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Counted::Words => ("minWords", "maxWords", "wordCount"),
            Counted::Sentences => ("minSentences", "maxSentences", "sentenceCount"),
            Counted::Characters => ("minCharacters", "maxCharacters", "characterCount"),
        }
    }
}

/// Reads check `id`'s parameters; `Err` says which parameter is wrong and how.
pub fn read(id: &str, p: &Params) -> Result<CheckParams, String> {
    let owned = |items: Vec<&str>| items.into_iter().map(str::to_string).collect::<Vec<String>>();
    if let Some(counted) = Counted::of(id) {
        let (min_key, max_key, _) = counted.keys();
        let (min, max) = (count(p, min_key)?, count(p, max_key)?);
        if min.is_none() && max.is_none() {
            return Err(format!("parameter `{min_key}` or `{max_key}` is required"));
        }
        return Ok(CheckParams::Count { counted, min, max, not: flag(p, "not")? });
    }
    Ok(match id {
        "default.regexMatch" => {
            let rule = required_string(p, "rule")?;
            let not = flag(p, "not")?;
            let regex = regex::cached(rule).map_err(|e| format!("parameter `rule` is not a valid pattern: {e}"))?;
            CheckParams::RegexMatch { pattern: Pattern { rule: rule.to_string(), regex }, not }
        }
        "default.contains" => {
            CheckParams::Contains { words: owned(strings(p, "words")?), operator: Operator::read(p)? }
        }
        "default.jsonSchema" => {
            let schema = p.get("schema").filter(|s| s.is_object()).ok_or("parameter `schema` must be an object")?;
            CheckParams::JsonSchema { schema: schema.clone(), not: flag(p, "not")? }
        }
        "default.jsonKeys" => CheckParams::JsonKeys { keys: owned(strings(p, "keys")?), operator: Operator::read(p)? },
        "default.containsCode" => CheckParams::ContainsCode { format: required_string(p, "format")?.to_string() },
        "default.modelWhitelist" => {
            CheckParams::ModelWhitelist { models: owned(strings(p, "models")?), not: flag(p, "not")? }
        }
        "default.requiredMetadataKeys" => {
            CheckParams::RequiredMetadataKeys { keys: owned(strings(p, "metadataKeys")?), operator: Operator::read(p)? }
        }
        "default.jwt" => jwt_params(p).map(|_| CheckParams::AsGiven)?,
        "default.webhook" => configured_headers(p).map(|_| CheckParams::AsGiven)?,
        "default.validUrls" | "default.log" => CheckParams::AsGiven,
        _ => CheckParams::Unknown,
    })
}

pub fn string<'a>(p: &'a Params, key: &str) -> Result<Option<&'a str>, String> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("parameter `{key}` must be a string, got {}", kind_of(v))),
    }
}

pub fn required_string<'a>(p: &'a Params, key: &str) -> Result<&'a str, String> {
    match string(p, key)? {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(format!("parameter `{key}` is required")),
    }
}

/// A non-empty array of strings.
pub fn strings<'a>(p: &'a Params, key: &str) -> Result<Vec<&'a str>, String> {
    let wrong = || format!("parameter `{key}` must be a non-empty array of strings");
    let items = p.get(key).and_then(Value::as_array).filter(|a| !a.is_empty()).ok_or_else(wrong)?;
    items.iter().map(|v| v.as_str().ok_or_else(wrong)).collect()
}

/// `not` and other flags: absent is false.
pub fn flag(p: &Params, key: &str) -> Result<bool, String> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!("parameter `{key}` must be a boolean, got {}", kind_of(v))),
    }
}

/// A non-negative whole number (`5.0` counts as 5).
pub fn count(p: &Params, key: &str) -> Result<Option<u64>, String> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => Ok(Some(u)),
            // Whole and in range: the cast is exact.
            (None, Some(f)) if f.fract() == 0.0 && (0.0..9.0e15).contains(&f) => Ok(Some(f as u64)),
            _ => Err(format!("parameter `{key}` must be a non-negative integer")),
        },
        Some(v) => Err(format!("parameter `{key}` must be a non-negative integer, got {}", kind_of(v))),
    }
}

/// `default.jwt` defaults, as the reference gateway's.
const DEFAULT_JWT_HEADER: &str = "authorization";
const DEFAULT_CACHE_MAX_AGE_S: u64 = 86_400;
const DEFAULT_CLOCK_TOLERANCE_S: u64 = 5;
const DEFAULT_MAX_TOKEN_AGE: &str = "1d";

/// The algorithms `algorithms` may name (and the default allow-list).
pub const ALGORITHMS: &[&str] = &["RS256", "RS384", "RS512", "PS256", "ES256", "ES384"];
/// What the check's parameters allow.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    pub algorithms: Vec<String>,
    pub clock_tolerance_s: u64,
    /// How old (`now - iat`) a token may be; a token without `iat` then fails.
    pub max_token_age_s: Option<u64>,
}

/// A duration like `45s`, `30m`, `1h`, `2d` or `1w` (or a bare number of seconds), in seconds.
pub fn duration_s(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let unit_s = match unit.trim() {
        "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600,
        "d" | "day" | "days" => 86_400,
        "w" | "week" | "weeks" => 604_800,
        _ => return Err(format!("`{text}` is not a duration like 30m, 1h or 2d")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a duration like 30m, 1h or 2d"))?;
    n.checked_mul(unit_s).ok_or_else(|| format!("`{text}` is too long a duration"))
}

/// `headers`: an object of strings (or that object as a JSON string, as some clients send it).
/// Names the gateway or HTTP framing owns are refused rather than sent.
pub fn configured_headers(p: &Params) -> Result<Vec<(String, String)>, String> {
    let parsed;
    let map = match p.get("headers") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(Value::String(text)) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|_| "parameter `headers` is not a JSON object")?;
            parsed.as_object().ok_or("parameter `headers` is not a JSON object")?
        }
        Some(v) => return Err(format!("parameter `headers` must be an object, got {}", kind_of(v))),
    };
    let token_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let owned = ["host", "content-length", "content-type", "transfer-encoding", "connection", "te", "upgrade"];
    map.iter()
        .map(|(name, value)| {
            let lower = name.to_ascii_lowercase();
            let bad = |why: &str| format!("parameter `headers`: header {:?} {why}", shorten(name));
            if lower.is_empty() || !lower.bytes().all(token_char) {
                return Err(bad("is not a valid header name"));
            }
            if owned.contains(&lower.as_str()) || lower.starts_with("x-gateway-") {
                return Err(bad("is set by the gateway"));
            }
            let value = value.as_str().ok_or_else(|| bad("must have a string value"))?;
            if !is_header_value(value) {
                return Err(bad("has control characters in its value"));
            }
            Ok((lower, value.to_string()))
        })
        .collect()
}

/// The upstream and `:path` of an http(s) URL: `Upstream::parse` checks the part before the
/// query, the query is kept as sent and a fragment dropped.
pub fn target(url: &str) -> Result<(Upstream, String), String> {
    let url = url.split('#').next().unwrap_or_default();
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let upstream = Upstream::parse(base).map_err(str::to_string)?;
    let mut path = if upstream.base_path.is_empty() { "/".to_string() } else { upstream.base_path.clone() };
    if let Some(query) = query {
        if !query.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("has a query with characters that are not allowed".to_string());
        }
        path = format!("{path}?{query}");
    }
    Ok((upstream, path))
}

/// `default.jwt`'s parameters, read and checked for type and form (nothing fetched).
pub struct JwtParams<'a> {
    pub uri: &'a str,
    pub header: String,
    pub max_age_s: u64,
    pub rules: Rules,
}

/// Reads `default.jwt`'s parameters; `Err` names the parameter at fault. The control plane
/// checks a stored guardrail with this too, so it refuses what the filter would refuse.
pub fn jwt_params(p: &Params) -> Result<JwtParams<'_>, String> {
    let uri = required_string(p, "jwksUri")?;
    target(uri).map_err(|e| format!("parameter `jwksUri` {e}"))?;
    let header = string(p, "headerKey")?.map_or(DEFAULT_JWT_HEADER.to_string(), str::to_ascii_lowercase);
    let max_age_s = count(p, "cacheMaxAge")?.unwrap_or(DEFAULT_CACHE_MAX_AGE_S);
    let clock_tolerance_s = count(p, "clockTolerance")?.unwrap_or(DEFAULT_CLOCK_TOLERANCE_S);
    let max_token_age_s = match p.get("maxTokenAge") {
        None | Some(Value::Null) => duration_s(DEFAULT_MAX_TOKEN_AGE)?,
        Some(Value::String(s)) => duration_s(s).map_err(|e| format!("parameter `maxTokenAge`: {e}"))?,
        Some(_) => count(p, "maxTokenAge")?.unwrap_or_default(),
    };
    let algorithms = match p.get("algorithms") {
        None | Some(Value::Null) => ALGORITHMS.iter().map(|a| a.to_string()).collect(),
        Some(_) => strings(p, "algorithms")?.into_iter().map(str::to_string).collect::<Vec<_>>(),
    };
    if let Some(unknown) = algorithms.iter().find(|a| !ALGORITHMS.contains(&a.as_str())) {
        let known = ALGORITHMS.join(", ");
        return Err(format!("parameter `algorithms`: {:?} is not one of {known}", shorten(unknown)));
    }
    let rules = Rules { algorithms, clock_tolerance_s, max_token_age_s: Some(max_token_age_s) };
    Ok(JwtParams { uri, header, max_age_s, rules })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    #[test]
    fn durations() {
        assert_eq!(duration_s("45s"), Ok(45));
        assert_eq!(duration_s("30m"), Ok(1800));
        assert_eq!(duration_s("1h"), Ok(3600));
        assert_eq!(duration_s("2d"), Ok(172_800));
        assert_eq!(duration_s("90"), Ok(90));
        assert!(duration_s("1y").is_err());
        assert!(duration_s("h").is_err());
        assert!(duration_s("99999999999999999999d").is_err());
    }

    fn params(v: Value) -> Params {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn stored_check_parameters_are_checked_for_form_only() {
        let jwt = |p: Value| read_known("default.jwt", &params(p)).map(drop);
        assert_eq!(
            jwt(json!({"jwksUri": "http://idp.local/jwks.json", "maxTokenAge": "30m", "algorithms": ["RS256"]})),
            Ok(())
        );
        assert_eq!(jwt(json!({"jwksUri": "https://idp.example/jwks", "maxTokenAge": "1h", "cacheMaxAge": 60})), Ok(()));
        assert!(jwt(json!({"jwksUri": "https://idp.example/jwks", "algorithms": ["HS256"]}))
            .unwrap_err()
            .contains("algorithms"));
        assert!(jwt(json!({"jwksUri": "https://idp.example/jwks", "maxTokenAge": "soon"}))
            .unwrap_err()
            .contains("maxTokenAge"));
        assert!(jwt(json!({})).unwrap_err().contains("jwksUri"));
        assert!(jwt(json!({"jwksUri": "https://idp.example/jwks", "clockTolerance": "5"}))
            .unwrap_err()
            .contains("clockTolerance"));
        assert!(read_known("default.contains", &params(json!({"words": ["a"], "operator": "any"}))).is_ok());
        assert!(read_known("default.regexMatch", &params(json!({"rule": "(a"}))).unwrap_err().contains("`rule`"));
        assert!(read_known("default.nope", &Params::new()).unwrap_err().contains("unknown check"));
    }
}
