//! The receipt keeper: the oldest stream at the flip, the pending receipt line
//! logged once, and a SIGTERM that cuts the drain short, each written to the
//! receipt's record (`host::receipt`).

use super::Health;

use crate::gate::fsm::{Record, State};
use crate::host::wasm_host::Host;
use crate::host::{logs, metrics::Id};
use crate::instruments::receipt;
use crate::instruments::receipt::host as shell;

impl<H: Host> Health<H> {
    /// Records the oldest stream at the flip (within a tick of it), and logs
    /// the pending receipt line a tick after this root first saw it (the traffic
    /// roots count the drain's last completed ends at their tick); one worker
    /// each. It reads the receipt's record only when it has something to
    /// look for there: the FSM moved (`rec.seq`) since this root last found
    /// nothing, or this root wrote a SIGTERM into it.
    pub(super) fn keep_receipt(&self, rec: &Record, oldest: &dyn Fn() -> Option<u64>) {
        if self.receipt_looked.get() == Some(rec.seq) {
            return;
        }
        let Some(b) = shell::read(self.host()) else {
            return;
        };
        let (flip, pending) = (b.flip_due(rec).is_some(), b.owed_line.and(b.owed_drain));
        if flip {
            let oldest = oldest();
            shell::change(self.host(), &mut |b| b.flipped(rec, oldest));
        }
        if pending.is_none() && !flip {
            // Nothing more to do here until the FSM moves again.
            self.receipt_looked.set(Some(rec.seq));
        }
        if pending.is_none() || self.receipt_seen.replace(pending) != pending {
            return;
        }
        let mut line = None;
        let taken = shell::change(self.host(), &mut |b| {
            line = b.take_line();
            line.is_some()
        });
        if let Some(line) = line.filter(|_| taken) {
            if let Some(ms) = receipt::duration_of(&line) {
                self.metrics.set(Id::DrainDuration, ms);
            }
            logs::info!("{line}")
        }
    }

    /// pilot-agent says the pod got its SIGTERM while a preStop answer is
    /// held (`termination`): the drain is cut short before CLOSED. The worker
    /// that writes it into the receipt counts it and says so; the receipt
    /// line (`ended=SIGTERM`) follows a tick later.
    pub fn sigterm(&self) {
        // No drain runs, or the record is unreadable (the tick says so).
        let drain = |r: &Record| matches!(r.state, State::Draining | State::Closing);
        let Some(rec) = self.store.current().ok().filter(|r| drain(r)) else {
            return;
        };
        let now = self.host().now();
        if shell::write_line(self.host(), &rec, "SIGTERM", self.metrics.tally(), now) {
            self.receipt_looked.set(None);
            self.metrics.add(Id::DrainsCutShort, 1);
            logs::warning!("event=sigterm_before_closed state={}", rec.state.name());
        }
    }

    /// What the latest drain counted so far (nothing before a first drain).
    pub(super) fn tally_of(&self, rec: &Record) -> receipt::Tally {
        let base = rec.drain_id.and_then(|_| shell::read(self.host())?.base);
        base.map(|base| self.metrics.tally().since(&base))
            .unwrap_or_default()
    }
}
