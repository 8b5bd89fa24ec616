//! Traffic roles: `traffic` counts every HTTP stream of the listener it is
//! inserted in, `traffic_tcp` every connection of the TCP or TLS-passthrough
//! filter chain it is inserted in (a network filter before `tcp_proxy`).
//! Both are one root type: each counts into its part of the count, beats the
//! same heartbeat, flips DRAINING → CLOSING from the callback that ends the
//! last stream or connection of either part, and keeps the ages of what it
//! has in flight.

use proxy_wasm::types::{Action, PeerType};
use std::cell::Cell;
use std::rc::Rc;

use crate::config::Shared;
use crate::gate::count::{self, ActiveCount, Part, PartCounter};
use crate::gate::fsm::host::Store;
use crate::gate::fsm::{Record, State};
use crate::gate::liveness::host::Heartbeat;
use crate::gate::refusal::{self, Meet, NewRequests};
use crate::host::logs;
use crate::host::metrics::{Id, Metrics};
use crate::host::wasm_host::{Envoy, Host};
use crate::instruments::in_flight::host::Book;
use crate::instruments::receipt::{self, End, First};
use crate::instruments::sizing::host as sizing;
use crate::instruments::sizing::Kind;

/// What the traffic role's last tick saw of a drain: whether streams are
/// counted exactly (`Traffic::exact`), and what holds the flip back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not DRAINING: no stream end needs to look any further.
    Outside,
    /// DRAINING, but `min_drain` has not elapsed: no flip before it does.
    Minimum,
    /// DRAINING, but a soft drain's gate has not passed: the health role
    /// flips on the 404 that passes it, or on its tick.
    Gate,
    /// DRAINING (or may be: a root starts so): every stream is counted
    /// exactly, and the last one's end flips.
    Flips,
}

/// Shared by every stream (or connection) of one traffic root context.
#[derive(Debug)]
pub struct Traffic<H: Host = Envoy> {
    /// What this root counts.
    pub part: Part,
    active: ActiveCount<H>,
    metrics: Metrics<H>,
    store: Store<H>,
    /// What the last tick saw of a drain: until a hold ends, a stream end
    /// that brings the count to 0 does not look (the health role flips when
    /// the hold ends).
    phase: Cell<Phase>,
    /// The drain the last tick saw (`fsm::Record::drain_id`; `None`: OPEN,
    /// and a root created mid-drain sorts ends from its first tick on). Only
    /// during one does an end cost a look at how it ended (`crate::instruments::receipt`).
    drain: Cell<Option<u64>>,
    /// `draining_new_requests`, and how it refuses (`config::Shared`).
    config: Shared,
    /// Ends of the drain that completed since the last tick: the common end
    /// is added to its counter once a tick, not by a host call per stream
    /// (the receipt's other ends are counted at once), and to `drain`'s
    /// receipt when that one ended or a newer began meanwhile
    /// (`crate::instruments::receipt::Record::add_completed`).
    completed: Cell<u64>,
    /// This worker's streams by start tick (`crate::instruments::in_flight`).
    ages: Book<H>,
    /// How long streams lasted (`crate::instruments::sizing`), flushed once a tick.
    durations: sizing::Book<H>,
    /// Registers this root and beats for it (its id: `Heartbeat::id`).
    pub heartbeat: Heartbeat<H>,
}

impl<H: Host + Copy> Traffic<H> {
    pub fn new(part: Part, metrics: Metrics<H>, config: &Shared) -> Traffic<H> {
        let host = *metrics.host();
        Traffic {
            part,
            active: ActiveCount::new(&metrics),
            metrics,
            store: Store::new(host).raising(crate::instruments::receipt::host::transition),
            phase: Cell::new(Phase::Flips),
            drain: Cell::new(None),
            config: *config,
            completed: Cell::new(0),
            ages: Book::new(host, config.tick_ms),
            durations: sizing::Book::new(host, config.tick_ms, metrics.durations),
            heartbeat: Heartbeat::new(host, config.tick_ms),
        }
    }
}

