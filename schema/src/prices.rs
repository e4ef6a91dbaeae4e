//! Model prices: the catalog shipped with the gateway (`prices.json`, read by the filter and the
//! control plane from this one file), a workspace's own prices (`PUT /v1/prices/{model}`), and
//! what a request costs.
//!
//! Prices are US dollars per million tokens, so tokens × price is millionths of a dollar
//! (micro-USD): costs are counted in whole micro-USD (Envoy counters and the limits' ledgers are
//! integers), rounded up where the gateway reserves a worst case.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The shipped catalog's text.
pub const CATALOG_JSON: &str = include_str!("prices.json");

/// What a model costs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_million: f64,
    pub output_per_million: f64,
    /// Input tokens the provider read from its prompt cache; at the input price when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_million: Option<f64>,
    /// Input tokens the provider wrote to its prompt cache (Anthropic's cache writes); at the
    /// input price when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_million: Option<f64>,
    /// The model's default output limit: what a request under a budget that names no
    /// `max_tokens` reserves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
}

/// Token counts as a provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Every input token, cached ones included.
    pub input: u64,
    /// Of `input`, those read from the provider's prompt cache.
    pub cached_input: u64,
    /// Of `input`, those written to the provider's prompt cache.
    pub cache_write_input: u64,
    pub output: u64,
}

impl Price {
    /// The cost of `tokens`, in micro-USD (rounded to the nearest).
    pub fn cost_micro_usd(&self, tokens: Tokens) -> u64 {
        self.exact_micro_usd(tokens).round() as u64
    }

    /// The most `tokens` can cost, in micro-USD (rounded up): what a reservation holds. Not
    /// knowing yet how the input will be read or written, every input token is at the dearest
    /// input price.
    pub fn worst_case_micro_usd(&self, tokens: Tokens) -> u64 {
        let input_price = [self.cached_input_per_million, self.cache_write_per_million]
            .into_iter()
            .flatten()
            .fold(self.input_per_million, f64::max);
        (tokens.input as f64 * input_price + tokens.output as f64 * self.output_per_million).ceil() as u64
    }

    fn exact_micro_usd(&self, tokens: Tokens) -> f64 {
        let cached = tokens.cached_input.min(tokens.input);
        let written = tokens.cache_write_input.min(tokens.input - cached);
        let cached_price = self.cached_input_per_million.unwrap_or(self.input_per_million);
        let write_price = self.cache_write_per_million.unwrap_or(self.input_per_million);
        (tokens.input - cached - written) as f64 * self.input_per_million
            + cached as f64 * cached_price
            + written as f64 * write_price
            + tokens.output as f64 * self.output_per_million
    }
}

/// Where a price in force comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PriceSource {
    /// The shipped catalog: the entry's provider section and the date of its list prices.
    Catalog {
        entry: &'static str,
        date: &'static str,
    },
    Workspace,
}

/// The shipped catalog, parsed once by whoever holds it.
pub struct Catalog {
    /// Model name → (price, its date).
    /// (model, price, date): a few dozen, searched in order.
    models: Vec<(String, Price, String)>,
}

impl Catalog {
    /// The catalog shipped with the gateway. Its file is checked by this crate's tests, so an
    /// unreadable one is an empty catalog here rather than a panic.
    pub fn shipped() -> Catalog {
        Catalog::parse(CATALOG_JSON).unwrap_or(Catalog { models: Vec::new() })
    }

    /// Each model's entry is a price (read as a workspace's is) and the `source` whose date it
    /// has.
    fn parse(text: &str) -> Result<Catalog, String> {
        let file: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let (Some(sources), Some(entries)) = (file.get("sources"), file.get("models").and_then(Value::as_object))
        else {
            return Err("the catalog needs sources and models".to_string());
        };
        let mut models = Vec::with_capacity(entries.len());
        for (name, entry) in entries {
            let mut fields = entry.as_object().cloned().ok_or(format!("{name}: not an object"))?;
            let source = fields.remove("source").and_then(|s| s.as_str().map(str::to_string));
            let date = source.as_deref().and_then(|s| sources.get(s)?.get("date")?.as_str());
            let date = date.ok_or(format!("{name}: no source with a date"))?;
            let price =
                parse_price(&Value::Object(fields)).map_err(|(field, message)| format!("{name}.{field}: {message}"))?;
            models.push((name.clone(), price, date.to_string()));
        }
        Ok(Catalog { models })
    }

    /// The catalog's price of `model` and the date of that price.
    pub fn price(&self, model: &str) -> Option<(Price, &str)> {
        let name = self.entry_of(model)?;
        self.models.iter().find(|(known, ..)| known == name).map(|(_, price, date)| (*price, date.as_str()))
    }

