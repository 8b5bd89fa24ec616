//! Health role: answers every request of the health listener locally from the
//! FSM (see `crate::api`), holds `wait=closed` answers, and runs the timers.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use std::cell::{Cell, RefCell};
use std::fmt::Display;
use std::net::IpAddr;
use std::rc::Rc;

use super::count::{Counts, Reading};
use super::in_flight;
use super::liveness::Watch;
use super::logs;
use super::metrics::Metrics;
use super::placeholder;
use super::rotation::Rotator;
use super::shared::{Envoy, Host};
use super::store::{self, Store};
use super::termination;
use crate::api::{self, Audience, CountInfo, Endpoint, Reply, RotationView, TrafficInfo, View};
use crate::clock::{self, Now};
use crate::config::{Config, NewRequests};
use crate::fsm::{self, CloseAfter, DrainPlan, Move, Reason, Record, State};
use crate::lb::Checkers;
use crate::placeholder::Action as PlaceholderAction;
use crate::receipt;
use crate::rotation;

/// What a status answer shows beyond the FSM record, read at once.
struct Snapshot {
    reading: Reading,
    checkers: Checkers,
    traffic: TrafficInfo,
    rotation: Option<rotation::Record>,
    /// The registered traffic roots (whose in-flight summaries count).
    ids: Vec<u64>,
    /// One above the highest registry id ever handed out.
    ids_high: u64,
}

/// A held `wait=closed` request.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    context_id: u32,
    since: Now,
    timeout_ms: u64,
}

impl Waiter {
    fn timed_out(&self, now: Now) -> bool {
        now.passed(self.since.wall_ms, self.since.mono_ms, self.timeout_ms)
    }
}

/// Shared by every stream of one health root context.
#[derive(Debug)]
pub struct Health<H: Host = Envoy> {
    pub config: Config,
    pub counter: Counts<H>,
    pub metrics: Metrics<H>,
    pub rotator: Rotator<H>,
    pub termination: termination::Watch<H>,
    store: Store<H>,
    waiters: RefCell<Vec<Waiter>>,
    watch: Watch<H>,
    lb_seen: store::LbSeen,
    /// The last tick could not read (or update) the record: checks fail
    /// closed until a tick succeeds again.
    unreadable: Cell<bool>,
    /// What the last tick decided about the placeholders (`crate::placeholder`):
    /// the checks read it, no shared data per check.
    placeholders: Cell<PlaceholderAction>,
    /// An LB check was answered 200 (as of this worker's last look).
    announced: Cell<bool>,
    /// The drain whose owed receipt line this root saw at its last tick: it
    /// is logged a tick later, once every traffic root's tick has counted
    /// what completed (`Traffic::tick`).
    receipt_seen: Cell<Option<u64>>,
}

/// Sends `reply` on the stream `context_id` (`None`: the current one).
fn send<H: Host>(host: &H, context_id: Option<u32>, reply: &Reply) {
    let headers: Vec<(&str, &str)> = reply
        .headers
        .iter()
        .map(|(n, v)| (*n, v.as_str()))
        .collect();
    if let Err(e) = host.respond(context_id, reply.status, &headers, &reply.body) {
        logs::warning!("event=send_failed status={e:?}");
    }
}

/// Logs why the state could not be read; the answer is the core's.
fn unavailable(error: &dyn Display) -> Reply {
    logs::error!("event=state_unavailable role=health error=\"{error}\"");
    api::unavailable()
}

impl<H: Host + Copy> Health<H> {
    pub fn new(config: Config, metrics: Metrics<H>) -> Health<H> {
        let host = *metrics.host();
        let counter = Counts::new(&metrics);
        let refusing = config.draining_new_requests == NewRequests::Refuse;
        let rotator = Rotator::new(host, config.rotate_connections.clone(), refusing);
        let termination = termination::Watch::new(host, config.termination_watch.clone());
        let watch = Watch::new(host, config.tick_ms);
        metrics.set_drain_timeout(config.drain_timeout_ms);
        let health = Health {
            config,
            counter,
            metrics,
            rotator,
            termination,
            store: Store::new(host),
            waiters: RefCell::new(Vec::new()),
            receipt_seen: Cell::new(None),
            watch,
            lb_seen: RefCell::new(None),
            unreadable: Cell::new(false),
            placeholders: Cell::new(PlaceholderAction::None),
            announced: Cell::new(false),
        };
        // Record where the wall clock stands before the first tick, so that
        // a step even then is seen.
        health.watch_clock();
        health
    }
}

impl<H: Host> Health<H> {
    fn host(&self) -> &H {
        self.store.host()
    }

    /// Everything a status answer shows, read now.
    fn snapshot(&self) -> Snapshot {
        let checkers = self.store.lb_checkers().unwrap_or_else(|e| {
            logs::warning!("event=lb_record_unavailable error=\"{e}\"");
            Checkers::default()
        });
        let rotation = self.store.rotation_load().unwrap_or_else(|e| {
            logs::warning!("event=rotation_record_unavailable error=\"{e}\"");
            None
        });
        let (reg, verdict, watch) = self.watch.snapshot();
        let placeholders = placeholder::read(self.host());
        let traffic = TrafficInfo {
            seen: !verdict.waiting,
            roots: reg.roots.len(),
            lost: (reg.lost.len() as u64).saturating_add(reg.dropped_lost),
            lost_total: reg.lost_total,
            back_total: reg.back_total,
            refused: reg.refused,
            stalls: watch.stalls,
            longest_stall_ms: watch.longest_stall_ms,
            placeholders: placeholders.present(),
            placeholders_serving: placeholders.serving(),
        };
        let ids = reg.roots.iter().map(|r| r.id).collect();
        Snapshot {
            reading: self.counter.read(),
            checkers,
            traffic,
            rotation,
            ids,
            ids_high: reg.ids_high,
        }
    }

