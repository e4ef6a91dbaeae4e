use super::*;
use crate::unit_tests::test;
use serde_json::json;

fn policy(limits: Value, prices: Value) -> Policy {
    Policy::parse(&json!({"limits": limits, "prices": prices}))
}

fn ask<'a>(models: Vec<&'a str>, body: &'a Value) -> Ask<'a> {
    Ask { workspace: "team", key_id: Some("key_1"), models, body: Some(body), tokens: TokenUse::InputAndOutput }
}

fn demands(policy: &Policy, ask: &Ask) -> Result<Vec<Demand>, GatewayError> {
    super::demands(policy, ask).map(|(demands, _)| demands)
}

fn amounts(demands: &[Demand]) -> Vec<(&str, LimitKind, u64)> {
    demands.iter().map(|d| (&*d.key.limit, d.key.kind, d.amount)).collect()
}

#[test]
fn each_limit_that_applies_asks_its_worst_case() {
    let policy = policy(
        json!([
            {"id": "team", "workspace": "team", "requests_per_minute": 10, "budget_usd": 5, "budget_period": "month"},
            // As the control plane writes it: a budget period without a budget.
            {"id": "key", "api_key_id": "key_1", "tokens_per_minute": 100000, "budget_period": "month"},
            {"id": "other-key", "api_key_id": "key_2", "requests_per_minute": 1},
            {"id": "other-model", "workspace": "team", "model": "gpt-4o", "requests_per_minute": 1}
        ]),
        json!({}),
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    let input = input_estimate(&body);
    assert_eq!(input, serde_json::to_vec(&body).unwrap().len() as u64);
    let demands = demands(&policy, &ask(vec!["gpt-4o-mini"], &body)).unwrap();
    // gpt-4o-mini: $0.15 and $0.60 per million tokens, so tokens × price is micro-USD.
    let cost = (input as f64 * 0.15 + 100.0 * 0.6).ceil() as u64;
    assert_eq!(
        amounts(&demands),
        vec![
            ("team", LimitKind::Requests, 1),
            ("team", LimitKind::Budget, cost),
            ("key", LimitKind::Tokens, input + 100)
        ]
    );
    assert_eq!(demands[1].bound, 5_000_000);
}

#[test]
fn a_budget_reserves_at_the_dearest_attempt_and_the_workspace_price_wins() {
    let policy = policy(
        json!([{"id": "b", "workspace": "team", "budget_usd": 1}]),
        json!({"cheap": {"input_per_million": 1, "output_per_million": 1}, "gpt-4o": {"input_per_million": 100, "output_per_million": 100}}),
    );
    let body = json!({"model": "cheap", "max_completion_tokens": 10, "messages": []});
    let input = input_estimate(&body);
    let demands = demands(&policy, &ask(vec!["cheap", "gpt-4o"], &body)).unwrap();
    assert_eq!(amounts(&demands), vec![("b", LimitKind::Budget, (input + 10) * 100)]);
}

#[test]
fn a_request_that_can_cost_nothing_holds_nothing_of_a_budget() {
    let policy = policy(
        json!([{"id": "b", "workspace": "team", "budget_usd": 5, "requests_per_minute": 10}]),
        json!({"free": {"input_per_million": 0, "output_per_million": 0}}),
    );
    let body = json!({"model": "free", "max_tokens": 5, "messages": []});
    let demands = demands(&policy, &ask(vec!["free"], &body)).unwrap();
    assert_eq!(amounts(&demands), vec![("b", LimitKind::Requests, 1)]);
}

#[test]
fn a_budget_on_a_model_without_a_price_is_a_400_naming_what_to_set() {
    let policy = policy(json!([{"id": "b", "workspace": "team", "budget_usd": 1}]), json!({}));
    let body = json!({"model": "my-model", "max_tokens": 10, "messages": []});
    let error = demands(&policy, &ask(vec!["my-model"], &body)).unwrap_err();
    assert_eq!((error.status, error.code, error.param.as_deref()), (400, Some("price_not_set"), Some("model")));
    assert!(error.message.contains("PUT /v1/prices/my-model"), "{}", error.message);
}

#[test]
fn without_max_tokens_the_models_output_limit_is_reserved_or_the_request_must_name_one() {
    let policy = policy(json!([{"id": "t", "workspace": "team", "tokens_per_minute": 1000000}]), json!({}));
    let body = json!({"model": "gpt-4o", "messages": []});
    let demands_known = demands(&policy, &ask(vec!["gpt-4o"], &body)).unwrap();
    assert_eq!(demands_known[0].amount, input_estimate(&body) + 16384);
    let unknown = json!({"model": "my-model", "messages": []});
    let error = demands(&policy, &ask(vec!["my-model"], &unknown)).unwrap_err();
    assert_eq!((error.status, error.code), (400, Some("max_tokens_required")));
    // Embeddings have no output; an image generation no tokens at all.
    let embeddings = json!({"model": "my-model", "input": "hello"});
    let input_only = Ask { tokens: TokenUse::Input, ..ask(vec!["my-model"], &embeddings) };
    assert_eq!(demands(&policy, &input_only).unwrap()[0].amount, input_estimate(&embeddings));
    let none = Ask { tokens: TokenUse::None, ..ask(vec!["my-model"], &unknown) };
    assert_eq!(demands(&policy, &none).unwrap(), vec![]);
}

#[test]
fn an_image_by_url_counts_more_than_its_bytes() {
    let text = json!({"messages": [{"role": "user", "content": "look"}]});
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/dog.png"}}
    ]}]});
    let bytes = serde_json::to_vec(&image).unwrap().len() as u64;
    assert_eq!(input_estimate(&image), bytes + 2 * TOKENS_PER_IMAGE_URL);
    assert_eq!(input_estimate(&text), serde_json::to_vec(&text).unwrap().len() as u64);
}