impl<H: Host> Traffic<H> {
    /// The counter of this root's part.
    pub fn counter(&self) -> &PartCounter<H> {
        self.active.part(self.part)
    }

    /// Whether streams are counted exactly now: during a drain, except while
    /// its `min_drain` holds the flip back. Then the lease of outside a drain
    /// serves (an over-count, never below the truth), and the tick that sees
    /// the minimum end gives it back before anything may flip.
    fn exact(&self) -> bool {
        !matches!(self.phase.get(), Phase::Outside | Phase::Minimum)
    }

    /// The root context is being removed cleanly: count what completed,
    /// leave the registry.
    pub fn goodbye(&self) {
        self.flush_completed();
        self.heartbeat.goodbye();
    }

    /// Adds the drain's ends that completed since the last tick to their
    /// counter — first to the receipt's record, for the drain they were
    /// sorted for (that drain's line is already written, or a newer began).
    fn flush_completed(&self) {
        let n = self.completed.take();
        if let (Some(drain), true) = (self.drain.get(), n > 0) {
            crate::instruments::receipt::host::change(self.store.host(), &mut |r| {
                r.add_completed(drain, n)
            });
        }
        self.metrics.add(Id::DrainCompleted, n);
    }

    /// Every `tick`: publish the ages; is a drain running? Give back the
    /// unused lease, and during a drain check whether this VM's last stream
    /// already ended before it knew about the drain.
    pub fn tick(&self) {
        self.ages.tick(self.heartbeat.beat());
        self.durations.tick();
        let hint = self.metrics.state_hint();
        // Out of OPEN the record says which drain runs (and what holds it).
        let rec = (hint != Some(State::Open))
            .then(|| self.store.current().ok())
            .flatten();
        self.flush_completed();
        let state = hint
            .or(rec.as_ref().map(|r| r.state))
            .unwrap_or(State::Draining); // unknown: keep looking
        let (drain, phase) = match (state, &rec) {
            (State::Open, _) => (None, Phase::Outside),
            (State::Draining, Some(r)) => (r.drain_id, self.flip_hold(r)),
            (State::Draining, None) => (self.drain.get(), Phase::Flips),
            (_, Some(r)) => (r.drain_id, Phase::Outside),
            (_, None) => (self.drain.get(), Phase::Outside),
        };
        self.drain.set(drain);
        self.phase.set(phase);
        self.counter().settle();
        if state == State::Draining && self.counter().in_flight() == 0 {
            self.try_flip();
        }
    }

    /// The hot path. Outside a drain: no host call most of the time (see the
    /// lease in `count`). During one, the stream that brings the count to 0 flips DRAINING →
    /// CLOSING itself. That is exact without polling because every
    /// transition writer publishes the state and then reads the count, while
    /// this side releases its count and then reads the state: of two such
    /// interleavings at least one side sees the other (both are sequentially
    /// consistent atomics in Envoy). A stream ending before this VM's next
    /// tick has seen a new drain is left to the health role's tick. The other
    /// part is read after this one is released (`ActiveCount::reads_zero`), so
    /// the last HTTP stream and the last TCP connection ending at once is
    /// the same argument once more.
    fn stream_ended(&self) {
        // Not while streams are in flight here, no drain runs, min_drain holds
        // it, or a gate does (the health role flips on the 404 that passes it).
        if self.counter().exit(self.exact()) == 0 && self.phase.get() == Phase::Flips {
            self.try_flip();
        }
    }

    /// What holds the running drain's flip back now (the tick asks, once per
    /// tick, only while DRAINING): a drain a `min_drain` or a gate holds open
    /// costs the streams that bring the count to 0 nothing until it ends.
    fn flip_hold(&self, rec: &Record) -> Phase {
        let (Some(plan), Some(started)) = (rec.plan, rec.drain_started_timer_ms()) else {
            return Phase::Flips;
        };
        let until = started.saturating_add(plan.min_drain_ms);
        if self.metrics.host().now().timer_ms() < until {
            Phase::Minimum
        } else if self.store.gate(rec).is_some_and(|g| !g.passes()) {
            Phase::Gate
        } else {
            Phase::Flips
        }
    }

