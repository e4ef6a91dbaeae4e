//! The worker: every request of one Envoy worker thread (one VM), and what outlives any one
//! of them. Each dispatched call is a task in one registry keyed by its call token, whichever
//! context its answer arrives on; a fetch several requests need (an access token, a JWKS, a
//! control-plane entry) is one call with its waiters; delayed attempts and record batches wait
//! on the root context's timer.

use super::gate::Gate;
use super::record::{self, Record};
use super::waiters::{Fetch, Waiter, Waiters, LOST_AFTER_MS};
use super::{lookups, metrics, reply, shipping, tokens};
use super::{Action, Bodies, CallAnswer, Env, Exchange, Io, Output};
use crate::routing::attempts::Next;
use crate::settings::Settings;
use crate::usage_limits::leases::{Ask, Leases, Report};
use hashbrown::HashMap;
use metrics::ModelLabels;
use serde_json::Value;
use std::rc::Rc;

/// A request's wait for the root context's timer.
pub(super) struct Timer {
    pub(super) due_ms: u64,
    pub(super) owner: u32,
    pub(super) wake: Wake,
}

/// What a request waits for the timer to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// Start this recovery attempt (its delay is over).
    Attempt(usize),
    /// Ask for a limit's allowance again (other replicas' leases may have ended).
    Allowance,
    /// See whether Envoy delivered the body of a request held for it (see [`BODY_WAIT_MS`]).
    BodyWithheld,
}

/// How long a request held for its body waits for the first of it before the gateway decides
/// that Envoy withholds it. An Envoy whose Wasm filter config lacks
/// `allow_on_headers_stop_iteration` (Istio's `WasmPlugin`, Envoy Gateway's
/// `EnvoyExtensionPolicy`) stops the whole stream when the filter holds the headers and
/// buffers the body without ever passing it on: without this probe the request would hang. It
/// runs only until a worker saw its first body, which proves the setting.
pub(super) const BODY_WAIT_MS: u64 = 2000;

/// What a dispatched call was for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Task {
    /// A recovery attempt (the plan knows which).
    Attempt,
    Embedding,
    /// A guardrail check's call (a webhook).
    Check,
    /// A call the aggregate MCP endpoint makes to one of its servers.
    McpBackend,
    /// What every request waiting for it needs (see [`Waiters`]).
    Fetch(Fetch),
    /// The control plane's health, for the gateway's own `/health`.
    Health,
    /// A batch of request records to the control plane (the root context's call).
    Records,
    /// A kept response (its id) written to the control plane.
    Kept(String),
    /// The timer's renewals and reports of the limits' leases (the root context's call).
    /// A lease call the timer sent at the time it holds (its reports and renewals).
    Leases(Box<(Vec<Report>, Vec<Ask>, u64)>),
}

/// Dispatched calls in flight (token → request and purpose) and waiting calls.
#[derive(Default)]
pub(super) struct Tasks {
    pub(super) calls: HashMap<u32, (u32, Task)>,
    pub(super) timers: Vec<Timer>,
    /// Requests waiting for a fetch: one call serves them all.
    pub(super) waiters: Waiters,
    /// Control-plane entries this worker read lately.
    pub(super) recent: lookups::Recent,
    /// Tokens for checks that wait for another request's call, counted down from `u32::MAX`.
    aliases: u32,
    /// Request records on their way to the control plane.
    records: shipping::Shipper,
    /// The worker's leases of the limits' allowance.
    pub(super) leases: Leases,
    /// Workspaces' limits and prices, parsed once per read.
    pub(super) policies: crate::usage_limits::Policies,
    /// The reports an ask for allowance carries, by its call's token (sent again if it fails).
    pub(super) asked: HashMap<u32, Vec<Report>>,
    /// Fetches that the next tick dispatches (see `send_pending`): asks for allowance, with the
    /// lease reports each carries, and fetches whose call the host lost.
    pub(super) to_send: Vec<(Fetch, super::Dispatch, Vec<Report>)>,
    /// The root context. Calls whose answer serves more than the request that started them
    /// (fetches, record batches, leases) are dispatched on it: Envoy cancels a context's calls
    /// when the context ends, and a request may end (its client gone) while others wait for
    /// its fetch.
    pub(super) root: u32,
}

