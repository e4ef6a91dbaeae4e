//! Guardrails and hooks in the exchange: the top-level config's checks run on the request
//! before it is sent (and before the cache), and on the answer before it reaches the client.
//! Checks that call out (webhooks, JWKS fetches) are tasks like any dispatched call; the
//! request or the answer is held until every one answered or timed out.

use super::record::HookStage;
use super::waiters::{Fetch, Waiter};
use super::worker::Task;
use super::{Dispatch, Env, RawHeaders};
use crate::cache::completion::{self, StreamAssembler};
use crate::client_api;
use crate::config::Config;
use crate::errors::GatewayError;
use crate::guardrails::calls::{CallSpec, Continuation, Reply};
use crate::guardrails::inject::{BeforeDone, Edit, ObjectSplice};
use crate::guardrails::verdict::{self, Item, ItemResult, Outcome, Slot, StageRun, Started};
use crate::guardrails::{arguments_text, cached_jwks, remember_jwks, request_text, response_text};
use crate::guardrails::{Env as CheckEnv, Input, Stage};
use crate::pipeline::{Call, ToolChecks};
use crate::request::endpoint::{ClientApi, Endpoint};
use crate::routing::not_implemented;
use hashbrown::HashMap;
use serde_json::{Map, Value};

/// A flowing stream is assembled for the output checks up to this size (a held one whole).
const MAX_ASSEMBLED_BYTES: usize = 4 << 20;

/// An answer on its way to the client.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) content_type: String,
    pub(super) body: Vec<u8>,
}

impl Answer {
    fn is_stream(&self) -> bool {
        crate::stream::is_stream(self.content_type.as_bytes())
    }
}

/// Whether a stage is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Progress {
    Done,
    Waiting,
}

/// A check waiting for its call.
struct Waiting {
    slot: Slot,
    then: Continuation,
    started_ms: u64,
}

struct Running {
    stage: Stage,
    run: StageRun,
    calls: HashMap<u32, Waiting>,
}

/// What the checks see of the request besides its text.
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    request: &'a Value,
    metadata: Option<&'a Map<String, Value>>,
    headers: &'a RawHeaders,
}

/// The request's view when the call no longer holds its body.
static NO_REQUEST: Value = Value::Null;

impl<'a> Seen<'a> {
    /// The request of `call`, borrowed while the call still holds its body.
    pub(super) fn of(call: &'a Call, raw: &'a RawHeaders) -> Seen<'a> {
        Seen { request: call.request_json().unwrap_or(&NO_REQUEST), metadata: call.metadata(), headers: raw }
    }
}

/// A copy of what the output checks see of the request, kept only when some will run (the
/// call lets the body go once it is sent).
#[derive(Default)]
struct Kept {
    request: Value,
    metadata: Option<Map<String, Value>>,
    headers: RawHeaders,
}

impl Kept {
    fn of(seen: Seen) -> Kept {
        Kept { request: seen.request.clone(), metadata: seen.metadata.cloned(), headers: seen.headers.to_vec() }
    }

    fn seen(&self) -> Seen<'_> {
        Seen { request: &self.request, metadata: self.metadata.as_ref(), headers: &self.headers }
    }
}

/// The checks of one request and what they decided so far.
pub(super) struct Guard {
    kept: Kept,
    /// The model asked for; a tool call's full name (`{server}__{tool}`).
    model: String,
    endpoint: Endpoint,
    /// The checks of a tool call (docs/mcp.md): the request's text is its arguments' strings,
    /// the answer's its result's text parts.
    tool_call: bool,
    before_items: Vec<Item>,
    after_items: Vec<Item>,
    async_items: Vec<Item>,
    before: Vec<ItemResult>,
    after: Vec<ItemResult>,
    async_results: Vec<ItemResult>,
    running: Option<Running>,
    /// The answer held while the output checks wait for their calls.
    pub(super) held: Option<Answer>,
    /// A stream that flows while it is assembled for the output checks (no item denies).
    watch: Option<StreamAssembler>,
    /// The flowing stream's `id`, `created` and `model`, once assembled.
    stream_header: Map<String, Value>,
    /// The client asked for the usage of a stream (`stream_options.include_usage`): the
    /// verdicts go to a last event too.
    include_usage: bool,
    /// `hook_results` on its way into a JSON answer that flows.
    splice: Option<ObjectSplice>,
    /// The verdicts' event on its way into a flowing stream, before `data: [DONE]`.
    before_done: Option<BeforeDone>,
}

