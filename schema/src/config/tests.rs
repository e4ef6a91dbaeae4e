use super::*;
use crate::cache::CacheMode;
use crate::cloud::{AzureDeploymentType, CloudFields, Deployment};
use crate::guardrails::params::CheckParams;
use crate::guardrails::spec::{Check, Feedback, HookOutcome, InlineGuardrail};
use crate::unit_tests::test;
use serde_json::json;

fn ok(v: Value) -> Config {
    match parse_config(&v) {
        Ok(c) => c,
        Err(e) => panic!("rejected {v}: {e}"),
    }
}

fn err(v: Value) -> ConfigError {
    match parse_config(&v) {
        Ok(c) => panic!("accepted {v}: {c:?}"),
        Err(e) => e,
    }
}

/// Asserts `v` is rejected at exactly `path` with a message containing `message`.
fn rejected(v: Value, path: &str, message: &str) {
    let e = err(v);
    assert_eq!(e.path, path, "{e}");
    assert!(e.message.contains(message), "expected {message:?} in {e}");
}

/// A minimal valid single-provider config plus the properties of `extra`.
fn with(extra: Value) -> Value {
    let mut v = json!({"provider": "openai", "api_key": "sk-test"});
    if let (Some(base), Value::Object(extra)) = (v.as_object_mut(), extra) {
        base.extend(extra);
    }
    v
}

fn provider() -> Value {
    with(json!({}))
}

/// A load-balanced config over `targets`.
fn balanced(targets: Value) -> Value {
    json!({"strategy": {"mode": "loadbalance"}, "targets": targets})
}

fn hook_with(extra: Value) -> Value {
    let mut h = json!({"id": "h1"});
    if let (Some(base), Value::Object(extra)) = (h.as_object_mut(), extra) {
        base.extend(extra);
    }
    h
}

// ---- objects and unknown properties ----

#[test]
fn root_and_targets_must_be_objects() {
    rejected(json!([]), "", "must be an object, got an array");
    rejected(json!(null), "", "must be an object, got null");
    rejected(json!("cfg-id"), "", "must be an object, got a string");
    rejected(balanced(json!([provider(), 5])), "targets[1]", "must be an object, got a number");
    ok(balanced(json!([provider(), provider()])));
}

#[test]
fn unknown_properties_are_rejected_with_their_path() {
    let cases = [
        (with(json!({"foo": 1})), "foo"),
        (balanced(json!([with(json!({"modle": "x"}))])), "targets[0].modle"),
        (with(json!({"strategy": {"mode": "single", "x": 1}})), "strategy.x"),
        (
            json!({"strategy": {"mode": "conditional", "default": "a",
                "conditions": [{"query": {}, "then": "a", "else": "b"}]}, "targets": [with(json!({"name": "a"}))]}),
            "strategy.conditions[0].else",
        ),
        (with(json!({"cache": {"mode": "simple", "ttl": 5}})), "cache.ttl"),
        (with(json!({"retry": {"attempts": 1, "backoff": 5}})), "retry.backoff"),
        (with(json!({"cb_config": {"failure_threshold": 1, "cooldown_interval": 30000, "x": 1}})), "cb_config.x"),
        (with(json!({"before_request_hooks": [hook_with(json!({"x": 1}))]})), "before_request_hooks[0].x"),
        (
            with(
                json!({"before_request_hooks": [hook_with(json!({"checks": [{"id": "c", "parameters": {}, "x": 1}]}))]}),
            ),
            "before_request_hooks[0].checks[0].x",
        ),
        (
            with(json!({"after_request_hooks": [hook_with(json!({"on_success": {"x": 1}}))]})),
            "after_request_hooks[0].on_success.x",
        ),
        (
            with(json!({"before_request_hooks": [hook_with(json!({"on_fail": {"feedback": {"x": 1}}}))]})),
            "before_request_hooks[0].on_fail.feedback.x",
        ),
        (
            with(json!({"deployments": [{"deployment_id": "d", "alias": "a", "api_version": "v", "x": 1}]})),
            "deployments[0].x",
        ),
    ];
    for (config, path) in cases {
        let key = path.rsplit('.').next().unwrap_or_default();
        rejected(config, path, &format!("unknown property `{key}`"));
    }
}

// ---- types ----

#[test]
fn property_types_are_checked() {
    rejected(json!({"provider": 5, "api_key": "k"}), "provider", "must be a string, got a number");
    rejected(with(json!({"api_key": null})), "api_key", "must be a string, got null");
    rejected(with(json!({"strict_vendor_compliance": "false"})), "strict_vendor_compliance", "must be a boolean");
    rejected(with(json!({"override_params": []})), "override_params", "must be an object, got an array");
    rejected(with(json!({"on_status_codes": 500})), "on_status_codes", "must be an array");
    rejected(with(json!({"forward_headers": "x-a"})), "forward_headers", "must be an array");
    rejected(with(json!({"before_request_hooks": {}})), "before_request_hooks", "must be an array");
    rejected(with(json!({"cloud_b_service_account_json": "{}"})), "cloud_b_service_account_json", "must be an object");
    let c = ok(with(json!({"strict_vendor_compliance": false, "name": "n", "cloud_b_service_account_json": {"a": 1}})));
    assert_eq!(c.strict_vendor_compliance, Some(false));
    assert_eq!(c.cloud.gcp_service_account_json, json!({"a": 1}).as_object().cloned());
}

#[test]
fn override_params_is_a_free_object() {
    let c = ok(with(json!({"override_params": {"model": "gpt-4o", "anything": [1, {"x": null}]}})));
    assert_eq!(c.override_params, json!({"model": "gpt-4o", "anything": [1, {"x": null}]}).as_object().cloned());
    rejected(with(json!({"override_params": "model=gpt-4o"})), "override_params", "must be an object");
}