    fn view<'a>(&'a self, rec: &'a Record, snap: &'a Snapshot) -> View<'a> {
        let now = self.host().now();
        let reading = &snap.reading;
        View {
            rec,
            active: reading.active,
            now,
            clock: self.clock_info(),
            in_flight: in_flight::read(self.host(), now.timer_ms(), snap.ids.iter().copied()),
            count: CountInfo {
                source: self.counter.source_name(),
                reliable: reading.reliable,
                http_streams: reading.streams,
                tcp_connections: reading.connections,
                unreliable_reason: reading.why.map(|w| w.name()),
            },
            traffic: snap.traffic,
            draining_lb_status: self.config.draining_lb_status,
            checkers: &snap.checkers,
            ignored_checks: self.metrics.lb_checks_ignored(),
            lb_fall: self.config.lb_fall,
            close_after: self.config.close_after,
            rotation: RotationView {
                cluster: self.rotator.cluster(),
                last: snap.rotation.as_ref(),
            },
            footprint: api::Footprint {
                metric_definitions: super::metrics::definitions(),
                shared_keys: super::keys::created(snap.ids_high),
            },
            receipt: self.tally_of(rec),
            new_requests: self.config.draining_new_requests.name(),
            refusal: self.config.refusal(),
            durations: super::sizing::read(self.host()),
            closing_ms: self.config.max_closing_ms(),
            scrape_ms: self.config.scrape_interval_ms,
        }
    }

    fn status_reply(&self, rec: &Record) -> Reply {
        api::status(&self.view(rec, &self.snapshot()))
    }

    fn wait_reply(&self, end: api::WaitEnd, rec: &Record) -> Reply {
        api::wait_reply(end, &self.view(rec, &self.snapshot()))
    }

    /// When the LB was observed DOWN, if `close_after` asks for it.
    fn lb_down_ms(&self) -> Option<u64> {
        if self.config.close_after != CloseAfter::LbObservedDown {
            return None;
        }
        self.store
            .lb_checkers()
            .ok()
            .and_then(|c| c.down_since(self.host().now().timer_ms(), self.config.lb_fall))
    }

    /// Answers the LB check and remembers what this checker was served
    /// (only sources in `lb_checkers`). The 404 that completes what a gated
    /// soft drain waits for flips it at once if nothing is in flight.
    fn lb_check(&self, state: State, req: &api::Request) -> Reply {
        let reply = api::check(Audience::Lb, state, &self.config, req.if_none_match);
        let Some(ip) = req.source else {
            return reply;
        };
        if !self.config.is_checker(ip) {
            self.ignored_check(ip, reply.status);
            return reply;
        }
        let served = if reply.status == 304 {
            200
        } else {
            reply.status
        };
        if let Err(e) =
            self.store
                .lb_observe(&ip.to_string(), served, self.config.lb_fall, &self.lb_seen)
        {
            logs::warning!("event=lb_record_unavailable error=\"{e}\"");
        }
        if state == State::Draining && served == 404 {
            let active = self.counter.read().for_decisions();
            if let Err(e) = self
                .store
                .apply_due(active, self.lb_down_ms(), &self.metrics)
            {
                logs::error!("event=state_unavailable role=health error=\"{e}\"");
            }
        }
        reply
    }

    /// A check from outside `lb_checkers`: answered, not recorded — counted,
    /// and logged once per new source, so that an LB whose checks arrive from
    /// another address (SNAT, a wrong CIDR) is seen, not silently ignored.
    fn ignored_check(&self, ip: IpAddr, status: u16) {
        self.metrics.lb_check_ignored();
        if matches!(status, 200 | 304) && !self.announced.get() {
            match self.store.lb_announce() {
                Ok(_) => self.announced.set(true),
                Err(e) => logs::warning!("event=lb_record_unavailable error=\"{e}\""),
            }
        }
        match self.store.lb_ignore(&ip.to_string()) {
            Ok(true) => logs::warning!(
                "event=lb_check_ignored source={ip} what=\"a /health_check.html from outside \
                 lb_checkers: answered, not recorded; if it is the LB, a soft drain's gate and \
                 lb_observed_down never see it\""
            ),
            Ok(false) => {}
            Err(e) => logs::warning!("event=lb_record_unavailable error=\"{e}\""),
        }
    }

    /// Moves the FSM for an admin command, then applies whatever became due
    /// (a drain with nothing in flight flips at once).
    fn command(&self, cmd: api::Command) -> Result<Record, store::Error> {
        self.advance(&|r: &Record| Move {
            expected_from: cmd.expected_from(r.state),
            to: cmd.target(),
            reason: cmd.reason(),
            plan: Some(cmd.plan(&self.config)),
            force: cmd.force(),
        })
    }

    /// Moves the FSM as `choose` says, then applies whatever became due.
    fn advance(&self, choose: &dyn Fn(&Record) -> Move) -> Result<Record, store::Error> {
        self.store
            .advance(choose, self.counter.read().active, &self.metrics)?;
        self.store
            .apply_due(
                self.counter.read().for_decisions(),
                self.lb_down_ms(),
                &self.metrics,
            )
            .map_err(store::Error::Shared)
    }

    /// The answer to one request, or `None` when it is held.
    fn handle(&self, req: &api::Request, context_id: u32) -> Option<Reply> {
        let endpoint = match api::route(req, &self.config) {
            Ok(e) => e,
            Err(reply) => return Some(reply),
        };
        if let Endpoint::Check(audience) = endpoint {
            return Some(self.check(audience, req));
        }
        let rec = match self.store.load() {
            Ok(r) => r,
            Err(e) => return Some(unavailable(&e)),
        };
        match endpoint {
            Endpoint::Check(audience) => Some(self.check(audience, req)),
            Endpoint::Status => Some(self.status_reply(&rec)),
            Endpoint::Transition(cmd) => Some(match self.command(cmd) {
                Ok(next) => self.status_reply(&next),
                Err(store::Error::Illegal(e)) => api::illegal(e),
                Err(store::Error::Shared(e)) => unavailable(&e),
            }),
            Endpoint::DrainAndWait { timeout_ms } => {
                self.drain_and_wait(rec, timeout_ms, context_id)
            }
        }
    }

    /// A health check, answered from the state gauge (one host call, no
    /// record to parse) when that gauge is live, else from the record. The
    /// gauge is written right after each transition by the worker whose
    /// write won, and repaired every tick (`Metrics::sync_state`); a record
    /// the tick could not read fails the checks closed from then on.
    fn check(&self, audience: Audience, req: &api::Request) -> Reply {
        let gauge = self.metrics.state_hint().filter(|_| !self.unreadable.get());
        let state = match gauge {
            Some(state) => state,
            None => match self.store.load() {
                Ok(rec) => rec.state,
                Err(e) => return unavailable(&e),
            },
        };
        match audience {
            _ if !self.watch.seen() => api::check_waiting(
                audience,
                state,
                &self.config,
                req.if_none_match,
                api::checks::WAITING_FOR_TRAFFIC,
            ),
            _ if self.placeholders.get() == PlaceholderAction::KeepOut => api::check_waiting(
                audience,
                state,
                &self.config,
                req.if_none_match,
                api::checks::WAITING_FOR_FILTER,
            ),
            Audience::Lb => self.lb_check(state, req),
            _ => api::check(audience, state, &self.config, req.if_none_match),
        }
    }

    /// Starts or joins a drain and holds the answer until it ends; a held
    /// answer is a preStop hold (`fsm::renew_hold`), and a maintenance drain
    /// it joins turns automatic (`fsm::resume`).
    fn drain_and_wait(&self, rec: Record, timeout_ms: u64, context_id: u32) -> Option<Reply> {
        if rec.state == State::Fault {
            return Some(self.wait_reply(api::WaitEnd::InFault, &rec));
        }
        let joined = match rec.state {
            State::Open => match self.command(api::Command::Drain) {
                Ok(next) => Ok(next),
                // Someone else started it first: join.
                Err(store::Error::Illegal(_)) => self.store.update(&fsm::resume),
                Err(store::Error::Shared(e)) => Err(e),
            },
            _ => self.store.update(&fsm::resume),
        };
        let rec = match joined {
            Ok(r) => r,
            Err(e) => return Some(unavailable(&e)),
        };
        if let Some(end) = api::wait_end(rec.state, false, self.lingering(&rec, self.host().now()))
        {
            return Some(self.wait_reply(end, &rec));
        }
        self.waiters.borrow_mut().push(Waiter {
            context_id,
            since: self.host().now(),
            timeout_ms,
        });
        self.renew_hold();
        None
    }

    /// Keeps the preStop hold of this worker's held answers alive.
    fn renew_hold(&self) {
        let lease = self.config.hold_lease_ms();
        let now = self.host().now();
        if let Err(e) = self.store.update(&|r| fsm::renew_hold(r, now, lease)) {
            logs::warning!("event=hold_unavailable error=\"{e}\"");
        }
    }

    /// Which clock the timers run on, and the wall-clock steps seen so far.
    fn clock_info(&self) -> api::ClockInfo {
        let steps = self.store.clock_steps().unwrap_or_else(|e| {
            logs::warning!("event=clock_record_unavailable error=\"{e}\"");
            clock::Steps::default()
        });
        api::ClockInfo::new(self.host().now().timers(), &steps)
    }

    /// Makes a wall-clock step visible: the worker that sees it first logs
    /// and counts it. The timers themselves never look at the wall clock.
    fn watch_clock(&self) {
        let now = self.host().now();
        let threshold = clock::step_threshold_ms(self.config.tick_ms);
        match self.store.clock_look(now, threshold) {
            Ok(Some((steps, by))) => {
                logs::warning!(
                    "event=clock_step step_ms={by} wall={} steps={} timers={}",
                    api::rfc3339(now.wall_ms),
                    steps.count,
                    now.timers().name()
                );
                self.metrics.clock_step();
            }
            Ok(None) => {}
            Err(e) => logs::warning!("event=clock_record_unavailable error=\"{e}\""),
        }
    }

    /// Runs every `tick` on each worker: the clock-step watch, automatic
    /// transitions, then the release of held answers that are over.
    pub fn tick(&self) {
        self.watch_clock();
        self.watch.tick(&self.metrics);
        let reading = self.counter.read();
        let due = self
            .store
            .apply_due(reading.for_decisions(), self.lb_down_ms(), &self.metrics);
        self.unreadable.set(due.is_err());
        let rec = match due {
            Ok(r) => r,
            Err(e) => {
                logs::error!("event=state_unavailable role=health error=\"{e}\"");
                return;
            }
        };
        self.metrics.sync_state(rec.state);
        self.judge_placeholders(&rec);
        self.rotator.tick(&rec, self.store.gate(&rec));
        self.metrics.set_count_unreliable(!reading.reliable);
        let ids: Vec<u64> = self.watch.snapshot().0.roots.iter().map(|r| r.id).collect();
        let now = self.host().now();
        let oldest = in_flight::read(self.host(), now.timer_ms(), ids).oldest_age_ms;
        self.metrics.set_oldest_in_flight(oldest);
        self.keep_receipt(&rec, oldest);
        self.release_waiters(&rec, now);
        let held = !self.waiters.borrow().is_empty();
        self.termination
            .tick(held && matches!(rec.state, State::Draining | State::Closing));
    }

    /// Keeps a gateway not yet announced out while a placeholder runs, and
    /// drains an announced one once a placeholder served a request: a drain
    /// that holds CLOSING, as a maintenance drain does (`crate::placeholder`).
    fn judge_placeholders(&self, rec: &Record) {
        let p = placeholder::read(self.host());
        if !self.announced.get() && p.present() > 0 {
            match self.store.lb_checkers() {
                Ok(c) => self.announced.set(c.announced_ms.is_some()),
                Err(e) => logs::warning!("event=lb_record_unavailable error=\"{e}\""),
            }
        }
        let action =
            crate::placeholder::action(p.present(), p.serving(), self.announced.get(), rec.state);
        self.placeholders.set(action);
        if action != PlaceholderAction::Drain {
            return;
        }
        let started = self.advance(&|_: &Record| Move {
            expected_from: State::Open,
            to: State::Draining,
            reason: Reason::FilterNotLoaded,
            plan: Some(DrainPlan {
                hold_closing: true,
                ..self.config.plan()
            }),
            force: false,
        });
        match started {
            Ok(_) => logs::error!(
                "event=placeholder_drain placeholders={} what=\"a traffic filter serves without its own \
                 configuration: the gateway drains out of the LB (CLOSING holds: /reopen once the filter loads)\"",
                p.present()
            ),
            // Another worker started it first.
            Err(store::Error::Illegal(_)) => {}
            Err(store::Error::Shared(e)) => logs::error!("event=state_unavailable role=health error=\"{e}\""),
        }
    }

    /// Records the oldest stream at the flip (within a tick of it), and logs
    /// the owed receipt line a tick after this root first saw it (the traffic
    /// roots count the drain's last completed ends at their tick); one worker
    /// each.
    fn keep_receipt(&self, rec: &Record, oldest: Option<u64>) {
        if fsm::record_flip(rec, oldest).is_some() {
            if let Err(e) = self.store.update(&|r| fsm::record_flip(r, oldest)) {
                logs::warning!("event=state_unavailable role=health error=\"{e}\"");
            }
        }
        let owed = rec.owed_line.as_ref().and(rec.owed_drain);
        if owed.is_none() || self.receipt_seen.replace(owed) != owed {
            return;
        }
        let line = RefCell::new(None);
        let taken = self
            .store
            .update(&|r| fsm::take_owed(r, &mut line.borrow_mut()));
        match (taken, line.take()) {
            (Ok(_), Some(line)) => {
                if let Some(ms) = receipt::duration_of(&line) {
                    self.metrics.drain_took(ms);
                }
                logs::info!("{line}")
            }
            (Ok(_), None) => {}
            (Err(e), _) => logs::warning!("event=state_unavailable role=health error=\"{e}\""),
        }
    }

    /// pilot-agent says the pod got its SIGTERM while a preStop answer is
    /// held (`termination`): the drain is cut short before CLOSED. The worker
    /// that writes it into the receipt counts it and says so; the receipt
    /// line (`ended=SIGTERM`) follows a tick later.
    pub fn sigterm(&self) {
        let now = self.host().now();
        let cut = Cell::new(None);
        let written = self.store.update(&|r| {
            let next = fsm::cut_short(r, self.tally_of(r), now);
            cut.set(next.as_ref().map(|_| r.state));
            next
        });
        match (written, cut.get()) {
            (Ok(_), Some(state)) => {
                self.metrics.drain_cut_short();
                logs::warning!("event=sigterm_before_closed state={}", state.name());
            }
            (Ok(_), None) => {}
            (Err(e), _) => logs::warning!("event=state_unavailable role=health error=\"{e}\""),
        }
    }

    /// What the drain of `rec` counted so far (nothing before a first drain).
    fn tally_of(&self, rec: &Record) -> receipt::Tally {
        rec.receipt_base
            .map(|base| self.metrics.tally().since(&base))
            .unwrap_or_default()
    }

    /// Answers the held `wait=closed` requests whose wait is over; renews the
    /// preStop hold of the others.
    fn release_waiters(&self, rec: &Record, now: Now) {
        if self.waiters.borrow().is_empty() {
            return;
        }
        let lingering = self.lingering(rec, now);
        let (over, held): (Vec<Waiter>, Vec<Waiter>) = self
            .waiters
            .borrow()
            .iter()
            .partition(|w| api::wait_end(rec.state, w.timed_out(now), lingering).is_some());
        if !held.is_empty() {
            self.renew_hold();
        }
        *self.waiters.borrow_mut() = held;
        for w in over {
            if let Some(end) = api::wait_end(rec.state, w.timed_out(now), lingering) {
                let reply = self.wait_reply(end, rec);
                send(self.host(), Some(w.context_id), &reply);
            }
        }
    }

    /// Whether CLOSED began less than `scrape_interval` ago: a held preStop
    /// answer waits for a scrape to see it.
    fn lingering(&self, rec: &Record, now: Now) -> bool {
        rec.closed_ms
            .is_some_and(|at| !now.passed(at, None, self.config.scrape_interval_ms))
    }

    fn forget(&self, context_id: u32) {
        self.waiters
            .borrow_mut()
            .retain(|w| w.context_id != context_id);
    }
}

