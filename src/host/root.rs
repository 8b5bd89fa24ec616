//! The root context: parses the plugin configuration once, picks the role,
//! and hands each HTTP stream (or, for `traffic_tcp`, each connection) the
//! role's shared state.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext, StreamContext};
use proxy_wasm::types::ContextType;
use std::cell::{Cell, OnceCell};
use std::rc::Rc;
use std::time::Duration;

use super::count::{self, Part};
use super::health::{Health, HealthStream};
use super::liveness;
use super::logs;
use super::metrics::Metrics;
use super::placeholder::{self, Stand, StandStream};
use super::rotation;
use super::shared::{Envoy, Host};
use super::store::Store;
use super::traffic::{Traffic, TrafficStream};
use crate::config::{self, Config};

thread_local! {
    /// This VM's metric ids, defined once: Envoy does not deduplicate
    /// `define_metric`, and every root context of the VM — each filter
    /// configuration of every role, again on every reconfiguration — would
    /// otherwise define all of them again.
    static METRICS: OnceCell<Metrics> = const { OnceCell::new() };
}

/// The metrics of this VM.
fn metrics() -> Metrics {
    METRICS.with(|m| *m.get_or_init(|| Metrics::define(Envoy)))
}

/// A stream or connection of an unconfigured root: does nothing.
struct Passthrough;
impl Context for Passthrough {}
impl HttpContext for Passthrough {}
impl StreamContext for Passthrough {}

/// What a root context does, once configured.
#[derive(Default)]
pub enum Role {
    /// Not (or not successfully) configured: creates no streams.
    #[default]
    Unconfigured,
    Traffic(Rc<Traffic>),
    Health(Rc<Health>),
    /// Stands in for a traffic filter without its configuration (`crate::placeholder`).
    Placeholder(Rc<Stand>),
}

/// The kind of filter a root context sits in: an HTTP filter hands it
/// streams, a network filter connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Filter {
    Http,
    Network,
}

#[derive(Default)]
pub struct Root {
    pub role: Role,
    /// Learnt from the first context the host creates (see `get_type`).
    filter: Cell<Option<Filter>>,
}

