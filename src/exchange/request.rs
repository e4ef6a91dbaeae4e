//! The request phases of an exchange, up to the moment Envoy's router sends it: the pipeline's
//! start (headers, then the body when the gateway reads it), the control-plane entries it
//! waits for, `/health`, the input checks, the cache lookup (and its embeddings call), the
//! backend's access token, and the edits that route it.

use super::caching::{CacheState, Hit};
use super::guard::{self, Answer, Guard, Progress};
use super::limits::Allowance;
use super::lookups::{Read, Stalled};
use super::waiters::{Fetch, Waiter};
use super::worker::Task;
use super::{lookups, tokens, trailers_refused, unroute};
use super::{Action, After, CallAnswer, Dispatch, Env, Exchange, Phase, RawHeaders, Routed};
use crate::cache::semantic;
use crate::catalog::{Entry, Ref};
use crate::errors::GatewayError;
use crate::guardrails::verdict;
use crate::pipeline::{self, Call, Started};
use crate::routing::attempts::Next;

/// A routed request not yet sent: its call, headers and body (as `forward` takes them).
pub(super) struct Held {
    call: Call,
    raw: RawHeaders,
    body: Option<(usize, Vec<u8>)>,
}

/// Whether a request's backend needs an access token first.
pub(super) enum Token {
    Unneeded,
    Ready(String),
    /// Being fetched; the request waits for it.
    Awaited,
}

/// How long the OAuth issuer's JWKS may take to arrive.
const JWKS_TIMEOUT_MS: u64 = 5_000;

impl Exchange {
    pub(super) fn request_headers(&mut self, env: &mut Env, raw: RawHeaders, end_of_stream: bool) -> Action {
        // Without a body to read, the request can be sent again only when it has none.
        self.process(env, raw, end_of_stream.then(|| (0, Vec::new())))
    }

    /// Processes the request from its headers (and its body, once complete): the first time,
    /// and again each time a control-plane entry it waited for arrived.
    fn process(&mut self, env: &mut Env, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        let (started, workspace) = self.reads.start(env, &raw, body.as_ref().map(|(_, bytes)| bytes.as_slice()));
        if let Some(workspace) = workspace {
            self.record.workspace = workspace;
        }
        match started {
            Err(error) => self.answer_error(env, &error),
            Ok(Started::Health) => self.health(env),
            Ok(Started::McpMetadata) => match &env.settings.mcp_oauth {
                Some(_) if !matches!(self.record.method.as_str(), "GET" | "HEAD") => {
                    self.answer_error(env, &crate::mcp::oauth::metadata_is_read())
                }
                Some(oauth) => self.answer(env, 200, oauth.metadata.clone()),
                None => self.answer_error(env, &crate::mcp::no_oauth_metadata()),
            },
            Ok(Started::Jwks(uri)) => self.fetch_jwks(env, uri, Stalled::new(raw, body)),
            Ok(Started::Ready(call)) => self.admit(env, call, raw, body),
            Ok(Started::Lookup(r)) => self.look_up(env, r, Stalled::new(raw, body)),
            Ok(Started::Relay(relay)) => self.relay(env, &relay, &raw),
            Ok(Started::Mcp { target, key_id, policy, checks }) => {
                self.policy = env.tasks.policies.of(policy.as_ref());
                match checks.as_deref().map(Guard::for_tool_calls).transpose() {
                    Ok(guard) => {
                        self.guard = guard.flatten().map(Box::new);
                        self.route_mcp(env, target, key_id, raw, body)
                    }
                    Err(error) => self.answer_error(env, &error),
                }
            }
            Ok(Started::NeedsBody(pending)) => {
                unroute(env, &raw);
                self.phase = Phase::AwaitingBody(Box::new((pending, raw)));
                // Held until the body is complete (allow_on_headers_stop_iteration).
                Action::Pause
            }
        }
    }

    /// Envoy withholds the body the request is held for (see [`super::worker::BODY_WAIT_MS`]).
    pub(super) fn body_withheld(&mut self, env: &mut Env) -> Action {
        let waits_for_body = match &self.phase {
            Phase::AwaitingBody(_) | Phase::McpAwaitingBody(_) => true,
            Phase::AwaitingLookup(stalled) => !stalled.ended,
            _ => false,
        };
        if !waits_for_body {
            return Action::Continue;
        }
        self.answer_error(env, &super::body_withheld_error())
    }