#[test]
fn refusals_are_429s_in_openais_shape() {
    let key = |kind| LedgerKey { limit: "team".into(), kind };
    let demand = |kind, amount, bound| Demand { key: key(kind), amount, bound, period: Period::Month };
    let rate = refusal(&demand(LimitKind::Requests, 1, 10), 12);
    assert_eq!((rate.status, rate.kind, rate.code), (429, "requests", Some("rate_limit_exceeded")));
    assert!(rate.message.contains("10 requests per minute") && rate.message.contains("12s"), "{}", rate.message);
    let tokens = refusal(&demand(LimitKind::Tokens, 500, 100), 3);
    assert_eq!((tokens.kind, tokens.code), ("tokens", Some("rate_limit_exceeded")));
    let budget = refusal(&demand(LimitKind::Budget, 1_500_000, 5_000_000), 86400);
    assert_eq!((budget.kind, budget.code), ("insufficient_quota", Some("budget_exceeded")));
    assert!(budget.message.contains("5 USD per month") && budget.message.contains("1.5 USD"), "{}", budget.message);
}

#[test]
fn cost_is_the_usage_at_the_price_in_force() {
    let usage = |prompt_tokens, cached_prompt_tokens, completion_tokens| Usage {
        prompt_tokens,
        cached_prompt_tokens,
        completion_tokens,
        ..Usage::default()
    };
    let own = policy(json!([]), json!({"gpt-4o": {"input_per_million": 1, "output_per_million": 2}}));
    assert_eq!(cost(Some(&own), "gpt-4o", usage(1000, 0, 100)), Some(1200));
    // Without a price of their own, cached prompt tokens cost the input price.
    assert_eq!(cost(Some(&own), "gpt-4o", usage(1000, 800, 100)), Some(1200));
    // The catalog's: $2.50 and $10 per million, cached input $1.25.
    assert_eq!(cost(None, "gpt-4o-2024-08-06", usage(1000, 0, 100)), Some(3500));
    assert_eq!(cost(None, "gpt-4o-2024-08-06", usage(1000, 800, 100)), Some(200 * 5 / 2 + 800 * 5 / 4 + 1000));
    assert_eq!(cost(None, "my-model", usage(1000, 0, 100)), None);
    // Anthropic's cache writes at their own price: claude-sonnet-4-5's $3 input, $0.30 read
    // and $3.75 written per million, $15 output.
    let written = Usage { cache_write_prompt_tokens: 400, ..usage(1000, 500, 100) };
    assert_eq!(cost(None, "claude-sonnet-4-5", written), Some(100 * 3 + 500 * 3 / 10 + 400 * 15 / 4 + 1500));
    // The most a usage can cost is rounded up: 1 token at $2.50 per million is 2.5 micro-USD;
    // every input token at the dearest input price.
    assert_eq!(most_cost(None, "gpt-4o", usage(1, 0, 0)), Some(3));
    assert_eq!(most_cost(None, "gpt-4o", usage(2, 1, 0)), Some(5));
    assert_eq!(most_cost(None, "claude-sonnet-4-5", usage(1000, 0, 0)), Some(3750));
}
