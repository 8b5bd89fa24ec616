//! Health role: answers every request of the health listener locally from the
//! FSM (see `crate::api`), holds `wait=closed` answers, and runs the timers.
//! One job per file:
//! - [`requests`]: the request handler (routing, checks, commands, held waits)
//!   and the HTTP stream ([`HealthStream`]);
//! - [`status`]: the status view every status and wait answer is built from;
//! - [`timer`]: what each tick does (automatic transitions, the clock-step
//!   watch, the placeholders, the release of held answers);
//! - [`receipt`]: the receipt keeper (the flip's oldest stream, the owed
//!   receipt line, a SIGTERM that cuts the drain short).
//!
//! The receipt keeper and the status view are this role's, and live in the
//! instruments' rooms beside the parts they serve
//! (`src/instruments/receipt/host.rs`, `src/instruments/status/host.rs`).

#[path = "../../instruments/receipt/keeper.rs"]
mod receipt;
mod requests;
#[path = "../../instruments/status/host.rs"]
mod status;
mod timer;

pub use requests::HealthStream;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::api::{self, Reply};
use crate::config;
use crate::gate::clock::Now;
use crate::gate::count::ActiveCount;
use crate::gate::fsm::host::{self as store, Store};
use crate::gate::fsm::{CloseAfter, Move, Record};
use crate::gate::liveness::host::Judge;
use crate::gate::placeholder::{Action as PlaceholderAction, Placeholders};
use crate::gate::refusal::NewRequests;
use crate::gate::rotation::host::Rotator;
use crate::host::logs;
use crate::host::metrics::{Id, Metrics};
use crate::host::shared::{Seen, SharedError};
use crate::host::wasm_host::{Envoy, Host};
use crate::instruments::termination::host as termination;

/// A held `wait=closed` request.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    context_id: u32,
    since: Now,
    timeout_ms: u64,
}

/// Shared by every stream of one health root context.
#[derive(Debug)]
pub struct Health<H: Host = Envoy> {
    pub config: config::Health,
    pub active: ActiveCount<H>,
    pub metrics: Metrics<H>,
    pub rotator: Rotator<H>,
    pub termination: termination::Watch<H>,
    store: Store<H>,
    waiters: RefCell<Vec<Waiter>>,
    watch: Judge<H>,
    /// The last tick could not read (or update) the record: checks fail
    /// closed until a tick succeeds again.
    unreadable: Cell<bool>,
    /// What the last tick decided about the placeholders (`crate::gate::placeholder`):
    /// the checks read it, no shared data per check.
    placeholders: Cell<PlaceholderAction>,
    /// The placeholders' record as the tick parsed it last.
    placeholders_seen: Seen<Placeholders>,
    /// An LB check was answered 200 (as of this worker's last look).
    announced: Cell<bool>,
    /// The drain whose owed receipt line this root saw at its last tick: it
    /// is logged a tick later, once every traffic root's tick has counted
    /// what completed (`Traffic::tick`).
    receipt_seen: Cell<Option<u64>>,
    /// The FSM's `seq` at which this root last found nothing to do in the
    /// receipt's record: it looks again when the FSM moves (`keep_receipt`).
    receipt_looked: Cell<Option<u64>>,
    /// When this root last set the LB detection gauges (timer clock).
    lb_gauges_at: Cell<Option<u64>>,
}

/// Logs why the state could not be read.
fn state_unavailable(error: impl std::fmt::Display) {
    logs::error!("event=state_unavailable role=health error=\"{error}\"");
}

/// Logs why the LB record could not be read or written.
fn lb_unavailable(error: SharedError) {
    logs::warning!("event=lb_record_unavailable error=\"{error}\"");
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

impl<H: Host + Copy> Health<H> {
    pub fn new(config: config::Health, metrics: Metrics<H>) -> Health<H> {
        let host = *metrics.host();
        let refusing = config.shared.draining_new_requests == NewRequests::Refuse;
        metrics.set(Id::DrainTimeout, config.drain_timeout_ms / 1000);
        let health = Health {
            rotator: Rotator::new(host, config.rotate_connections.clone(), refusing),
            termination: termination::Watch::new(host, config.termination_watch.clone()),
            watch: Judge::new(host, config.shared.tick_ms),
            config,
            active: ActiveCount::new(&metrics),
            metrics,
            store: Store::new(host).raising(crate::instruments::receipt::host::transition),
            waiters: RefCell::new(Vec::new()),
            receipt_seen: Cell::new(None),
            receipt_looked: Cell::new(None),
            lb_gauges_at: Cell::new(None),
            unreadable: Cell::new(false),
            placeholders: Cell::new(PlaceholderAction::None),
            placeholders_seen: Seen::new(crate::host::keys::PLACEHOLDERS),
            announced: Cell::new(false),
        };
        // Record where the wall clock stands before the first tick, so that
        // a step even then is seen.
        health.watch_clock();
        health
    }
}

impl<H: Host> Health<H> {
    pub(super) fn host(&self) -> &H {
        self.store.host()
    }

    /// Moves the FSM for an admin command, then applies whatever became due
    /// (a drain with nothing in flight flips at once).
    pub(super) fn command(&self, cmd: api::Command) -> Result<Record, store::TransitionError> {
        self.advance(&|r: &Record| cmd.move_in(r.state, &self.config))
    }

    /// Moves the FSM as `choose` says, then applies whatever became due.
    pub(super) fn advance(
        &self,
        choose: &dyn Fn(&Record) -> Move,
    ) -> Result<Record, store::TransitionError> {
        self.store
            .advance(choose, self.active.read().active, &self.metrics)?;
        self.apply_due(self.active.read().for_decisions())
            .map(Rc::unwrap_or_clone)
            .map_err(store::TransitionError::Shared)
    }

    /// Applies whatever became due (`Store::apply_due`) with the count
    /// `active` (`Reading::for_decisions`), and when the LB was observed
    /// DOWN if `close_after` asks for it.
    pub(super) fn apply_due(&self, active: u64) -> Result<Rc<Record>, SharedError> {
        let observed = self.config.close_after == CloseAfter::LbObservedDown;
        let checkers = observed.then(|| self.store.lb_checkers().ok()).flatten();
        let lb_fall = self.config.lb_fall;
        let lb_down_ms = checkers.and_then(|c| c.down_since(self.host().now().timer_ms(), lb_fall));
        self.store.apply_due(active, lb_down_ms, &self.metrics)
    }

    pub(super) fn forget(&self, context_id: u32) {
        self.waiters
            .borrow_mut()
            .retain(|w| w.context_id != context_id);
    }
}

#[cfg(test)]
pub(crate) mod tests;
