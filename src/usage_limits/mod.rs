//! Rate limits, token limits and budgets at the gateway, and what each request costs.
//!
//! The control plane owns every limit's ledger (in its database, shared by replicas); a worker
//! holds leases of the allowance it granted ([`leases`]) and spends them locally, so a request
//! under a limit makes no call in steady state. Before a request is sent it reserves, of each
//! limit that applies, its worst case: one request; its input-token estimate plus its output
//! bound in tokens; that many tokens at the model's price in micro-USD. When the answer ends the
//! reservation is settled with the usage the provider reported.

pub(crate) mod leases;

use crate::errors::GatewayError;
use crate::providers::Usage;
use gateway_schema::limits::{parse_limit, Limit, LimitKind, Period};
use gateway_schema::prices::{self, Catalog, Price, Tokens};
use serde_json::Value;
use std::cell::RefCell;
use std::rc::Rc;

thread_local! {
    /// The shipped price catalog, read once per worker.
    static CATALOG: Catalog = Catalog::shipped();
    /// The catalog's price of each model this worker's requests named (a model the catalog
    /// does not list is looked for across it with every version suffix).
    static CATALOG_PRICES: RefCell<Kept<String, Option<Price>>> = const { RefCell::new(Kept::new()) };
}

/// Values a worker keeps by key in a vector (it sees few keys), emptied when full: what was
/// kept is made again.
struct Kept<K, V>(Vec<(K, V)>);

impl<K, V: Clone> Kept<K, V> {
    const fn new() -> Self {
        Kept(Vec::new())
    }

    /// The value kept under the key `is` matches, or the `(key, value)` that `make` makes, kept
    /// from now on (all are dropped first when `bound` are kept).
    fn get_or_make(&mut self, bound: usize, is: impl Fn(&K) -> bool, make: impl FnOnce() -> (K, V)) -> V {
        if let Some((_, value)) = self.0.iter().find(|(key, _)| is(key)) {
            return value.clone();
        }
        let (key, value) = make();
        if self.0.len() >= bound {
            self.0.clear();
        }
        self.0.push((key, value.clone()));
        value
    }
}

/// Models whose catalog price a worker keeps (emptied when full: they are looked up again).
const CATALOG_PRICES_KEPT: usize = 64;

/// A workspace's limits and prices, read from its policy entry.
#[derive(Debug, Default)]
pub(crate) struct Policy {
    /// Each with its id, shared by its ledgers' keys (a request clones no string).
    limits: Vec<(Rc<str>, Limit)>,
    /// By model: a workspace has few.
    prices: Vec<(String, Price)>,
}

impl Policy {
    /// The policy in the control plane's entry; a limit or price it cannot read is left out
    /// (the control plane checked them as they were stored).
    pub(crate) fn parse(value: &Value) -> Policy {
        let limits = match value.get("limits") {
            Some(Value::Array(items)) => {
                items.iter().filter_map(parse_stored_limit).map(|limit| (Rc::from(limit.id.as_str()), limit)).collect()
            }
            _ => Vec::new(),
        };
        Policy { limits, prices: prices::parse_workspace_prices(value.get("prices")) }
    }

    /// The price of `model`: the workspace's own, else the catalog's.
    pub(crate) fn price(&self, model: &str) -> Option<Price> {
        price_of(Some(self), model)
    }

    pub(crate) fn has_limits(&self) -> bool {
        !self.limits.is_empty()
    }
}

/// Parsed policies by the entry they were read from: while an entry is fresh the worker's
/// requests share it (one `Rc`), so it is parsed once per read, not once per request.
pub(crate) struct Policies(Kept<Rc<Value>, Option<Rc<Policy>>>);

impl Default for Policies {
    fn default() -> Self {
        Policies(Kept::new())
    }
}

/// Entries a worker keeps parsed (emptied when full: they are parsed again).
const POLICIES: usize = 64;

