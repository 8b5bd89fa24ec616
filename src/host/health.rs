//! Health role: answers every request of the health listener locally from the
//! FSM (see `crate::api`), holds `wait=closed` answers, and runs the timers.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use std::cell::RefCell;
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use super::count::{Counts, Reading};
use super::in_flight;
use super::liveness::Watch;
use super::metrics::Metrics;
use super::rotation::Rotator;
use super::shared::{Envoy, Host};
use super::store::{self, Store};
use crate::api::{self, Audience, CountInfo, Endpoint, Reply, RotationView, TrafficInfo, View};
use crate::clock::{self, Now};
use crate::config::Config;
use crate::fsm::{self, CloseAfter, Move, Record, State};
use crate::lb::Checkers;
use crate::rotation;

/// What a status answer shows beyond the FSM record, read at once.
type Snapshot = (Reading, Checkers, TrafficInfo, Option<rotation::Record>);

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
    store: Store<H>,
    waiters: RefCell<Vec<Waiter>>,
    watch: Watch<H>,
}

/// Sends `reply` on the stream `context_id` (`None`: the current one).
fn send<H: Host>(host: &H, context_id: Option<u32>, reply: &Reply) {
    let headers: Vec<(&str, &str)> = reply
        .headers
        .iter()
        .map(|(n, v)| (*n, v.as_str()))
        .collect();
    if let Err(e) = host.respond(context_id, reply.status, &headers, &reply.body) {
        log::warn!("event=send_failed status={e:?}");
    }
}

/// Logs why the state could not be read; the answer is the core's.
fn unavailable(error: &dyn Display) -> Reply {
    log::error!("event=state_unavailable role=health error=\"{error}\"");
    api::unavailable()
}