    /// The catalog entry `model` is priced by: its exact name, or the longest entry that
    /// `model` extends with a date or version suffix only (so `gpt-4o-2024-08-06` is `gpt-4o`,
    /// but `gpt-4o-audio-preview` is not priced at all rather than priced as `gpt-4o`).
    fn entry_of(&self, model: &str) -> Option<&str> {
        let model = strip_region_prefix(model);
        let names = || self.models.iter().map(|(name, ..)| name.as_str());
        if let Some(name) = names().find(|name| *name == model) {
            return Some(name);
        }
        names().filter(|name| model.strip_prefix(name).is_some_and(is_version_suffix)).max_by_key(|name| name.len())
    }
}

/// Bedrock's cross-region inference profiles prefix the model id (`us.anthropic.claude-...`).
fn strip_region_prefix(model: &str) -> &str {
    for prefix in ["us.", "eu.", "apac.", "global.", "us-gov."] {
        if let Some(rest) = model.strip_prefix(prefix) {
            return rest;
        }
    }
    model
}

/// A date or version suffix: `-2024-08-06`, `-20241022`, `@20250929`, `-v1`, `:0`, `-latest`
/// and their combinations (`-20250929-v1:0`).
fn is_version_suffix(rest: &str) -> bool {
    // (separator, part) pairs: "-2024-08-06:0" is ('-', "2024"), ('-', "08"), ('-', "06"), (':', "0").
    let mut parts = Vec::new();
    let mut start = None;
    for (i, c) in rest.char_indices() {
        if matches!(c, '-' | '@' | ':') {
            if let Some((separator, from)) = start {
                parts.push((separator, rest.get(from..i).unwrap_or_default()));
            }
            start = Some((c, i + 1));
        } else if start.is_none() {
            return false;
        }
    }
    match start {
        Some((separator, from)) => parts.push((separator, rest.get(from..).unwrap_or_default())),
        None => return false,
    }
    let mut i = 0;
    while let Some(&(separator, part)) = parts.get(i) {
        let date =
            |len: usize, at: usize| parts.get(at).is_some_and(|&(s, p)| s == '-' && p.len() == len && is_digits(p));
        i += match (separator, part.len()) {
            ('-', 4) if is_digits(part) && date(2, i + 1) && date(2, i + 2) => 3,
            ('-' | '@', 8) if is_digits(part) => 1,
            ('-', _) if part == "latest" || part.strip_prefix('v').is_some_and(is_digits) => 1,
            (':', _) if is_digits(part) => 1,
            _ => return false,
        };
    }
    true
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Checks a price's numbers: each finite and at least 0, `max_output_tokens` at least 1. Err:
/// the field at fault and why.
pub fn check(price: &Price) -> Result<(), (&'static str, String)> {
    let amounts = [
        ("input_per_million", Some(price.input_per_million)),
        ("output_per_million", Some(price.output_per_million)),
        ("cached_input_per_million", price.cached_input_per_million),
        ("cache_write_per_million", price.cache_write_per_million),
    ];
    for (field, amount) in amounts {
        if let Some(amount) = amount {
            if !(0.0..=MAX_PER_MILLION).contains(&amount) {
                return Err((field, format!("{field} must be a number from 0 to {MAX_PER_MILLION} (US dollars)")));
            }
        }
    }
    if price.max_output_tokens == Some(0) {
        return Err(("max_output_tokens", "max_output_tokens must be an integer of at least 1".to_string()));
    }
    Ok(())
}

/// No model costs more than this per million tokens: a larger figure is a mistake.
const MAX_PER_MILLION: f64 = 100_000.0;

/// A workspace's price as `PUT /v1/prices/{model}` gives it. Err: the field at fault and why.
pub fn parse_price(body: &Value) -> Result<Price, (String, String)> {
    let Some(object) = body.as_object() else {
        return Err((String::new(), "the body must be a JSON object".to_string()));
    };
    for key in object.keys() {
        if !FIELDS.contains(&key.as_str()) {
            return Err((key.clone(), format!("unknown field {key}: a price has {}", FIELDS.join(", "))));
        }
    }
    let number = |field: &str, required: bool| -> Result<Option<f64>, (String, String)> {
        match object.get(field) {
            None if required => {
                Err((field.to_string(), format!("{field} is required (US dollars per million tokens)")))
            }
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                (field.to_string(), format!("{field} must be a number (US dollars per million tokens)"))
            }),
        }
    };
    let max_output_tokens = match object.get("max_output_tokens") {
        None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            ("max_output_tokens".to_string(), "max_output_tokens must be an integer of at least 1".to_string())
        })?),
    };
    let price = Price {
        input_per_million: number("input_per_million", true)?.unwrap_or_default(),
        output_per_million: number("output_per_million", true)?.unwrap_or_default(),
        cached_input_per_million: number("cached_input_per_million", false)?,
        cache_write_per_million: number("cache_write_per_million", false)?,
        max_output_tokens,
    };
    check(&price).map_err(|(field, message)| (field.to_string(), message))?;
    Ok(price)
}

const FIELDS: [&str; 5] = [
    "input_per_million",
    "output_per_million",
    "cached_input_per_million",
    "cache_write_per_million",
    "max_output_tokens",
];