#[test]
fn integers_reject_fractions_negatives_and_overflow() {
    rejected(with(json!({"request_timeout": 1.5})), "request_timeout", "must be an integer");
    rejected(with(json!({"request_timeout": -1})), "request_timeout", "must be at least 1");
    rejected(with(json!({"request_timeout": 0})), "request_timeout", "must be at least 1");
    rejected(with(json!({"request_timeout": "100"})), "request_timeout", "must be an integer, got a string");
    rejected(with(json!({"request_timeout": 1e30})), "request_timeout", "must be at most");
    let beyond_u64: Value = serde_json::from_str("18446744073709551616").unwrap();
    rejected(with(json!({"request_timeout": beyond_u64})), "request_timeout", "must be at most");
    assert_eq!(ok(with(json!({"request_timeout": 1}))).request_timeout, Some(1));
    assert_eq!(ok(with(json!({"request_timeout": u64::MAX}))).request_timeout, Some(u64::MAX));
    // JSON has one number type: an integral float is that integer.
    assert_eq!(ok(with(json!({"request_timeout": 5000.0}))).request_timeout, Some(5000));
}

#[test]
fn status_codes_are_integers_from_100_to_599() {
    rejected(with(json!({"on_status_codes": [429, 99]})), "on_status_codes[1]", "must be at least 100");
    rejected(with(json!({"on_status_codes": [600]})), "on_status_codes[0]", "must be at most 599");
    rejected(with(json!({"on_status_codes": ["500"]})), "on_status_codes[0]", "must be an integer");
    rejected(
        with(json!({"retry": {"attempts": 1, "on_status_codes": [500.5]}})),
        "retry.on_status_codes[0]",
        "integer",
    );
    rejected(
        with(
            json!({"cb_config": {"failure_threshold": 1, "cooldown_interval": 30000, "failure_status_codes": [70000]}}),
        ),
        "cb_config.failure_status_codes[0]",
        "must be at most 599",
    );
    let c = ok(with(json!({"on_status_codes": [100, 429, 599]})));
    assert_eq!(c.on_status_codes, Some(vec![100, 429, 599]));
}

#[test]
fn weight_is_a_non_negative_number() {
    rejected(balanced(json!([with(json!({"weight": -0.5}))])), "targets[0].weight", "must be at least 0");
    rejected(with(json!({"weight": "1"})), "weight", "must be a number");
    assert_eq!(ok(with(json!({"weight": 0}))).weight, Some(0.0));
    assert_eq!(ok(with(json!({"weight": 2.5}))).weight, Some(2.5));
}

// ---- enums ----

#[test]
fn enums_list_their_allowed_values() {
    rejected(
        json!({"strategy": {"mode": "round_robin"}, "targets": [provider()]}),
        "strategy.mode",
        "must be one of `single`, `loadbalance`, `fallback`, `conditional`",
    );
    rejected(with(json!({"cache": {"mode": "exact"}})), "cache.mode", "must be one of `simple`, `semantic`");
    rejected(with(json!({"cache": {"mode": 1}})), "cache.mode", "must be a string");
    rejected(
        with(json!({"cloud_a_deployment_type": "dedicated"})),
        "cloud_a_deployment_type",
        "must be one of `serverless`, `managed`",
    );
    assert_eq!(ok(with(json!({"cache": {"mode": "simple"}}))).cache.map(|c| c.mode), Some(CacheMode::Simple));
    let c = ok(with(json!({"cloud_a_deployment_type": "serverless"})));
    assert_eq!(c.cloud.azure_deployment_type, Some(AzureDeploymentType::Serverless));
}

// ---- required properties ----

#[test]
fn required_properties_are_reported_at_their_path() {
    let hook = |h: Value| with(json!({"before_request_hooks": [h]}));
    let conditional = |condition: Value| {
        json!({"strategy": {"mode": "conditional", "conditions": [condition], "default": "a"},
            "targets": [with(json!({"name": "a"}))]})
    };
    let cases = [
        (json!({"strategy": {}, "targets": [provider()]}), "strategy.mode"),
        (conditional(json!({"then": "a"})), "strategy.conditions[0].query"),
        (conditional(json!({"query": {}})), "strategy.conditions[0].then"),
        (with(json!({"cache": {"max_age": 60}})), "cache.mode"),
        (with(json!({"retry": {"on_status_codes": [429]}})), "retry.attempts"),
        (with(json!({"cb_config": {"cooldown_interval": 30000}})), "cb_config.failure_threshold"),
        (with(json!({"cb_config": {"failure_threshold": 3}})), "cb_config.cooldown_interval"),
        (hook(json!({"type": "guardrail"})), "before_request_hooks[0].id"),
        (hook(hook_with(json!({"checks": [{"parameters": {}}]}))), "before_request_hooks[0].checks[0].id"),
        (hook(hook_with(json!({"checks": [{"id": "c"}]}))), "before_request_hooks[0].checks[0].parameters"),
        (with(json!({"deployments": [{"alias": "a", "api_version": "v"}]})), "deployments[0].deployment_id"),
        (with(json!({"deployments": [{"deployment_id": "d", "api_version": "v"}]})), "deployments[0].alias"),
        (with(json!({"deployments": [{"deployment_id": "d", "alias": "a"}]})), "deployments[0].api_version"),
    ];
    for (config, path) in cases {
        rejected(config, path, "is required");
    }
    rejected(conditional(json!({"query": [], "then": "a"})), "strategy.conditions[0].query", "must be an object");
    rejected(
        hook(hook_with(json!({"checks": [{"id": "c", "parameters": null}]}))),
        "before_request_hooks[0].checks[0].parameters",
        "must be an object",
    );
}

// ---- bounds ----

#[test]
fn circuit_breaker_bounds() {
    let cb = |threshold: Value, cooldown: Value| {
        balanced(json!([
            provider(),
            with(json!({"cb_config": {"failure_threshold": threshold, "cooldown_interval": cooldown}}))
        ]))
    };
    rejected(cb(json!(0), json!(30000)), "targets[1].cb_config.failure_threshold", "must be at least 1");
    rejected(cb(json!(1.5), json!(30000)), "targets[1].cb_config.failure_threshold", "must be an integer");
    rejected(cb(json!(4_294_967_296u64), json!(30000)), "targets[1].cb_config.failure_threshold", "at most 4294967295");
    rejected(cb(json!(1), json!(29999)), "targets[1].cb_config.cooldown_interval", "must be at least 30000");
    rejected(cb(json!(1), json!(-30000)), "targets[1].cb_config.cooldown_interval", "must be at least 30000");
    let c = ok(cb(json!(1), json!(30000)));
    let expected = CircuitBreakerConfig { failure_threshold: 1, cooldown_interval: 30000, failure_status_codes: None };
    assert_eq!(c.targets[1].cb_config, Some(expected));
}

