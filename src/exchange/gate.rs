//! The lookup gate (settings `lookup_gate`): an instance of the filter before the main one
//! that only reads the control-plane entries a request needs (its key, saved config, stored
//! providers), holding the request meanwhile, then lets it pass to the main instance, which
//! finds the entries fresh. It never changes, routes or records a request; it answers only
//! when an entry cannot be had at all, as the main instance would.

use super::lookups::{Read, Reads, Stalled};
use super::{json_headers, After, Env, RawHeaders};
use super::{Action, GatewayError};
use crate::catalog::{Entry, Ref};
use crate::pipeline::{Started, TRACE_HEADER};
use crate::ports::Host;
use crate::settings::Settings;
use std::rc::Rc;

/// One request at the gate, while it waits for an entry.
pub(super) struct Gate {
    pub(super) settings: Rc<Settings>,
    /// The trace id the gateway's answers carry (the client's, else a new one).
    trace_id: String,
    reads: Reads,
    /// The request while it waits for an entry.
    held: Option<Box<Stalled>>,
}

impl Gate {
    pub(super) fn new(settings: Rc<Settings>, raw: &RawHeaders, host: &mut dyn Host) -> Gate {
        let trace_id = super::trace_id(&crate::request::headers::trace_fields(raw), host);
        Gate { settings, trace_id, reads: Reads::default(), held: None }
    }

    /// Whether the gate still holds the request (else it is the main instance's).
    pub(super) fn holds(&self) -> bool {
        self.held.is_some()
    }

    pub(super) fn request_headers(&mut self, env: &mut Env, raw: RawHeaders, end_of_stream: bool) -> Action {
        self.process(env, raw, end_of_stream.then(|| (0, Vec::new())))
    }

    /// Reads the first entry the request needs that is not known yet; none: it passes.
    fn process(&mut self, env: &mut Env, raw: RawHeaders, body: Option<(usize, Vec<u8>)>) -> Action {
        let (started, _) = self.reads.start(env, &raw, body.as_ref().map(|(_, bytes)| bytes.as_slice()));
        let Ok(Started::Lookup(r)) = started else {
            // The main instance does the rest, errors included.
            return Action::Continue;
        };
        let stalled = Stalled::new(raw, body);
        match self.reads.read(env, r, &stalled.raw) {
            Ok(Read::Waiting) => {
                self.held = Some(stalled);
                Action::Pause
            }
            Ok(Read::Known) => self.process(env, stalled.raw, stalled.body),
            Err(error) => self.answer_error(env, &error),
        }
    }

    pub(super) fn request_body(&mut self, env: &mut Env, size: usize, end_of_stream: bool) -> Action {
        let Some(stalled) = &mut self.held else {
            return Action::Continue;
        };
        if end_of_stream {
            stalled.body_ended(env, size);
        }
        Action::Pause
    }

    /// Envoy withholds the body of the held request (see [`super::worker::BODY_WAIT_MS`]).
    pub(super) fn body_withheld(&mut self, env: &mut Env) -> Action {
        if self.held.as_ref().is_none_or(|stalled| stalled.ended) {
            return Action::Continue;
        }
        self.answer_error(env, &super::body_withheld_error())
    }

    pub(super) fn request_trailers(&mut self, env: &mut Env) -> Action {
        // A held request must never go on unchecked (see the exchange's).
        if self.held.as_ref().is_some_and(|stalled| !stalled.ended) {
            return self.answer_error(env, &super::trailers_refused());
        }
        Action::Continue
    }

    /// Envoy answered while the request waited: it is over (the entry finds nothing to let
    /// go), and Envoy's answer carries the trace id.
    pub(super) fn response_headers(&mut self, env: &mut Env) -> Action {
        self.held = None;
        env.io.set_response_header(env.id, TRACE_HEADER, Some(&self.trace_id));
        Action::Continue
    }

    /// The entry the request waited for (or why there is none): it is processed again, and
    /// lets go unless it waits for another entry.
    pub(super) fn lookup_arrived(&mut self, env: &mut Env, r: &Ref, settled: &Result<Entry, GatewayError>) -> Action {
        let Some(stalled) = self.held.take() else {
            return Action::Continue;
        };
        let action = match settled {
            Ok(entry) => {
                self.reads.arrived(r, entry);
                let Stalled { raw, body, .. } = *stalled;
                self.process(env, raw, body)
            }
            // The main instance reads it again and answers.
            Err(_) => Action::Continue,
        };
        if action == Action::Continue {
            env.after.push(After::ResumeRequest(env.id));
        }
        Action::Continue
    }

    fn answer_error(&mut self, env: &mut Env, error: &GatewayError) -> Action {
        self.held = None;
        let mut headers = json_headers();
        headers.push((TRACE_HEADER.to_string(), self.trace_id.clone()));
        headers.extend(super::allow_header(error));
        env.after.push(After::Reply { id: env.id, status: error.status, headers, body: error.to_json() });
        Action::Pause
    }
}