pub struct HealthStream {
    context_id: u32,
    health: Rc<Health>,
}

impl HealthStream {
    pub fn new(context_id: u32, health: Rc<Health>) -> HealthStream {
        HealthStream { context_id, health }
    }
}

fn header(name: &str) -> Option<String> {
    match hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name) {
        Ok(Some(v)) => String::from_utf8(v).ok(),
        _ => None,
    }
}

/// The downstream peer address (`source.address` is "ip:port").
fn source_ip() -> Option<IpAddr> {
    let bytes = hostcalls::get_property(vec!["source", "address"]).ok()??;
    crate::net::peer_ip(&bytes)
}

impl Context for HealthStream {}

impl HttpContext for HealthStream {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let method = header(":method").unwrap_or_default();
        let path = header(":path").unwrap_or_default();
        let if_none_match = header("if-none-match");
        let authorization = header("authorization");
        let req = api::Request {
            method: &method,
            path: &path,
            if_none_match: if_none_match.as_deref(),
            authorization: authorization.as_deref(),
            source: source_ip(),
        };
        if let Some(reply) = self.health.handle(&req, self.context_id) {
            send(self.health.host(), None, &reply);
        }
        // Answered locally or held: never forwarded.
        Action::Pause
    }
}

impl Drop for HealthStream {
    fn drop(&mut self) {
        self.health.forget(self.context_id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::config;
    use crate::host::count::Part;
    use crate::host::sim::Sim;
    use crate::host::traffic::{Traffic, TrafficStream};

    const T0: u64 = 1_764_000_000_000;

    /// A gateway in one simulated process: a health root and a traffic root
    /// (registered by its first tick), both with `extra` configuration.
    fn gateway<'a>(sim: &'a Sim, extra: &str) -> (Health<&'a Sim>, Rc<Traffic<&'a Sim>>) {
        let parse = |role: &str| {
            let mut raw: serde_json::Value = serde_json::from_str(extra).unwrap();
            raw["role"] = role.into();
            Config::parse(raw.to_string().as_bytes()).unwrap()
        };
        let traffic = Rc::new(Traffic::new(
            Part::Streams,
            Metrics::define(sim),
            &parse("traffic"),
        ));
        crate::host::liveness::ensure_registry(&sim);
        crate::host::count::announce_traffic(&sim);
        traffic.tick();
        let health = Health::new(parse("health"), Metrics::define(sim));
        health.tick();
        (health, traffic)
    }

    fn call(h: &Health<&Sim>, method: &str, path: &str, ctx: u32) -> Option<Reply> {
        let req = api::Request {
            method,
            path,
            source: Some("127.0.0.1".parse().unwrap()),
            ..api::Request::default()
        };
        h.handle(&req, ctx)
    }

    fn json(r: &Reply) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    fn state(h: &Health<&Sim>) -> State {
        h.store.load().unwrap().state
    }

    /// Both roots tick, `n` times, `ms` apart.
    fn ticks(sim: &Sim, h: &Health<&Sim>, t: &Traffic<&Sim>, n: usize, ms: u64) {
        for _ in 0..n {
            sim.advance(ms);
            t.tick();
            h.tick();
        }
    }

    #[test]
    fn a_drain_with_nothing_in_flight_is_closing_at_once_then_closed_after_lb_buffer() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
        let r = call(&h, "POST", "/drain", 1).unwrap();
        assert_eq!(
            (r.status, json(&r)["state"].as_str()),
            (200, Some("CLOSING"))
        );
        ticks(&sim, &h, &t, 9, 100);
        assert_eq!(state(&h), State::Closing, "lb_buffer not over");
        ticks(&sim, &h, &t, 1, 100);
        assert_eq!(state(&h), State::Closed);
    }