#[test]
fn retry_attempts_are_capped_at_10() {
    rejected(with(json!({"retry": {"attempts": 11}})), "retry.attempts", "must be at most 10");
    rejected(with(json!({"retry": {"attempts": 4_294_967_296u64}})), "retry.attempts", "must be at most 10");
    rejected(with(json!({"retry": {"attempts": -1}})), "retry.attempts", "must be at least 0");
    rejected(
        with(json!({"retry": {"attempts": 1, "use_retry_after_headers": 1}})),
        "retry.use_retry_after_headers",
        "boolean",
    );
    let r = ok(with(json!({"retry": {"attempts": 0}}))).retry;
    assert_eq!(r, Some(RetryConfig { attempts: 0, on_status_codes: None, use_retry_after_headers: false }));
    assert_eq!(ok(with(json!({"retry": {"attempts": 10}}))).retry.map(|r| r.attempts), Some(10));
}

#[test]
fn cache_max_age_is_at_least_one_second() {
    rejected(with(json!({"cache": {"mode": "simple", "max_age": 0}})), "cache.max_age", "must be at least 1");
    rejected(with(json!({"cache": {"mode": "simple", "max_age": 0.5}})), "cache.max_age", "must be an integer");
    let c = ok(with(json!({"cache": {"mode": "semantic", "max_age": 60}}))).cache;
    assert_eq!(c, Some(CacheConfig { mode: CacheMode::Semantic, max_age: Some(60) }));
}

// ---- hooks and guardrails ----

#[test]
fn async_only_on_after_request_hooks() {
    let h = hook_with(json!({"async": true}));
    rejected(with(json!({"before_request_hooks": [h.clone()]})), "before_request_hooks[0].async", "unknown property");
    let c = ok(with(json!({"after_request_hooks": [h]})));
    assert!(c.after_request_hooks[0].is_async);
    rejected(
        with(json!({"after_request_hooks": [hook_with(json!({"async": "yes"}))]})),
        "after_request_hooks[0].async",
        "must be a boolean",
    );
}

#[test]
fn deny_only_where_the_spec_allows_it() {
    let on_fail = json!({"on_fail": {"deny": true}});
    let c = ok(with(json!({"before_request_hooks": [hook_with(on_fail.clone())]})));
    assert_eq!(c.before_request_hooks[0].on_fail, Some(HookOutcome { feedback: None, deny: Some(true) }));
    rejected(
        with(json!({"after_request_hooks": [hook_with(on_fail.clone())]})),
        "after_request_hooks[0].on_fail.deny",
        "unknown property",
    );
    rejected(
        with(json!({"input_guardrails": [on_fail.clone()]})),
        "input_guardrails[0].on_fail.deny",
        "unknown property",
    );
    let c = ok(with(json!({"output_guardrails": [{"on_success": {"deny": false}}]})));
    let Guardrail::Inline(g) = &c.output_guardrails[0] else { panic!("expected an inline guardrail") };
    assert_eq!(g.on_success, Some(HookOutcome { feedback: None, deny: Some(false) }));
    rejected(
        with(json!({"before_request_hooks": [hook_with(json!({"on_fail": {"deny": "yes"}}))]})),
        "before_request_hooks[0].on_fail.deny",
        "must be a boolean",
    );
}

#[test]
fn feedback_shape() {
    let fb =
        |feedback: Value| with(json!({"after_request_hooks": [hook_with(json!({"on_fail": {"feedback": feedback}}))]}));
    rejected(fb(json!({"value": "bad"})), "after_request_hooks[0].on_fail.feedback.value", "must be a number");
    rejected(fb(json!({"weight": true})), "after_request_hooks[0].on_fail.feedback.weight", "must be a number");
    rejected(fb(json!({"metadata": "m"})), "after_request_hooks[0].on_fail.feedback.metadata", "must be an object");
    rejected(fb(json!([])), "after_request_hooks[0].on_fail.feedback", "must be an object");
    let c = ok(fb(json!({"value": -5, "weight": 0.5, "metadata": {"k": "v"}})));
    let expected = Feedback { value: Some(-5.0), weight: Some(0.5), metadata: json!({"k": "v"}).as_object().cloned() };
    assert_eq!(c.after_request_hooks[0].on_fail.as_ref().and_then(|o| o.feedback.clone()), Some(expected));
}

#[test]
fn guardrails_are_references_or_inline_objects() {
    let c = ok(with(json!({"input_guardrails": [
        "gr-jailbreak",
        {"id": "g1", "deny": true, "async": false, "default.contains": {"words": ["x"], "operator": "any"}, "vendor.pii": {}}
    ]})));
    let checks =
        vec![check("default.contains", json!({"words": ["x"], "operator": "any"})), check("vendor.pii", json!({}))];
    let inline = InlineGuardrail {
        id: Some("g1".into()),
        deny: Some(true),
        is_async: Some(false),
        checks,
        ..Default::default()
    };
    assert_eq!(c.input_guardrails, vec![Guardrail::Reference("gr-jailbreak".into()), Guardrail::Inline(inline)]);

    rejected(with(json!({"input_guardrails": [""]})), "input_guardrails[0]", "must not be empty");
    rejected(with(json!({"output_guardrails": ["g", 5]})), "output_guardrails[1]", "must be a string or an object");
    rejected(
        with(json!({"input_guardrails": [null]})),
        "input_guardrails[0]",
        "must be a string or an object, got null",
    );
    rejected(
        with(json!({"input_guardrails": [{"default.contains": "secret"}]})),
        "input_guardrails[0].default.contains",
        "must be an object",
    );
    rejected(with(json!({"input_guardrails": [{"deny": "yes"}]})), "input_guardrails[0].deny", "must be a boolean");
    // A check's parameters are read with the config: a bad one is refused there, named.
    rejected(
        with(json!({"input_guardrails": [{"default.regexMatch": {"rule": "(a"}}]})),
        "input_guardrails[0].default.regexMatch",
        "parameter `rule` is not a valid pattern",
    );
    rejected(
        with(json!({"output_guardrails": [{"default.contains": {"words": ["x"]}}]})),
        "output_guardrails[0].default.contains",
        "parameter `operator` must be one of",
    );
    rejected(with(json!({"input_guardrails": [{"id": 1}]})), "input_guardrails[0].id", "must be a string");
}

