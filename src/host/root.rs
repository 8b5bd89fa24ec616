//! The root context: parses the plugin configuration once, picks the role,
//! and hands each HTTP stream (or, for `traffic_tcp`, each connection) the
//! role's shared state.

use proxy_wasm::traits::{Context, HttpContext, RootContext, StreamContext};
use proxy_wasm::types::{Action, ContextType, PeerType};
use std::cell::{Cell, OnceCell};
use std::rc::Rc;
use std::time::Duration;

use super::health::{Health, HealthStream};
use super::keys::{CLOCK, DURATIONS, FSM, LB, RECEIPT};
use super::logs;
use super::metrics::Metrics;
use super::shared::{ensure, ensure_json};
use super::wasm_host::{Envoy, Host};
use crate::config::Config;
use crate::gate::count::{self, Part};
use crate::gate::fsm::host::Store;
use crate::gate::liveness::host as liveness;
use crate::gate::placeholder::host::{self as placeholder, Stand};
use crate::gate::rotation::host as rotation;
use crate::gate::{clock::Steps, fsm::Record, lb::Checkers};
use crate::host::traffic::{Traffic, TrafficStream};

thread_local! {
    /// This VM's metric ids, defined once: Envoy does not deduplicate
    /// `define_metric`, and every root context of the VM — each filter
    /// configuration of every role, again on every reconfiguration — would
    /// otherwise define all of them again.
    static METRICS: OnceCell<Metrics> = const { OnceCell::new() };
}

/// The metrics of this VM (Envoy's root contexts define them once).
fn metrics(_: Envoy) -> Metrics {
    METRICS.with(|m| *m.get_or_init(|| Metrics::define(Envoy)))
}

/// Every stream or connection a root context hands the host, as one type:
/// the module then carries one copy of the SDK's context tables rather than
/// one per role. Each callback goes to the role's stream, which answers it as
/// the SDK's default does where the role has nothing to do.
enum Stream<H: Host> {
    /// Of an unconfigured root, or of a role loaded as the wrong kind of
    /// filter: does nothing.
    Passthrough,
    Traffic(TrafficStream<H>),
    Health(HealthStream<H>),
    /// A request through a placeholder: passed on, uncounted.
    Stand(Rc<Stand<H>>),
}

impl<H: Host> Stream<H> {
    /// Runs `f` on the traffic role's stream, the only one with callbacks
    /// past the request headers; every such callback continues.
    fn traffic<R>(&mut self, f: impl FnOnce(&mut TrafficStream<H>) -> R) -> Action {
        if let Stream::Traffic(t) = self {
            f(t);
        }
        Action::Continue
    }
}

impl<H: Host> Context for Stream<H> {}

impl<H: Host> HttpContext for Stream<H> {
    fn on_http_request_headers(&mut self, num_headers: usize, end_of_stream: bool) -> Action {
        if let Stream::Traffic(t) = self {
            return t.request_headers();
        }
        match self {
            Stream::Health(h) => h.on_http_request_headers(num_headers, end_of_stream),
            Stream::Stand(s) => {
                s.serve();
                Action::Continue
            }
            Stream::Traffic(_) | Stream::Passthrough => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        self.traffic(|t| t.response_headers(end_of_stream))
    }

    fn on_http_response_body(&mut self, _: usize, end_of_stream: bool) -> Action {
        self.traffic(|t| t.response(end_of_stream))
    }

    fn on_http_response_trailers(&mut self, _: usize) -> Action {
        self.traffic(|t| t.response(true))
    }

    fn on_log(&mut self) {
        self.traffic(TrafficStream::log);
    }
}

impl<H: Host> StreamContext for Stream<H> {
    fn on_downstream_data(&mut self, _: usize, end_of_stream: bool) -> Action {
        self.traffic(|t| end_of_stream.then(|| t.side_ended(true, None)))
    }

    fn on_upstream_data(&mut self, _: usize, end_of_stream: bool) -> Action {
        self.traffic(|t| end_of_stream.then(|| t.side_ended(false, None)))
    }

