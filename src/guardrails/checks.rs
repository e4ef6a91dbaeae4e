//! The checks that decide from what they see alone, their parameters read when their config or
//! stored guardrail was (`params`).

use super::params::{Counted, Operator, Pattern};
use super::schema;
use super::{excerpt, CheckResult, Input};
use serde_json::{json, Map, Value};

/// `rule` (a pattern of `query::regex`, which matches in linear time whatever the pattern)
/// must match somewhere in the text; `not` inverts.
pub(super) fn regex_match(id: &str, pattern: &Pattern, not: bool, input: &Input) -> CheckResult {
    let matched = pattern.regex.is_match(input.text);
    let verdict = matched != not;
    let explanation = format!("The pattern {} the text.", if matched { "matched" } else { "did not match" });
    let data = json!({"regexPattern": pattern.rule, "not": not, "matched": matched, "explanation": explanation,
        "textExcerpt": excerpt(input.text)});
    CheckResult::new(id, verdict, data)
}

/// `words` looked for as (case-sensitive) substrings of the text, under `operator`.
pub(super) fn contains(id: &str, words: &[String], operator: Operator, input: &Input) -> CheckResult {
    let (found, missing): (Vec<&str>, Vec<&str>) =
        words.iter().map(String::as_str).partition(|w| input.text.contains(*w));
    let verdict = operator.holds(found.len(), words.len());
    let data = json!({"operator": operator.name(), "foundWords": found, "missingWords": missing,
        "textExcerpt": excerpt(input.text)});
    CheckResult::new(id, verdict, data)
}

/// A count of the text within `min..=max`; `not` inverts. Words are runs of non-whitespace; a
/// sentence is text holding a letter or digit, ended by `.`, `!` or `?` (any run of them) or by
/// the end of the text ("Hi. Bye" is two sentences, "..." none); characters are Unicode scalar
/// values.
pub(super) fn count_within(
    id: &str,
    counted: Counted,
    (min, max, not): (Option<u64>, Option<u64>, bool),
    input: &Input,
) -> CheckResult {
    let count = match counted {
        Counted::Words => input.text.split_whitespace().count(),
        Counted::Sentences => {
            input.text.split(['.', '!', '?']).filter(|s| s.chars().any(char::is_alphanumeric)).count()
        }
        Counted::Characters => input.text.chars().count(),
    } as u64;
    let (min_key, max_key, what) = counted.keys();
    let within = min.is_none_or(|m| count >= m) && max.is_none_or(|m| count <= m);
    let data = json!({what: count, min_key: min, max_key: max, "not": not, "textExcerpt": excerpt(input.text)});
    CheckResult::new(id, within != not, data)
}

/// The JSON values the text holds: the whole text, else each fenced code block (```json or a
/// bare ```), else the span from the first `{` to the last `}`.
fn json_candidates(text: &str) -> Vec<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(text.trim()) {
        return vec![v];
    }
    let mut found: Vec<Value> = fenced_blocks(text)
        .into_iter()
        .filter(|(tag, _)| tag.is_empty() || tag.eq_ignore_ascii_case("json"))
        .filter_map(|(_, body)| serde_json::from_str(body.trim()).ok())
        .collect();
    if found.is_empty() {
        let span = text.find('{').zip(text.rfind('}')).and_then(|(start, end)| text.get(start..=end));
        found.extend(span.and_then(|s| serde_json::from_str(s).ok()));
    }
    found
}

/// Markdown code fences: each block's language tag (possibly empty) and body. An unclosed
/// fence is no block.
pub(super) fn fenced_blocks(text: &str) -> Vec<(&str, &str)> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = rest.get(open + 3..).unwrap_or_default();
        let Some(line_end) = after.find('\n') else { break };
        let tag = after.get(..line_end).unwrap_or_default().trim();
        let body_start = after.get(line_end + 1..).unwrap_or_default();
        let Some(close) = body_start.find("```") else { break };
        blocks.push((tag, body_start.get(..close).unwrap_or_default()));
        rest = body_start.get(close + 3..).unwrap_or_default();
    }
    blocks
}