#[test]
fn hook_checks_and_type_parse() {
    let c = ok(with(json!({"before_request_hooks": [
        {"id": "h", "type": "guardrail", "checks": [{"id": "default.regexMatch", "parameters": {"rule": "x"}}]}
    ]})));
    let expected = Hook {
        id: "h".into(),
        kind: Some("guardrail".into()),
        checks: vec![check("default.regexMatch", json!({"rule": "x"}))],
        on_fail: None,
        on_success: None,
        is_async: false,
    };
    assert_eq!(c.before_request_hooks, vec![expected]);
    rejected(
        with(json!({"before_request_hooks": [hook_with(json!({"checks": [{"id": "c", "parameters": {}}, 7]}))]})),
        "before_request_hooks[0].checks[1]",
        "must be an object",
    );
    rejected(
        with(json!({"before_request_hooks": [hook_with(json!({"type": 1}))]})),
        "before_request_hooks[0].type",
        "string",
    );
    rejected(
        with(json!({"before_request_hooks": [hook_with(json!({"checks": [
            {"id": "default.wordCount", "parameters": {"minWords": -1}}
        ]}))]})),
        "before_request_hooks[0].checks[0].parameters",
        "parameter `minWords` must be a non-negative integer",
    );
    // An id the gateway does not run is no error here: the check fails when it runs.
    let unknown =
        json!({"before_request_hooks": [hook_with(json!({"checks": [{"id": "vendor.x", "parameters": {}}]}))]});
    assert_eq!(ok(with(unknown)).before_request_hooks[0].checks[0].params, CheckParams::Unknown);
}

// ---- "at least one of" (spec 2.1) ----

#[test]
fn a_config_must_do_something() {
    rejected(json!({}), "", "a config needs one of");
    rejected(json!({"provider": "openai"}), "", "a config needs one of");
    rejected(json!({"name": "x", "weight": 1, "override_params": {}}), "", "a config needs one of");
    rejected(json!({"before_request_hooks": [], "forward_headers": []}), "", "a config needs one of");
    rejected(json!({"provider": "cloud-c", "cloud_c_access_key_id": "a"}), "", "a config needs one of");
    rejected(balanced(json!([provider(), {"provider": "openai", "weight": 1}])), "targets[1]", "a config needs one of");
    let e = err(json!({}));
    assert_eq!(e.to_string(), format!("invalid config: {}", e.message));
}

#[test]
fn each_property_set_of_spec_2_1_is_enough() {
    let hook = json!([{"id": "h"}]);
    let configs = [
        json!({"provider": "openai", "api_key": "k"}),
        json!({"provider": "openai", "custom_host": "http://localhost:8000/v1"}),
        json!({"provider": "@my-openai"}),
        json!({"virtual_key": "vk"}),
        balanced(json!([provider()])),
        json!({"cache": {"mode": "simple"}}),
        json!({"retry": {"attempts": 2}}),
        json!({"prompt_id": "p"}),
        json!({"forward_headers": ["x-a"]}),
        json!({"request_timeout": 1000}),
        json!({"provider": "cloud-c", "cloud_c_access_key_id": "a", "cloud_c_secret_access_key": "s"}),
        json!({"provider": "cloud-b", "cloud_b_region": "r", "cloud_b_service_account_json": {}}),
        json!({"provider": "cloud-b", "cloud_b_region": "r", "cloud_b_project_id": "p"}),
        json!({"provider": "cloud-a", "cloud_a_deployment_name": "d", "cloud_a_deployment_type": "serverless",
            "cloud_a_region": "r", "cloud_a_api_version": "v"}),
        json!({"provider": "cloud-a", "cloud_a_endpoint_name": "e", "cloud_a_deployment_type": "managed"}),
        json!({"after_request_hooks": hook}),
        json!({"before_request_hooks": hook}),
        json!({"input_guardrails": ["g"]}),
        json!({"output_guardrails": ["g"]}),
    ];
    for config in configs {
        ok(config);
    }
}

// ---- strategy and targets ----

#[test]
fn strategy_and_targets_go_together() {
    rejected(
        json!({"strategy": {"mode": "fallback"}}),
        "targets",
        "at least one target is required in mode `fallback`",
    );
    rejected(balanced(json!([])), "targets", "at least one target is required in mode `loadbalance`");
    rejected(with(json!({"targets": [provider()]})), "targets", "targets need a strategy");
    rejected(with(json!({"targets": []})), "targets", "targets need a strategy");
    rejected(json!({"strategy": {"mode": "fallback"}, "targets": {}}), "targets", "must be an array");
    // Single mode works without targets when the node names a provider itself.
    ok(with(json!({"strategy": {"mode": "single"}})));
    ok(json!({"strategy": {"mode": "single"}, "targets": [provider()]}));
    rejected(json!({"strategy": {"mode": "single"}}), "", "a config needs one of");
}

#[test]
fn strategy_properties_belong_to_their_mode() {
    let targets = json!([with(json!({"name": "a"}))]);
    rejected(
        json!({"strategy": {"mode": "fallback", "conditions": []}, "targets": targets}),
        "strategy.conditions",
        "only allowed in mode `conditional`",
    );
    rejected(
        json!({"strategy": {"mode": "loadbalance", "default": "a"}, "targets": targets}),
        "strategy.default",
        "only allowed in mode `conditional`",
    );
    rejected(
        json!({"strategy": {"mode": "loadbalance", "on_status_codes": [429]}, "targets": targets}),
        "strategy.on_status_codes",
        "only allowed in mode `fallback`",
    );
    rejected(
        json!({"strategy": {"mode": "fallback", "on_status_codes": [429, 1000]}, "targets": targets}),
        "strategy.on_status_codes[1]",
        "at most 599",
    );
    let c = ok(json!({"strategy": {"mode": "fallback", "on_status_codes": [429, 503]}, "targets": targets}));
    assert_eq!(c.strategy.and_then(|s| s.on_status_codes), Some(vec![429, 503]));
}