    /// The state now, when the tick's view may be a tick old (`None`: unknown).
    fn state_now(&self) -> Option<State> {
        self.metrics
            .state_hint()
            .or_else(|| self.store.current().ok().map(|r| r.state))
    }

    /// A new HTTP request: refused while draining when
    /// `draining_new_requests: refuse` (the state confirmed, so that a
    /// `/reopen` ends the refusing at once). One host call per request, only
    /// in a drain and only in that mode.
    fn refuses(&self) -> bool {
        self.config.draining_new_requests == NewRequests::Refuse
            && self.drain.get().is_some()
            && self.state_now().is_some_and(|s| s != State::Open)
    }

    /// How a stream or connection that ended during a drain ended, counted
    /// (`crate::instruments::receipt`). A cut is confirmed against the state (the tick's
    /// view may be a tick old); `by_lb`, asked of a cut only: it came at a
    /// checker's DOWN (`at_lb_down`).
    fn sort_end(&self, end: End, by_lb: impl FnOnce() -> bool) {
        let m = &self.metrics;
        match end {
            End::Completed => self.completed.set(self.completed.get().saturating_add(1)),
            End::Cut if self.state_now() == Some(State::Open) => {} // reopened meanwhile: not a drain's end
            End::Upstream => m.add(Id::DrainEndedUpstream, 1),
            End::Refused => m.add(Id::Refused, 1),
            End::Cut => {
                m.add(Id::Cut, 1);
                m.add(Id::CutTcp, u64::from(self.part == Part::Connections));
                m.add(Id::CutLb, u64::from(by_lb()));
            }
        }
    }

    /// Whether a cut now is the LB's (`lb::Checkers::cut_by_lb`): the LB
    /// record is read, and the downstream's address when a checker's window
    /// is open (`source`: whether this callback can read it).
    fn at_lb_down(&self, source: bool) -> bool {
        let host = self.metrics.host();
        let now = host.now().timer_ms();
        let peer = || {
            source
                .then(|| host.property("source\0address"))
                .flatten()
                .and_then(|b| crate::net::peer_ip(&b))
        };
        self.store
            .lb_checkers()
            .is_ok_and(|c| c.cut_by_lb(now, peer))
    }

    /// The global count may be 0 during a drain: flip if it is.
    fn try_flip(&self) {
        let hint = self.metrics.state_hint();
        if !hint.is_some_and(|s| s != State::Draining)
            && self.active.reads_zero()
            && self.active.read().for_decisions() == 0
        {
            if let Err(e) = self.store.apply_due(0, None, &self.metrics) {
                logs::error!("event=state_unavailable role=traffic error=\"{e}\"");
            }
        }
    }
}