/// The text's JSON (see `json_candidates`; the first value found) validated against
/// `schema`; text without JSON does not match. `not` inverts.
pub(super) fn json_schema(id: &str, schema: &Value, not: bool, input: &Input) -> Result<CheckResult, String> {
    let candidates = json_candidates(input.text);
    let (matched, errors) = match candidates.first() {
        Some(value) => {
            let errors = schema::validate(schema, value)?;
            (errors.is_empty(), errors)
        }
        None => (false, vec!["no JSON found in the text".to_string()]),
    };
    let data = json!({"not": not, "matched": matched, "validationErrors": errors, "textExcerpt": excerpt(input.text)});
    Ok(CheckResult::new(id, matched != not, data))
}

/// `keys` looked for among the top-level keys of the text's JSON objects, under `operator`:
/// the first object that satisfies it decides, else the one holding the most keys reports.
pub(super) fn json_keys(id: &str, keys: &[String], operator: Operator, input: &Input) -> CheckResult {
    let objects: Vec<Map<String, Value>> = json_candidates(input.text)
        .into_iter()
        .filter_map(|v| match v {
            Value::Object(map) => Some(map),
            _ => None,
        })
        .collect();
    let mut best: Option<(bool, Vec<&str>)> = None;
    for object in &objects {
        let present: Vec<&str> = keys.iter().map(String::as_str).filter(|k| object.contains_key(*k)).collect();
        let holds = operator.holds(present.len(), keys.len());
        if best.as_ref().is_none_or(|(_, b)| holds || present.len() > b.len()) {
            best = Some((holds, present));
        }
        if holds {
            break;
        }
    }
    let json_found = best.is_some();
    let (verdict, present) = best.unwrap_or((false, Vec::new()));
    let missing: Vec<&str> = keys.iter().map(String::as_str).filter(|k| !present.contains(k)).collect();
    let data = json!({"operator": operator.name(), "jsonFound": json_found, "presentKeys": present,
        "missingKeys": missing, "textExcerpt": excerpt(input.text)});
    CheckResult::new(id, verdict, data)
}

/// Every `http://` or `https://` URL in the text is well formed (no network: the URL is
/// only parsed). Text without URLs passes.
pub(super) fn valid_urls(id: &str, input: &Input) -> CheckResult {
    let urls = urls_in(input.text);
    let (valid, invalid): (Vec<&str>, Vec<&str>) = urls.iter().partition(|u| well_formed_url(u));
    let data = json!({"validUrls": valid, "invalidUrls": invalid});
    CheckResult::new(id, invalid.is_empty(), data)
}

/// The URLs in prose: from each `http://` or `https://` (any case) to the next whitespace or
/// `<>"` character, without the trailing punctuation that ends a sentence or a bracket.
fn urls_in(text: &str) -> Vec<&str> {
    let lower = text.to_ascii_lowercase();
    let mut urls = Vec::new();
    let mut from = 0;
    while let Some(start) = lower.get(from..).and_then(|s| s.find("http")).map(|i| i + from) {
        let tail = lower.get(start..).unwrap_or_default();
        from = start + 4;
        if !(tail.starts_with("http://") || tail.starts_with("https://")) {
            continue;
        }
        let rest = text.get(start..).unwrap_or_default();
        let end = rest.find(|c: char| c.is_whitespace() || "<>\"".contains(c)).unwrap_or(rest.len());
        let mut url = rest.get(..end).unwrap_or_default();
        loop {
            let trimmed = url.trim_end_matches(['.', ',', ';', ':', '!', '?', '\'']);
            // A closing bracket the URL did not open belongs to the prose around it.
            let unopened = |close: char, open: char| {
                trimmed.ends_with(close) && trimmed.matches(close).count() > trimmed.matches(open).count()
            };
            let trimmed = if unopened(')', '(') || unopened(']', '[') || unopened('}', '{') {
                trimmed.get(..trimmed.len() - 1).unwrap_or_default()
            } else {
                trimmed
            };
            if trimmed.len() == url.len() {
                break;
            }
            url = trimmed;
        }
        from = start + url.len().max(4);
        urls.push(url);
    }
    urls
}

/// An absolute http(s) URL: a valid host (DNS name, IPv4 or bracketed IPv6), an optional
/// port up to 65535, and a path, query and fragment of printable characters with complete
/// `%XX` escapes.
fn well_formed_url(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    let skip = if lower.starts_with("https://") { 8 } else { 7 };
    let rest = url.get(skip..).unwrap_or_default();
    let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else { return false };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => (None, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return false,
            },
        }
    } else {
        match host_port.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(host_port), None),
        }
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.parse::<u32>().is_ok_and(|n| n <= 65535));
    port_ok && host.is_none_or(valid_host) && valid_url_tail(tail)
}