    pub(super) fn request_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        if let Phase::AwaitingLookup(stalled) = &mut self.phase {
            // Buffered meanwhile; the request is processed with it once the entry arrived.
            if end_of_stream {
                if let Some(body) = stalled.body_ended(env, size) {
                    self.record.client_sent(body);
                }
            }
            return Action::Pause;
        }
        if !matches!(self.phase, Phase::AwaitingBody(..) | Phase::McpAwaitingBody(..)) {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        if matches!(self.phase, Phase::McpAwaitingBody(..)) {
            return self.mcp_body(env, size);
        }
        let Phase::AwaitingBody(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return Action::Continue;
        };
        let (pending, raw) = *held;
        let body = env.io.request_body(env.id, size);
        self.record.client_sent(&body);
        match self.reads.finish(env, pending, &body) {
            Err(error) => self.answer_error(env, &error),
            Ok(Started::Ready(call)) => self.admit(env, call, raw, Some((size, body))),
            Ok(Started::Lookup(r)) => self.look_up(env, r, Stalled::new(raw, Some((size, body)))),
            Ok(Started::Relay(relay)) => self.relay(env, &relay, &raw),
            Ok(_) => self.answer_error(env, &GatewayError::new(500, "api_error", "the request was not routed")),
        }
    }

    pub(super) fn request_trailers(&mut self, env: &mut Env) -> Action {
        let incomplete = matches!(&self.phase, Phase::AwaitingLookup(stalled) if !stalled.ended);
        if matches!(self.phase, Phase::AwaitingBody(..) | Phase::McpAwaitingBody(..)) || incomplete {
            return self.answer_error(env, &trailers_refused());
        }
        Action::Continue
    }

    /// A managed-batch request goes to the control plane through Envoy's router, as it came
    /// (its answer passes back untouched).
    fn relay(&mut self, env: &mut Env, relay: &pipeline::Relay, raw: &RawHeaders) -> Action {
        let Some(edits) = relay.edits(env.settings, raw) else {
            let error = GatewayError::new(500, "api_error", "managed batches need the control plane");
            return self.answer_error(env, &error);
        };
        env.io.set_request_headers(env.id, &edits.apply(raw));
        Action::Continue
    }

    /// Holds the request until control-plane entry `r` arrives.
    fn look_up(&mut self, env: &mut Env, r: Ref, stalled: Box<Stalled>) -> Action {
        match self.reads.read(env, r, &stalled.raw) {
            Ok(Read::Waiting) => {
                self.phase = Phase::AwaitingLookup(stalled);
                Action::Pause
            }
            Ok(Read::Known) => self.process(env, stalled.raw, stalled.body),
            Err(error) => self.answer_error(env, &error),
        }
    }

    /// Holds an MCP request until the OAuth issuer's JWKS at `uri` is fetched (one call serves
    /// every request waiting for it).
    fn fetch_jwks(&mut self, env: &mut Env, uri: String, stalled: Box<Stalled>) -> Action {
        let Some(oauth) = env.settings.mcp_oauth.as_ref().filter(|_| !self.jwks_fetched) else {
            return self.answer_error(env, &crate::mcp::jwks_unavailable(0));
        };
        self.jwks_fetched = true;
        let fetch = Fetch::Jwks(uri);
        let id = env.id;
        if !env.tasks.waiters.join(&fetch, || Waiter::request(id)) {
            let accept = vec![("accept".to_string(), "application/json".to_string())];
            let path = oauth.jwks.path_or_root();
            let call = Dispatch::request(env.settings, &oauth.jwks, "GET", path, Vec::new(), accept, JWKS_TIMEOUT_MS);
            if super::start_fetch(env, &call, fetch, |_| Waiter::request(id)).is_none() {
                return self.answer_error(env, &crate::mcp::jwks_unavailable(0));
            }
        }
        self.phase = Phase::AwaitingLookup(stalled);
        Action::Pause
    }

