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
//! CLOSING), it asks that readiness at every tick, one call at a time, and
//! hands each answer — its status, whether an upstream gave it, its body's
//! size — to `crate::instruments::termination::Watch`, which decides. pilot-agent's own
//! 503 after its 200 is the SIGTERM: the drain is cut short (its receipt says
//! so, `Health::sigterm`) and the watch asks no more. Envoy's own
//! reply, another answer, or a 503 before any 200 never is: the watch says
//! once, in a warning and `drain_gate_termination_watch_unavailable`, that it
//! cannot see the SIGTERM.
//!
//! At SIGTERM pilot-agent also stops accepting connections (its status
//! server's listener closes): its 503 reaches the watch on the connection
//! Envoy keeps open to it, which the call at every tick keeps in use.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use crate::host::logs;
use crate::host::metrics::{Id, Metrics};
use crate::host::wasm_host::{Envoy, Host};
use crate::instruments::termination::{self, Answer, Verdict};

/// pilot-agent's readiness path.
pub const READY_PATH: &str = "/healthz/ready";
/// How long one readiness call may take.
const TIMEOUT: Duration = Duration::from_millis(1_000);

/// This worker's readiness call in flight, if any.
#[derive(Debug)]
pub struct Watch<H: Host = Envoy> {
    host: H,
    /// `None`: not watched (`termination_watch: false`).
    cluster: Option<String>,
    sent: Cell<Option<u32>>,
    /// What the answers so far said.
    seen: RefCell<termination::Watch>,
}

impl<H: Host> Watch<H> {
    pub fn new(host: H, cluster: Option<String>) -> Watch<H> {
        Watch {
            host,
            cluster,
            sent: Cell::new(None),
            seen: RefCell::default(),
        }
    }

    /// Runs in the health root context's tick: asks pilot-agent's readiness
    /// while `watching` (a preStop answer held in a drain), unless a call is
    /// in flight or the SIGTERM was seen.
    pub fn tick(&self, watching: bool, metrics: &Metrics<H>) {
        let idle = || self.sent.get().is_none() && !self.seen.borrow().done();
        let Some(cluster) = self.cluster.as_deref().filter(|_| watching && idle()) else {
            return;
        };
        let request = ["GET", READY_PATH, "pilot-agent"];
        match self.host.http_call(cluster, request, TIMEOUT) {
            Ok(token) => self.sent.set(Some(token)),
            Err(e) => {
                let verdict = self.seen.borrow_mut().refused();
                self.say(verdict, metrics, &format_args!(" host_status={e:?}"));
            }
        }
    }

    /// The answer to the call sent with `token` (`num_headers` 0: none came;
    /// `body_bytes`: its body's size): whether it says the pod got its SIGTERM.
    pub fn answered(
        &self,
        token: u32,
        num_headers: usize,
        body_bytes: usize,
        metrics: &Metrics<H>,
    ) -> bool {
        if self.sent.get() != Some(token) {
            return false;
        }
        self.sent.set(None);
        let answer = match num_headers {
            0 => Answer::default(),
            _ => Answer {
                status: self.host.http_call_status(),
                upstream: self.host.http_call_has_header(termination::UPSTREAM_MARK),
                body_bytes,
            },
        };
        let verdict = self.seen.borrow_mut().answered(answer);
        self.say(verdict, metrics, &"");
        verdict == Verdict::Sigterm
    }

    /// The watch cannot see the SIGTERM: one warning, one count.
    fn say(&self, verdict: Verdict, metrics: &Metrics<H>, extra: &dyn std::fmt::Display) {
        if let Verdict::Unavailable(why) = verdict {
            let cluster = self.cluster.as_deref().unwrap_or_default();
            logs::warning!("event=termination_watch_unavailable cluster={cluster}{extra} {why}");
            metrics.add(Id::TerminationWatchUnavailable, 1);
        }
    }
}