impl Policies {
    /// The parsed policy of a workspace's entry; None when it has neither limits nor prices.
    pub(crate) fn of(&mut self, entry: Option<&Rc<Value>>) -> Option<Rc<Policy>> {
        let value = entry?;
        self.0.get_or_make(POLICIES, |known| Rc::ptr_eq(known, value), || (Rc::clone(value), parse_policy(value)))
    }
}

fn parse_policy(value: &Value) -> Option<Rc<Policy>> {
    // Most workspaces have neither limits nor prices of their own.
    let empty = |name: &str| match value.get(name) {
        Some(Value::Array(items)) => items.is_empty(),
        Some(Value::Object(fields)) => fields.is_empty(),
        _ => true,
    };
    if empty("limits") && empty("prices") {
        return None;
    }
    Some(Rc::new(Policy::parse(value)))
}

/// A limit as the control plane hands it over: its fields, read as `PUT /v1/limits/{id}`
/// reads them, and its `id` (the control plane writes `budget_period` even without a budget).
fn parse_stored_limit(value: &Value) -> Option<Limit> {
    let mut fields = value.as_object()?.clone();
    let id = fields.remove("id")?.as_str()?.to_string();
    if !fields.contains_key("budget_usd") {
        fields.remove("budget_period");
    }
    parse_limit(&id, &Value::Object(fields)).ok()
}

/// The price of `model`: the workspace's own (with a policy), else the catalog's.
pub(crate) fn price_of(policy: Option<&Policy>, model: &str) -> Option<Price> {
    if let Some((_, price)) = policy.and_then(|p| p.prices.iter().find(|(known, _)| known == model)) {
        return Some(*price);
    }
    CATALOG_PRICES.with_borrow_mut(|known| {
        known.get_or_make(
            CATALOG_PRICES_KEPT,
            |name| name == model,
            || (model.to_string(), CATALOG.with(|catalog| catalog.price(model).map(|(price, _)| price))),
        )
    })
}

/// One limit's ledger of one kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LedgerKey {
    pub(crate) limit: Rc<str>,
    pub(crate) kind: LimitKind,
}

/// What a request must hold of one ledger before it is sent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Demand {
    pub(crate) key: LedgerKey,
    /// Requests (1), tokens, or micro-USD.
    pub(crate) amount: u64,
    pub(crate) bound: u64,
    pub(crate) period: Period,
}

/// A request as limits see it.
pub(crate) struct Ask<'a> {
    pub(crate) workspace: &'a str,
    pub(crate) key_id: Option<&'a str>,
    /// The model of each attempt the plan may make, after `override_params`: the first scopes
    /// the limits; a budget reserves at the dearest.
    pub(crate) models: Vec<&'a str>,
    /// The client's body, when the gateway read it.
    pub(crate) body: Option<&'a Value>,
    /// What tokens the endpoint's answers count.
    pub(crate) tokens: TokenUse,
}

/// What tokens an endpoint's answers count: token limits and budgets bound only endpoints
/// that count some (rate limits bound every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenUse {
    /// Images, audio, moderations, token counts, resources: no token usage.
    None,
    /// Embeddings: input only.
    Input,
    /// Chat, completions, Messages, Responses.
    InputAndOutput,
}

/// Tokens reserved for each image a request gives by URL (its bytes say nothing of its size):
/// more than any listed provider counts for one image.
pub(crate) const TOKENS_PER_IMAGE_URL: u64 = 3000;

