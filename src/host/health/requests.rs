//! The request handler: routes each request of the health listener, answers
//! checks and commands, holds `wait=closed` answers; and the HTTP stream.

use super::{lb_unavailable, send, state_unavailable, Health, Waiter};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::net::IpAddr;
use std::rc::Rc;

use crate::api::{self, Audience, Endpoint, Reply};
use crate::gate::answer;
use crate::gate::fsm::host::{self as store, TransitionError::Shared};
use crate::gate::fsm::{self, Record, State};
use crate::host::wasm_host::{Envoy, Host};
use crate::host::{logs, metrics::Id};

/// What an endpoint answers: the status of a record, with how a held wait
/// ended (`None`: held), or the error it met.
type Answer = Result<Option<(Record, Option<api::WaitEnd>)>, store::TransitionError>;

impl<H: Host> Health<H> {
    /// Remembers what an LB check was served (only sources in
    /// `lb_checkers`). The 404 that completes what a gated soft drain waits
    /// for flips it at once if nothing is in flight.
    fn lb_observed(&self, state: State, served: u16, ip: IpAddr) {
        if !self.config.is_checker(ip) {
            self.ignored_check(ip, served);
            return;
        }
        self.store
            .lb_change(&mut |c, now| c.observe(&ip.to_string(), served, now, self.config.lb_fall))
            .map_or_else(lb_unavailable, drop);
        if state == State::Draining && served == 404 {
            if let Err(e) = self.apply_due(self.active.read().for_decisions()) {
                state_unavailable(e);
            }
        }
    }

    /// A check from outside `lb_checkers`: answered, not recorded — counted,
    /// and logged once per new source, so that an LB whose checks arrive from
    /// another address (SNAT, a wrong CIDR) is seen, not silently ignored.
    fn ignored_check(&self, ip: IpAddr, served: u16) {
        self.metrics.add(Id::LbChecksIgnored, 1);
        if served == 200 && !self.announced.get() {
            match self.store.lb_change(&mut |c, now| c.announce(now)) {
                Ok(_) => self.announced.set(true),
                Err(e) => lb_unavailable(e),
            }
        }
        let source = ip.to_string();
        match self.store.lb_change(&mut |c, now| c.ignore(&source, now)) {
            Ok(true) => logs::warning!(
                "event=lb_check_ignored source={} what=\"a /health_check.html from outside \
                 lb_checkers: answered, not recorded; if it is the LB, a soft drain's gate and \
                 lb_observed_down never see it\"",
                ip
            ),
            Ok(false) => {}
            Err(e) => lb_unavailable(e),
        }
    }

    /// The answer to one request, or `None` when it is held. Every endpoint
    /// but the checks starts from the current record (503 when it cannot be
    /// read) and answers with the status (`Answer`) or the error it met.
    pub(super) fn handle(&self, req: &api::Request, context_id: u32) -> Option<Reply> {
        let endpoint = match api::route(req, &self.config) {
            Ok(Endpoint::Check(audience)) => return Some(self.check(audience, req)),
            Ok(endpoint) => endpoint,
            Err(reply) => return Some(reply),
        };
        let answer = match (self.store.load(), endpoint) {
            (Err(e), _) => Err(Shared(e)),
            (Ok(rec), Endpoint::DrainAndWait { timeout_ms }) => {
                self.drain_and_wait(rec, timeout_ms, context_id)
            }
            (Ok(_), Endpoint::Transition(cmd)) => self.command(cmd).map(|next| Some((next, None))),
            (Ok(rec), _) => Ok(Some((rec, None))),
        };
        Some(match answer.transpose()? {
            Ok((rec, end)) => self.status(&rec, end),
            Err(store::TransitionError::Illegal(e)) => api::illegal(e),
            Err(Shared(e)) => {
                state_unavailable(e);
                api::unavailable()
            }
        })
    }

    /// A health check, answered (`crate::gate::answer`) from the state gauge (one
    /// host call, no record to parse) when that gauge is live, else from the
    /// record. The gauge is written right after each transition by the worker
    /// whose write won, and repaired every tick (`Metrics::sync_state`); a
    /// record the tick could not read fails the checks closed from then on.
    fn check(&self, audience: Audience, req: &api::Request) -> Reply {
        let gauge = self.metrics.state_hint().filter(|_| !self.unreadable.get());
        let state =
            gauge.or_else(|| Some(self.store.load().map_err(state_unavailable).ok()?.state));
        let answer = answer::answer(&answer::Inputs {
            audience,
            state,
            traffic_seen: self.watch.seen(),
            placeholders: self.placeholders.get(),
            draining_lb_status: self.config.draining_lb_status,
            if_none_match: req.if_none_match,
        });
        // A check whose source the host could not tell is answered, not remembered.
        if let (Some(state), Some(served), Some(ip)) = (state, answer.lb_served, req.source) {
            self.lb_observed(state, served, ip);
        }
        answer.reply
    }

    /// Starts or joins a drain and holds the answer until it ends; a held
    /// answer is a preStop hold (`fsm::renew_hold`), and a maintenance drain
    /// it joins turns automatic (`fsm::resume`).
    fn drain_and_wait(&self, rec: Record, timeout_ms: u64, context_id: u32) -> Answer {
        if rec.state == State::Fault {
            return Ok(Some((rec, Some(api::WaitEnd::InFault))));
        }
        let rec = match (rec.state == State::Open).then(|| self.command(api::Command::Drain)) {
            Some(Ok(next)) => next,
            Some(Err(e @ Shared(_))) => return Err(e),
            // Not OPEN, or someone else started it first: join.
            _ => Rc::unwrap_or_clone(self.store.update(&fsm::resume).map_err(Shared)?),
        };
        if let Some(end) = self.wait_end(&rec, self.host().now(), false) {
            return Ok(Some((rec, Some(end))));
        }
        self.waiters.borrow_mut().push(Waiter {
            context_id,
            since: self.host().now(),
            timeout_ms,
        });
        self.renew_hold();
        Ok(None)
    }
}

pub struct HealthStream<H: Host = Envoy> {
    pub context_id: u32,
    pub health: Rc<Health<H>>,
}

impl<H: Host> Context for HealthStream<H> {}

impl<H: Host> HttpContext for HealthStream<H> {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let host = self.health.host();
        let method = host.request_header(":method").unwrap_or_default();
        let path = host.request_header(":path").unwrap_or_default();
        let if_none_match = host.request_header("if-none-match");
        let authorization = host.request_header("authorization");
        let req = api::Request {
            method: &method,
            path: &path,
            if_none_match: if_none_match.as_deref(),
            authorization: authorization.as_deref(),
            // The downstream peer address (`source.address` is "ip:port").
            source: host
                .property("source\0address")
                .and_then(|a| crate::net::peer_ip(&a)),
        };
        if let Some(reply) = self.health.handle(&req, self.context_id) {
            send(host, None, &reply);
        }
        // Answered locally or held: never forwarded.
        Action::Pause
    }
}

impl<H: Host> Drop for HealthStream<H> {
    fn drop(&mut self) {
        self.health.forget(self.context_id);
    }
}