impl Tasks {
    /// A check of request `id` joins the fetch on its way: the token of its own it waits under
    /// (None when no fetch is on its way).
    pub(super) fn join_as_check(&mut self, id: u32, fetch: &Fetch) -> Option<u32> {
        let aliases = &mut self.aliases;
        let mut alias = None;
        self.waiters.join(fetch, || {
            let token = *aliases;
            *aliases = token.wrapping_sub(1);
            alias = Some(token);
            Waiter { id, token }
        });
        alias
    }
}

/// What an idle worker leaves with its host (see `Worker::idle_calls`).
#[cfg(any(test, feature = "native"))]
pub(crate) struct IdleCalls {
    /// The report of its leases, if it holds any.
    pub(crate) leases: Option<super::Dispatch>,
    pub(crate) records: shipping::Handover,
}

/// Every request of one worker (one Envoy worker thread, one VM).
pub(crate) struct Worker {
    settings: Rc<Settings>,
    exchanges: HashMap<u32, Exchange>,
    /// The requests a lookup gate holds for their control-plane entries.
    gates: HashMap<u32, Gate>,
    tasks: Tasks,
    models: ModelLabels,
    /// Whether this worker queued a record yet (the drop counter is then defined, at 0).
    shipping: bool,
    /// Whether Envoy delivered a request body to this worker yet (see [`BODY_WAIT_MS`]).
    bodies_delivered: bool,
}

impl Worker {
    pub(crate) fn new(settings: Rc<Settings>) -> Worker {
        Worker {
            settings,
            exchanges: HashMap::new(),
            gates: HashMap::new(),
            tasks: Tasks { aliases: u32::MAX, ..Tasks::default() },
            models: ModelLabels::default(),
            shipping: false,
            bodies_delivered: false,
        }
    }

    /// The worker of root context `root`.
    pub(crate) fn rooted(mut self, root: u32) -> Worker {
        self.tasks.root = root;
        self
    }

    /// New requests use `settings` (requests in flight keep theirs).
    pub(crate) fn configure(&mut self, settings: Settings) {
        self.settings = Rc::new(settings);
    }

    /// Runs `event` on exchange `id` with what it may reach.
    fn on(&mut self, id: u32, io: &mut dyn Io, event: impl FnOnce(&mut Exchange, &mut Env) -> Action) -> Output {
        let Some(exchange) = self.exchanges.get_mut(&id) else {
            return Output::proceed();
        };
        let settings = Rc::clone(&exchange.settings);
        let mut env = Env { id, settings: &settings, io, tasks: &mut self.tasks, after: Vec::new() };
        let action = event(exchange, &mut env);
        if !env.tasks.to_send.is_empty() {
            rearm(env.tasks, env.io);
        }
        Output { action, after: env.after }
    }

    /// Runs `event` on the gate's request `id`, if the gate holds it; the gate lets go of a
    /// request that waits for no entry any more.
    fn at_gate(
        &mut self,
        id: u32,
        io: &mut dyn Io,
        event: impl FnOnce(&mut Gate, &mut Env) -> Action,
    ) -> Option<Output> {
        let gate = self.gates.get_mut(&id)?;
        let settings = Rc::clone(&gate.settings);
        let mut env = Env { id, settings: &settings, io, tasks: &mut self.tasks, after: Vec::new() };
        let action = event(gate, &mut env);
        if !gate.holds() {
            self.gates.remove(&id);
        }
        Some(Output { action, after: env.after })
    }