    fn on_downstream_close(&mut self, peer: PeerType) {
        self.traffic(|t| t.side_ended(true, Some(peer)));
    }

    fn on_upstream_close(&mut self, peer: PeerType) {
        self.traffic(|t| t.side_ended(false, Some(peer)));
    }
}

/// What a root context does, once configured.
pub enum Role<H: Host = Envoy> {
    /// Not (or not successfully) configured: creates no streams.
    Unconfigured,
    Traffic(Rc<Traffic<H>>),
    Health(Rc<Health<H>>),
    /// Stands in for a traffic filter without its configuration (`crate::gate::placeholder`).
    Placeholder(Rc<Stand<H>>),
}

/// A root context over the host `H` (Envoy in the module, the stand-in host
/// in `cargo test`).
pub struct Root<H: Host = Envoy> {
    pub role: Role<H>,
    /// The kind of filter this root sits in (an HTTP filter hands it streams,
    /// a network filter connections), learnt from the first context the host
    /// creates (see `get_type`).
    filter: Cell<Option<ContextType>>,
    host: H,
    /// This VM's metrics over `host`.
    metrics: fn(H) -> Metrics<H>,
}

impl Default for Root {
    fn default() -> Root {
        Root::new(Envoy, metrics)
    }
}

impl<H: Host> Role<H> {
    /// The role's name, and the kind of filter it must be loaded as (inlined:
    /// every stream asks, and only for the kind).
    #[inline(always)]
    fn kind(&self) -> (&'static str, Option<ContextType>) {
        let http = Some(ContextType::HttpContext);
        match self {
            Role::Traffic(t) if t.part == Part::Connections => {
                ("traffic_tcp", Some(ContextType::StreamContext))
            }
            Role::Traffic(_) => ("traffic", http),
            Role::Health(_) => ("health", http),
            Role::Placeholder(_) => ("placeholder", http),
            Role::Unconfigured => ("(unconfigured)", None),
        }
    }
}

/// Creates every shared-data key several writers update (but
/// `keys::TRAFFIC_PRESENT`, whose absence says that no traffic role runs
/// here), whatever the role. Configure runs on the main thread before any
/// worker VM exists, so each key is created once and every later
/// compare-and-swap writes with a version (`shared::cas_update`).
/// `keys::GAUGES` is created with the metrics (`Metrics::define`).
pub fn create_shared<H: Host + Copy>(host: H) {
    // The FSM record OPEN, the LB checkers and the clock-step record as each
    // reads when absent; the durations empty; the receipt: no drain yet.
    ensure_json(&host, FSM, &Record::new(host.now().wall_ms));
    ensure_json(&host, LB, &Checkers::default());
    ensure_json(&host, CLOCK, &Steps::default());
    rotation::create(&host);
    liveness::ensure_registry(&host);
    placeholder::ensure(&host);
    count::create_shared(&host);
    ensure(&host, DURATIONS, &[0; crate::instruments::sizing::BYTES]);
    ensure(&host, RECEIPT, b"{}");
}

impl<H: Host + Copy> Root<H> {
    /// An unconfigured root over `host`, whose metrics `metrics` gives.
    pub fn new(host: H, metrics: fn(H) -> Metrics<H>) -> Root<H> {
        Root {
            role: Role::Unconfigured,
            filter: Cell::new(None),
            host,
            metrics,
        }
    }

