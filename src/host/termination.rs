//! The pod's SIGTERM, as the health role can see it. The kubelet sends
//! SIGTERM to istio-proxy's pilot-agent once the preStop hook returns or the
//! grace period runs out — before CLOSED when the termination is shorter
//! than the drain (an eviction's or a `--grace-period` override's short
//! grace, a node shutdown). Envoy itself shows nothing of it: pilot-agent's
//! `POST /drain_listeners?graceful` leaves `server.state` LIVE and starts the
//! drain sequence drain-gate's own rotation may already have started. But
//! pilot-agent's readiness (`/healthz/ready` on its status port, the `agent`
//! cluster of istio-proxy's bootstrap) answers 503 from SIGTERM on ("server
//! is terminated"), having answered 200 since Envoy first was ready.
//!
//! So while a worker holds a preStop answer during a drain (DRAINING or
//! CLOSING), it asks that readiness at every tick, one call at a time; an
//! answer other than 200 is the SIGTERM: the drain is cut short, and its
//! receipt says so (`crate::fsm::cut_short`). No answer (the call failed)
//! says nothing.

use std::cell::Cell;
use std::time::Duration;

use super::logs;
use super::wasm_host::{Envoy, Host};

/// pilot-agent's readiness path.
pub const READY_PATH: &str = "/healthz/ready";
/// How long one readiness call may take.
const TIMEOUT_MS: u64 = 1_000;

/// This worker's readiness call in flight, if any.
#[derive(Debug)]
pub struct Watch<H: Host = Envoy> {
    host: H,
    /// `None`: not watched (`termination_watch: false`).
    cluster: Option<String>,
    sent: Cell<Option<u32>>,
    /// The cluster refused a call: said once.
    refused: Cell<bool>,
}

impl<H: Host> Watch<H> {
    pub fn new(host: H, cluster: Option<String>) -> Watch<H> {
        Watch {
            host,
            cluster,
            sent: Cell::new(None),
            refused: Cell::new(false),
        }
    }

    /// Runs in the health root context's tick: asks pilot-agent's readiness
    /// while `watching` (a preStop answer held in a drain), unless a call is
    /// in flight.
    pub fn tick(&self, watching: bool) {
        let Some(cluster) = self.cluster.as_deref().filter(|_| watching) else {
            return;
        };
        if self.sent.get().is_some() {
            return;
        }
        let headers = [
            (":method", "GET"),
            (":path", READY_PATH),
            (":authority", "pilot-agent"),
        ];
        match self
            .host
            .http_call(cluster, &headers, Duration::from_millis(TIMEOUT_MS))
        {
            Ok(token) => self.sent.set(Some(token)),
            Err(e) if !self.refused.replace(true) => {
                logs::warning!("event=termination_watch_unavailable cluster={cluster} status={e:?}")
            }
            Err(_) => {}
        }
    }

    /// The answer to the call sent with `token` (`num_headers` 0: none came):
    /// whether it says the pod got its SIGTERM.
    pub fn answered(&self, token: u32, num_headers: usize) -> bool {
        if self.sent.get() != Some(token) {
            return false;
        }
        self.sent.set(None);
        num_headers > 0 && self.host.http_call_status().is_some_and(|s| s != 200)
    }
}