    /// The OAuth issuer's JWKS at `uri` answered: kept for every worker, and the held request
    /// processed again; a JWKS that could not be had fails the request (never fetched again for
    /// it: that could go on for ever).
    pub(super) fn jwks_arrived(&mut self, env: &mut Env, uri: &str, answer: &CallAnswer) {
        if !matches!(self.phase, Phase::AwaitingLookup(_)) {
            return;
        }
        let Phase::AwaitingLookup(stalled) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return;
        };
        let jwks = serde_json::from_slice::<serde_json::Value>(&answer.body).ok();
        let action = match jwks.filter(|jwks| answer.status == 200 && jwks.get("keys").is_some_and(|k| k.is_array())) {
            Some(_) => {
                let now_s = env.io.host().now_ms() / 1000;
                crate::guardrails::remember_jwks(env.io.host().store(), uri, &answer.body, now_s);
                let Stalled { raw, body, .. } = *stalled;
                self.process(env, raw, body)
            }
            None => {
                log::warn!("the OAuth issuer's JWKS at '{uri}' could not be fetched: it answered {}", answer.status);
                self.answer_error(env, &crate::mcp::jwks_unavailable(answer.status))
            }
        };
        if action == Action::Continue {
            env.after.push(After::ResumeRequest(env.id));
        }
    }

    /// The entry a held request waited for (or why there is none): it is processed again.
    pub(super) fn lookup_arrived(&mut self, env: &mut Env, r: &Ref, settled: &Result<Entry, GatewayError>) {
        if !matches!(self.phase, Phase::AwaitingLookup(_)) {
            return;
        }
        let Phase::AwaitingLookup(stalled) = std::mem::replace(&mut self.phase, Phase::Headers) else {
            return;
        };
        let action = match settled {
            Ok(entry) => {
                self.reads.arrived(r, entry);
                let Stalled { raw, body, .. } = *stalled;
                self.process(env, raw, body)
            }
            Err(error) => self.answer_error(env, error),
        };
        if action == Action::Continue {
            env.after.push(After::ResumeRequest(env.id));
        }
    }

    /// `/health`: ok, or with a control plane, ok only when the control plane answers ok too.
    fn health(&mut self, env: &mut Env) -> Action {
        let Some(cp) = &env.settings.control_plane else {
            return self.answer(env, 200, br#"{"status":"ok"}"#.to_vec());
        };
        match env.io.dispatch(env.id, &lookups::health_call(cp)) {
            Some(token) => {
                env.tasks.calls.insert(token, (env.id, Task::Health));
                self.phase = Phase::AwaitingHealth;
                Action::Pause
            }
            None => self.health_answered(env, 0),
        }
    }

    /// The control plane's health answered (status 0: it did not).
    pub(super) fn health_answered(&mut self, env: &mut Env, status: u16) -> Action {
        if !matches!(self.phase, Phase::AwaitingHealth | Phase::Headers) {
            return Action::Continue;
        }
        if status == 200 {
            return self.answer(env, 200, br#"{"status":"ok"}"#.to_vec());
        }
        let why = if status == 0 { "no answer".to_string() } else { format!("it answered {status}") };
        let error = GatewayError::new(503, "api_error", format!("the control plane is not healthy ({why})"))
            .with_code("control_plane_unavailable");
        self.answer_error(env, &error)
    }

    /// Runs the input checks of the top-level config (before the cache: a denied prompt is
    /// not answered from it either), then forwards; a request whose checks call out is held.
    fn admit(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        // Routed: from here on every answer, a denial or a cache hit too, counts for the
        // provider and model the request is meant for.
        self.note(&call, call.attempts.current);
        self.record.api_key_id = call.key_id().map(str::to_string);
        self.policy = env.tasks.policies.of(call.policy());
        match self.reserve(env, &call) {
            Allowance::Admitted => self.check(env, call, raw, body),
            Allowance::Waiting => {
                self.phase = Phase::AwaitingAllowance(Box::new(Held { call, raw, body }));
                Action::Pause
            }
            Allowance::Refused(error) => self.answer_error(env, &error),
        }
    }

    /// A request held for a limit's allowance: admitted (it goes on), refused, or still
    /// waiting.
    pub(super) fn allowed(&mut self, env: &mut Env, allowance: Allowance) {
        let held = matches!(self.phase, Phase::AwaitingAllowance(_) | Phase::McpAwaitingAllowance(_));
        if matches!(allowance, Allowance::Waiting) || !held {
            return;
        }
        let action = match (std::mem::replace(&mut self.phase, Phase::Headers), allowance) {
            (_, Allowance::Refused(error)) => self.answer_error(env, &error),
            (Phase::AwaitingAllowance(held), _) => {
                let Held { call, raw, body } = *held;
                self.check(env, call, raw, body)
            }
            (Phase::McpAwaitingAllowance(held), _) => self.mcp_admitted(env, *held),
            _ => Action::Continue,
        };
        if action == Action::Continue {
            env.after.push(After::ResumeRequest(env.id));
        }
    }

    /// Runs the input checks, then forwards.
    fn check(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        let mut guard = match Guard::new(&call, &raw) {
            Ok(Some(guard)) => guard,
            Ok(None) => return self.forward(env, call, raw, body),
            Err(error) => return self.answer_error(env, &error),
        };
        let progress = guard.start_before(env, guard::Seen::of(&call, &raw));
        self.guard = Some(Box::new(guard));
        match progress {
            Progress::Waiting => {
                self.phase = Phase::AwaitingChecks(Box::new(Held { call, raw, body }));
                Action::Pause
            }
            Progress::Done => self.checked(env, call, raw, body),
        }
    }

    /// The input checks decided: a denied request is answered 446, the others go on.
    fn checked(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        match &self.guard {
            Some(guard) if guard.outcome() == verdict::Outcome::Deny => {
                let body = guard.denied_body();
                self.answer(env, verdict::DENY_STATUS, body)
            }
            _ => self.forward(env, call, raw, body),
        }
    }

    /// A check's call answered: the held request goes on (or is denied), or the held answer
    /// is sent.
    pub(super) fn check_answered(&mut self, env: &mut Env, token: u32, answer: CallAnswer) {
        let Some(guard) = &mut self.guard else {
            return;
        };
        if guard.answer(env, token, answer.status, &answer.body) != Some(Progress::Done) {
            return;
        }
        if self.mcp_checks_decided(env) {
            return;
        }
        if matches!(self.phase, Phase::AwaitingChecks(_)) {
            let Phase::AwaitingChecks(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
                return;
            };
            let Held { call, raw, body } = *held;
            if self.checked(env, call, raw, body) == Action::Continue {
                env.after.push(After::ResumeRequest(env.id));
            }
            return;
        }
        let Some(guard) = &mut self.guard else {
            return;
        };
        if let Some(held) = guard.held.take() {
            let answer = guard.compose(env, held);
            self.reply(env, answer);
        }
    }

    /// Sends the current attempt of `call` through Envoy's router. `body` is the whole request
    /// body and its size in Envoy's buffer, when the gateway has it (or knows there is none);
    /// only then can a later attempt send the request again.
    fn forward(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        self.cache = match CacheState::look_up(call.cache_plan(), env.settings, env.io.host()) {
            Ok(cache) => cache,
            Err(hit) => return self.answer_hit(env, hit),
        };
        self.send_current(env, call, raw, body)
    }

    /// Sends the current attempt of `call` once its backend's access token is at hand.
    fn send_current(&mut self, env: &mut Env, call: Call, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        let token = match token_for(env, &call, call.attempts.current) {
            Ok(Token::Unneeded) => None,
            Ok(Token::Ready(token)) => Some(token),
            Ok(Token::Awaited) => {
                self.phase = Phase::AwaitingToken(Box::new(Held { call, raw, body }));
                return Action::Pause;
            }
            Err(error) => return self.unsendable(env, call, raw, body, &error),
        };
        self.send(env, call, raw, body, token.as_deref())
    }

    /// The current attempt cannot be sent (its request cannot be built for its target, or
    /// its token cannot be had): as a later attempt would, a fallback passes on to the next
    /// target that can take it; with none left, `error` is the answer.
    fn unsendable(
        &mut self,
        env: &mut Env,
        mut call: Call,
        raw: RawHeaders,
        body: Option<(usize, Vec<u8>)>,
        error: &GatewayError,
    ) -> Action {
        let skipped = call.attempts.current;
        match call.attempts.skip(env.io.host()) {
            Next::Call { index, .. } => {
                log::debug!("attempt {skipped} skipped: {}", error.message);
                self.record.model = call.facts(index).model;
                self.send_current(env, call, raw, body)
            }
            Next::GiveUp => self.answer_error(env, error),
        }
    }

    /// Sends the current attempt of `call` (with its backend's access token, when it needs one).
    fn send(
        &mut self,
        env: &mut Env,
        mut call: Call,
        raw: RawHeaders,
        body: Option<(usize, Vec<u8>)>,
        token: Option<&str>,
    ) -> Action {
        let host = env.io.host();
        let forward = match call.forward(env.settings, &raw, call.attempts.current, token, &|| host.now_ms()) {
            Ok(forward) => forward,
            Err(error) => return self.unsendable(env, call, raw, body, &error),
        };
        let awaits_embedding = self.ask_embedding(env);
        let resendable = body.is_some();
        let (size, original) = body.unwrap_or_default();
        if let Some(new_body) = &forward.body {
            env.io.set_request_body(env.id, size, new_body);
        }
        env.io.set_request_headers(env.id, &forward.headers.apply(&raw));
        self.record.provider = forward.response.provider.name;
        call.attempts.sending();
        self.record.target = call.target_path().to_string();
        let retained = (resendable && call.attempts.plan.can_recover()).then_some((raw, original));
        let routed = Routed { call, plan: forward.response, retained, head: Default::default() };
        self.phase = Phase::Forwarded(Box::new(routed));
        // A semantic lookup holds the request until its embedding arrives.
        if awaits_embedding {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    /// The access token a held request or a recovery attempt waited for (or why there is none).
    pub(super) fn token_arrived(&mut self, env: &mut Env, fetched: &Result<String, GatewayError>) {
        if matches!(self.phase, Phase::AwaitingToken(_)) {
            let Phase::AwaitingToken(held) = std::mem::replace(&mut self.phase, Phase::Headers) else {
                return;
            };
            let Held { call, raw, body } = *held;
            let action = match fetched {
                Ok(token) => self.send(env, call, raw, body, Some(token)),
                Err(error) => self.unsendable(env, call, raw, body, error),
            };
            if action == Action::Continue {
                env.after.push(After::ResumeRequest(env.id));
            }
            return;
        }
        self.attempt_token_arrived(env, fetched);
    }

    /// Semantic mode: starts the embeddings call; true when the request waits for it.
    fn ask_embedding(&mut self, env: &mut Env) -> bool {
        let Some(call) = self.cache.embeddings_call(env.settings) else {
            return false;
        };
        match env.io.dispatch(env.id, &call) {
            Some(token) => {
                env.tasks.calls.insert(token, (env.id, Task::Embedding));
                true
            }
            None => {
                log::warn!("the embeddings call could not start");
                self.cache.semantic_unavailable();
                false
            }
        }
    }

    pub(super) fn embedding_arrived(&mut self, env: &mut Env, answer: CallAnswer) {
        let vector = if (200..300).contains(&answer.status) { semantic::embedding_of(&answer.body) } else { None };
        if vector.is_none() {
            log::warn!("semantic cache lookup skipped: the embeddings call answered {}", answer.status);
        }
        match self.cache.embedding_arrived(vector, env.settings, env.io.host()) {
            Some(hit) => {
                self.answer_hit(env, hit);
            }
            None => env.after.push(After::ResumeRequest(env.id)),
        }
    }

    /// Answers from the cache.
    fn answer_hit(&mut self, env: &mut Env, hit: Hit) -> Action {
        self.record.status = 200;
        self.record.provider = crate::providers::find(&hit.provider).map_or("", |spec| spec.name);
        self.cache = CacheState::Served(hit.status);
        if let Some(limited) = &mut self.limits {
            limited.from_cache = true;
        }
        self.first_byte(env);
        // No attempt answered: the gateway headers name no target and no retries.
        self.phase = Phase::Answered;
        let answer = Answer { status: 200, content_type: hit.content_type, body: hit.body };
        // A cached answer passes the output checks too.
        let answer = match self.guard.is_some() {
            true => self.checked_answer(env, answer),
            false => Some(answer),
        };
        if let Some(answer) = answer {
            self.reply(env, answer);
        }
        Action::Pause
    }
}

/// Whether attempt `index` of `call` needs an access token: cached, or fetched now (one
/// fetch per credential serves every request waiting for it).
pub(super) fn token_for(env: &mut Env, call: &Call, index: usize) -> Result<Token, GatewayError> {
    let Some(backend) = call.token_source(index) else {
        return Ok(Token::Unneeded);
    };
    let Some(source) = backend.token_source() else {
        return Ok(Token::Unneeded);
    };
    let key = source.cache_key();
    let host = env.io.host();
    if let Some(token) = tokens::cached(host.store(), key, host.now_ms()) {
        return Ok(Token::Ready(token));
    }
    let fetch = Fetch::Token(key.to_string());
    if env.tasks.waiters.join(&fetch, || Waiter::request(env.id)) {
        return Ok(Token::Awaited);
    }
    let request = source.request(host.now_ms())?;
    let dispatch = tokens::call(env.settings, &request)?;
    let id = env.id;
    if super::start_fetch(env, &dispatch, fetch, |_| Waiter::request(id)).is_none() {
        return Err(GatewayError::new(502, "api_error", "the token endpoint could not be called")
            .with_code("token_exchange_failed"));
    }
    Ok(Token::Awaited)
}