impl Guard {
    /// The checks of `call`'s top-level config; None when it has none.
    pub(super) fn new(call: &Call, raw: &RawHeaders) -> Result<Option<Guard>, GatewayError> {
        let Some(config) = call.root_config() else {
            return Ok(None);
        };
        let Some(mut guard) = Guard::of(config, &|reference| call.stored_guardrail(reference).cloned())? else {
            return Ok(None);
        };
        let seen = Seen::of(call, raw);
        if !(guard.after_items.is_empty() && guard.async_items.is_empty()) {
            guard.kept = Kept::of(seen);
        }
        let request = seen.request;
        guard.model = request.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
        guard.include_usage = request.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
        guard.endpoint = call.endpoint();
        Ok(Some(guard))
    }

    /// The checks of an MCP request's config, run on its tool call if it is one (see
    /// `start_tool_call`); None when the config has none.
    pub(super) fn for_tool_calls(checks: &ToolChecks) -> Result<Option<Guard>, GatewayError> {
        let guard = Guard::of(&checks.config, &|reference| checks.stored_guardrail(reference).cloned())?;
        Ok(guard.map(|guard| Guard { tool_call: true, ..guard }))
    }

    /// The items of `config`'s hooks and guardrails (`stored`: the stored ones it refers to);
    /// None when it has none.
    fn of(config: &Config, stored: &dyn Fn(&str) -> Option<Item>) -> Result<Option<Guard>, GatewayError> {
        let refused = |_| not_implemented("a stored guardrail (it needs the control plane)");
        let before_items =
            verdict::items(&config.before_request_hooks, &config.input_guardrails, Stage::Before, stored)
                .map_err(refused)?;
        let after = verdict::items(&config.after_request_hooks, &config.output_guardrails, Stage::After, stored)
            .map_err(refused)?;
        if before_items.is_empty() && after.is_empty() {
            return Ok(None);
        }
        let (async_items, after_items): (Vec<Item>, Vec<Item>) = after.into_iter().partition(|item| item.is_async);
        Ok(Some(Guard {
            kept: Kept::default(),
            model: String::new(),
            endpoint: Endpoint::ChatCompletions,
            tool_call: false,
            before_items,
            after_items,
            async_items,
            before: Vec::new(),
            after: Vec::new(),
            async_results: Vec::new(),
            running: None,
            held: None,
            watch: None,
            stream_header: Map::new(),
            include_usage: false,
            splice: None,
            before_done: None,
        }))
    }

    /// Runs the input checks on the request `seen` (borrowed from the call, which holds it).
    pub(super) fn start_before(&mut self, env: &mut Env, seen: Seen) -> Progress {
        let items = std::mem::take(&mut self.before_items);
        self.start(env, Stage::Before, items, None, Some(seen))
    }

    /// The tool call the checks see (`params`: its JSON-RPC params; `tool`: its full name).
    pub(super) fn keep_tool_call(&mut self, params: Value, raw: &RawHeaders, tool: String) {
        self.kept = Kept { request: params, metadata: None, headers: raw.to_vec() };
        self.model = tool;
    }

    /// Runs the input checks on the kept tool call.
    pub(super) fn start_tool_call(&mut self, env: &mut Env) -> Progress {
        let items = std::mem::take(&mut self.before_items);
        self.start(env, Stage::Before, items, None, None)
    }

    /// Whether output checks read a tool call's result (its answer is then held whole).
    pub(super) fn checks_results(&self) -> bool {
        !(self.after_items.is_empty() && self.async_items.is_empty())
    }

    /// Runs the output checks on a tool call's `result` (async ones at once: they never change
    /// the answer).
    pub(super) fn start_result(&mut self, env: &mut Env, result: &Value) -> Progress {
        self.run_async(env, result);
        let items = std::mem::take(&mut self.after_items);
        self.start(env, Stage::After, items, Some(result), None)
    }

    /// Every item's result so far, as `hook_results`.
    pub(super) fn hook_results(&self) -> Vec<u8> {
        verdict::hook_results(&self.before, &self.after)
    }

