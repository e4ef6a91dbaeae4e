//! Drives a plan through failures: retries a target by its own rule first, then falls back,
//! skipping targets whose circuit is open, and records every outcome in the breaker.

use super::breaker::{admit, classify, record, Admission};
use super::plan::{Failure, Plan};
use super::retry::{is_retryable, next_delay};
use crate::errors::GatewayError;
use crate::ports::Host;

/// Where a request stands in its plan.
pub(crate) struct Attempts {
    pub(crate) plan: Plan,
    /// The attempt in flight (or about to be).
    pub(crate) current: usize,
    /// The attempt sent last: the one whose answer is the latest outcome.
    pub(crate) sent: usize,
    /// Retries of the current target so far.
    retries_here: u32,
    /// Retries of every target so far, for the client's response header.
    pub(crate) retries: u32,
    /// Circuits this request's outcomes opened, for the host's metric.
    pub(crate) circuits_opened: u32,
    /// How this request's outcomes changed the number of circuits open now (a gauge).
    pub(crate) circuits_open_change: i32,
    /// Every retry and fallback taken, with the provider of the target that failed.
    pub(crate) moves: Vec<(&'static str, Move)>,
}

/// A step to another attempt after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Move {
    /// The same target again.
    Retry,
    /// The next target of a fallback.
    Fallback,
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Call attempt `index` after `delay_ms` (0: at once).
    Call { index: usize, delay_ms: u64 },
    /// Nothing is left to try: the last failure is the answer.
    GiveUp,
}

impl Attempts {
    /// The first attempt whose circuit lets it through; every circuit open is a 503.
    pub(crate) fn start(plan: Plan, host: &mut dyn Host) -> Result<Attempts, GatewayError> {
        let mut attempts = Attempts {
            plan,
            current: 0,
            sent: 0,
            retries_here: 0,
            retries: 0,
            circuits_opened: 0,
            circuits_open_change: 0,
            moves: Vec::new(),
        };
        if attempts.admitted(0, host) {
            return Ok(attempts);
        }
        match attempts.next_admitted(0, Failure::CircuitOpen, host) {
            Some(index) => {
                attempts.current = index;
                Ok(attempts)
            }
            None => Err(GatewayError::new(
                503,
                "api_error",
                "every target of this request has an open circuit breaker (too many recent failures); \
                 try again after the cooldown",
            )
            .with_code("circuit_open")),
        }
    }

    /// The current attempt is being sent.
    pub(crate) fn sending(&mut self) {
        self.sent = self.current;
    }

    /// The current attempt succeeded.
    pub(crate) fn succeeded(&mut self, status: u16, host: &dyn Host) {
        self.record(Some(status), host);
    }

    /// The current attempt failed and nothing else will be tried (the request cannot be sent
    /// again): only the breaker learns of it.
    pub(crate) fn failed_finally(&mut self, failure: Failure, host: &dyn Host) {
        self.record(failure.provider_status(), host);
    }

    /// The current attempt could not even be sent (its request cannot be built for that
    /// target): move on as past an open circuit, telling the breaker nothing.
    pub(crate) fn skip(&mut self, host: &mut dyn Host) -> Next {
        match self.next_admitted(self.current, Failure::CircuitOpen, host) {
            Some(next) => {
                self.current = next;
                self.retries_here = 0;
                Next::Call { index: next, delay_ms: 0 }
            }
            None => Next::GiveUp,
        }
    }

    /// The current attempt failed. `headers` are the failed response's (for Retry-After).
    pub(crate) fn failed(&mut self, failure: Failure, headers: &[(String, Vec<u8>)], host: &mut dyn Host) -> Next {
        self.record(failure.provider_status(), host);
        let index = self.current;
        let retry = self.plan.attempts.get(index).and_then(|a| a.target.options.retry.clone());
        if let Some(retry) = retry {
            if self.retries_here < retry.attempts
                && is_retryable(&retry, failure.provider_status())
                && self.admitted(index, host)
            {
                let random = host.random();
                // None: the provider asked for a longer wait than the gateway holds a request.
                if let Some(delay_ms) = next_delay(&retry, self.retries_here, headers, host.now_ms(), random) {
                    self.retries_here += 1;
                    self.retries += 1;
                    self.moves.push((self.provider(index), Move::Retry));
                    return Next::Call { index, delay_ms };
                }
            }
        }
        match self.next_admitted(index, failure, host) {
            Some(next) => {
                self.moves.push((self.provider(index), Move::Fallback));
                self.current = next;
                self.retries_here = 0;
                Next::Call { index: next, delay_ms: 0 }
            }
            None => Next::GiveUp,
        }
    }