    pub(crate) fn request_headers(&mut self, id: u32, end_of_stream: bool, io: &mut dyn Io) -> Output {
        let raw = io.request_headers(id);
        let output = if self.settings.lookup_gate {
            self.gates.insert(id, Gate::new(Rc::clone(&self.settings), &raw, io.host()));
            let output = self.at_gate(id, io, |gate, env| gate.request_headers(env, raw, end_of_stream));
            output.unwrap_or_else(Output::proceed)
        } else {
            let exchange = Exchange::new(Rc::clone(&self.settings), &raw, io.host());
            self.exchanges.insert(id, exchange);
            self.on(id, io, |exchange, env| exchange.request_headers(env, raw, end_of_stream))
        };
        if !end_of_stream && !self.bodies_delivered && output.action == Action::Pause {
            let due_ms = io.host().now_ms() + BODY_WAIT_MS;
            self.tasks.timers.push(Timer { due_ms, owner: id, wake: Wake::BodyWithheld });
            rearm(&self.tasks, io);
        }
        output
    }

    pub(crate) fn request_body(&mut self, id: u32, size: usize, end_of_stream: bool, io: &mut dyn Io) -> Output {
        if !self.bodies_delivered {
            // Envoy passes bodies on: no request needs the probe any more.
            self.bodies_delivered = true;
            self.tasks.timers.retain(|t| t.wake != Wake::BodyWithheld);
            rearm(&self.tasks, io);
        }
        if let Some(output) = self.at_gate(id, io, |gate, env| gate.request_body(env, size, end_of_stream)) {
            return output;
        }
        self.on(id, io, |exchange, env| exchange.request_body(env, size, end_of_stream))
    }

    pub(crate) fn request_trailers(&mut self, id: u32, io: &mut dyn Io) -> Output {
        if let Some(output) = self.at_gate(id, io, |gate, env| gate.request_trailers(env)) {
            return output;
        }
        self.on(id, io, |exchange, env| exchange.request_trailers(env))
    }

    pub(crate) fn response_headers(&mut self, id: u32, end_of_stream: bool, io: &mut dyn Io) -> Output {
        if let Some(output) = self.at_gate(id, io, |gate, env| gate.response_headers(env)) {
            return output;
        }
        self.on(id, io, |exchange, env| exchange.response_headers(env, end_of_stream))
    }

    pub(crate) fn response_body(&mut self, id: u32, size: usize, end_of_stream: bool, io: &mut dyn Io) -> Output {
        self.on(id, io, |exchange, env| exchange.response_body(env, size, end_of_stream))
    }

    /// Whether a call answer is awaited (an unknown token's answer need not even be read).
    pub(crate) fn awaits(&self, token: u32) -> bool {
        self.tasks.calls.contains_key(&token)
    }

    /// A dispatched call answered, on whichever context it arrived.
    pub(crate) fn call_answered(&mut self, token: u32, answer: CallAnswer, io: &mut dyn Io) -> Output {
        let Some((owner, task)) = self.tasks.calls.remove(&token) else {
            return Output::proceed();
        };
        match task {
            Task::Fetch(fetch) => {
                if let Some(reports) = self.tasks.asked.remove(&token) {
                    if shipping::grants(&answer).is_none() {
                        let now_ms = io.host().now_ms();
                        self.tasks.leases.call_failed(reports, &[], now_ms);
                    }
                }
                self.fetched(fetch, answer, io)
            }
            Task::Records if !self.tasks.records.carries(token) => Output::proceed(),
            Task::Records => {
                let now_ms = io.host().now_ms();
                let dropped = self.tasks.records.answered(answer.status, now_ms, self.settings.records.max_queued);
                count_dropped(io, dropped);
                rearm(&self.tasks, io);
                Output::proceed()
            }
            Task::Leases(sent) => {
                let now_ms = io.host().now_ms();
                self.renewed(*sent, &answer, now_ms);
                rearm(&self.tasks, io);
                Output::proceed()
            }
            Task::Kept(id) => {
                if !(200..300).contains(&answer.status) {
                    log::warn!("response {id} was not kept: the control plane answered {}", answer.status);
                }
                Output::proceed()
            }
            task => self.on(owner, io, |exchange, env| {
                match task {
                    Task::Embedding => exchange.embedding_arrived(env, answer),
                    Task::Health => {
                        exchange.health_answered(env, answer.status);
                    }
                    Task::Check => exchange.check_answered(env, token, answer),
                    Task::McpBackend => exchange.backend_answered(env, token, answer),
                    _ => exchange.attempt_answered(env, answer),
                }
                Action::Continue
            }),
        }
    }