    /// Whether the answer changes with the checks: some check ran before, or will after.
    pub(super) fn shapes_answer(&self) -> bool {
        !self.before.is_empty() || !self.after_items.is_empty() || !self.async_items.is_empty()
    }

    /// Whether every verdict is known before the answer starts: only input checks ran (none
    /// runs after the answer, not even async ones, which need the whole answer).
    pub(super) fn decided_before_answer(&self) -> bool {
        !self.before.is_empty() && self.after_items.is_empty() && self.async_items.is_empty()
    }

    /// The JSON answer flows with `hook_results` spliced in (see `decided_before_answer`); how
    /// many bytes it grows by.
    pub(super) fn splice_answer(&mut self) -> usize {
        let splice = ObjectSplice::new(&verdict::hook_results(&self.before, &[]));
        let added = splice.added_len();
        self.splice = Some(splice);
        added
    }

    /// Whether an output check may deny, so a stream must be held until it is decided.
    /// A stream is held whole when an output check may deny it, or when it is in a client API
    /// besides chat (whose streams are checked whole: no assembler follows them as they flow).
    pub(super) fn holds_streams(&self) -> bool {
        let client_api = self.endpoint.client_api() != ClientApi::Chat;
        self.after_items.iter().any(|item| item.deny)
            || (client_api && !(self.after_items.is_empty() && self.async_items.is_empty()))
    }

    pub(super) fn outcome(&self) -> Outcome {
        verdict::outcome(&self.before).max(verdict::outcome(&self.after))
    }

    pub(super) fn denied_body(&self) -> Vec<u8> {
        verdict::denied_body(&self.hook_results())
    }

    /// Runs the output checks on `answer` (a 2xx), kept in `held` until they decided.
    pub(super) fn start_after(&mut self, env: &mut Env, answer: Answer) -> Progress {
        let json = self.answer_json(&answer);
        let items = std::mem::take(&mut self.after_items);
        let progress = self.start(env, Stage::After, items, Some(&json), None);
        self.held = Some(answer);
        if progress == Progress::Done {
            self.run_async(env, &json);
        }
        progress
    }

    /// The answer the client gets once every check decided.
    pub(super) fn compose(&mut self, env: &mut Env, answer: Answer) -> Answer {
        if self.held.is_none() && self.running.is_none() && !self.async_items.is_empty() {
            let json = self.answer_json(&answer);
            self.run_async(env, &json);
        }
        let results = verdict::hook_results(&self.before, &self.after);
        match self.outcome() {
            Outcome::Deny => Answer {
                status: verdict::DENY_STATUS,
                content_type: "application/json".into(),
                body: verdict::denied_body(&results),
            },
            outcome => {
                let status = if outcome == Outcome::Flag { verdict::FLAG_STATUS } else { answer.status };
                let body = if answer.is_stream() {
                    answer.body
                } else {
                    verdict::with_hook_results(&answer.body, &results).unwrap_or(answer.body)
                };
                Answer { status, content_type: answer.content_type, body }
            }
        }
    }

    /// A flowing stream is assembled for the output checks, whose verdicts go to the record,
    /// and to a last event when the client asked for the usage.
    pub(super) fn watch_stream(&mut self) {
        let event = self.include_usage && (!self.before.is_empty() || !self.after_items.is_empty());
        if event {
            self.before_done = Some(BeforeDone::default());
        }
        if event || !self.after_items.is_empty() || !self.async_items.is_empty() {
            self.watch = Some(StreamAssembler::new(self.endpoint, MAX_ASSEMBLED_BYTES));
        }
    }

    /// Whether the guard reads (and may edit) the chunks of an answer that flows.
    pub(super) fn follows_answer(&self) -> bool {
        self.watch.is_some() || self.splice.is_some() || self.before_done.is_some()
    }

    /// The client's bytes of an answer that flows, and what to change in them: `hook_results`
    /// spliced into a JSON answer, or the verdicts' event put before a stream's `[DONE]`. The
    /// output checks run once the stream is complete (their calls are sent, the stream does
    /// not wait for them).
    pub(super) fn watched(&mut self, env: &mut Env, bytes: &[u8], end: bool) -> Option<Edit> {
        if let Some(splice) = &mut self.splice {
            return splice.push(bytes, end);
        }
        if let Some(watch) = &mut self.watch {
            watch.push(bytes);
        }
        let Some(mut before_done) = self.before_done.take() else {
            if end {
                self.check_stream(env);
            }
            return None;
        };
        let edit = before_done.push(bytes, end, &mut || {
            self.check_stream(env);
            self.stream_event()
        });
        self.before_done = Some(before_done);
        edit
    }