    #[test]
    fn a_stream_in_flight_holds_the_drain_and_its_end_flips_it() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{}"#);
        let stream = TrafficStream::new(Rc::clone(&t));
        call(&h, "POST", "/drain", 1).unwrap();
        ticks(&sim, &h, &t, 3, 100);
        assert_eq!(state(&h), State::Draining);
        let lb = call(&h, "GET", "/health_check.html", 2).unwrap();
        assert_eq!(lb.status, 200, "the LB check stays 200 while it runs");
        drop(stream);
        assert_eq!(state(&h), State::Closing, "flipped by the stream's own end");
    }

    #[test]
    fn without_a_traffic_role_the_gateway_waits_and_a_drain_never_trusts_zero() {
        let sim = Sim::at(T0);
        let config = Config::parse(br#"{"role":"health","drain_timeout":"2s"}"#).unwrap();
        let h = Health::new(config, Metrics::define(&sim));
        h.tick();
        let lb = call(&h, "GET", "/health_check.html", 1).unwrap();
        assert_eq!((lb.status, lb.body.as_slice()), (503, b"WAIT\n".as_slice()));
        let r = call(&h, "POST", "/drain", 2).unwrap();
        assert_eq!(
            json(&r)["state"],
            "DRAINING",
            "an unseen traffic role is not a 0"
        );
        assert_eq!(
            json(&r)["count"]["unreliable_reason"],
            "traffic_role_not_seen"
        );
        for _ in 0..21 {
            sim.advance(100);
            h.tick();
        }
        let rec = h.store.load().unwrap();
        assert_eq!(
            (rec.state, rec.reason),
            (State::Closing, fsm::Reason::DrainTimeout)
        );
    }

    #[test]
    fn a_held_wait_answers_at_closed_on_its_own_stream() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"500ms"}"#);
        assert!(call(&h, "POST", "/drain?wait=closed", 7).is_none(), "held");
        assert!(sim.answers.borrow().is_empty());
        ticks(&sim, &h, &t, 5, 100);
        let answers = sim.answers.borrow();
        assert_eq!(answers.len(), 1);
        let a = &answers[0];
        assert_eq!((a.context_id, a.status), (Some(7), 200));
        assert_eq!(
            (a.json()["state"].as_str(), a.json()["wait"].as_str()),
            (Some("CLOSED"), Some("closed"))
        );
    }

    #[test]
    fn a_held_wait_times_out_with_a_small_504_and_the_drain_goes_on() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{}"#);
        let _stream = TrafficStream::new(Rc::clone(&t));
        assert!(call(&h, "GET", "/prestop?timeout=1s", 3).is_none());
        ticks(&sim, &h, &t, 9, 100);
        assert!(sim.answers.borrow().is_empty(), "0.9 s: still held");
        ticks(&sim, &h, &t, 1, 100);
        let a = sim.answers.borrow()[0].clone();
        assert_eq!((a.context_id, a.status), (Some(3), 504));
        assert_eq!(a.json()["error"], "wait_timeout");
        assert_eq!(state(&h), State::Draining);
    }

    #[test]
    fn a_held_wait_holds_reopen_until_its_lease_runs_out() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{}"#);
        let _stream = TrafficStream::new(Rc::clone(&t));
        assert!(call(&h, "POST", "/drain?wait=closed", 4).is_none());
        ticks(&sim, &h, &t, 30, 100); // renewed by every tick while held
        let r = call(&h, "POST", "/reopen", 5).unwrap();
        assert_eq!(
            (r.status, json(&r)["error"].as_str()),
            (409, Some("prestop_hold"))
        );
        // The caller hung up: nothing renews the hold, which expires after its lease.
        h.forget(4);
        ticks(&sim, &h, &t, 19, 100);
        assert_eq!(
            call(&h, "POST", "/reopen", 6).unwrap().status,
            409,
            "1.9 s: held"
        );
        ticks(&sim, &h, &t, 1, 100);
        assert_eq!(call(&h, "POST", "/reopen", 6).unwrap().status, 200);
    }

    #[test]
    fn a_forced_reopen_aborts_the_held_wait() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{}"#);
        let _stream = TrafficStream::new(Rc::clone(&t));
        assert!(call(&h, "POST", "/drain?wait=closed", 4).is_none());
        let r = call(&h, "POST", "/reopen?force=true", 5).unwrap();
        assert_eq!((r.status, json(&r)["state"].as_str()), (200, Some("OPEN")));
        ticks(&sim, &h, &t, 1, 100);
        let a = sim.answers.borrow()[0].clone();
        assert_eq!((a.context_id, a.status), (Some(4), 409));
        assert_eq!(a.json()["error"], "drain_aborted");
    }

    #[test]
    fn a_gated_soft_drain_flips_on_the_404_that_completes_it() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"draining_lb_status":404}"#);
        assert_eq!(
            call(&h, "GET", "/health_check.html", 1).unwrap().status,
            200
        );
        let r = call(&h, "POST", "/drain", 2).unwrap();
        assert_eq!(
            json(&r)["state"],
            "DRAINING",
            "the LB has not been served the 404"
        );
        ticks(&sim, &h, &t, 5, 100);
        assert_eq!(state(&h), State::Draining);
        let lb = call(&h, "GET", "/health_check.html", 3).unwrap();
        assert_eq!(lb.status, 404);
        assert_eq!(state(&h), State::Closing, "the 404 itself flipped it");
    }

    #[test]
    fn the_rotation_goes_out_once_at_the_flip_not_at_the_drain_start() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
        let stream = TrafficStream::new(Rc::clone(&t));
        call(&h, "POST", "/drain", 1).unwrap();
        ticks(&sim, &h, &t, 5, 100);
        assert!(
            sim.calls.borrow().is_empty(),
            "200 while draining: connections kept"
        );
        drop(stream); // the flip
        assert!(
            sim.calls.borrow().is_empty(),
            "not from a stream's callback"
        );
        ticks(&sim, &h, &t, 3, 100);
        let calls = sim.calls.borrow().clone();
        assert_eq!(calls.len(), 1, "once per drain");
        assert_eq!(calls[0].cluster, crate::rotation::DEFAULT_CLUSTER);
        assert!(calls[0]
            .headers
            .contains(&(":path".to_string(), crate::rotation::ADMIN_PATH.to_string())));
        sim.call_status.set(Some(200));
        h.rotator.answered(calls[0].token, 3);
        let status = json(&call(&h, "GET", "/drain/status", 2).unwrap());
        let last = &status["connection_rotation"]["last"];
        assert_eq!(
            (last["outcome"].as_str(), last["trigger"].as_str()),
            (Some("done"), Some("flip"))
        );
        // A second health root (another worker) finds the drain's rotation claimed.
        let other = Health::new(h.config.clone(), Metrics::define(&sim));
        other.tick();
        assert_eq!(sim.calls.borrow().len(), 1);
    }

    #[test]
    fn a_soft_drain_rotates_once_the_lb_was_served_its_404() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"draining_lb_status":404,"lb_buffer":"60m"}"#);
        let _stream = TrafficStream::new(Rc::clone(&t));
        assert_eq!(
            call(&h, "GET", "/health_check.html", 1).unwrap().status,
            200
        );
        call(&h, "POST", "/drain", 2).unwrap();
        ticks(&sim, &h, &t, 3, 100);
        assert!(
            sim.calls.borrow().is_empty(),
            "the LB still sends new connections here"
        );
        assert_eq!(
            call(&h, "GET", "/health_check.html", 3).unwrap().status,
            404
        );
        ticks(&sim, &h, &t, 1, 100);
        assert_eq!(
            sim.calls.borrow().len(),
            1,
            "NOLB: a reconnect goes elsewhere now"
        );
        assert_eq!(state(&h), State::Draining, "the stream still runs");
    }

    #[test]
    fn a_maintenance_drain_neither_rotates_nor_closes() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
        let r = call(&h, "POST", "/drain?hold=closing", 1).unwrap();
        assert_eq!(json(&r)["state"], "CLOSING");
        ticks(&sim, &h, &t, 30, 100);
        assert_eq!(state(&h), State::Closing);
        assert!(sim.calls.borrow().is_empty());
        assert_eq!(call(&h, "POST", "/reopen", 2).unwrap().status, 200);
    }

    fn placeholder(sim: &Sim) -> crate::host::placeholder::Stand<&Sim> {
        crate::host::placeholder::ensure(&sim);
        let p = crate::host::placeholder::Stand::new(sim);
        p.tick();
        p
    }

    #[test]
    fn a_placeholder_keeps_a_gateway_no_lb_check_saw_out_until_it_goes() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{}"#);
        let p = placeholder(&sim);
        ticks(&sim, &h, &t, 1, 100);
        let lb = call(&h, "GET", "/health_check.html", 1).unwrap();
        assert_eq!((lb.status, lb.body.as_slice()), (503, b"WAIT\n".as_slice()));
        let ready = call(&h, "GET", "/health", 2).unwrap();
        assert_eq!(
            (ready.status, json(&ready)["waiting_for"].as_str()),
            (503, Some("filter_config"))
        );
        let st = json(&call(&h, "GET", "/drain/status", 3).unwrap());
        assert_eq!(
            (
                st["waiting_for"].as_str(),
                st["traffic"]["placeholders"].as_u64()
            ),
            (Some("filter_config"), Some(1))
        );
        // Its request (a new pod's listener warm without the filter's configuration): still out, not drained.
        p.serve();
        ticks(&sim, &h, &t, 3, 100);
        assert_eq!(
            call(&h, "GET", "/health_check.html", 4).unwrap().status,
            503
        );
        assert_eq!(state(&h), State::Open);
        // The filter got its own configuration: Envoy removes the placeholder.
        drop(p);
        ticks(&sim, &h, &t, 1, 100);
        assert_eq!(
            call(&h, "GET", "/health_check.html", 5).unwrap().status,
            200
        );
        assert_eq!(call(&h, "GET", "/health", 6).unwrap().status, 200);
    }

    #[test]
    fn a_placeholder_that_serves_on_an_announced_gateway_drains_it_and_cuts_nothing() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
        assert_eq!(
            call(&h, "GET", "/health_check.html", 1).unwrap().status,
            200,
            "announced"
        );
        let p = placeholder(&sim);
        ticks(&sim, &h, &t, 5, 100);
        assert_eq!(
            (
                call(&h, "GET", "/health_check.html", 2).unwrap().status,
                state(&h)
            ),
            (200, State::Open),
            "present only: a listener still warming, the previous one serves"
        );
        // The listener went live without the filter's configuration: a request passes the placeholder.
        let stream = TrafficStream::new(Rc::clone(&t));
        p.serve();
        ticks(&sim, &h, &t, 1, 100);
        let st = json(&call(&h, "GET", "/drain/status", 3).unwrap());
        assert_eq!(
            (st["state"].as_str(), st["progress"]["reason"].as_str()),
            (Some("DRAINING"), Some("filter_not_loaded"))
        );
        assert_eq!(st["waiting_for"], serde_json::Value::Null);
        assert_eq!(
            call(&h, "GET", "/health_check.html", 4).unwrap().status,
            200,
            "its stream runs"
        );
        drop(stream);
        ticks(&sim, &h, &t, 1, 100);
        assert_eq!(
            call(&h, "GET", "/health_check.html", 5).unwrap().status,
            503,
            "flipped at its end"
        );
        ticks(&sim, &h, &t, 30, 100);
        assert_eq!(
            state(&h),
            State::Closing,
            "held, as a maintenance drain: no lb_buffer close"
        );
        // Reopened while the placeholder still serves: out again at the next tick.
        assert_eq!(call(&h, "POST", "/reopen", 6).unwrap().status, 200);
        ticks(&sim, &h, &t, 1, 100);
        assert_eq!(state(&h), State::Closing);
        // Once the filter loaded (the placeholder gone), a reopen stays.
        drop(p);
        assert_eq!(call(&h, "POST", "/reopen", 7).unwrap().status, 200);
        ticks(&sim, &h, &t, 5, 100);
        assert_eq!(state(&h), State::Open);
        assert!(
            sim.calls.borrow().is_empty(),
            "it never rotated connections"
        );
    }

    #[test]
    fn a_wait_asked_for_in_fault_says_so_and_one_aborted_by_a_fault_says_that() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{}"#);
        let _stream = TrafficStream::new(Rc::clone(&t));
        assert!(call(&h, "GET", "/prestop", 1).is_none());
        assert_eq!(call(&h, "POST", "/fault", 2).unwrap().status, 200);
        ticks(&sim, &h, &t, 1, 100);
        let aborted = sim.answers.borrow()[0].clone();
        assert_eq!(
            (aborted.status, aborted.json()["error"].as_str()),
            (409, Some("drain_aborted"))
        );
        for (method, path) in [("GET", "/prestop"), ("POST", "/drain?wait=closed")] {
            let r = call(&h, method, path, 3).unwrap();
            assert_eq!(
                (r.status, json(&r)["error"].as_str()),
                (409, Some("in_fault")),
                "{path}"
            );
            assert_eq!(json(&r)["wait"], "fault");
        }
    }

    /// How a stream of these tests ends (what `on_log` reads).
    #[derive(Clone, Copy)]
    enum How {
        /// Its response ended: the upstream's answer.
        Completed,
        /// Its response ended: Envoy's own answer, with these code details.
        Local(&'static str),
        /// Its response did not end: these response flags.
        Flags(u64),
    }

    fn end_with(sim: &Sim, mut stream: TrafficStream<&Sim>, how: How) {
        let details = match how {
            How::Completed => "via_upstream",
            How::Local(d) => d,
            How::Flags(flags) => {
                sim.set_flags(flags);
                "via_upstream"
            }
        };
        stream.response(!matches!(how, How::Flags(_)));
        sim.set_property("response.code_details", details.as_bytes());
        stream.log();
        drop(stream);
    }

    /// `/drain/status`'s receipt once the traffic root's tick added what it
    /// sorted to the drain's tally.
    fn receipt_after_tick(h: &Health<&Sim>, t: &Traffic<&Sim>) -> serde_json::Value {
        t.tick();
        json(&call(h, "GET", "/drain/status", 9).unwrap())["receipt"].clone()
    }

    /// The `event=drain_receipt` lines logged so far on this test's thread,
    /// each as its fields.
    fn receipt_lines() -> Vec<std::collections::HashMap<String, String>> {
        logs::taken()
            .iter()
            .filter(|l| l.starts_with("event=drain_receipt "))
            .map(|l| {
                l.split(' ')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn ends_during_a_drain_are_sorted_and_the_lb_s_cuts_attributed() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
        let outside = TrafficStream::new(Rc::clone(&t));
        end_with(&sim, outside, How::Flags(0x4000)); // a client abort while OPEN: not a drain's
        let streams: Vec<_> = (0..6).map(|_| TrafficStream::new(Rc::clone(&t))).collect();
        let held = TrafficStream::new(Rc::clone(&t));
        call(&h, "POST", "/drain", 1).unwrap();
        ticks(&sim, &h, &t, 1, 100);
        let mut it = streams.into_iter();
        end_with(&sim, it.next().unwrap(), How::Completed);
        end_with(&sim, it.next().unwrap(), How::Flags(0x10)); // upstream reset
        end_with(&sim, it.next().unwrap(), How::Local("response_timeout")); // 504 UT
        end_with(
            &sim,
            it.next().unwrap(),
            How::Local("upstream_reset_before_response_started{remote_connection_failure}"),
        ); // 503 UF
        end_with(&sim, it.next().unwrap(), How::Flags(0x4000)); // a client that gave up
        assert_eq!(receipt_after_tick(&h, &t)["cut"], 1);
        // The LB is served 503 twice (lb_fall 2) after the flip: DOWN, and it
        // resets what it still carries.
        call(&h, "POST", "/close-lb", 3).unwrap();
        for _ in 0..2 {
            assert_eq!(
                call(&h, "GET", "/health_check.html", 4).unwrap().status,
                503
            );
            sim.advance(500);
        }
        end_with(&sim, it.next().unwrap(), How::Flags(0x1000_0000)); // RST_STREAM at DOWN
        sim.advance(3_000);
        end_with(&sim, held, How::Flags(0x4000)); // long after the DOWN: not the LB's
        let r = receipt_after_tick(&h, &t);
        assert_eq!(
            (
                r["cut"].as_u64(),
                r["cut_lb"].as_u64(),
                r["cut_other"].as_u64()
            ),
            (Some(3), Some(1), Some(2))
        );
        assert_eq!(
            (r["completed"].as_u64(), r["ended_upstream"].as_u64()),
            (Some(1), Some(3)),
            "Envoy's 504 and 503 are not completed: {r}"
        );
        assert_eq!(
            sim.metric(crate::metric_names::CUT),
            3,
            "the OPEN abort is not counted"
        );
        assert_eq!(sim.metric(crate::metric_names::CUT_LB), 1);
        assert_eq!(sim.metric(crate::metric_names::DRAIN_ENDED_UPSTREAM), 3);
    }

    #[test]
    fn a_connection_the_downstream_ended_first_is_a_cut_when_reset_or_at_the_lb_s_down() {
        use proxy_wasm::types::PeerType;
        let sim = Sim::at(T0);
        let (h, _t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
        let tcp = Rc::new(Traffic::new(
            Part::Connections,
            Metrics::define(&sim),
            &Config::parse(br#"{"role":"traffic_tcp"}"#).unwrap(),
        ));
        let conn = || TrafficStream::new(Rc::clone(&tcp));
        let (mut reset, mut upstream_first, mut done) = (conn(), conn(), conn());
        let (mut at_down, mut client_in_window, mut lb_in_window, mut late) =
            (conn(), conn(), conn(), conn());
        call(&h, "POST", "/drain", 1).unwrap();
        tcp.tick();
        reset.closed(true, PeerType::Remote); // a reset from the client side
        drop(reset);
        upstream_first.half_closed(false); // the upstream's FIN first ...
        upstream_first.half_closed(true);
        upstream_first.closed(false, PeerType::Unknown);
        upstream_first.closed(true, PeerType::Local); // ... then Envoy closed the client side
        drop(upstream_first);
        done.half_closed(true); // a client done with its connection: its FIN first ...
        done.half_closed(false); // ... answered by the upstream's
        done.closed(false, PeerType::Unknown);
        done.closed(true, PeerType::Local);
        drop(done);
        let r = receipt_after_tick(&h, &tcp);
        assert_eq!(
            (r["cut_tcp"].as_u64(), r["completed"].as_u64()),
            (Some(1), Some(2))
        );
        // The LB's DOWN (lb_fall 2, the checker at 127.0.0.1): HAProxy's
        // shutdown-sessions in mode tcp sends the gateway a FIN from its own
        // address, and its reset may follow before the upstream answers.
        call(&h, "POST", "/close-lb", 3).unwrap();
        for _ in 0..2 {
            assert_eq!(
                call(&h, "GET", "/health_check.html", 4).unwrap().status,
                503
            );
        }
        sim.advance(5);
        sim.set_property("source.address", b"127.0.0.1:40100");
        at_down.half_closed(true);
        at_down.closed(true, PeerType::Remote);
        drop(at_down);
        // Its 3rd and 4th 503 (a second backend's DOWN may come then) hold the
        // window open for its own address, 2 s past the 4th.
        for _ in 0..2 {
            sim.advance(1_000);
            call(&h, "GET", "/health_check.html", 4).unwrap();
        }
        sim.advance(1_500); // 3.5 s after the DOWN
        sim.set_property("source.address", b"10.1.2.3:51000");
        client_in_window.half_closed(true); // a client in the cluster done with it
        client_in_window.half_closed(false);
        drop(client_in_window);
        sim.set_property("source.address", b"127.0.0.1:40101");
        lb_in_window.half_closed(true); // the checker's own address: its FIN is the LB's
        drop(lb_in_window);
        sim.advance(6_500); // 10 s after the DOWN: a FIN is a client's again
        late.half_closed(true);
        late.half_closed(false);
        late.closed(true, PeerType::Local);
        drop(late);
        let r = receipt_after_tick(&h, &tcp);
        assert_eq!(
            (
                r["cut_tcp"].as_u64(),
                r["cut_lb"].as_u64(),
                r["completed"].as_u64()
            ),
            (Some(3), Some(2), Some(4)),
            "{r}"
        );
    }

    #[test]
    fn refuse_mode_answers_new_requests_503_while_draining_and_stops_at_reopen() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(
            &sim,
            r#"{"draining_new_requests":"refuse","lb_buffer":"60m"}"#,
        );
        let mut before = TrafficStream::new(Rc::clone(&t));
        assert_eq!(before.request_headers(), Action::Continue, "OPEN: served");
        call(&h, "POST", "/drain?hold=closing", 1).unwrap();
        ticks(&sim, &h, &t, 1, 100);
        let mut new = TrafficStream::new(Rc::clone(&t));
        assert_eq!(new.request_headers(), Action::Pause);
        let a = sim.answers.borrow().last().cloned().unwrap();
        assert_eq!(
            (a.context_id, a.status, a.json()["error"].as_str()),
            (None, 503, Some("draining"))
        );
        assert!(a
            .headers
            .contains(&("x-drain-gate".to_string(), "refused; draining".to_string())));
        new.log();
        drop(new);
        t.tick(); // the drain's ends are in its tally from the root's tick
        let st = json(&call(&h, "GET", "/drain/status", 2).unwrap());
        assert_eq!(
            st["refusing"],
            serde_json::json!({"mode": "refuse", "grpc": "serve", "refuse_with": "response",
                               "active": true, "this_drain": 1})
        );
        assert_eq!(sim.metric(crate::metric_names::REFUSED), 1);
        assert_eq!(call(&h, "POST", "/reopen", 3).unwrap().status, 200);
        let mut after = TrafficStream::new(Rc::clone(&t));
        assert_eq!(
            after.request_headers(),
            Action::Continue,
            "reopened: served at once, before a tick"
        );
        drop((before, after));
    }

    /// A refusing drain, and `n` new requests with `content_type`: what each met.
    fn refusing(config: &str, content_type: &str, n: usize) -> (Sim, Vec<Action>) {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, config);
        call(&h, "POST", "/drain?hold=closing", 1).unwrap();
        ticks(&sim, &h, &t, 1, 100);
        sim.request_headers
            .borrow_mut()
            .insert("content-type".into(), content_type.into());
        let mut met = Vec::new();
        for _ in 0..n {
            let mut s = TrafficStream::new(Rc::clone(&t));
            met.push(s.request_headers());
            s.response_headers(true);
            s.log();
        }
        let st = json(&call(&h, "GET", "/drain/status", 2).unwrap());
        assert_eq!(
            st["receipt"]["refused"],
            sim.metric(crate::metric_names::REFUSED)
        );
        drop((h, t));
        (sim, met)
    }

    #[test]
    fn grpc_is_served_while_refusing_unless_refused_too_then_answered_503() {
        let refuse = r#""draining_new_requests":"refuse","lb_buffer":"60m""#;
        let (sim, met) = refusing(&format!("{{{refuse}}}"), "application/grpc", 2);
        assert_eq!(met, [Action::Continue; 2], "gRPC served by default");
        assert!(sim.answers.borrow().is_empty());
        assert_eq!(sim.metric(crate::metric_names::REFUSED), 0);
        let (sim, met) = refusing(&format!("{{{refuse}}}"), "application/json", 1);
        assert_eq!(met, [Action::Pause]);
        assert!(
            sim.response_headers.borrow().is_empty(),
            "not gRPC: the 503 as sent"
        );
        let grpc_too = format!(r#"{{{refuse},"draining_grpc_requests":"refuse"}}"#);
        let (sim, met) = refusing(&grpc_too, "application/grpc+proto", 2);
        assert_eq!(met, [Action::Pause; 2]);
        assert_eq!(sim.answers.borrow().len(), 2);
        assert_eq!(sim.answers.borrow()[0].status, 503);
        // Envoy made the answer 200 + grpc-status 14: each gets its 503 back, once.
        let restored = (":status".to_string(), "503".to_string());
        assert_eq!(*sim.response_headers.borrow(), [restored.clone(), restored]);
        assert_eq!(sim.metric(crate::metric_names::REFUSED), 2);
    }

    #[test]
    fn refuse_with_reset_resets_with_no_answer_and_counts_it_refused() {
        let reset = r#"{"draining_new_requests":"refuse","refuse_with":"reset","lb_buffer":"60m""#;
        let (sim, met) = refusing(&format!("{reset}}}"), "text/plain", 3);
        assert_eq!(met, [Action::Pause; 3]);
        assert_eq!(sim.resets.get(), 3);
        assert!(sim.answers.borrow().is_empty() && sim.response_headers.borrow().is_empty());
        assert_eq!(sim.metric(crate::metric_names::REFUSED), 3);
        let (sim, met) = refusing(&format!("{reset}}}"), "application/grpc", 1);
        assert_eq!(
            (met, sim.resets.get()),
            (vec![Action::Continue], 0),
            "gRPC served"
        );
        let all = format!(r#"{reset},"draining_grpc_requests":"refuse"}}"#);
        let (sim, met) = refusing(&all, "application/grpc", 1);
        assert_eq!((met, sim.resets.get()), (vec![Action::Pause], 1));
    }

    #[test]
    fn a_drain_s_receipt_is_logged_once_when_it_ends() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
        let s = TrafficStream::new(Rc::clone(&t));
        call(&h, "POST", "/drain", 1).unwrap();
        ticks(&sim, &h, &t, 1, 100);
        end_with(&sim, s, How::Completed);
        ticks(&sim, &h, &t, 12, 100);
        let rec = h.store.load().unwrap();
        assert_eq!(rec.state, State::Closed);
        assert!(rec.receipt_logged && rec.flip_recorded && rec.owed_line.is_none());
        let lines = receipt_lines();
        assert_eq!(lines.len(), 1, "once");
        assert_eq!(
            (lines[0]["ended"].as_str(), lines[0]["completed"].as_str()),
            ("CLOSED", "1")
        );
        ticks(&sim, &h, &t, 5, 100);
        assert!(receipt_lines().is_empty(), "once, whatever the ticks");
    }

    #[test]
    fn what_completed_after_the_last_traffic_tick_is_in_the_receipt() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
        call(&h, "POST", "/drain", 1).unwrap(); // nothing in flight: CLOSING at once
        ticks(&sim, &h, &t, 1, 100);
        let late = TrafficStream::new(Rc::clone(&t)); // the LB still sends in CLOSING
        sim.advance(1_000);
        end_with(&sim, late, How::Completed); // completed after its traffic root's last tick
        h.tick();
        let rec = h.store.load().unwrap();
        assert_eq!(rec.state, State::Closed);
        assert!(
            rec.owed_line.is_some(),
            "owed, but its traffic root has not counted it yet"
        );
        assert_eq!(sim.metric(crate::metric_names::DRAIN_COMPLETED), 0);
        ticks(&sim, &h, &t, 1, 100);
        assert!(
            h.store.load().unwrap().owed_line.is_none(),
            "logged a tick later"
        );
        assert_eq!(sim.metric(crate::metric_names::DRAIN_COMPLETED), 1);
        let lines = receipt_lines();
        assert_eq!((lines.len(), lines[0]["completed"].as_str()), (1, "1"));
    }

    #[test]
    fn a_reopen_and_a_new_drain_within_a_tick_log_one_receipt_each_with_its_own_ends() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
        let first: Vec<_> = (0..4).map(|_| TrafficStream::new(Rc::clone(&t))).collect();
        let second: Vec<_> = (0..3).map(|_| TrafficStream::new(Rc::clone(&t))).collect();
        call(&h, "POST", "/drain", 1).unwrap();
        ticks(&sim, &h, &t, 1, 100);
        let mut it = first.into_iter();
        end_with(&sim, it.next().unwrap(), How::Completed);
        end_with(&sim, it.next().unwrap(), How::Flags(0x4000)); // a client gave up
        end_with(&sim, it.next().unwrap(), How::Local("response_timeout"));
        // Reopened and drained again before any tick: the first drain's line
        // is still owed when the second begins.
        assert_eq!(call(&h, "POST", "/reopen", 2).unwrap().status, 200);
        assert_eq!(call(&h, "POST", "/drain", 3).unwrap().status, 200);
        let rec = h.store.load().unwrap();
        assert_eq!(
            (rec.state, rec.owed_line.is_some()),
            (State::Draining, true)
        );
        end_with(&sim, it.next().unwrap(), How::Completed); // the traffic root still sees drain 1
        ticks(&sim, &h, &t, 1, 100); // ... until its tick: from here on, drain 2
        for s in second {
            end_with(&sim, s, How::Flags(0x1000_0000));
        }
        assert_eq!(call(&h, "POST", "/reopen", 4).unwrap().status, 200);
        ticks(&sim, &h, &t, 3, 100);
        let lines = receipt_lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        let counts = |l: &std::collections::HashMap<String, String>| {
            ["ended", "completed", "cut", "ended_upstream"].map(|k| l[k].clone())
        };
        assert_eq!(counts(&lines[0]), ["OPEN", "2", "1", "1"]);
        assert_eq!(counts(&lines[1]), ["OPEN", "0", "3", "0"]);
        assert_ne!(lines[0]["started"], lines[1]["started"]);
        assert!(h.store.load().unwrap().owed_line.is_none());
    }

    #[test]
    fn a_sigterm_before_closed_while_the_prestop_is_held_is_in_the_receipt() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"termination_watch":"agent","lb_buffer":"60m"}"#);
        let s = TrafficStream::new(Rc::clone(&t));
        call(&h, "POST", "/drain", 1).unwrap();
        ticks(&sim, &h, &t, 2, 100);
        assert!(
            sim.calls.borrow().is_empty(),
            "no preStop held: nothing watched"
        );
        assert!(
            call(&h, "POST", "/drain?wait=closed", 2).is_none(),
            "the preStop, held"
        );
        ticks(&sim, &h, &t, 3, 100);
        let calls = sim.calls.borrow().clone();
        assert_eq!(calls.len(), 1, "one call at a time");
        assert_eq!(calls[0].cluster, "agent");
        assert!(calls[0]
            .headers
            .contains(&(":path".to_string(), termination::READY_PATH.to_string())));
        sim.call_status.set(Some(200));
        assert!(
            !h.termination.answered(calls[0].token, 3),
            "ready: no SIGTERM yet"
        );
        ticks(&sim, &h, &t, 1, 100);
        let token = sim.calls.borrow().last().unwrap().token;
        sim.call_status.set(Some(503)); // pilot-agent: "server is terminated"
        assert!(h.termination.answered(token, 3));
        h.sigterm();
        h.sigterm(); // another worker's answer: once per drain
        assert_eq!(sim.metric(crate::metric_names::DRAINS_CUT_SHORT), 1);
        end_with(&sim, s, How::Flags(0x4000)); // Envoy ends with the pod
        ticks(&sim, &h, &t, 2, 100);
        let lines = receipt_lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(
            (lines[0]["ended"].as_str(), lines[0]["closed"].as_str()),
            ("SIGTERM", "-")
        );
        call(&h, "POST", "/close", 3).unwrap();
        ticks(&sim, &h, &t, 3, 100);
        assert!(
            receipt_lines().is_empty(),
            "one line per drain: CLOSED adds none"
        );
    }

    #[test]
    fn without_the_watch_or_a_call_answered_nothing_is_cut_short() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
        let _s = TrafficStream::new(Rc::clone(&t));
        assert!(call(&h, "POST", "/drain?wait=closed", 1).is_none());
        ticks(&sim, &h, &t, 5, 100);
        assert!(
            sim.calls.borrow().is_empty(),
            "termination_watch is off by default"
        );
        let (h, t) = gateway(&sim, r#"{"termination_watch":true,"lb_buffer":"60m"}"#);
        let _s = TrafficStream::new(Rc::clone(&t));
        assert!(call(&h, "POST", "/drain?wait=closed", 2).is_none());
        ticks(&sim, &h, &t, 1, 100);
        let token = sim.calls.borrow().last().unwrap().token;
        assert_eq!(
            sim.calls.borrow().last().unwrap().cluster,
            config::AGENT_CLUSTER
        );
        assert!(!h.termination.answered(token, 0), "no answer says nothing");
        assert!(!h.termination.answered(token + 100, 3), "not its call");
    }

    #[test]
    fn a_held_prestop_answer_comes_a_scrape_interval_after_closed() {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"lb_buffer":"500ms","scrape_interval":"2s"}"#);
        assert!(call(&h, "POST", "/drain?wait=closed", 7).is_none());
        while state(&h) != State::Closed {
            ticks(&sim, &h, &t, 1, 100);
        }
        ticks(&sim, &h, &t, 19, 100);
        assert!(
            sim.answers.borrow().is_empty(),
            "1.9 s after CLOSED: still held"
        );
        ticks(&sim, &h, &t, 1, 100);
        let a = sim.answers.borrow()[0].clone();
        assert_eq!(
            (a.context_id, a.status, a.json()["wait"].as_str()),
            (Some(7), 200, Some("closed"))
        );
    }

    /// A gateway DRAINING with nothing in flight, its `min_drain` `min`, ticked
    /// once since the drain began.
    fn draining_with_min_drain<'a>(
        sim: &'a Sim,
        min: &str,
    ) -> (Health<&'a Sim>, Rc<Traffic<&'a Sim>>) {
        let config = format!(r#"{{"min_drain":"{min}","drain_timeout":"60m","lb_buffer":"60m"}}"#);
        let (h, t) = gateway(sim, &config);
        call(&h, "POST", "/drain", 1).unwrap();
        ticks(sim, &h, &t, 1, 100);
        (h, t)
    }

    #[test]
    fn a_drain_held_open_costs_a_stream_next_to_nothing() {
        let sim = Sim::at(T0);
        let (h, t) = draining_with_min_drain(&sim, "60m");
        let before = sim.host_calls.get();
        for _ in 0..100 {
            end_with(&sim, TrafficStream::new(Rc::clone(&t)), How::Completed); // each brings the count to 0
        }
        // The lease counts the streams while the minimum holds, the receipt
        // reads how each ended (one property) and adds it up for the tick, and
        // nothing reads the state, the count or the record.
        let calls = sim.host_calls.get() - before;
        let per_stream = calls as f64 / 100.0;
        assert!(per_stream <= 1.2, "{per_stream} host calls per stream");
        assert_eq!(state(&h), State::Draining);
    }

    #[test]
    fn a_drain_held_by_min_drain_never_reads_below_its_stream_and_flips_at_its_end() {
        let sim = Sim::at(T0);
        let (h, t) = draining_with_min_drain(&sim, "1s");
        let s = TrafficStream::new(Rc::clone(&t));
        for _ in 0..12 {
            assert!(sim.metric(crate::metric_names::ACTIVE_REQUESTS) >= 1);
            ticks(&sim, &h, &t, 1, 100);
        }
        assert_eq!(
            state(&h),
            State::Draining,
            "its stream holds it past min_drain"
        );
        assert_eq!(
            sim.metric(crate::metric_names::ACTIVE_REQUESTS),
            1,
            "exact once it ended"
        );
        end_with(&sim, s, How::Completed);
        assert_eq!(state(&h), State::Closing, "flipped by the stream's own end");
        assert!(!h.store.load().unwrap().reason.forced());
    }

    #[test]
    fn streams_that_ended_while_min_drain_held_leave_the_flip_to_its_end() {
        let sim = Sim::at(T0);
        let (h, t) = draining_with_min_drain(&sim, "1s");
        for _ in 0..20 {
            end_with(&sim, TrafficStream::new(Rc::clone(&t)), How::Completed);
        }
        ticks(&sim, &h, &t, 8, 100);
        assert_eq!(state(&h), State::Draining, "min_drain not over");
        ticks(&sim, &h, &t, 3, 100);
        assert_eq!(
            state(&h),
            State::Closing,
            "within a tick of min_drain's end"
        );
        assert_eq!(sim.metric(crate::metric_names::ACTIVE_REQUESTS), 0);
    }

    #[test]
    fn an_unreadable_record_fails_closed_with_503() {
        let sim = Sim::at(T0);
        let (h, _t) = gateway(&sim, r#"{}"#);
        sim.put(crate::host::keys::FSM, b"{not json");
        // Checks answer from the state gauge until a tick finds the record
        // unreadable; the status document reads the record at once.
        assert_eq!(call(&h, "GET", "/drain/status", 1).unwrap().status, 503);
        h.tick();
        for path in ["/health_check.html", "/health", "/drain/status"] {
            let r = call(&h, "GET", path, 1).unwrap();
            assert_eq!(
                (r.status, json(&r)["error"].as_str()),
                (503, Some("state_unavailable"))
            );
        }
    }

    #[test]
    fn a_check_that_changes_nothing_reads_two_values_and_writes_none() {
        let sim = Sim::at(T0);
        let (h, _t) = gateway(&sim, r#"{}"#);
        assert_eq!(
            call(&h, "GET", "/health_check.html", 1).unwrap().status,
            200
        );
        let lb = sim.value(crate::host::keys::LB);
        let before = sim.host_calls.get();
        for _ in 0..10 {
            assert_eq!(
                call(&h, "GET", "/health_check.html", 1).unwrap().status,
                200
            );
        }
        // Per check: the state gauge, the clock (two calls: wall and
        // monotonic), the LB record (remembered by version, so not parsed) —
        // and no write. (Reading the request's headers and source, and the
        // answer, are the stream's own calls, outside the `Host` trait: `make
        // cost` counts those too.)
        assert_eq!((sim.host_calls.get() - before) / 10, 4);
        assert_eq!(sim.value(crate::host::keys::LB), lb);
        // What does change is written: the 404 of a soft drain.
        let (h, _t) = gateway(&sim, r#"{"draining_lb_status": 404}"#);
        call(&h, "POST", "/drain", 2).unwrap();
        assert_eq!(
            call(&h, "GET", "/health_check.html", 3).unwrap().status,
            404
        );
        assert_ne!(sim.value(crate::host::keys::LB), lb);
    }
}
