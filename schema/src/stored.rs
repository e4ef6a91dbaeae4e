//! The checks of what the control plane stores (configs, providers, guardrails), by exactly the
//! code with which the filter later reads them, with the same JSON-path errors.
//!
//! Errors are `SharedError`: an HTTP status and the OpenAI error body the filter would answer
//! (`{"error": {"message", "type", "param", "code"}}`), `param` naming the field at fault.

use crate::config::{self, parse_config};
use crate::credential::Credential;
use crate::errors::SharedError;
use crate::guardrails::spec::parse_stored_guardrail;
use crate::json_check::{beyond_depth, MAX_JSON_DEPTH};
use crate::value_check::ConfigError;
use serde_json::Value;

/// A 400 naming the field at fault by its JSON path (`checks[0].id`; the root: `body`).
fn invalid_config(e: &ConfigError) -> SharedError {
    let param = if e.path.is_empty() { "body" } else { e.path.as_str() };
    let message = e.to_string();
    SharedError::new(400, "invalid_request_error", &message, Some(param), Some("invalid_config"))
}

/// A config object (spec 2.1) as `x-gateway-config` would carry it: the filter's parser.
pub fn check_config(value: &Value) -> Result<(), SharedError> {
    parse_config(value).map(drop).map_err(|e| invalid_config(&e))
}

/// A stored provider (`provider`, `api_key`, `custom_host`, cloud fields, vendor ids): the
/// parser of the filter's stored credentials.
pub fn check_provider(value: &Value) -> Result<(), SharedError> {
    Credential::parse(value).map(drop).map_err(|e| invalid_config(&e))
}

/// Why a JSON body that serde_json could not read is refused when it nests deeper than the
/// parser reads: a 400 saying so (`None`: it does not, so it is not valid JSON).
pub fn nested_too_deep(body: &[u8]) -> Option<SharedError> {
    beyond_depth(body, MAX_JSON_DEPTH)?;
    let message = format!("the body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep");
    Some(SharedError::new(400, "invalid_request_error", &message, Some("body"), None))
}

/// As `nested_too_deep`, for a config or stored provider: targets nested too deep are named
/// as `check_config` names 9 to 63 levels.
pub fn config_nested_too_deep(body: &[u8]) -> Option<SharedError> {
    config::nested_too_deep(body).map(|e| invalid_config(&e))
}