impl Role {
    /// The kind of filter this role must be loaded as.
    fn filter(&self) -> Option<Filter> {
        match self {
            Role::Traffic(t) if t.part == Part::Connections => Some(Filter::Network),
            Role::Traffic(_) | Role::Health(_) | Role::Placeholder(_) => Some(Filter::Http),
            Role::Unconfigured => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Role::Traffic(t) if t.part == Part::Connections => "traffic_tcp",
            Role::Traffic(_) => "traffic",
            Role::Health(_) => "health",
            Role::Placeholder(_) => "placeholder",
            Role::Unconfigured => "(unconfigured)",
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
    Store::new(host).create();
    rotation::create(&host);
    liveness::ensure_registry(&host);
    placeholder::ensure(&host);
    count::create_shared(&host);
}

impl Root {
    /// A role loaded as the wrong kind of filter: what passes it is not
    /// counted, so a traffic role marks the count unreliable for the life of
    /// the process (`Why::MisplacedRole`); every role says so in one line.
    fn misplaced(&self, loaded_as: Filter) {
        let (kind, wanted) = match loaded_as {
            Filter::Http => ("an HTTP filter", "a network filter before tcp_proxy"),
            Filter::Network => ("a network filter", "an HTTP filter"),
        };
        logs::error!(
            "event=misplaced_role role={} what=\"loaded as {kind}; this role is {wanted}: it passes \
             everything through, counts nothing{}\"",
            self.role.name(),
            if matches!(self.role, Role::Traffic(_)) {
                ", and the count is not trusted until istio-proxy restarts"
            } else {
                ""
            }
        );
        if matches!(self.role, Role::Traffic(_)) {
            liveness::misplaced(&Envoy);
        }
    }

    /// The kind of filter the first context showed: an HTTP stream knows its
    /// protocol when it is created, a connection does not. One host call per
    /// root context, never per stream.
    fn loaded_as(&self) -> Filter {
        if let Some(f) = self.filter.get() {
            return f;
        }
        let http = matches!(
            hostcalls::get_property(vec!["request", "protocol"]),
            Ok(Some(_))
        );
        let filter = if http { Filter::Http } else { Filter::Network };
        self.filter.set(Some(filter));
        if self.role.filter().is_some_and(|want| want != filter) {
            self.misplaced(filter);
        }
        filter
    }

    /// Whether this root runs its role for the contexts it is given.
    fn in_place(&self) -> bool {
        self.role.filter() == self.filter.get()
    }
}

impl Context for Root {
    /// The health role's outgoing calls: the admin API's answer to the
    /// connection rotation, pilot-agent's to the termination watch.
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, _: usize, _: usize) {
        if let Role::Health(h) = &self.role {
            h.rotator.answered(token, num_headers);
            if h.termination.answered(token, num_headers) {
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

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let bytes = match hostcalls::get_buffer(
            proxy_wasm::types::BufferType::PluginConfiguration,
            0,
            usize::MAX,
        ) {
            Ok(b) => b.unwrap_or_default(),
            Err(e) => {
                logs::error!("invalid configuration: (configuration): cannot be read: {e:?}");
                return false;
            }
        };
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                logs::error!("{e}");
                return false;
            }
        };
        let metrics = metrics();
        create_shared(Envoy);
        match Store::new(Envoy).load() {
            Ok(rec) => metrics.set_state(rec.state),
            Err(e) => logs::error!("event=state_unavailable error=\"{e}\""),
        }
        if let Err(e) = hostcalls::set_tick_period(Duration::from_millis(config.tick_ms)) {
            logs::error!("invalid configuration: tick: the host refused it: {e:?}");
            return false;
        }
        self.role = match config.role {
            // Both traffic roles announce themselves and beat the same
            // heartbeat: a TCP-only gateway is a traffic role seen.
            config::Role::Traffic | config::Role::TrafficTcp => {
                count::announce_traffic(&Envoy);
                let part = match config.role {
                    config::Role::TrafficTcp => Part::Connections,
                    _ => Part::Streams,
                };
                Role::Traffic(Rc::new(Traffic::new(part, metrics, &config)))
            }
            config::Role::Health => {
                for w in config.warnings() {
                    logs::warning!("event=config_warning what=\"{w}\"");
                }
                Role::Health(Rc::new(Health::new(config, metrics)))
            }
            config::Role::Placeholder => Role::Placeholder(Rc::new(Stand::new(Envoy))),
        };
        true
    }

    fn on_tick(&mut self) {
        match &self.role {
            Role::Health(h) => h.tick(),
            Role::Traffic(t) => t.tick(),
            Role::Placeholder(p) => p.tick(),
            Role::Unconfigured => {}
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        if !self.in_place() {
            return Some(Box::new(Passthrough));
        }
        match &self.role {
            Role::Traffic(t) => Some(Box::new(TrafficStream::new(Rc::clone(t)))),
            Role::Health(h) => Some(Box::new(HealthStream::new(context_id, Rc::clone(h)))),
            Role::Placeholder(p) => Some(Box::new(StandStream::new(Rc::clone(p)))),
            // The host does not create streams for a plugin whose
            // configuration was refused; if it ever did, pass them through.
            Role::Unconfigured => Some(Box::new(Passthrough)),
        }
    }

    /// Connections of a network filter (`traffic_tcp`).
    fn create_stream_context(&self, _: u32) -> Option<Box<dyn StreamContext>> {
        match &self.role {
            Role::Traffic(t) if self.in_place() => Some(Box::new(TrafficStream::new(Rc::clone(t)))),
            _ => Some(Box::new(Passthrough)),
        }
    }

    /// Which kind of context the host's new contexts are: what the filter
    /// this root sits in creates, whatever the role wants — so that a role
    /// loaded as the wrong kind of filter passes its traffic through and says
    /// so (`misplaced`), instead of the SDK aborting the VM on the first
    /// callback of the other kind.
    fn get_type(&self) -> Option<ContextType> {
        Some(match self.loaded_as() {
            Filter::Http => ContextType::HttpContext,
            Filter::Network => ContextType::StreamContext,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::host::keys;
    use crate::host::sim::Sim;

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
        assert_eq!(store.load().unwrap().state, crate::fsm::State::Open);
        assert_eq!(rotation::load(&&sim).unwrap(), None);
        assert_eq!(store.lb_checkers().unwrap(), Default::default());
    }
}