fn valid_host(host: &str) -> bool {
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    // All-digit labels make an IPv4 address, which must be one.
    if labels.iter().all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit())) {
        return host.parse::<std::net::Ipv4Addr>().is_ok();
    }
    labels.iter().all(|l| {
        !l.is_empty()
            && l.chars().count() <= 63
            && l.chars().all(|c| c.is_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    })
}

fn valid_url_tail(tail: &str) -> bool {
    let bytes = tail.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
            continue;
        }
        // RFC 3986 leaves these out of URLs; other non-ASCII text (IRIs) is accepted.
        if b.is_ascii_control() || b" \"<>\\^`{|}".contains(&b) {
            return false;
        }
        i += 1;
    }
    true
}

/// Language tags of fenced code blocks and the names users give in `format`.
const LANGUAGES: &[(&str, &str)] = &[
    ("sql", "SQL"),
    ("py", "Python"),
    ("python", "Python"),
    ("ts", "TypeScript"),
    ("typescript", "TypeScript"),
    ("js", "JavaScript"),
    ("javascript", "JavaScript"),
    ("java", "Java"),
    ("cs", "C#"),
    ("csharp", "C#"),
    ("cpp", "C++"),
    ("c++", "C++"),
    ("c", "C"),
    ("rb", "Ruby"),
    ("ruby", "Ruby"),
    ("php", "PHP"),
    ("swift", "Swift"),
    ("kt", "Kotlin"),
    ("kotlin", "Kotlin"),
    ("go", "Go"),
    ("golang", "Go"),
    ("rs", "Rust"),
    ("rust", "Rust"),
    ("scala", "Scala"),
    ("r", "R"),
    ("pl", "Perl"),
    ("perl", "Perl"),
    ("sh", "Shell"),
    ("bash", "Shell"),
    ("shell", "Shell"),
    ("html", "HTML"),
    ("css", "CSS"),
    ("xml", "XML"),
    ("json", "JSON"),
    ("yml", "YAML"),
    ("yaml", "YAML"),
    ("md", "Markdown"),
    ("markdown", "Markdown"),
    ("dockerfile", "Dockerfile"),
];

/// A fenced code block tagged with the language `format` (a name such as "Python" or a tag
/// such as "py", any case). Only tagged fences count: guessing a language from bare text
/// would be both slow and wrong too often to deny on.
pub(super) fn contains_code(id: &str, format: &str, input: &Input) -> CheckResult {
    let name_of = |tag: &str| {
        let lower = tag.to_ascii_lowercase();
        LANGUAGES.iter().find(|(t, _)| *t == lower).map_or(lower.clone(), |(_, name)| name.to_string())
    };
    let wanted = name_of(format);
    let found: Vec<String> =
        fenced_blocks(input.text).into_iter().filter(|(tag, _)| !tag.is_empty()).map(|(tag, _)| name_of(tag)).collect();
    let verdict = found.iter().any(|f| f.eq_ignore_ascii_case(&wanted));
    let data = json!({"searchedFormat": format, "foundFormats": found, "textExcerpt": excerpt(input.text)});
    CheckResult::new(id, verdict, data)
}

/// The request's model is one of `models`; `not` inverts.
pub(super) fn model_whitelist(id: &str, models: &[String], not: bool, input: &Input) -> CheckResult {
    let listed = models.iter().any(|m| m == input.model);
    let data = json!({"requestedModel": input.model, "allowedModels": models, "not": not});
    CheckResult::new(id, listed != not, data)
}

/// `metadataKeys` among the keys of `x-gateway-metadata`, under `operator`.
pub(super) fn required_metadata_keys(id: &str, keys: &[String], operator: Operator, input: &Input) -> CheckResult {
    let has = |k: &&str| input.metadata.is_some_and(|m| m.contains_key(*k));
    let (found, missing): (Vec<&str>, Vec<&str>) = keys.iter().map(String::as_str).partition(has);
    let verdict = operator.holds(found.len(), keys.len());
    let data = json!({"operator": operator.name(), "found_metadata_keys": found, "missing_metadata_keys": missing});
    CheckResult::new(id, verdict, data)
}