/// A stored guardrail (spec 4.3): `name`, `checks` (at least one; ids the filter runs;
/// `default.jwt` parameters checked for form, nothing fetched) and `actions`.
pub fn check_guardrail(value: &Value) -> Result<(), SharedError> {
    parse_stored_guardrail(value, "").map(drop).map_err(|e| invalid_config(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;
    use serde_json::json;

    fn param(r: Result<(), SharedError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.status, 400);
        e.param().unwrap()
    }

    #[test]
    fn configs_are_checked_by_the_filter_parser() {
        assert_eq!(check_config(&json!({"provider": "openai", "api_key": "sk-1"})), Ok(()));
        assert_eq!(param(check_config(&json!({"retry": {"attempts": "x"}}))), "retry.attempts");
        assert_eq!(param(check_config(&json!({"nope": 1}))), "nope");
        assert_eq!(param(check_config(&json!([1]))), "body");
    }

    #[test]
    fn providers_are_checked_by_the_credential_parser() {
        assert_eq!(check_provider(&json!({"provider": "openai", "api_key": "sk-1"})), Ok(()));
        assert_eq!(param(check_provider(&json!({"api_key": "sk-1"}))), "provider");
        assert_eq!(param(check_provider(&json!({"provider": "openai", "retry": {}}))), "retry");
        assert_eq!(param(check_provider(&json!({"provider": 5}))), "provider");
    }

    #[test]
    fn values_sent_as_headers_refuse_control_characters() {
        for bad in ["sk-1\r\nx: y", "sk-1\n", "sk\u{0}1"] {
            for field in ["api_key", "vendor_organization", "vendor_project", "cloud_c_session_token"] {
                let mut provider = json!({"provider": "openai", "api_key": "sk-1"});
                provider[field] = json!(bad);
                let e = check_provider(&provider).unwrap_err();
                assert_eq!((e.status, e.param().as_deref()), (400, Some(field)));
                assert!(!e.message().contains("sk"), "never echoed: {}", e.message());
                assert_eq!(param(check_config(&provider)), field);
            }
            let nested = json!({"strategy": {"mode": "fallback"}, "targets": [{"provider": "openai", "api_key": bad}]});
            assert_eq!(param(check_config(&nested)), "targets[0].api_key");
            let webhook = json!({"checks": [{"id": "default.webhook",
                "parameters": {"webhookURL": "http://127.0.0.1:9/h", "headers": {"x-team": bad}}}]});
            assert_eq!(param(check_guardrail(&webhook)), "checks[0].parameters");
        }
        // A tab is part of a header value.
        assert_eq!(check_provider(&json!({"provider": "openai", "api_key": "sk\t1"})), Ok(()));
    }

    #[test]
    fn bodies_nested_deeper_than_the_parser_reads_are_named_as_such() {
        let mut config = json!({"provider": "openai", "api_key": "sk-1"});
        for _ in 0..64 {
            config = json!({"strategy": {"mode": "fallback"}, "targets": [config]});
        }
        let text = config.to_string();
        assert!(serde_json::from_str::<Value>(&text).is_err(), "beyond serde_json's limit");
        let deep = config_nested_too_deep(text.as_bytes()).unwrap();
        let ninth = ["targets[0]"; 9].join(".");
        assert_eq!((deep.status, deep.param()), (400, Some(ninth)));
        assert!(deep.message().contains("targets nest more than 8 levels deep"), "{}", deep.message());
        let array = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(nested_too_deep(array.as_bytes()).unwrap().param().as_deref(), Some("body"));
        assert!(nested_too_deep(b"[1, oops]").is_none());
        assert!(config_nested_too_deep(b"{\"a\": oops}").is_none());
    }

    #[test]
    fn guardrails_name_the_field_at_fault() {
        let ok = json!({"name": "jwt", "checks": [{"id": "default.jwt", "name": "j", "is_enabled": true,
            "parameters": {"jwksUri": "http://idp.local/jwks", "maxTokenAge": "30m", "algorithms": ["RS256", "ES256"]}}],
            "actions": {"deny": true, "async": false, "on_fail": {"feedback": {"value": -1, "weight": 1, "metadata": "m"}},
            "on_success": {"feedback": {"value": 1}}}});
        assert_eq!(check_guardrail(&ok), Ok(()));
        let with = |checks: Value| json!({"name": "g", "checks": checks});
        assert_eq!(param(check_guardrail(&with(json!([])))), "checks");
        assert_eq!(param(check_guardrail(&json!({"name": "g"}))), "checks");
        let contains = json!({"id": "default.contains", "parameters": {"words": ["a"], "operator": "any"}});
        assert_eq!(param(check_guardrail(&with(json!([contains, {"id": "x.y"}])))), "checks[1].id");
        // Every check's parameters are read as the filter reads them, patterns compiled.
        let rule = json!([{"id": "default.regexMatch", "parameters": {"rule": "(a"}}]);
        let e = check_guardrail(&with(rule)).unwrap_err();
        assert_eq!((e.status, e.param().as_deref()), (400, Some("checks[0].parameters")));
        assert!(e.message().contains("parameter `rule` is not a valid pattern"), "{}", e.message());
        assert_eq!(param(check_guardrail(&with(json!([{"id": "default.contains"}])))), "checks[0].parameters");
        let hs = json!([{"id": "default.jwt", "parameters": {"jwksUri": "https://a/j", "algorithms": ["HS256"]}}]);
        assert_eq!(param(check_guardrail(&with(hs))), "checks[0].parameters");
        let age = json!([{"id": "default.jwt", "parameters": {"jwksUri": "https://a/j", "maxTokenAge": "later"}}]);
        assert!(check_guardrail(&with(age)).unwrap_err().message().contains("maxTokenAge"));
        assert_eq!(
            param(check_guardrail(&with(json!([{"id": "default.log", "is_enabled": "yes"}])))),
            "checks[0].is_enabled"
        );
        let bad_action =
            json!({"checks": [{"id": "default.log"}], "actions": {"on_fail": {"feedback": {"value": "x"}}}});
        assert_eq!(param(check_guardrail(&bad_action)), "actions.on_fail.feedback.value");
        assert_eq!(param(check_guardrail(&json!({"checks": [{"id": "default.log"}], "extra": 1}))), "extra");
    }
}