/// One HTTP stream or one TCP connection. It is counted from its creation,
/// which Envoy runs when the stream reaches this filter (the filter's
/// `decodeHeaders`; a connection's `onNewConnection`), not when the
/// connection manager decodes it: a request an earlier filter holds (an
/// authorization call, a JWKS fetch, an injected delay) does not exist here
/// until it is let go (Envoy creates it at the access log of a stream that
/// never reached the filter: counted for that instant, its end sorted).
/// Hence the traffic role is the first HTTP filter of every chain
/// (envoyfilter/docs/counting.md, "What is counted"). Once created it
/// is counted whether or not a later callback runs (a later filter may
/// answer locally), and released in `Drop`, which the host runs for every
/// stream end and connection close, resets included. Its only data
/// callbacks are a connection's, which look at `end_of_stream` (which side
/// ended first, `crate::instruments::receipt::First`), make no host call and continue.
pub struct TrafficStream<H: Host = Envoy> {
    traffic: Rc<Traffic<H>>,
    counted: bool,
    started_ms: u64,
    /// Refused by drain-gate while draining (answered 503, or reset).
    refused: bool,
    /// A refused gRPC request: its answer gets its 503 back on the way out.
    restore_status: bool,
    /// A connection: which side ended first (`None`: neither yet).
    first: Option<First>,
    /// An HTTP stream: its response ended (end of stream seen on the way
    /// out): it completed, or ended by Envoy's own answer (`on_log` reads
    /// which), whatever happens to its connection afterwards.
    response_done: bool,
    /// An HTTP stream of `crate::instruments::sizing::CLASSIFY_FROM_MS` or more that was
    /// upgraded (WebSocket, CONNECT), as its request headers say at its end.
    upgraded: bool,
    /// Whether a connection's first end, by its downstream during a drain,
    /// came at a checker's DOWN, read when it happened (else read as it
    /// closes).
    at_lb_down: Option<bool>,
}

impl<H: Host> TrafficStream<H> {
    #[inline(always)]
    pub fn new(traffic: Rc<Traffic<H>>) -> TrafficStream<H> {
        traffic.heartbeat.ensure();
        let counted = traffic.counter().admit(traffic.exact());
        if !counted {
            count::not_counted(&traffic.metrics);
        }
        TrafficStream {
            started_ms: traffic.ages.enter(),
            traffic,
            counted,
            refused: false,
            restore_status: false,
            first: None,
            response_done: false,
            at_lb_down: None,
            upgraded: false,
        }
    }

    /// The request's headers arrived: forwarded, or refused while draining
    /// (never forwarded, so always safe to resend): answered 503, or reset
    /// (`crate::gate::refusal`). `connection: close` is Envoy's to add, not a
    /// filter's: it strips the hop-by-hop headers of a local reply, and adds
    /// `connection: close` to every HTTP/1.1 response once its drain sequence
    /// runs (the connection rotation, which a refusing drain starts as it
    /// begins).
    pub fn request_headers(&mut self) -> Action {
        if !self.traffic.refuses() {
            return Action::Continue;
        }
        self.refuse()
    }

    /// A request `request_headers` may refuse: its headers say how (or
    /// that it is served after all).
    #[cold]
    #[inline(never)]
    fn refuse(&mut self) -> Action {
        let refusal = self.traffic.config.refusal;
        let host = self.traffic.metrics.host();
        let meet = refusal.meet(|name| host.request_header(name));
        let sent = match meet {
            Meet::Serve => return Action::Continue,
            Meet::Reset => host.reset_stream(),
            _ => host.respond(None, refusal::STATUS, &refusal::HEADERS, refusal::BODY),
        };
        if let Err(e) = sent {
            logs::warning!("event=refuse_failed status={e:?}");
            return Action::Continue;
        }
        self.refused = true;
        self.restore_status = meet == (Meet::Respond { grpc: true });
        Action::Pause
    }

    /// The response's headers pass on their way out: a refused gRPC request's
    /// answer, which Envoy made `:status: 200` with `grpc-status: 14`, gets
    /// its 503 back, so that an LB resends it as any refusal.
    pub fn response_headers(&mut self, end: bool) {
        if self.restore_status {
            self.restore_status();
        }
        self.response(end);
    }

    /// A refused gRPC request's answer: its 503 back.
    #[cold]
    #[inline(never)]
    fn restore_status(&mut self) {
        self.restore_status = false;
        let host = self.traffic.metrics.host();
        let status = refusal::STATUS.to_string();
        if let Err(e) = host.set_response_header(refusal::STATUS_HEADER, &status) {
            logs::warning!("event=refuse_status_failed status={e:?}");
        }
    }

    /// A piece of the response passed on its way out; `end` when it was
    /// the last (headers, the last data frame, or trailers).
    pub fn response(&mut self, end: bool) {
        self.response_done |= end;
    }

