//! drain-gate: an Istio ingress-gateway drain controller inside istio-proxy.
//!
//! Pure core (no proxy-wasm types, unit-tested on the host):
//! - [`fsm`]: states, the transition table, `advance()`;
//! - [`answer`]: what the health listener answers each audience, from
//!   everything that decides it (one function);
//! - [`clock`]: what the timers measure elapsed time on (the monotonic clock);
//! - [`config`]: plugin configuration → validated [`config::Config`];
//! - [`duration`]: durations as the configuration and queries spell them;
//! - [`net`]: IP networks (`admin_allow`);
//! - [`api`]: the HTTP surface of the health listener: routing ([`api`]),
//!   the status document and held answers ([`api::status`]), the reply type
//!   and error answers ([`api::reply`]);
//! - [`lb`]: what each LB checker has been answered (LB-observed-down), and its
//!   measured check interval beside what CLOSING waits;
//! - [`in_flight`]: how old the streams in flight are (what a drain waits for);
//! - [`json`]: drain-gate's own records as JSON, each field name declared once;
//! - [`liveness`]: whether the traffic role is there and alive;
//! - [`placeholder`]: a traffic filter whose own configuration did not load;
//! - [`metric_names`]: every metric name (the host defines them);
//! - [`receipt`]: how the streams of a drain ended, and what the LB cut;
//! - [`refusal`]: which new requests a refusing drain refuses, and how;
//! - [`rotation`]: connection rotation during a drain (Envoy's own connection drain,
//!   event ③ of a pod termination);
//! - [`sizing`]: how long streams last, and the `drain_timeout` and grace period they call for;
//! - [`termination`]: the pod's SIGTERM in pilot-agent's readiness: which answer is
//!   pilot-agent's, and when its 503 is the SIGTERM.
//!
//! Host shell ([`host`]): root, traffic and health contexts, shared data,
//! the active count, the metrics (defined from [`metric_names`]) and timers.

pub mod answer;
pub mod api;
pub mod clock;
pub mod config;
pub mod duration;
pub mod fsm;
pub mod host;
pub mod in_flight;
pub mod json;
pub mod lb;
pub mod liveness;
pub mod metric_names;
pub mod net;
pub mod placeholder;
pub mod receipt;
pub mod refusal;
pub mod rotation;
pub mod sizing;
pub mod termination;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(host::root::Root::default())
    });
}}

#[cfg(test)]
mod tests {
    /// The `pub mod` names of a source file, in order.
    fn modules(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub mod "))
            .filter_map(|rest| rest.strip_suffix(';'))
            .collect()
    }

    /// The fixture crates (the trap filter, the bench bisection) build this
    /// crate's own files with another entry point; a module missing from their
    /// list breaks their build, and with it every failure-direction test.
    #[test]
    fn the_fixture_crates_build_every_module() {
        let ours = modules(include_str!("lib.rs"));
        let fixtures = modules(include_str!("../tests/fixtures/src_modules.rs"));
        assert!(!ours.is_empty());
        assert_eq!(
            ours, fixtures,
            "tests/fixtures/src_modules.rs must list every module of src/lib.rs"
        );
    }
}