/// A workspace's prices by model, as the control plane hands them to the filter.
pub fn parse_workspace_prices(value: Option<&Value>) -> Vec<(String, Price)> {
    let Some(Value::Object(prices)) = value else { return Vec::new() };
    prices_of(prices)
}

fn prices_of(prices: &Map<String, Value>) -> Vec<(String, Price)> {
    prices.iter().filter_map(|(model, v)| Some((model.clone(), parse_price(v).ok()?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    #[test]
    fn the_shipped_catalog_reads_whole() {
        let catalog = Catalog::parse(CATALOG_JSON).unwrap();
        assert!(catalog.models.len() >= 30);
        let (price, date) = catalog.price("gpt-4o-mini").unwrap();
        assert_eq!((price.input_per_million, price.output_per_million), (0.15, 0.6));
        assert_eq!(date, "2025-08-07");
    }

    #[test]
    fn dated_and_versioned_names_take_their_models_price() {
        let catalog = Catalog::shipped();
        let name = |model: &str| catalog.entry_of(model).map(str::to_string);
        assert_eq!(name("gpt-4o-2024-08-06").as_deref(), Some("gpt-4o"));
        assert_eq!(name("gpt-4o-mini-2024-07-18").as_deref(), Some("gpt-4o-mini"));
        assert_eq!(name("claude-sonnet-4-5-20250929").as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(name("claude-sonnet-4-5@20250929").as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(name("claude-3-5-haiku-latest").as_deref(), Some("claude-3-5-haiku"));
        assert_eq!(
            name("us.anthropic.claude-sonnet-4-5-20250929-v1:0").as_deref(),
            Some("anthropic.claude-sonnet-4-5")
        );
        assert_eq!(name("amazon.nova-pro-v1:0").as_deref(), Some("amazon.nova-pro-v1"));
        // Another model, not a version of one: unpriced rather than mispriced.
        assert_eq!(name("gpt-4o-audio-preview"), None);
        assert_eq!(name("claude-sonnet-4-6"), None);
        assert_eq!(name("o3-pro"), None);
        assert_eq!(name("gpt-4o-2024-08"), None);
        assert_eq!(name("my-model"), None);
    }

    #[test]
    fn costs_are_micro_usd_with_cached_input_at_its_price() {
        let price = Price {
            input_per_million: 2.5,
            output_per_million: 10.0,
            cached_input_per_million: Some(1.25),
            cache_write_per_million: None,
            max_output_tokens: None,
        };
        // 1000 input (400 cached) and 200 output: 600 × 2.5 + 400 × 1.25 + 200 × 10.
        let tokens = Tokens { input: 1000, cached_input: 400, output: 200, ..Tokens::default() };
        assert_eq!(price.cost_micro_usd(tokens), 4000);
        // 100 of the 600 written to the cache, at the input price without a price of their own.
        let written = Tokens { cache_write_input: 100, ..tokens };
        assert_eq!(price.cost_micro_usd(written), 4000);
        let anthropic = Price { cache_write_per_million: Some(3.125), ..price };
        // 500 × 2.5 + 400 × 1.25 + 100 × 3.125 + 200 × 10, rounded.
        assert_eq!(anthropic.cost_micro_usd(written), 4063);
        // A reservation prices every input token at the dearest input price.
        assert_eq!(anthropic.worst_case_micro_usd(Tokens { input: 1000, output: 200, ..Tokens::default() }), 5125);
        assert_eq!(price.worst_case_micro_usd(Tokens { input: 1000, output: 200, ..Tokens::default() }), 4500);
        let third =
            Price { input_per_million: 0.333, output_per_million: 0.0, cached_input_per_million: None, ..price };
        assert_eq!(third.cost_micro_usd(Tokens { input: 1, ..Tokens::default() }), 0);
        assert_eq!(third.worst_case_micro_usd(Tokens { input: 1, ..Tokens::default() }), 1);
    }

    #[test]
    fn a_workspace_price_is_checked_field_by_field() {
        let ok = parse_price(&json!({"input_per_million": 1, "output_per_million": 2.5})).unwrap();
        assert_eq!((ok.input_per_million, ok.output_per_million, ok.cached_input_per_million), (1.0, 2.5, None));
        let field = |body: Value| parse_price(&body).unwrap_err().0;
        assert_eq!(field(json!({"output_per_million": 1})), "input_per_million");
        assert_eq!(field(json!({"input_per_million": -1, "output_per_million": 1})), "input_per_million");
        assert_eq!(field(json!({"input_per_million": 1, "output_per_million": "2"})), "output_per_million");
        assert_eq!(field(json!({"input_per_million": 1, "output_per_million": 1, "currency": "EUR"})), "currency");
        assert_eq!(
            field(json!({"input_per_million": 1, "output_per_million": 1, "max_output_tokens": 0})),
            "max_output_tokens"
        );
        assert_eq!(field(json!([])), "");
    }
}