    /// A call whose answer will not come: the host cancelled it with the stream that carried it
    /// (the native module's root calls ride on a stream). A fetch that requests still wait for is
    /// sent again from the next tick; any other call is answered as failed.
    #[cfg(any(test, feature = "native"))]
    pub(crate) fn call_lost(&mut self, token: u32, io: &mut dyn Io) -> Output {
        let resend = match self.tasks.calls.get(&token) {
            Some((_, Task::Fetch(fetch))) => {
                self.tasks.waiters.awaited_call(fetch).map(|call| (fetch.clone(), call.clone()))
            }
            _ => None,
        };
        let Some((fetch, call)) = resend else {
            return self.call_answered(token, CallAnswer::FAILED, io);
        };
        self.tasks.calls.remove(&token);
        let reports = self.tasks.asked.remove(&token).unwrap_or_default();
        self.tasks.to_send.push((fetch, call, reports));
        rearm(&self.tasks, io);
        Output::proceed()
    }

    /// A fetch answered: what it fetched goes to every request waiting for it.
    fn fetched(&mut self, fetch: Fetch, answer: CallAnswer, io: &mut dyn Io) -> Output {
        let mut after = Vec::new();
        match &fetch {
            Fetch::Token(key) => {
                let fetched = tokens::from_answer(&answer);
                match &fetched {
                    Ok((token, expires_in)) => {
                        let now_ms = io.host().now_ms();
                        tokens::remember(io.host().store(), key, token, *expires_in, now_ms);
                    }
                    Err(error) => log::warn!("{}", error.message),
                }
                let fetched = fetched.map(|(token, _)| token);
                for waiter in self.tasks.waiters.answered(&fetch) {
                    let output = self.on(waiter.id, io, |exchange, env| {
                        exchange.token_arrived(env, &fetched);
                        Action::Continue
                    });
                    after.extend(output.after);
                }
            }
            Fetch::Jwks(uri) => {
                for waiter in self.tasks.waiters.answered(&fetch) {
                    let copy = CallAnswer { status: answer.status, headers: Vec::new(), body: answer.body.clone() };
                    let output = self.on(waiter.id, io, |exchange, env| {
                        // A check waits under its call's token; a request's OAuth token under none.
                        match waiter.token {
                            0 => exchange.jwks_arrived(env, uri, &copy),
                            token => exchange.check_answered(env, token, copy),
                        }
                        Action::Continue
                    });
                    after.extend(output.after);
                }
            }
            Fetch::Allowance(key) => {
                let grant = shipping::grants(&answer).and_then(|grants| grants.into_iter().next());
                if let Some(grant) = &grant {
                    let now_ms = io.host().now_ms();
                    let asked_ms = self.tasks.waiters.since_ms(&fetch).unwrap_or(now_ms);
                    self.tasks.leases.granted(key, grant, asked_ms, now_ms);
                } else {
                    log::warn!(
                        "the control plane granted no allowance of limit '{}': it answered {}",
                        key.limit,
                        answer.status
                    );
                }
                for waiter in self.tasks.waiters.answered(&fetch) {
                    let output = self.on(waiter.id, io, |exchange, env| {
                        let allowance = exchange.allowance_arrived(env, grant.as_ref());
                        exchange.allowed(env, allowance);
                        Action::Continue
                    });
                    after.extend(output.after);
                }
                rearm(&self.tasks, io);
            }
            Fetch::Lookup(r) => {
                let settled = lookups::settle(&self.settings, r, &answer, io);
                for waiter in self.tasks.waiters.answered(&fetch) {
                    let output = match self.at_gate(waiter.id, io, |gate, env| gate.lookup_arrived(env, r, &settled)) {
                        Some(output) => output,
                        None => self.on(waiter.id, io, |exchange, env| {
                            exchange.lookup_arrived(env, r, &settled);
                            Action::Continue
                        }),
                    };
                    after.extend(output.after);
                }
            }
        }
        Output { action: Action::Continue, after }
    }