    /// The output checks on the assembled stream (once).
    fn check_stream(&mut self, env: &mut Env) {
        let Some(watch) = self.watch.take() else {
            return;
        };
        self.stream_header = watch.header().clone();
        let json = watch.finish().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).unwrap_or(Value::Null);
        let items = std::mem::take(&mut self.after_items);
        self.start(env, Stage::After, items, Some(&json), None);
        self.run_async(env, &json);
    }

    /// The stream's last event before `[DONE]`: a chunk without choices that carries the
    /// verdicts decided so far (output checks still waiting for a call are not in it).
    fn stream_event(&self) -> Vec<u8> {
        let object = completion::object_names(self.endpoint).map_or("chat.completion.chunk", |(_, chunk)| chunk);
        let field = |name: &str| self.stream_header.get(name).cloned();
        let mut event = Map::new();
        event.extend(field("id").map(|id| ("id".to_string(), id)));
        event.insert("object".into(), object.into());
        event.extend(field("created").map(|created| ("created".to_string(), created)));
        event.insert("model".into(), field("model").unwrap_or_else(|| self.model.clone().into()));
        event.insert("choices".into(), Value::Array(Vec::new()));
        let event = Value::Object(event).to_string().into_bytes();
        let results = verdict::hook_results(&self.before, &self.after);
        verdict::with_hook_results(&event, &results).unwrap_or(event)
    }

    fn answer_json(&self, answer: &Answer) -> Value {
        let api = self.endpoint.client_api();
        if answer.is_stream() && api != ClientApi::Chat {
            return client_api::stream_answer(api, &answer.body).unwrap_or(Value::Null);
        }
        let bytes = if answer.is_stream() {
            // The stream is held whole already: it is read whole (a bound below its size would
            // hand the checks nothing, and a denying check would pass it).
            let bound = answer.body.len().saturating_add(MAX_ASSEMBLED_BYTES);
            let mut assembler = StreamAssembler::new(self.endpoint, bound);
            assembler.push(&answer.body);
            assembler.finish().unwrap_or_default()
        } else {
            answer.body.clone()
        };
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    }

    /// Async items: their checks run now, their calls go out unawaited; never the answer's.
    fn run_async(&mut self, env: &mut Env, json: &Value) {
        let items = std::mem::take(&mut self.async_items);
        if items.is_empty() {
            return;
        }
        let started = self.evaluate(env, Stage::After, items, Some(json), None);
        for call in started.sends.iter().chain(started.pending.iter().map(|p| &p.call)) {
            send(env, call);
        }
        // Checks that waited for a call show as failed ("no answer") in the record.
        self.async_results = started.run.finish();
    }

    /// Evaluates `items` on the request `seen` (None: the kept copy) and, after, the `response`.
    fn evaluate(
        &self,
        env: &mut Env,
        stage: Stage,
        items: Vec<Item>,
        response: Option<&Value>,
        seen: Option<Seen>,
    ) -> Started {
        let seen = seen.unwrap_or_else(|| self.kept.seen());
        let text = match response {
            // A tool's result has the `content` parts a Messages answer has.
            Some(answer) => response_text(answer),
            None if self.tool_call => arguments_text(seen.request),
            None => request_text(seen.request),
        };
        let input = Input {
            stage,
            text: &text,
            request: seen.request,
            response,
            metadata: seen.metadata,
            headers: seen.headers,
            model: &self.model,
        };
        let host = env.io.host();
        let host: &dyn crate::ports::Host = host;
        let store = host.store();
        let jwks = |uri: &str| cached_jwks(store, uri);
        let now_ms = host.now_ms();
        let check_env = CheckEnv { now_s: now_ms / 1000, jwks: &jwks };
        StageRun::start(items, &input, &check_env, now_ms, &|| host.now_ms())
    }

    fn start(
        &mut self,
        env: &mut Env,
        stage: Stage,
        items: Vec<Item>,
        response: Option<&Value>,
        seen: Option<Seen>,
    ) -> Progress {
        let Started { mut run, pending, sends } = self.evaluate(env, stage, items, response, seen);
        for call in &sends {
            send(env, call);
        }
        let mut calls = HashMap::new();
        // The clock is read only for checks that wait for a call.
        let now_ms = if pending.is_empty() { 0 } else { env.io.host().now_ms() };
        for pending in pending {
            let jwks = match &pending.then {
                Continuation::Jwks { uri, .. } => Some(Fetch::Jwks(uri.clone())),
                Continuation::Webhook { .. } => None,
            };
            // One JWKS fetch serves every check waiting for it.
            if let Some(alias) = jwks.as_ref().and_then(|fetch| env.tasks.join_as_check(env.id, fetch)) {
                calls.insert(alias, Waiting { slot: pending.slot, then: pending.then, started_ms: now_ms });
                continue;
            }
            let id = env.id;
            let token = match jwks {
                Some(fetch) => request_of(env, &pending.call).and_then(|call| {
                    let token = super::start_fetch(env, &call, fetch, |token| Waiter { id, token });
                    started_or_logged(&pending.call, token)
                }),
                None => dispatch(env, &pending.call).inspect(|token| {
                    env.tasks.calls.insert(*token, (id, Task::Check));
                }),
            };
            match token {
                Some(token) => {
                    calls.insert(token, Waiting { slot: pending.slot, then: pending.then, started_ms: now_ms });
                }
                None => {
                    let failed = Reply { status: 0, body: &[] };
                    run.answer(pending.slot, pending.then, failed, now_ms / 1000, 0);
                }
            }
        }
        if run.is_done() {
            self.finished(stage, run);
            Progress::Done
        } else {
            self.running = Some(Running { stage, run, calls });
            Progress::Waiting
        }
    }

    /// A check's call answered (status 0: failed or timed out); Done when its stage is decided.
    pub(super) fn answer(&mut self, env: &mut Env, token: u32, status: u16, body: &[u8]) -> Option<Progress> {
        let running = self.running.as_mut()?;
        let waiting = running.calls.remove(&token)?;
        let now_ms = env.io.host().now_ms();
        let elapsed = now_ms.saturating_sub(waiting.started_ms);
        let update = running.run.answer(waiting.slot, waiting.then, Reply { status, body }, now_ms / 1000, elapsed);
        if let Some(update) = update {
            remember_jwks(env.io.host().store(), &update.uri, &update.json, now_ms / 1000);
        }
        if !running.run.is_done() {
            return Some(Progress::Waiting);
        }
        let Running { stage, run, .. } = self.running.take()?;
        self.finished(stage, run);
        Some(Progress::Done)
    }

    fn finished(&mut self, stage: Stage, run: StageRun) {
        match stage {
            Stage::Before => self.before = run.finish(),
            Stage::After => self.after = run.finish(),
        }
    }

    /// Each item's result with its stage, for the request record.
    pub(super) fn into_results(self) -> Vec<(HookStage, ItemResult)> {
        let stages =
            [(HookStage::Before, self.before), (HookStage::After, self.after), (HookStage::Async, self.async_results)];
        stages.into_iter().flat_map(|(stage, results)| results.into_iter().map(move |result| (stage, result))).collect()
    }
}

fn dispatch(env: &mut Env, call: &CallSpec) -> Option<u32> {
    let request = request_of(env, call)?;
    let token = env.io.dispatch(env.id, &request);
    started_or_logged(call, token)
}

/// The call a check makes, unless its host is not in the allow-list.
fn request_of(env: &Env, call: &CallSpec) -> Option<Dispatch> {
    if !env.settings.custom_host_allowed(&call.upstream.host) {
        log::warn!("a check's call to '{}' is refused: the host is not in the allow-list", call.upstream.host);
        return None;
    }
    Some(Dispatch::request(
        env.settings,
        &call.upstream,
        call.method,
        &call.path,
        call.body.clone(),
        call.headers.clone(),
        call.timeout_ms,
    ))
}

/// `token` of `call`, logged when there is none (the call could not start).
fn started_or_logged(call: &CallSpec, token: Option<u32>) -> Option<u32> {
    if token.is_none() {
        log::warn!("a check's call to '{}' could not start", call.upstream.host);
    }
    token
}

/// Sends a call whose answer nobody awaits.
fn send(env: &mut Env, call: &CallSpec) {
    dispatch(env, call);
}
