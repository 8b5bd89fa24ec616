//! The root context: parses the plugin configuration once, picks the role,
//! and hands each HTTP stream (or, for `traffic_tcp`, each connection) the
//! role's shared state.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext, StreamContext};
use proxy_wasm::types::ContextType;
use std::cell::OnceCell;
use std::rc::Rc;
use std::time::Duration;

use super::count::{self, Part};
use super::health::{Health, HealthStream};
use super::liveness;
use super::metrics::Metrics;
use super::shared::Envoy;
use super::store::Store;
use super::traffic::{Traffic, TrafficStream};
use crate::config::{Config, Role};

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

#[derive(Default)]
pub enum Root {
    /// Not (or not successfully) configured: creates no streams.
    #[default]
    Unconfigured,
    Traffic(Rc<Traffic>),
    Health(Rc<Health>),
}

impl Context for Root {
    /// The admin API's answer to the connection rotation (the health role's
    /// only outgoing call).
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, _: usize, _: usize) {
        if let Root::Health(h) = self {
            h.rotator.answered(token, num_headers);
        }
    }

    /// The plugin is being removed (LDS update, reconfiguration): a clean
    /// goodbye, so that the health role does not take it for a failed VM.
    fn on_done(&mut self) -> bool {
        if let Root::Traffic(t) = self {
            t.goodbye();
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
                log::error!("invalid configuration: (configuration): cannot be read: {e:?}");
                return false;
            }
        };
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        let metrics = metrics();
        match Store::new(Envoy).load() {
            Ok(rec) => metrics.set_state(rec.state),
            Err(e) => log::error!("event=state_unavailable error=\"{e}\""),
        }
        if let Err(e) = hostcalls::set_tick_period(Duration::from_millis(config.tick_ms)) {
            log::error!("invalid configuration: tick: the host refused it: {e:?}");
            return false;
        }
        *self = match config.role {
            // Both traffic roles announce themselves and beat the same
            // heartbeat: a TCP-only gateway is a traffic role seen.
            Role::Traffic | Role::TrafficTcp => {
                liveness::ensure_registry(&Envoy);
                count::announce_traffic(&Envoy);
                let part = match config.role {
                    Role::TrafficTcp => Part::Connections,
                    _ => Part::Streams,
                };
                Root::Traffic(Rc::new(Traffic::new(part, metrics, config.tick_ms)))
            }
            Role::Health => {
                for w in config.warnings() {
                    log::warn!("event=config_warning what=\"{w}\"");
                }
                liveness::ensure_registry(&Envoy);
                Root::Health(Rc::new(Health::new(config, metrics)))
            }
        };
        true
    }

    fn on_tick(&mut self) {
        match self {
            Root::Health(h) => h.tick(),
            Root::Traffic(t) => t.tick(),
            Root::Unconfigured => {}
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        match self {
            Root::Traffic(t) => Some(Box::new(TrafficStream::new(Rc::clone(t)))),
            Root::Health(h) => Some(Box::new(HealthStream::new(context_id, Rc::clone(h)))),
            // The host does not create streams for a plugin whose
            // configuration was refused; if it ever did, pass them through.
            Root::Unconfigured => Some(Box::new(Passthrough)),
        }
    }

    /// Connections of a network filter (`traffic_tcp`); any other role
    /// loaded as a network filter passes them through uncounted.
    fn create_stream_context(&self, _: u32) -> Option<Box<dyn StreamContext>> {
        match self {
            Root::Traffic(t) if t.part == Part::Connections => {
                Some(Box::new(TrafficStream::new(Rc::clone(t))))
            }
            _ => Some(Box::new(Passthrough)),
        }
    }

    /// Which kind of context the host's new contexts are: connections for
    /// `traffic_tcp`, HTTP streams otherwise.
    fn get_type(&self) -> Option<ContextType> {
        match self {
            Root::Traffic(t) if t.part == Part::Connections => Some(ContextType::StreamContext),
            _ => Some(ContextType::HttpContext),
        }
    }
}