    /// The root's timer: starts the calls whose delay is over.
    pub(crate) fn tick(&mut self, io: &mut dyn Io) -> Output {
        let now = io.host().now_ms();
        let (due, waiting): (Vec<Timer>, Vec<Timer>) =
            std::mem::take(&mut self.tasks.timers).into_iter().partition(|t| t.due_ms <= now);
        self.tasks.timers = waiting;
        let mut after = Vec::new();
        for timer in due {
            let output = match timer.wake {
                Wake::BodyWithheld => self.body_withheld(timer.owner, io),
                Wake::Attempt(index) => self.on(timer.owner, io, |exchange, env| {
                    exchange.step(env, Next::Call { index, delay_ms: 0 });
                    Action::Continue
                }),
                Wake::Allowance => self.on(timer.owner, io, |exchange, env| {
                    let allowance = exchange.reserve_again(env);
                    exchange.allowed(env, allowance);
                    Action::Continue
                }),
            };
            after.extend(output.after);
        }
        after.extend(self.send_pending(io));
        after.extend(self.give_up_lost_fetches(now, io));
        self.ship(now, io);
        self.renew(io);
        rearm(&self.tasks, io);
        Output { action: Action::Continue, after }
    }

    /// What a worker whose last request ended sends if no other comes soon (the native module's
    /// timer rides on its streams: nothing ticks before the next request): the reports of its
    /// leases as if each ended at `now_ms`, rather than expire unreported, which the control plane
    /// would count as wholly spent; and the records queued since the last time, for the relay to
    /// copy with those it keeps (they stay queued: the control plane stores each record id once).
    /// None without a control plane. The host holds these calls, drops them when a request comes
    /// first, and else sends them and says so (`idle_sent`) before the worker's next event.
    #[cfg(any(test, feature = "native"))]
    pub(crate) fn idle_calls(&mut self, now_ms: u64) -> Option<IdleCalls> {
        let cp = self.settings.control_plane.as_ref()?;
        let reports = self.tasks.leases.idle_reports(now_ms);
        let leases = (!reports.is_empty()).then(|| shipping::leases(cp, &[], &reports));
        Some(IdleCalls { leases, records: self.tasks.records.hand_over() })
    }

    /// The calls `idle_calls(idle_ms)` made went: the leases ended then, and were reported;
    /// when every call was answered (`stored`), the records handed over are the control plane's.
    #[cfg(any(test, feature = "native"))]
    pub(crate) fn idle_sent(&mut self, idle_ms: u64, stored: bool) {
        if stored {
            self.tasks.records.copies_stored();
        }
        self.tasks.leases.retire_all(idle_ms);
        // Their reports went with those calls (and with no lease active, none is renewed).
        let _sent = self.tasks.leases.due(idle_ms);
    }

    /// Request `id` was held for its body [`BODY_WAIT_MS`] ago and no worker's request got a
    /// body since: Envoy withholds bodies from the filter, and the request is answered with
    /// what to set instead of hanging.
    fn body_withheld(&mut self, id: u32, io: &mut dyn Io) -> Output {
        if self.bodies_delivered {
            return Output::proceed();
        }
        log::warn!("{}", super::body_withheld_error().message);
        if let Some(output) = self.at_gate(id, io, |gate, env| gate.body_withheld(env)) {
            return output;
        }
        self.on(id, io, |exchange, env| exchange.body_withheld(env))
    }

    /// Fetches whose call never answered (see [`LOST_AFTER_MS`]) answer their
    /// waiters as a failed call would; a late answer finds nothing to do.
    fn give_up_lost_fetches(&mut self, now_ms: u64, io: &mut dyn Io) -> Vec<super::After> {
        let mut after = Vec::new();
        for fetch in self.tasks.waiters.lost(now_ms) {
            log::warn!(
                "a call that requests wait for did not answer in {} s: it counts as failed",
                LOST_AFTER_MS / 1000
            );
            let tokens: Vec<u32> = self
                .tasks
                .calls
                .iter()
                .filter(|(_, (_, task))| matches!(task, Task::Fetch(f) if *f == fetch))
                .map(|(token, _)| *token)
                .collect();
            for token in tokens {
                self.tasks.calls.remove(&token);
                if let Some(reports) = self.tasks.asked.remove(&token) {
                    self.tasks.leases.call_failed(reports, &[], now_ms);
                }
            }
            after.extend(self.fetched(fetch, CallAnswer::FAILED, io).after);
        }
        after
    }

