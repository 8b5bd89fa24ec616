//! drain-gate: an Istio ingress-gateway drain controller inside istio-proxy.
//!
//! Pure core (no proxy-wasm types, unit-tested on the host):
//! - [`fsm`]: states, the transition table, `advance()`, answers per audience;
//! - [`config`]: plugin configuration → validated [`config::Config`];
//! - [`api`]: the HTTP surface of the health listener;
//! - [`lb`]: what each LB checker has been answered (LB-observed-down);
//! - [`liveness`]: whether the traffic role is there and alive;
//! - [`metrics`]: every metric name.
//!
//! Host shell ([`host`]): root, traffic and health contexts, shared data,
//! the active count, metrics and timers.

pub mod api;
pub mod config;
pub mod fsm;
pub mod host;
pub mod lb;
pub mod liveness;
pub mod metrics;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(host::root::Root::default())
    });
}}