    /// The stream's access-log moment (its end): during a drain, how it
    /// ended, by what Envoy says happened — one property read per end: a
    /// stream whose response ended reads its `response.code_details` (the
    /// upstream's answer completed it, Envoy's own local reply did not), one
    /// whose response did not end its `response.flags` (cut, or ended by the
    /// upstream or Envoy). A cut also reads the LB record, and, at a
    /// checker's DOWN, its downstream's address. A refused stream reads
    /// nothing. Outside a drain: nothing — but, in and outside one, a stream
    /// that lasted `crate::instruments::sizing::CLASSIFY_FROM_MS` reads its `upgrade`
    /// header (and, without one, its `:method`): whether its duration is an
    /// upgraded stream's.
    pub fn log(&mut self) {
        let long = self.traffic.ages.since(self.started_ms)
            >= crate::instruments::sizing::CLASSIFY_FROM_MS;
        if long || self.traffic.drain.get().is_some() {
            self.look_at_end(long);
        }
    }

    /// `log`'s reads, for a stream that lasted `long` or ended in a drain.
    #[cold]
    #[inline(never)]
    fn look_at_end(&mut self, long: bool) {
        let host = self.traffic.metrics.host();
        if long {
            self.upgraded = host.request_header("upgrade").is_some()
                || host.request_header(":method").as_deref() == Some("CONNECT");
        }
        if self.traffic.drain.get().is_none() {
            return;
        }
        let end = if self.refused {
            End::Refused
        } else if self.response_done {
            receipt::http_done(host.property("response\0code_details").as_deref())
        } else {
            let flags = host
                .property("response\0flags")
                .and_then(|b| crate::host::shared::u64_of(&b))
                .unwrap_or(0);
            receipt::http_end(flags)
        };
        self.traffic.sort_end(end, || self.traffic.at_lb_down(true));
    }

    /// One side of a connection ended: `closed` by Envoy's close event (by
    /// that peer), or, `None`, half-closed: its data ended (a FIN). The first
    /// end counts, unless the other side's (or the downstream's own FIN) came
    /// before; Envoy closing the downstream itself is none. When the
    /// downstream's is first during a drain, whether it came at a checker's
    /// DOWN is read now, from this connection's callback.
    pub fn side_ended(&mut self, downstream: bool, closed: Option<PeerType>) {
        let how = match (downstream, closed) {
            (false, _) => First::Upstream,
            (true, None) => First::DownstreamFin,
            (true, Some(PeerType::Remote)) => First::DownstreamReset,
            (true, Some(_)) => return,
        };
        if self.first.is_none() {
            self.first = Some(how);
            if how != First::Upstream && self.traffic.drain.get().is_some() {
                self.at_lb_down = Some(self.traffic.at_lb_down(true));
            }
        }
    }
}

impl<H: Host> Drop for TrafficStream<H> {
    fn drop(&mut self) {
        self.traffic.ages.exit(self.started_ms);
        if !self.refused {
            let kind = match (self.traffic.part, self.upgraded) {
                (Part::Connections, _) => Kind::Tcp,
                (_, true) => Kind::Upgraded,
                _ => Kind::Http,
            };
            let took = self.traffic.ages.since(self.started_ms);
            self.traffic.durations.record(kind, took);
        }
        if self.traffic.part == Part::Connections && self.traffic.drain.get().is_some() {
            // A downstream end seen before the drain did: its address is no
            // longer readable here.
            let at_down = self
                .at_lb_down
                .unwrap_or_else(|| self.traffic.at_lb_down(false));
            let end = receipt::tcp_end(self.first.unwrap_or_default(), || at_down);
            self.traffic.sort_end(end, || at_down);
        }
        if self.counted {
            self.traffic.stream_ended();
        } else {
            self.traffic.counter().uncounted_ended();
        }
    }
}

#[cfg(test)]
#[path = "traffic_tests.rs"]
mod tests;