    /// The kind of filter the first context showed: an HTTP stream knows its
    /// protocol when it is created, a connection does not. One host call per
    /// root context, never per stream.
    ///
    /// A role loaded as the wrong kind of filter: what passes it is not
    /// counted, so a traffic role marks the count unreliable for the life of
    /// the process (`Unreliable::MisplacedRole`); every role says so in one line.
    #[cold]
    #[inline(never)]
    fn learn_filter(&self) -> ContextType {
        let filter = match self.host.property("request\0protocol") {
            Some(_) => ContextType::HttpContext,
            None => ContextType::StreamContext,
        };
        self.filter.set(Some(filter));
        if self.role.kind().1.is_some_and(|want| want != filter) {
            let (kind, wanted) = if filter == ContextType::HttpContext {
                ("an HTTP filter", "a network filter before tcp_proxy")
            } else {
                ("a network filter", "an HTTP filter")
            };
            let traffic = matches!(self.role, Role::Traffic(_));
            let untrusted = ", and the count is not trusted until istio-proxy restarts";
            logs::error!(
                "event=misplaced_role role={} what=\"loaded as {kind}; this role is {wanted}: it \
                 passes everything through, counts nothing{}\"",
                self.role.kind().0,
                if traffic { untrusted } else { "" }
            );
            if traffic {
                liveness::misplaced(&self.host);
            }
        }
        filter
    }

    /// A stream (or connection) `context_id` of the role, or one that passes
    /// through if the role does not run in this kind of filter (the host asks
    /// `get_type` first, so the filter is known).
    /// Each arm boxes its own stream: built in place, not moved into the box.
    fn stream(&self, context_id: u32) -> Box<Stream<H>> {
        match &self.role {
            r if r.kind().1 != self.filter.get() => Box::new(Stream::Passthrough),
            Role::Traffic(t) => Box::new(Stream::Traffic(TrafficStream::new(Rc::clone(t)))),
            Role::Health(h) => Box::new(Stream::Health(HealthStream {
                context_id,
                health: Rc::clone(h),
            })),
            Role::Placeholder(p) => Box::new(Stream::Stand(Rc::clone(p))),
            // The host does not create streams for a plugin whose
            // configuration was refused; if it ever did, pass them through.
            Role::Unconfigured => Box::new(Stream::Passthrough),
        }
    }
}

impl<H: Host + Copy + 'static> Context for Root<H> {
    /// The health role's outgoing calls: the admin API's answer to the
    /// connection rotation, pilot-agent's to the termination watch.
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body: usize, _: usize) {
        if let Role::Health(h) = &self.role {
            h.rotator.answered(token, num_headers);
            if h.termination.answered(token, num_headers, body, &h.metrics) {
                h.sigterm();
            }
        }
    }

    /// The plugin is being removed (LDS update, reconfiguration): a clean
    /// goodbye, so that the health role does not take it for a failed VM.
    fn on_done(&mut self) -> bool {
        match &self.role {
            Role::Traffic(t) => t.goodbye(),
            Role::Placeholder(p) => p.goodbye(),
            Role::Health(_) | Role::Unconfigured => {}
        }
        true
    }
}