#[test]
fn conditional_mode_needs_conditions_and_default() {
    let targets = json!([with(json!({"name": "a"})), with(json!({"name": "b"}))]);
    rejected(
        json!({"strategy": {"mode": "conditional", "default": "a"}, "targets": targets}),
        "strategy.conditions",
        "at least one condition is required",
    );
    rejected(
        json!({"strategy": {"mode": "conditional", "default": "a", "conditions": []}, "targets": targets}),
        "strategy.conditions",
        "at least one condition is required",
    );
    rejected(
        json!({"strategy": {"mode": "conditional", "conditions": [{"query": {}, "then": "a"}]}, "targets": targets}),
        "strategy.default",
        "is required in mode `conditional`",
    );
    let c = ok(json!({"strategy": {"mode": "conditional", "default": "b",
        "conditions": [{"query": {"metadata.tier": {"$eq": "pro"}}, "then": "a"}]}, "targets": targets}));
    let expected = Strategy {
        mode: StrategyMode::Conditional,
        conditions: vec![Condition {
            query: json!({"metadata.tier": {"$eq": "pro"}}).as_object().cloned().unwrap_or_default(),
            then: "a".into(),
        }],
        default: Some("b".into()),
        on_status_codes: None,
    };
    assert_eq!(c.strategy, Some(expected));
}

#[test]
fn conditional_references_name_existing_unique_targets() {
    let conditional = |then: &str, default: &str, targets: Value| {
        json!({"strategy": {"mode": "conditional", "default": default,
            "conditions": [{"query": {}, "then": "a"}, {"query": {}, "then": then}]}, "targets": targets})
    };
    let targets = json!([with(json!({"name": "a"})), with(json!({"name": "b"})), provider()]);
    rejected(conditional("c", "a", targets.clone()), "strategy.conditions[1].then", "no target is named `c`");
    rejected(conditional("b", "z", targets.clone()), "strategy.default", "no target is named `z`");
    let duplicated = json!([with(json!({"name": "a"})), with(json!({"name": "a"}))]);
    rejected(conditional("a", "a", duplicated), "targets[1].name", "duplicate target name `a`");
    ok(conditional("b", "a", targets.clone()));
    // Nested: the error names the nested strategy.
    rejected(
        json!({"strategy": {"mode": "fallback"}, "targets": [conditional("b", "q", targets)]}),
        "targets[0].strategy.default",
        "no target is named `q`",
    );
    // Outside conditional mode names are free labels and may repeat.
    ok(balanced(json!([with(json!({"name": "a"})), with(json!({"name": "a"}))])));
}

#[test]
fn condition_queries_are_validated_with_their_path() {
    let conditional = |query: Value| {
        json!({"strategy": {"mode": "conditional", "default": "a",
            "conditions": [{"query": {}, "then": "a"}, {"query": query, "then": "a"}]},
            "targets": [with(json!({"name": "a"}))]})
    };
    rejected(
        conditional(json!({"params.model": {"$foo": 1}})),
        "strategy.conditions[1].query.params.model.$foo",
        "unknown operator `$foo`",
    );
    rejected(
        conditional(json!({"$or": [{"metadata.tier": "pro"}, {"params.model": {"$regex": "gpt-(4"}}]})),
        "strategy.conditions[1].query.$or[1].params.model.$regex",
        "is not a valid regular expression: found open group without closing ')'",
    );
    rejected(conditional(json!({"$nope": []})), "strategy.conditions[1].query.$nope", "unknown operator `$nope`");
    rejected(
        conditional(json!({"metadata.tier": {"$in": "pro"}})),
        "strategy.conditions[1].query.metadata.tier.$in",
        "must be an array, got a string",
    );
    // Nested targets: the path starts at the root.
    rejected(
        json!({"strategy": {"mode": "fallback"}, "targets": [conditional(json!({"$not": 1}))]}),
        "targets[0].strategy.conditions[1].query.$not",
        "must be a query object, got a number",
    );
    ok(conditional(json!({"params.model": {"$regex": "(?i)^gpt-4o"}, "$or": [{"metadata._user": {"$exists": true}}]})));
}

#[test]
fn errors_in_nested_targets_carry_the_full_path() {
    let inner = balanced(json!([provider(), with(json!({"cache": {"mode": "simple", "max_age": -1}}))]));
    rejected(
        json!({"strategy": {"mode": "fallback"}, "targets": [provider(), inner]}),
        "targets[1].targets[1].cache.max_age",
        "must be at least 1",
    );
}

// ---- shaped strings ----

#[test]
fn custom_host_must_be_an_absolute_http_url() {
    for url in ["https://llm.internal:8443/v1", "http://10.0.0.7", "HTTPS://Host.example/v1", "http://[::1]:8080/v1"] {
        assert_eq!(ok(with(json!({"custom_host": url}))).custom_host.as_deref(), Some(url));
    }
    let cases = [
        ("ftp://host/v1", "absolute http:// or https:// URL"),
        ("llm.internal/v1", "absolute http:// or https:// URL"),
        ("/v1/chat", "absolute http:// or https:// URL"),
        ("https://", "has no valid host"),
        ("https:///v1", "has no valid host"),
        ("https://:8080/v1", "has no valid host"),
        ("https://user:pw@host/v1", "credentials"),
        ("https://host:abc/v1", "port"),
        ("https://host:70000", "port"),
        ("https://host:/v1", "port"),
        ("https://ho st/v1", "whitespace"),
        ("https://host/v1\r\nx-injected: 1", "control characters"),
        ("https://host/v1?x=1", "query"),
        ("https://host/v1/../admin", "path"),
    ];
    for (url, message) in cases {
        rejected(with(json!({"custom_host": url})), "custom_host", message);
    }
    rejected(with(json!({"custom_host": 1})), "custom_host", "must be a string");
}