    fn provider(&self, index: usize) -> &'static str {
        self.plan.attempts.get(index).map_or("", |a| a.target.provider.name)
    }

    /// The attempt that follows `index` after `failure`, passing over open circuits.
    fn next_admitted(&self, index: usize, failure: Failure, host: &mut dyn Host) -> Option<usize> {
        let mut next = self.plan.next_past(index, failure, 0);
        while let Some((candidate, inner_levels)) = next {
            if self.admitted(candidate, host) {
                return Some(candidate);
            }
            next = self.plan.next_past(candidate, failure, inner_levels);
        }
        None
    }

    fn admitted(&self, index: usize, host: &dyn Host) -> bool {
        match self.plan.attempts.get(index).and_then(|a| a.circuit.as_ref()) {
            Some(c) => admit(host.store(), c.id, &c.config, host.now_ms()) != Admission::Open,
            None => true,
        }
    }

    fn record(&mut self, status: Option<u16>, host: &dyn Host) {
        if let Some(c) = self.plan.attempts.get(self.current).and_then(|a| a.circuit.as_ref()) {
            let outcome = classify(&c.config, status);
            let recorded = record(host.store(), c.id, &c.config, outcome, host.now_ms());
            self.circuits_opened += u32::from(recorded.opened);
            self.circuits_open_change += recorded.open_change;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_config;
    use crate::ports::testing::FakeHost;
    use crate::request::headers::GatewayHeaders;
    use crate::routing::plan::make_plan;
    use crate::settings::Settings;
    use crate::unit_tests::test;
    use serde_json::{json, Value};

    fn start(config: Value, host: &mut FakeHost) -> Result<Attempts, GatewayError> {
        let settings = Settings::parse(br#"{"api_keys": ["gw"]}"#).unwrap();
        let headers = GatewayHeaders::parse([]).unwrap();
        let config = parse_config(&config).unwrap();
        let mut nothing = crate::catalog::Nothing;
        let mut catalog = crate::catalog::Catalog::new(&settings, &mut nothing);
        let plan = make_plan(&settings, &headers, Some(&config), &Value::Null, host, &mut catalog)?;
        Attempts::start(plan, host)
    }

    fn target(key: &str, retry: Value) -> Value {
        json!({"provider": "openai", "api_key": key, "retry": retry})
    }

    #[test]
    fn each_fallback_target_retries_by_its_own_rule_first() {
        let mut host = FakeHost::new(0);
        let config = json!({"strategy": {"mode": "fallback"}, "targets": [
            target("a", json!({"attempts": 2})), target("b", json!({"attempts": 1, "on_status_codes": [500]}))]});
        let mut attempts = start(config, &mut host).unwrap();
        let fail = |a: &mut Attempts, host: &mut FakeHost, status| a.failed(Failure::Status(status), &[], host);
        assert!(matches!(fail(&mut attempts, &mut host, 503), Next::Call { index: 0, .. }));
        assert!(matches!(fail(&mut attempts, &mut host, 503), Next::Call { index: 0, .. }));
        assert_eq!(fail(&mut attempts, &mut host, 503), Next::Call { index: 1, delay_ms: 0 });
        // b retries 500 but not 429 (its own codes), then nothing is left.
        assert_eq!(fail(&mut attempts, &mut host, 429), Next::GiveUp);
        assert_eq!(attempts.retries, 2);
    }

    #[test]
    fn transport_failures_and_timeouts_are_retried() {
        let mut host = FakeHost::new(0);
        let mut attempts = start(target("a", json!({"attempts": 2, "on_status_codes": [429]})), &mut host).unwrap();
        assert!(matches!(attempts.failed(Failure::Timeout, &[], &mut host), Next::Call { index: 0, .. }));
        assert!(matches!(attempts.failed(Failure::Unreachable, &[], &mut host), Next::Call { index: 0, .. }));
        assert_eq!(attempts.failed(Failure::Unreachable, &[], &mut host), Next::GiveUp);
    }

    #[test]
    fn a_status_the_rule_does_not_list_is_not_retried() {
        let mut host = FakeHost::new(0);
        let mut attempts = start(target("a", json!({"attempts": 3})), &mut host).unwrap();
        assert_eq!(attempts.failed(Failure::Status(400), &[], &mut host), Next::GiveUp);
        assert_eq!(attempts.retries, 0);
    }

    #[test]
    fn retry_after_beyond_the_cap_stops_retrying() {
        let mut host = FakeHost::new(0);
        let mut attempts =
            start(target("a", json!({"attempts": 3, "use_retry_after_headers": true})), &mut host).unwrap();
        let wait = [("retry-after-ms".to_string(), b"1500".to_vec())];
        assert_eq!(attempts.failed(Failure::Status(429), &wait, &mut host), Next::Call { index: 0, delay_ms: 1500 });
        let too_long = [("retry-after".to_string(), b"3600".to_vec())];
        assert_eq!(attempts.failed(Failure::Status(429), &too_long, &mut host), Next::GiveUp);
    }
}
