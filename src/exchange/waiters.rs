//! Requests waiting for what one dispatched call fetches for all of them: a credential's
//! access token, a JWKS, a control-plane entry. The first request starts the call; the others
//! join it; its answer goes to every request still waiting. A request that ends leaves the
//! queue, but the call goes on for the others (and its key stays, so a later request joins the
//! call on its way instead of starting another).

use super::Dispatch;
use crate::catalog::Ref;
use crate::usage_limits::LedgerKey;
use hashbrown::HashMap;

/// What one call fetches for every request of the worker waiting for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Fetch {
    /// The access token of the credential with this cache key.
    Token(String),
    /// The JWKS at this URI (for the checks that verify a JWT).
    Jwks(String),
    /// A control-plane entry.
    Lookup(Ref),
    /// A grant of a limit's allowance.
    Allowance(LedgerKey),
}

/// A request waiting for a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiter {
    pub(super) id: u32,
    /// The call token the request waits under (a check's, for a JWKS); 0 when it needs none.
    pub(super) token: u32,
}

impl Waiter {
    pub(super) fn request(id: u32) -> Waiter {
        Waiter { id, token: 0 }
    }
}

/// Every call that fetches answers within its timeout, at most a minute (control-plane reads,
/// token endpoints, JWKS): a fetch on its way this long lost its call, and is answered as failed
/// rather than held for ever with everyone who joined it.
pub(super) const LOST_AFTER_MS: u64 = 70_000;

/// A fetch on its way: since when, the requests waiting for it in arrival order, and its call
/// (sent again when the host loses it: only the native module's can, see `Worker::call_lost`).
struct Pending {
    since_ms: u64,
    waiters: Vec<Waiter>,
    #[cfg(any(test, feature = "native"))]
    call: Dispatch,
}

/// Every fetch a worker's requests wait for.
#[derive(Default)]
pub(super) struct Waiters(HashMap<Fetch, Pending>);

impl Waiters {
    /// Joins the fetch already on its way with the waiter `waiter` makes; false when none is
    /// (the caller starts the call, then `started`).
    pub(super) fn join(&mut self, fetch: &Fetch, waiter: impl FnOnce() -> Waiter) -> bool {
        match self.0.get_mut(fetch) {
            Some(pending) => {
                pending.waiters.push(waiter());
                true
            }
            None => false,
        }
    }

    /// `call` for `fetch` started at `now_ms` on behalf of `first`.
    pub(super) fn started(&mut self, fetch: Fetch, first: Waiter, now_ms: u64, call: &Dispatch) {
        #[cfg(not(any(test, feature = "native")))]
        let _ = call;
        let pending = Pending {
            since_ms: now_ms,
            waiters: vec![first],
            #[cfg(any(test, feature = "native"))]
            call: call.clone(),
        };
        self.0.insert(fetch, pending);
    }

    /// The call of `fetch`, while requests wait for it.
    #[cfg(any(test, feature = "native"))]
    pub(super) fn awaited_call(&self, fetch: &Fetch) -> Option<&Dispatch> {
        self.0.get(fetch).filter(|pending| !pending.waiters.is_empty()).map(|pending| &pending.call)
    }

    /// When the call for `fetch` on its way was started.
    pub(super) fn since_ms(&self, fetch: &Fetch) -> Option<u64> {
        self.0.get(fetch).map(|pending| pending.since_ms)
    }

    /// The fetch answered: the requests still waiting for it.
    pub(super) fn answered(&mut self, fetch: &Fetch) -> Vec<Waiter> {
        self.0.remove(fetch).map(|pending| pending.waiters).unwrap_or_default()
    }

    /// Request `id` ended: it waits for nothing any more.
    pub(super) fn forget(&mut self, id: u32) {
        for pending in self.0.values_mut() {
            pending.waiters.retain(|waiter| waiter.id != id);
        }
    }

    /// The fetches on their way for [`LOST_AFTER_MS`] at `now_ms`.
    pub(super) fn lost(&self, now_ms: u64) -> Vec<Fetch> {
        let lost = |pending: &&Pending| now_ms.saturating_sub(pending.since_ms) >= LOST_AFTER_MS;
        self.0.iter().filter(|(_, pending)| lost(pending)).map(|(fetch, _)| fetch.clone()).collect()
    }

    /// When the oldest fetch on its way counts as lost.
    pub(super) fn next_loss_ms(&self) -> Option<u64> {
        self.0.values().map(|pending| pending.since_ms.saturating_add(LOST_AFTER_MS)).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    fn call() -> Dispatch {
        Dispatch { cluster: "c".into(), headers: Vec::new(), body: Vec::new(), timeout_ms: 1000 }
    }

    #[test]
    fn one_fetch_serves_every_waiter_and_a_request_that_ended_leaves_its_queue() {
        let mut waiters = Waiters::default();
        let jwks = Fetch::Jwks("https://idp/jwks".into());
        assert!(!waiters.join(&jwks, || Waiter { id: 1, token: 10 }), "nobody fetches it yet");
        waiters.started(jwks.clone(), Waiter { id: 1, token: 10 }, 0, &call());
        assert!(waiters.join(&jwks, || Waiter { id: 2, token: 20 }));
        assert!(waiters.join(&jwks, || Waiter { id: 3, token: 30 }));
        waiters.forget(2);
        assert_eq!(waiters.answered(&jwks), vec![Waiter { id: 1, token: 10 }, Waiter { id: 3, token: 30 }]);
        assert_eq!(waiters.answered(&jwks), Vec::new(), "answered once");
    }

    #[test]
    fn a_fetch_whose_waiters_all_ended_is_still_joined() {
        let mut waiters = Waiters::default();
        let token = Fetch::Token("sa@project".into());
        waiters.started(token.clone(), Waiter::request(1), 0, &call());
        assert_eq!(waiters.awaited_call(&token), Some(&call()));
        waiters.forget(1);
        assert_eq!(waiters.awaited_call(&token), None, "nobody waits: a lost call is not sent again");
        // The call goes on: a later request waits for it instead of starting another.
        assert!(waiters.join(&token, || Waiter::request(2)));
        assert_eq!(waiters.answered(&token), vec![Waiter::request(2)]);
        assert!(!waiters.join(&Fetch::Token("other".into()), || Waiter::request(3)));
    }
}