impl<H: Host + Copy + 'static> RootContext for Root<H> {
    fn on_configure(&mut self, _: usize) -> bool {
        let bytes = match self.host.configuration() {
            Ok(b) => b.unwrap_or_default(),
            Err(e) => {
                logs::error!("invalid configuration: (configuration): cannot be read: {e:?}");
                return false;
            }
        };
        let Ok(config) = Config::parse(&bytes).map_err(|e| logs::error!("{e}")) else {
            return false;
        };
        let metrics = (self.metrics)(self.host);
        create_shared(self.host);
        match Store::new(self.host).load() {
            Ok(rec) => metrics.set_state(rec.state),
            Err(e) => logs::error!("event=state_unavailable error=\"{e}\""),
        }
        let tick = Duration::from_millis(config.tick_ms());
        if let Err(e) = self.host.set_tick_period(tick) {
            logs::error!("invalid configuration: tick: the host refused it: {e:?}");
            return false;
        }
        let part = match config {
            Config::TrafficTcp(_) => Part::Connections,
            _ => Part::Streams,
        };
        self.role = match config {
            // Both traffic roles announce themselves and beat the same
            // heartbeat: a TCP-only gateway is a traffic role seen.
            Config::Traffic(shared) | Config::TrafficTcp(shared) => {
                count::announce_traffic(&self.host);
                Role::Traffic(Rc::new(Traffic::new(part, metrics, &shared)))
            }
            Config::Health(health) => {
                for w in health.warnings() {
                    logs::warning!("event=config_warning what=\"{w}\"");
                }
                Role::Health(Rc::new(Health::new(health, metrics)))
            }
            Config::Placeholder(_) => Role::Placeholder(Rc::new(Stand::new(self.host))),
        };
        true
    }

    /// A tick reads the clocks once (`one_instant`).
    fn on_tick(&mut self) {
        super::wasm_host::one_instant(|| match &self.role {
            Role::Health(h) => h.tick(),
            Role::Traffic(t) => t.tick(),
            Role::Placeholder(p) => p.tick(),
            Role::Unconfigured => {}
        })
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(self.stream(context_id))
    }

    /// Connections of a network filter (`traffic_tcp`).
    fn create_stream_context(&self, context_id: u32) -> Option<Box<dyn StreamContext>> {
        Some(self.stream(context_id))
    }

    /// Which kind of context the host's new contexts are: what the filter
    /// this root sits in creates, whatever the role wants — so that a role
    /// loaded as the wrong kind of filter passes its traffic through and says
    /// so (`misplaced`), instead of the SDK aborting the VM on the first
    /// callback of the other kind.
    fn get_type(&self) -> Option<ContextType> {
        Some(self.filter.get().unwrap_or_else(|| self.learn_filter()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::host::keys;
    use crate::host::sim::{Answer, Sim};
    use proxy_wasm::types::Action;

    #[test]
    fn configure_creates_every_key_several_writers_update() {
        let sim = Sim::at(1_000);
        Metrics::define(&sim);
        create_shared(&sim);
        let absent: Vec<_> = keys::FIXED
            .iter()
            .filter(|k| **k != keys::TRAFFIC_PRESENT && sim.value(k).is_none())
            .collect();
        assert!(absent.is_empty(), "not created on configure: {absent:?}");
        assert_eq!(
            sim.value(keys::TRAFFIC_PRESENT),
            None,
            "a traffic role sets it"
        );
        // What each key reads as is what it read as absent.
        let store = Store::new(&sim);
        assert_eq!(store.load().unwrap().state, crate::gate::fsm::State::Open);
        assert_eq!(rotation::load(&&sim).unwrap(), None);
        assert_eq!(store.lb_checkers().unwrap(), Default::default());
    }

    /// A process of the stand-in host that lives as long as the root
    /// contexts the host keeps (`Box<dyn HttpContext>` is `'static`).
    fn process() -> &'static Sim {
        let sim: &'static Sim = Box::leak(Box::new(Sim::at(1_764_000_000_000)));
        sim.set_property("request.protocol", b"HTTP/1.1");
        sim
    }

    /// A root context configured with `config`, as Envoy configures one.
    fn configured(sim: &'static Sim, config: &str) -> Root<&'static Sim> {
        *sim.configuration.borrow_mut() = config.as_bytes().to_vec();
        let mut root = Root::new(sim, Metrics::define);
        assert!(root.on_configure(0), "refused: {config}");
        root
    }

    /// One request on a new stream of the health root, as Envoy delivers it
    /// (the SDK asks the root for the context's type first): its answer.
    fn ask(sim: &Sim, health: &Root<&'static Sim>, ctx: u32, method: &str, path: &str) -> Answer {
        *sim.request_headers.borrow_mut() = [(":method", method), (":path", path)]
            .map(|(n, v)| (n.into(), v.into()))
            .into();
        sim.set_property("source.address", b"127.0.0.1:40000");
        assert_eq!(health.get_type(), Some(ContextType::HttpContext));
        let mut stream = health.create_http_context(ctx).unwrap();
        assert_eq!(stream.on_http_request_headers(2, true), Action::Pause);
        drop(stream);
        sim.answers.borrow().last().cloned().unwrap()
    }

    /// A line starting with `prefix` was logged on this test's thread.
    fn assert_logged(prefix: &str) {
        let lines = crate::host::logs::taken();
        assert!(lines.iter().any(|l| l.starts_with(prefix)), "{lines:?}");
    }

    /// Both roots tick, `n` times, 100 ms apart.
    fn ticks(sim: &Sim, roots: &mut [&mut Root<&'static Sim>], n: usize) {
        for _ in 0..n {
            sim.advance(100);
            for root in roots.iter_mut() {
                root.on_tick();
            }
        }
    }

    #[test]
    fn configure_streams_a_drain_and_the_health_answers_end_to_end() {
        let sim = process();
        let mut traffic = configured(sim, r#"{"role":"traffic"}"#);
        assert_eq!(sim.tick_period.get(), Some(Duration::from_millis(100)));
        let mut health = configured(sim, r#"{"role":"health","lb_buffer":"1s"}"#);
        assert_eq!(traffic.get_type(), Some(ContextType::HttpContext));
        assert_eq!(health.get_type(), Some(ContextType::HttpContext));
        ticks(sim, &mut [&mut traffic, &mut health], 1);
        assert_eq!(
            ask(sim, &health, 10, "GET", "/health_check.html").status,
            200
        );

        let mut stream = traffic.create_http_context(20).unwrap();
        assert_eq!(stream.on_http_request_headers(4, true), Action::Continue);
        let drain = ask(sim, &health, 11, "POST", "/drain");
        assert_eq!(
            (drain.status, drain.json()["state"].as_str()),
            (200, Some("DRAINING"))
        );
        ticks(sim, &mut [&mut traffic, &mut health], 3);
        let lb = ask(sim, &health, 12, "GET", "/health_check.html");
        assert_eq!(lb.status, 200, "held at 200 while the stream runs");
        let status = ask(sim, &health, 13, "GET", "/drain/status").json();
        assert_eq!(
            (status["state"].as_str(), &status["active"]),
            (Some("DRAINING"), &1.into())
        );

        assert_eq!(stream.on_http_response_headers(3, true), Action::Continue);
        sim.set_property("response.code_details", b"via_upstream");
        stream.on_log();
        drop(stream);
        let status = ask(sim, &health, 14, "GET", "/drain/status").json();
        assert_eq!(
            status["state"], "CLOSING",
            "flipped by the stream's own end"
        );
        ticks(sim, &mut [&mut traffic, &mut health], 10);
        let lb = ask(sim, &health, 15, "GET", "/health_check.html");
        assert_eq!(lb.status, 503, "CLOSED once lb_buffer is over");
        let status = ask(sim, &health, 16, "GET", "/drain/status").json();
        assert_eq!(
            (
                status["state"].as_str(),
                status["receipt"]["completed"].as_u64()
            ),
            (Some("CLOSED"), Some(1))
        );
    }

    #[test]
    fn a_role_loaded_as_the_wrong_kind_of_filter_passes_through_and_no_count_is_trusted() {
        let sim = process();
        let mut health = configured(sim, r#"{"role":"health"}"#);
        let mut tcp = configured(sim, r#"{"role":"traffic_tcp"}"#);
        assert_eq!(
            tcp.get_type(),
            Some(ContextType::HttpContext),
            "an HTTP filter creates HTTP streams, whatever the role"
        );
        let mut stream = tcp.create_http_context(30).unwrap();
        assert_eq!(stream.on_http_request_headers(2, true), Action::Continue);
        drop(stream);
        assert_logged("event=misplaced_role role=traffic_tcp ");
        ticks(sim, &mut [&mut tcp, &mut health], 2);
        let status = ask(sim, &health, 31, "GET", "/drain/status").json();
        assert_eq!(status["count"]["reliable"], false, "{status}");
        assert_eq!(status["count"]["unreliable_reason"], "misplaced_role");
    }

    #[test]
    fn a_configuration_that_does_not_parse_is_refused_and_the_root_stays_unconfigured() {
        let sim = process();
        *sim.configuration.borrow_mut() = br#"{"role":"nope"}"#.to_vec();
        let mut root = Root::new(sim, Metrics::define);
        assert!(!root.on_configure(0));
        assert!(matches!(root.role, Role::Unconfigured));
        assert_eq!(
            sim.tick_period.get(),
            None,
            "no tick for a refused configuration"
        );
        assert_logged("invalid configuration: ");
    }
}