impl<H: Host + Copy> Health<H> {
    pub fn new(config: Config, metrics: Metrics<H>) -> Health<H> {
        let host = *metrics.host();
        let counter = Counts::new(&metrics);
        let rotator = Rotator::new(host, config.rotate_connections.clone());
        let health = Health {
            config,
            counter,
            metrics,
            rotator,
            store: Store::new(host),
            waiters: RefCell::new(Vec::new()),
            watch: Watch::new(host),
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
            log::warn!("event=lb_record_unavailable error=\"{e}\"");
            Checkers::default()
        });
        let rotation = self.store.rotation_load().unwrap_or_else(|e| {
            log::warn!("event=rotation_record_unavailable error=\"{e}\"");
            None
        });
        let (reg, verdict) = self.watch.snapshot();
        let traffic = TrafficInfo {
            seen: !verdict.waiting,
            roots: reg.roots.len(),
            lost: reg.lost_total,
        };
        (self.counter.read(), checkers, traffic, rotation)
    }

    fn view<'a>(
        &'a self,
        rec: &'a Record,
        (reading, checkers, traffic, rotation): &'a Snapshot,
    ) -> View<'a> {
        let now = self.host().now();
        View {
            rec,
            active: reading.active,
            now,
            clock: self.clock_info(),
            in_flight: in_flight::read(self.host(), now.timer_ms()),
            count: CountInfo {
                source: self.counter.source_name(),
                reliable: reading.reliable,
                http_streams: reading.streams,
                tcp_connections: reading.connections,
                unreliable_reason: reading.why.map(|w| w.name()),
            },
            traffic: *traffic,
            draining_lb_status: self.config.draining_lb_status,
            checkers,
            lb_fall: self.config.lb_fall,
            close_after: self.config.close_after,
            rotation: RotationView {
                cluster: self.rotator.cluster(),
                last: rotation.as_ref(),
            },
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
            .and_then(|c| c.down_since(self.host().now().wall_ms, self.config.lb_fall))
    }

    /// Answers the LB check and remembers what this checker was served
    /// (only sources in `lb_checkers`). The 404 that completes what a gated
    /// soft drain waits for flips it at once if nothing is in flight.
    fn lb_check(&self, state: State, req: &api::Request) -> Reply {
        let reply = api::check(Audience::Lb, state, &self.config, req.if_none_match);
        let Some(ip) = req.source.filter(|ip| self.config.is_checker(*ip)) else {
            return reply;
        };
        let served = if reply.status == 304 {
            200
        } else {
            reply.status
        };
        if let Err(e) = self
            .store
            .lb_observe(&ip.to_string(), served, self.config.lb_fall)
        {
            log::warn!("event=lb_record_unavailable error=\"{e}\"");
        }
        if state == State::Draining && served == 404 {
            let active = self.counter.read().for_decisions();
            if let Err(e) = self
                .store
                .apply_due(active, self.lb_down_ms(), &self.metrics)
            {
                log::error!("event=state_unavailable role=health error=\"{e}\"");
            }
        }
        reply
    }

    /// Moves the FSM for an admin command, then applies whatever became due
    /// (a drain with nothing in flight flips at once).
    fn command(&self, cmd: api::Command) -> Result<Record, store::Error> {
        let choose = |r: &Record| Move {
            expected_from: cmd.expected_from(r.state),
            to: cmd.target(),
            reason: cmd.reason(),
            plan: Some(cmd.plan(&self.config)),
            force: cmd.force(),
        };
        let moved = self
            .store
            .advance(choose, self.counter.read().active, &self.metrics)?;
        self.rotator.moved(&moved);
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
        let rec = match self.store.load() {
            Ok(r) => r,
            Err(e) => return Some(unavailable(&e)),
        };
        match endpoint {
            Endpoint::Check(audience) if !self.watch.seen() => Some(api::check_waiting(
                audience,
                rec.state,
                &self.config,
                req.if_none_match,
            )),
            Endpoint::Check(Audience::Lb) => Some(self.lb_check(rec.state, req)),
            Endpoint::Check(audience) => Some(api::check(
                audience,
                rec.state,
                &self.config,
                req.if_none_match,
            )),
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

    /// Starts or joins a drain and holds the answer until it ends; a held
    /// answer is a preStop hold (`fsm::renew_hold`), and a maintenance drain
    /// it joins turns automatic (`fsm::resume`).
    fn drain_and_wait(&self, rec: Record, timeout_ms: u64, context_id: u32) -> Option<Reply> {
        let joined = match rec.state {
            State::Open => match self.command(api::Command::Drain) {
                Ok(next) => Ok(next),
                // Someone else started it first: join.
                Err(store::Error::Illegal(_)) => self.store.update(fsm::resume),
                Err(store::Error::Shared(e)) => Err(e),
            },
            _ => self.store.update(fsm::resume),
        };
        let rec = match joined {
            Ok(r) => r,
            Err(e) => return Some(unavailable(&e)),
        };
        if let Some(end) = api::wait_end(rec.state, false) {
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
        if let Err(e) = self.store.update(|r| fsm::renew_hold(r, now, lease)) {
            log::warn!("event=hold_unavailable error=\"{e}\"");
        }
    }

    /// Which clock the timers run on, and the wall-clock steps seen so far.
    fn clock_info(&self) -> api::ClockInfo {
        let steps = self.store.clock_steps().unwrap_or_else(|e| {
            log::warn!("event=clock_record_unavailable error=\"{e}\"");
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
                log::warn!(
                    "event=clock_step step_ms={by} wall={} steps={} timers={}",
                    api::rfc3339(now.wall_ms),
                    steps.count,
                    now.timers().name()
                );
                self.metrics.clock_step();
            }
            Ok(None) => {}
            Err(e) => log::warn!("event=clock_record_unavailable error=\"{e}\""),
        }
    }

    /// Runs every `tick` on each worker: the clock-step watch, automatic
    /// transitions, then the release of held answers that are over.
    pub fn tick(&self) {
        self.watch_clock();
        self.watch.tick(&self.metrics);
        let reading = self.counter.read();
        let rec =
            match self
                .store
                .apply_due(reading.for_decisions(), self.lb_down_ms(), &self.metrics)
            {
                Ok(r) => r,
                Err(e) => {
                    log::error!("event=state_unavailable role=health error=\"{e}\"");
                    return;
                }
            };
        self.metrics.sync_state(rec.state);
        self.rotator.tick(&rec);
        self.metrics.set_count_unreliable(!reading.reliable);
        let now = self.host().now();
        self.metrics
            .set_oldest_in_flight(in_flight::read(self.host(), now.timer_ms()).oldest_age_ms);
        if self.waiters.borrow().is_empty() {
            return;
        }
        let (over, held): (Vec<Waiter>, Vec<Waiter>) = self
            .waiters
            .borrow()
            .iter()
            .partition(|w| api::wait_end(rec.state, w.timed_out(now)).is_some());
        if !held.is_empty() {
            self.renew_hold();
        }
        *self.waiters.borrow_mut() = held;
        for w in over {
            if let Some(end) = api::wait_end(rec.state, w.timed_out(now)) {
                let reply = self.wait_reply(end, &rec);
                send(self.host(), Some(w.context_id), &reply);
            }
        }
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
        Ok(Some(v)) => Some(String::from_utf8_lossy(&v).into_owned()),
        _ => None,
    }
}

/// The downstream peer address (`source.address` is "ip:port").
fn source_ip() -> Option<IpAddr> {
    let bytes = hostcalls::get_property(vec!["source", "address"]).ok()??;
    let text = std::str::from_utf8(&bytes).ok()?;
    text.parse::<SocketAddr>()
        .map(|s| s.ip())
        .or_else(|_| text.parse::<IpAddr>())
        .ok()
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