    /// Dispatches the fetches requests wait for (asks for allowance, lost calls sent again) from
    /// the root context, whose calls answer however long the requests that asked live; a call
    /// that cannot be sent answers its waiters as unanswered.
    fn send_pending(&mut self, io: &mut dyn Io) -> Vec<super::After> {
        let mut after = Vec::new();
        for (fetch, call, reports) in std::mem::take(&mut self.tasks.to_send) {
            match io.dispatch(self.tasks.root, &call) {
                Some(token) => {
                    self.tasks.calls.insert(token, (self.tasks.root, Task::Fetch(fetch)));
                    if !reports.is_empty() {
                        self.tasks.asked.insert(token, reports);
                    }
                }
                None => {
                    let now_ms = io.host().now_ms();
                    self.tasks.leases.call_failed(reports, &[], now_ms);
                    after.extend(self.fetched(fetch, CallAnswer::FAILED, io).after);
                }
            }
        }
        after
    }

    /// The timer's work on the limits' leases: one call renews the ledgers in use and reports the
    /// leases that are done (its task carries both, for when the call is not answered).
    fn renew(&mut self, io: &mut dyn Io) {
        let Some(cp) = &self.settings.control_plane else {
            return;
        };
        let now_ms = io.host().now_ms();
        let (reports, asks) = self.tasks.leases.due(now_ms);
        if reports.is_empty() && asks.is_empty() {
            return;
        }
        match io.dispatch(self.tasks.root, &shipping::leases(cp, &asks, &reports)) {
            Some(token) => {
                self.tasks.calls.insert(token, (self.tasks.root, Task::Leases(Box::new((reports, asks, now_ms)))));
            }
            None => self.tasks.leases.call_failed(reports, &asks, now_ms),
        }
    }

    /// The timer's lease call answered: the renewals are installed.
    fn renewed(&mut self, sent: (Vec<Report>, Vec<Ask>, u64), answer: &CallAnswer, now_ms: u64) {
        let (reports, asks, asked_ms) = sent;
        let Some(grants) = shipping::grants(answer) else {
            log::warn!("the control plane did not take the limits' leases: it answered {}", answer.status);
            return self.tasks.leases.call_failed(reports, &asks, now_ms);
        };
        for (ask, grant) in asks.iter().zip(&grants) {
            self.tasks.leases.granted(&ask.key(), grant, asked_ms, now_ms);
        }
    }

    /// Sends the next batch of records when one is due (from the root's timer).
    fn ship(&mut self, now_ms: u64, io: &mut dyn Io) {
        let Some(cp) = &self.settings.control_plane else {
            let dropped = self.tasks.records.clear();
            return count_dropped(io, dropped);
        };
        let Some(body) = self.tasks.records.take(now_ms) else {
            return;
        };
        match io.dispatch(self.tasks.root, &shipping::call(cp, body)) {
            Some(token) => {
                self.tasks.records.sent(token);
                self.tasks.calls.insert(token, (self.tasks.root, Task::Records));
            }
            None => {
                let dropped = self.tasks.records.answered(0, now_ms, self.settings.records.max_queued);
                count_dropped(io, dropped);
            }
        }
    }