/// What the request must reserve of each limit of `policy` that applies to it, and its
/// input-token estimate (0 when no limit needed it).
pub(crate) fn demands(policy: &Policy, ask: &Ask) -> Result<(Vec<Demand>, u64), GatewayError> {
    let scope_model = ask.models.first().copied().unwrap_or_default();
    let mut demands = Vec::new();
    let mut tokens = None;
    for (id, limit) in policy.limits.iter().filter(|(_, l)| l.applies(ask.workspace, ask.key_id, scope_model)) {
        for kind in limit.kinds() {
            if kind != LimitKind::Requests && ask.tokens == TokenUse::None {
                continue;
            }
            let amount = match kind {
                LimitKind::Requests => 1,
                LimitKind::Tokens => {
                    let worst = worst_tokens(policy, ask, limit, &mut tokens)?;
                    worst.input.saturating_add(worst.output)
                }
                LimitKind::Budget => {
                    let worst = worst_tokens(policy, ask, limit, &mut tokens)?;
                    worst_cost(policy, ask, limit, worst)?
                }
            };
            if kind == LimitKind::Budget && amount == 0 {
                // It can cost nothing (its models are priced at 0): a budget has nothing to hold.
                continue;
            }
            let bound = limit.bound(kind).unwrap_or_default();
            let key = LedgerKey { limit: Rc::clone(id), kind };
            demands.push(Demand { key, amount, bound, period: limit.budget_period });
        }
    }
    Ok((demands, tokens.map_or(0, |t| t.input)))
}

/// What an MCP `tools/call` of `server`'s `tool` must reserve: one request of each MCP limit
/// of `policy` that applies to it (an MCP limit bounds requests alone).
pub(crate) fn tool_demands(
    policy: &Policy,
    workspace: &str,
    key_id: Option<&str>,
    server: &str,
    tool: &str,
) -> Vec<Demand> {
    let applying = policy.limits.iter().filter(|(_, l)| l.applies_to_tool(workspace, key_id, server, tool));
    applying
        .filter_map(|(id, limit)| {
            let bound = limit.bound(LimitKind::Requests)?;
            let key = LedgerKey { limit: Rc::clone(id), kind: LimitKind::Requests };
            Some(Demand { key, amount: 1, bound, period: limit.budget_period })
        })
        .collect()
}

/// The most tokens the request can use: its input estimate and its output bound (computed
/// once per request).
fn worst_tokens(policy: &Policy, ask: &Ask, limit: &Limit, known: &mut Option<Tokens>) -> Result<Tokens, GatewayError> {
    if let Some(tokens) = known {
        return Ok(*tokens);
    }
    let input = ask.body.map_or(0, input_estimate);
    let output = match ask.body.and_then(output_bound) {
        _ if ask.tokens == TokenUse::Input => 0,
        Some(bound) => bound,
        None => {
            // The model's default output limit, the largest among the attempts'.
            let defaults = ask.models.iter().map(|m| policy.price(m).and_then(|p| p.max_output_tokens));
            defaults.collect::<Option<Vec<_>>>().and_then(|d| d.into_iter().max()).ok_or_else(|| {
                GatewayError::invalid_param(
                    "max_tokens",
                    format!(
                        "limit '{}' needs the request's output bound: set max_tokens (the model's default output limit is not known)",
                        limit.id
                    ),
                )
                .with_code("max_tokens_required")
            })?
        }
    };
    let tokens = Tokens { input, output, ..Tokens::default() };
    *known = Some(tokens);
    Ok(tokens)
}

/// The dearest attempt's cost of `tokens`, in micro-USD; a model without a price is refused.
fn worst_cost(policy: &Policy, ask: &Ask, limit: &Limit, tokens: Tokens) -> Result<u64, GatewayError> {
    let mut worst = 0;
    for model in &ask.models {
        let price = policy.price(model).ok_or_else(|| {
            GatewayError::invalid_param(
                "model",
                format!(
                    "limit '{}' has a budget and model '{model}' has no price: set one with PUT /v1/prices/{model}",
                    limit.id
                ),
            )
            .with_code("price_not_set")
        })?;
        worst = worst.max(price.worst_case_micro_usd(tokens));
    }
    Ok(worst)
}

/// The request's output bound, from whichever field its API names it by.
fn output_bound(body: &Value) -> Option<u64> {
    ["max_completion_tokens", "max_tokens", "max_output_tokens"].iter().find_map(|f| body.get(*f)?.as_u64())
}