#[test]
fn forward_headers_are_header_names_lowercased() {
    let c = ok(with(json!({"forward_headers": ["X-Custom-Header", "x-trace_id", "Authorization"]})));
    assert_eq!(c.forward_headers, Some(vec!["x-custom-header".into(), "x-trace_id".into(), "authorization".into()]));
    rejected(with(json!({"forward_headers": ["x-ok", "bad header"]})), "forward_headers[1]", "valid HTTP header name");
    rejected(with(json!({"forward_headers": [""]})), "forward_headers[0]", "valid HTTP header name");
    rejected(with(json!({"forward_headers": ["x:y"]})), "forward_headers[0]", "valid HTTP header name");
    rejected(with(json!({"forward_headers": ["x-é"]})), "forward_headers[0]", "valid HTTP header name");
    rejected(with(json!({"forward_headers": [5]})), "forward_headers[0]", "must be a string");
}

#[test]
fn deployments_parse() {
    let c = ok(with(json!({"deployments": [
        {"deployment_id": "d1", "alias": "gpt-4o", "api_version": "2024-06-01", "is_default": true},
        {"deployment_id": "d2", "alias": "mini", "api_version": "2024-06-01"}
    ]})));
    let d = |id: &str, alias: &str, is_default| Deployment {
        deployment_id: id.into(),
        alias: alias.into(),
        api_version: "2024-06-01".into(),
        is_default,
    };
    assert_eq!(c.cloud.deployments, vec![d("d1", "gpt-4o", true), d("d2", "mini", false)]);
    rejected(
        with(json!({"deployments": [{"deployment_id": "d", "alias": "a", "api_version": "v", "is_default": "y"}]})),
        "deployments[0].is_default",
        "must be a boolean",
    );
}

// ---- depth ----

/// A config with `levels` nested fallback strategies around a provider.
fn nested(levels: usize) -> Value {
    let mut v = json!({"provider": "@p"});
    for _ in 0..levels {
        // Built by hand: `json!` would re-serialize `v`, recursing as deep as it is.
        let mut node = Map::new();
        node.insert("strategy".into(), json!({"mode": "fallback"}));
        node.insert("targets".into(), Value::Array(vec![v]));
        v = Value::Object(node);
    }
    v
}

#[test]
fn targets_nest_at_most_8_levels() {
    ok(nested(8));
    rejected(nested(9), "targets[0].".repeat(9).trim_end_matches('.'), "more than 8 levels");
}