    /// Request `id` ended: its metrics go to the host, its record is returned, and nothing
    /// of it is left behind.
    pub(crate) fn finished(&mut self, id: u32, io: &mut dyn Io) -> Option<Record> {
        self.tasks.timers.retain(|t| t.owner != id);
        // A fetch goes on for the other requests waiting for it.
        self.tasks.calls.retain(|_, (owner, task)| *owner != id || matches!(task, Task::Fetch(_)));
        self.tasks.waiters.forget(id);
        // A gate's request is the main instance's to record.
        self.gates.remove(&id);
        let mut exchange = self.exchanges.remove(&id)?;
        let settings = Rc::clone(&exchange.settings);
        // Envoy answered a held answer itself when its provider broke off or went silent: the
        // record says so.
        let envoys = if exchange.awaiting_end { reply::envoys_own_answer(&io.response_details(id)) } else { None };
        let reportable = exchange.settle(&mut self.tasks.leases);
        let mut record = exchange.into_record();
        if let Some((status, code)) = envoys {
            record.status = status;
            record.error_code = Some(code);
        }
        record.end(io.host().now_ms());
        if reportable {
            // A lease whose reservations all settled is reported at once.
            rearm(&self.tasks, io);
        }
        for metric in metrics::of_request(&record, &settings.metrics, &mut self.models) {
            io.metric(metric.kind, &metric.name, metric.value);
        }
        let line = record.to_json();
        io.access_log(&line);
        if settings.control_plane.is_some() && !record.workspace.is_empty() {
            self.queue(&line, record.start_ms, record.bodies.as_deref(), &settings, io);
        }
        Some(record)
    }

    /// Queues a finished request's record for the control plane; the timer is set again only
    /// when the first record waits or a batch is due at once.
    fn queue(&mut self, line: &[u8], start_ms: u64, bodies: Option<&Bodies>, settings: &Settings, io: &mut dyn Io) {
        if !self.shipping {
            // Scrapes show the counter at 0 once records are shipped, not only after a drop.
            self.shipping = true;
            io.metric(metrics::Kind::Counter, metrics::RECORDS_DROPPED, 0);
        }
        let host = io.host();
        let now_ms = host.now_ms();
        let record_id = record::record_id(now_ms, host.random());
        let extra = record::Shipped::new(start_ms, record_id.as_deref());
        let records = &mut self.tasks.records;
        let Some(shipped) = record::shipped_with_bodies(line, &extra, bodies, shipping::MAX_RECORD_BYTES) else {
            return count_dropped(io, 1);
        };
        if !records.push(shipped, now_ms, settings.records.max_queued) {
            return count_dropped(io, 1);
        }
        if records.len() == 1 || records.len() == shipping::EAGER {
            rearm(&self.tasks, io);
        }
    }
}

/// Counts records dropped on their way to the control plane.
fn count_dropped(io: &mut dyn Io, dropped: u64) {
    if dropped > 0 {
        io.metric(metrics::Kind::Counter, metrics::RECORDS_DROPPED, dropped);
    }
}

/// Ticks when the earliest timer (or the next batch of records) is due; no ticks while
/// nothing waits.
pub(super) fn rearm(tasks: &Tasks, io: &mut dyn Io) {
    let now = io.host().now_ms();
    let leases = tasks.leases.next_due_ms(now);
    let asks = (!tasks.to_send.is_empty()).then_some(now);
    let lost = tasks.waiters.next_loss_ms();
    let earliest =
        tasks.timers.iter().map(|t| t.due_ms).chain(tasks.records.due_ms()).chain(leases).chain(asks).chain(lost).min();
    io.tick_every(earliest.map_or(0, |due| due.saturating_sub(now).max(1)));
}

/// Sends what a translated Responses answer keeps (`kept`, from its translator) to the control
/// plane as the answer reaches the client; without a control plane nothing is kept. The write is
/// the root context's call: the request ends right after its answer, and Envoy would cancel a
/// call of the request's own with it.
pub(super) fn keep(env: &mut Env, workspace: &str, kept: Option<(String, Value)>) {
    let (Some(cp), Some((id, kept))) = (&env.settings.control_plane, kept) else {
        return;
    };
    let root = env.tasks.root;
    match env.io.dispatch(root, &shipping::keep_response(cp, workspace, &id, &kept)) {
        Some(token) => {
            env.tasks.calls.insert(token, (root, Task::Kept(id)));
        }
        None => log::warn!("response {id} was not kept: the control plane could not be called"),
    }
}