/// An upper bound of the request's input tokens: the bytes of its JSON body (every token of
/// the listed providers' tokenizers covers at least one byte of text, and the JSON around the
/// text counts too), plus [`TOKENS_PER_IMAGE_URL`] for each image given by URL.
pub(crate) fn input_estimate(body: &Value) -> u64 {
    let mut bytes = ByteCount(0);
    // Counted as written: the body is not printed again.
    let bytes = serde_json::to_writer(&mut bytes, body).map_or(0, |()| bytes.0);
    bytes.saturating_add(TOKENS_PER_IMAGE_URL.saturating_mul(image_urls(body)))
}

/// A writer that only counts the bytes written to it.
struct ByteCount(u64);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len() as u64);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Images given by URL anywhere in the body (OpenAI's `image_url`, the Responses API's
/// `input_image`, Anthropic's `url` source).
fn image_urls(value: &Value) -> u64 {
    match value {
        Value::Object(fields) => {
            let own = match fields.get("type").and_then(Value::as_str) {
                Some("image_url" | "input_image") => 1,
                Some("url") if fields.contains_key("url") => 1,
                _ => 0,
            };
            own + fields.values().map(image_urls).sum::<u64>()
        }
        Value::Array(items) => items.iter().map(image_urls).sum(),
        _ => 0,
    }
}

/// The cost of `usage` of `model`, in micro-USD (cached prompt tokens at their own price);
/// None when the model has no price.
pub(crate) fn cost(policy: Option<&Policy>, model: &str, usage: Usage) -> Option<u64> {
    Some(price_of(policy, model)?.cost_micro_usd(tokens(usage)))
}

/// The most `usage` of `model` can cost, in micro-USD (rounded up).
pub(crate) fn most_cost(policy: Option<&Policy>, model: &str, usage: Usage) -> Option<u64> {
    Some(price_of(policy, model)?.worst_case_micro_usd(tokens(usage)))
}

fn tokens(usage: Usage) -> Tokens {
    Tokens {
        input: usage.prompt_tokens,
        cached_input: usage.cached_prompt_tokens,
        cache_write_input: usage.cache_write_prompt_tokens,
        output: usage.completion_tokens,
    }
}

/// The 429 of a limit the request does not fit, in OpenAI's shape.
pub(crate) fn refusal(demand: &Demand, retry_after_s: u64) -> GatewayError {
    let id = &demand.key.limit;
    let wait = format!("Try again in {retry_after_s}s.");
    match demand.key.kind {
        LimitKind::Requests => GatewayError::new(
            429,
            "requests",
            format!("Rate limit reached for limit '{id}': {} requests per minute. {wait}", demand.bound),
        )
        .with_code("rate_limit_exceeded"),
        LimitKind::Tokens => GatewayError::new(
            429,
            "tokens",
            format!(
                "Rate limit reached for limit '{id}': {} tokens per minute; this request may use up to {} tokens. {wait}",
                demand.bound, demand.amount
            ),
        )
        .with_code("rate_limit_exceeded"),
        LimitKind::Budget => GatewayError::new(
            429,
            "insufficient_quota",
            format!(
                "The budget of limit '{id}' ({} USD per {}) cannot cover this request, which may cost up to {} USD. {wait}",
                usd(demand.bound),
                demand.period.as_str(),
                usd(demand.amount)
            ),
        )
        .with_code("budget_exceeded"),
    }
}

/// The 503 of a limit whose allowance the control plane could not grant.
pub(crate) fn unavailable(demand: &Demand) -> GatewayError {
    GatewayError::new(
        503,
        "api_error",
        format!(
            "the allowance of limit '{}' could not be had from the control plane: the request is refused rather than let past the limit",
            demand.key.limit
        ),
    )
    .with_code("limits_unavailable")
}

/// Micro-USD as US dollars.
pub(crate) fn usd(micro: u64) -> f64 {
    micro as f64 / 1e6
}

#[cfg(test)]
mod tests;