#[test]
fn targets_nested_deeper_than_the_parser_reads_get_the_same_error() {
    let ninth = "targets[0].".repeat(9);
    let ninth = ninth.trim_end_matches('.');
    for levels in [9, 63, 64, 200] {
        let text = nested(levels).to_string();
        let expected = err(nested(levels));
        assert_eq!(expected.path, ninth);
        match serde_json::from_str::<Value>(&text) {
            // 63 levels and fewer parse (1 + 2 * 63 = 127 arrays and objects), and nothing is too deep.
            Ok(_) => assert!(levels <= 63 && nested_too_deep(text.as_bytes()).is_none(), "{levels}"),
            Err(_) => assert_eq!(nested_too_deep(text.as_bytes()), Some(expected), "{levels}"),
        }
    }
    // Targets elsewhere, or other content, nested too deep: named at the root.
    let deep = format!(r#"{{"provider":"@p","override_params":{{"x":{}{}}}}}"#, "[".repeat(200), "]".repeat(200));
    let e = nested_too_deep(deep.as_bytes()).unwrap();
    assert_eq!((e.path.as_str(), e.message.as_str()), ("", "nests arrays and objects more than 127 levels deep"));
    assert_eq!(e.to_gateway_error().param.as_deref(), Some("x-gateway-config"));
    let mut second = nested(70);
    second["targets"] = json!([provider(), second["targets"][0].clone()]);
    assert_eq!(
        nested_too_deep(second.to_string().as_bytes()).unwrap().path,
        format!("targets[1].{}", "targets[0].".repeat(8).trim_end_matches('.'))
    );
    // Not too deep: not valid JSON, for the caller to say.
    assert_eq!(nested_too_deep(b"{\"provider\": oops}"), None);
}

// ---- values sent as headers ----

#[test]
fn values_sent_as_headers_refuse_control_characters() {
    let fields = [
        "api_key",
        "vendor_organization",
        "vendor_project",
        "cloud_c_access_key_id",
        "cloud_c_session_token",
        "cloud_a_deployment_name",
    ];
    for field in fields {
        for bad in ["k\r\nx-injected: 1", "k\r", "k\n", "k\u{0}", "k\u{7f}"] {
            rejected(with(json!({field: bad})), field, "must not contain control characters");
            let target = balanced(json!([provider(), with(json!({field: bad}))]));
            rejected(target, &format!("targets[1].{field}"), "control characters");
        }
        // The value may be a secret: never echoed.
        assert!(!err(with(json!({field: "secret\n"}))).to_string().contains("secret"));
        // A tab belongs to a header value.
        ok(with(json!({field: "k\tk"})));
    }
    let g = err(with(json!({"api_key": "k\n"}))).to_gateway_error();
    assert_eq!((g.status, g.param.as_deref(), g.code), (400, Some("api_key"), Some("invalid_config")));
}

// ---- error rendering ----

#[test]
fn errors_render_as_openai_errors() {
    let e = err(balanced(json!([
        provider(),
        with(json!({"cb_config": {"failure_threshold": 1, "cooldown_interval": 5}}))
    ])));
    let g = e.to_gateway_error();
    assert_eq!(g.status, 400);
    assert_eq!(g.kind, "invalid_request_error");
    assert_eq!(g.code, Some("invalid_config"));
    assert_eq!(g.param.as_deref(), Some("targets[1].cb_config.cooldown_interval"));
    assert_eq!(g.message, "invalid config at `targets[1].cb_config.cooldown_interval`: must be at least 30000");
    let root = err(json!([])).to_gateway_error();
    assert_eq!(root.message, "invalid config: must be an object, got an array");
    assert_eq!(root.param.as_deref(), Some("x-gateway-config"));
}

// ---- a realistic config ----

fn check(id: &str, parameters: Value) -> Check {
    Check::new(id.to_string(), map(parameters)).unwrap()
}

fn map(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[test]
fn realistic_nested_config_parses_into_the_expected_struct() {
    let config = json!({
        "name": "prod-router",
        "strategy": {"mode": "fallback", "on_status_codes": [429, 503]},
        "retry": {"attempts": 3, "on_status_codes": [429, 500, 502], "use_retry_after_headers": true},
        "cache": {"mode": "semantic", "max_age": 3600},
        "request_timeout": 30000,
        "forward_headers": ["X-Request-Source", "x-tenant"],
        "strict_vendor_compliance": false,
        "before_request_hooks": [{
            "id": "pii-check", "type": "guardrail",
            "checks": [{"id": "default.regexMatch", "parameters": {"rule": "\\d{3}-\\d{2}-\\d{4}", "not": true}}],
            "on_fail": {"deny": true, "feedback": {"value": -10, "weight": 1, "metadata": {"reason": "pii"}}},
            "on_success": {"feedback": {"value": 1}}
        }],
        "after_request_hooks": [{"id": "toxicity", "async": true, "checks": [{"id": "vendor.moderate", "parameters": {}}]}],
        "input_guardrails": ["gr-jailbreak", {"id": "inline-1", "deny": true, "default.contains": {"words": ["secret"], "operator": "none"}}],
        "output_guardrails": [{"async": false, "on_fail": {"deny": true}, "default.wordCount": {"maxWords": 500}}],
        "targets": [
            {"name": "primary", "strategy": {"mode": "loadbalance"}, "targets": [
                {"provider": "@openai-prod", "weight": 0.7, "override_params": {"model": "gpt-4o", "temperature": 0.2}},
                {"provider": "cloud-a", "api_key": "k", "resource_name": "res", "deployment_id": "dep",
                 "api_version": "2024-06-01", "weight": 0.3,
                 "deployments": [{"deployment_id": "d1", "alias": "gpt-4o", "api_version": "2024-06-01", "is_default": true}]}
            ]},
            {"name": "backup", "provider": "anthropic", "api_key": "sk-ant",
             "cb_config": {"failure_threshold": 5, "cooldown_interval": 60000, "failure_status_codes": [500, 502]},
             "override_params": {"model": "claude-3-5-sonnet"}},
            {"name": "self-hosted", "provider": "openai", "custom_host": "https://llm.internal:8443/v1",
             "forward_headers": ["Authorization"]},
            {"provider": "cloud-c", "cloud_c_access_key_id": "AK", "cloud_c_secret_access_key": "SK",
             "cloud_c_region": "us-east-1", "cloud_c_session_token": "tok"},
            {"provider": "cloud-b", "cloud_b_region": "europe-west4", "cloud_b_project_id": "proj",
             "cloud_b_service_account_json": {"type": "service_account"}},
            {"provider": "cloud-a", "cloud_a_endpoint_name": "ep", "cloud_a_deployment_type": "managed",
             "cloud_a_region": "r", "cloud_a_deployment_name": "dn", "cloud_a_api_version": "v1"},
            {"virtual_key": "vk-legacy", "vendor_organization": "org", "vendor_project": "proj", "prompt_id": "pp-1"}
        ]
    });
    let s = |x: &str| Some(x.to_string());
    let expected = Config {
        name: s("prod-router"),
        strategy: Some(Strategy {
            mode: StrategyMode::Fallback,
            conditions: vec![],
            default: None,
            on_status_codes: Some(vec![429, 503]),
        }),
        retry: Some(RetryConfig {
            attempts: 3,
            on_status_codes: Some(vec![429, 500, 502]),
            use_retry_after_headers: true,
        }),
        cache: Some(CacheConfig { mode: CacheMode::Semantic, max_age: Some(3600) }),
        request_timeout: Some(30000),
        forward_headers: Some(vec!["x-request-source".into(), "x-tenant".into()]),
        strict_vendor_compliance: Some(false),
        before_request_hooks: vec![Hook {
            id: "pii-check".into(),
            kind: s("guardrail"),
            checks: vec![check("default.regexMatch", json!({"rule": "\\d{3}-\\d{2}-\\d{4}", "not": true}))],
            on_fail: Some(HookOutcome {
                feedback: Some(Feedback {
                    value: Some(-10.0),
                    weight: Some(1.0),
                    metadata: Some(map(json!({"reason": "pii"}))),
                }),
                deny: Some(true),
            }),
            on_success: Some(HookOutcome {
                feedback: Some(Feedback { value: Some(1.0), ..Default::default() }),
                deny: None,
            }),
            is_async: false,
        }],
        after_request_hooks: vec![Hook {
            id: "toxicity".into(),
            kind: None,
            checks: vec![check("vendor.moderate", json!({}))],
            on_fail: None,
            on_success: None,
            is_async: true,
        }],
        input_guardrails: vec![
            Guardrail::Reference("gr-jailbreak".into()),
            Guardrail::Inline(InlineGuardrail {
                id: s("inline-1"),
                deny: Some(true),
                checks: vec![check("default.contains", json!({"words": ["secret"], "operator": "none"}))],
                ..Default::default()
            }),
        ],
        output_guardrails: vec![Guardrail::Inline(InlineGuardrail {
            is_async: Some(false),
            on_fail: Some(HookOutcome { feedback: None, deny: Some(true) }),
            checks: vec![check("default.wordCount", json!({"maxWords": 500}))],
            ..Default::default()
        })],
        targets: vec![
            Config {
                name: s("primary"),
                strategy: Some(Strategy {
                    mode: StrategyMode::LoadBalance,
                    conditions: vec![],
                    default: None,
                    on_status_codes: None,
                }),
                targets: vec![
                    Config {
                        provider: s("@openai-prod"),
                        weight: Some(0.7),
                        override_params: Some(map(json!({"model": "gpt-4o", "temperature": 0.2}))),
                        ..Default::default()
                    },
                    Config {
                        provider: s("cloud-a"),
                        api_key: s("k"),
                        weight: Some(0.3),
                        cloud: CloudFields {
                            resource_name: s("res"),
                            deployment_id: s("dep"),
                            api_version: s("2024-06-01"),
                            deployments: vec![Deployment {
                                deployment_id: "d1".into(),
                                alias: "gpt-4o".into(),
                                api_version: "2024-06-01".into(),
                                is_default: true,
                            }],
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
            Config {
                name: s("backup"),
                provider: s("anthropic"),
                api_key: s("sk-ant"),
                cb_config: Some(CircuitBreakerConfig {
                    failure_threshold: 5,
                    cooldown_interval: 60000,
                    failure_status_codes: Some(vec![500, 502]),
                }),
                override_params: Some(map(json!({"model": "claude-3-5-sonnet"}))),
                ..Default::default()
            },
            Config {
                name: s("self-hosted"),
                provider: s("openai"),
                custom_host: s("https://llm.internal:8443/v1"),
                forward_headers: Some(vec!["authorization".into()]),
                ..Default::default()
            },
            Config {
                provider: s("cloud-c"),
                cloud: CloudFields {
                    aws_access_key_id: s("AK"),
                    aws_secret_access_key: s("SK"),
                    aws_region: s("us-east-1"),
                    aws_session_token: s("tok"),
                    ..Default::default()
                },
                ..Default::default()
            },
            Config {
                provider: s("cloud-b"),
                cloud: CloudFields {
                    gcp_region: s("europe-west4"),
                    gcp_project_id: s("proj"),
                    gcp_service_account_json: Some(map(json!({"type": "service_account"}))),
                    ..Default::default()
                },
                ..Default::default()
            },
            Config {
                provider: s("cloud-a"),
                cloud: CloudFields {
                    azure_endpoint_name: s("ep"),
                    azure_deployment_type: Some(AzureDeploymentType::Managed),
                    azure_region: s("r"),
                    azure_deployment_name: s("dn"),
                    azure_api_version: s("v1"),
                    ..Default::default()
                },
                ..Default::default()
            },
            Config {
                virtual_key: s("vk-legacy"),
                vendor_organization: s("org"),
                vendor_project: s("proj"),
                prompt_id: s("pp-1"),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    assert_eq!(ok(config), expected);
}

// ---- hostile input: errors, never panics ----

#[test]
fn wrong_shapes_everywhere_are_errors() {
    let hostile = [
        json!({"strategy": [], "targets": [provider()]}),
        json!({"strategy": null, "targets": [provider()]}),
        json!({"strategy": {"mode": null}, "targets": [provider()]}),
        json!({"strategy": {"mode": "conditional", "conditions": {}, "default": 1}, "targets": [provider()]}),
        json!({"strategy": {"mode": "fallback"}, "targets": [[], null, "x"]}),
        with(json!({"cache": []})),
        with(json!({"retry": null})),
        with(json!({"cb_config": "x"})),
        with(json!({"before_request_hooks": [[]]})),
        with(json!({"after_request_hooks": [{"id": "h", "checks": {}}]})),
        with(json!({"input_guardrails": {}})),
        with(json!({"deployments": [null]})),
        with(json!({"request_timeout": 1e308})),
        with(json!({"request_timeout": -1e308})),
        with(json!({"request_timeout": i64::MIN})),
        with(json!({"retry": {"attempts": u64::MAX}})),
        with(json!({"weight": -1e308})),
        with(json!({"on_status_codes": [u64::MAX, i64::MIN]})),
    ];
    for config in hostile {
        let e = err(config);
        assert!(!e.message.is_empty());
    }
    assert_eq!(ok(with(json!({"weight": 1e308}))).weight, Some(1e308));
}

#[test]
fn deep_nesting_is_cut_off_without_exhausting_the_stack() {
    let e = err(nested(1000));
    assert!(e.message.contains("more than 8 levels"), "{e}");
}

#[test]
fn free_content_nests_as_deep_as_the_json_parser_allows() {
    // serde_json stops parsing at 128 levels, which bounds the recursion of cloning free
    // content (override_params, check parameters) for any config that arrives as text.
    let deep = |levels: usize| format!("{}{{}}{}", r#"{"x":"#.repeat(levels), "}".repeat(levels));
    let text = |levels: usize| {
        format!(r#"{{"provider":"@p","override_params":{0},"input_guardrails":[{{"default.x":{0}}}]}}"#, deep(levels))
    };
    assert!(serde_json::from_str::<Value>(&text(1000)).is_err());
    let parsed: Value = serde_json::from_str(&text(120)).unwrap();
    ok(parsed);
}

#[test]
fn megabyte_strings_are_handled_and_not_echoed_in_full() {
    let big = "a".repeat(1 << 20);
    let c = ok(json!({"provider": format!("@{big}")}));
    assert_eq!(c.provider.map(|p| p.len()), Some((1 << 20) + 1));
    ok(with(json!({"forward_headers": [big.clone()], "name": big.clone()})));
    ok(with(json!({"input_guardrails": [big.clone()]})));

    let mut unknown = Map::new();
    unknown.insert(big.clone(), json!(1));
    let e = err(with(Value::Object(unknown)));
    assert!(e.path.len() < 100 && e.message.len() < 100, "{e}");
    assert!(e.message.starts_with("unknown property `aaaa"), "{e}");

    let e = err(with(json!({"custom_host": format!("https://{big}:x")})));
    assert_eq!(e.path, "custom_host");
    let e = err(with(json!({"cache": {"mode": big.clone()}})));
    assert!(e.message.len() < 100, "{e}");
    let targets = json!([with(json!({"name": "a"}))]);
    let e =
        err(json!({"strategy": {"mode": "conditional", "default": big, "conditions": [{"query": {}, "then": "a"}]},
        "targets": targets}));
    assert!(e.message.len() < 100, "{e}");
}

#[test]
fn many_targets_are_fine() {
    let targets: Vec<Value> = (0..10_000).map(|i| with(json!({"name": format!("t{i}")}))).collect();
    let c = ok(json!({"strategy": {"mode": "conditional", "default": "t9999",
        "conditions": [{"query": {}, "then": "t0"}]}, "targets": targets}));
    assert_eq!(c.targets.len(), 10_000);
}
