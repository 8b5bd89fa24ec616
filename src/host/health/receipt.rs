//! The receipt keeper: the oldest stream at the flip, the owed receipt line
//! logged once, and a SIGTERM that cuts the drain short.

use super::Health;
use std::cell::{Cell, RefCell};

use crate::fsm::{self, Record};
use crate::host::logs;
use crate::host::wasm_host::Host;
use crate::receipt;

impl<H: Host> Health<H> {
    /// Records the oldest stream at the flip (within a tick of it), and logs
    /// the owed receipt line a tick after this root first saw it (the traffic
    /// roots count the drain's last completed ends at their tick); one worker
    /// each.
    pub(super) fn keep_receipt(&self, rec: &Record, oldest: Option<u64>) {
        if fsm::record_flip(rec, oldest).is_some() {
            if let Err(e) = self.store.update(&|r| fsm::record_flip(r, oldest)) {
                logs::warning!("event=state_unavailable role=health error=\"{e}\"");
            }
        }
        let owed = rec.owed_line.as_ref().and(rec.owed_drain);
        if owed.is_none() || self.receipt_seen.replace(owed) != owed {
            return;
        }
        let line = RefCell::new(None);
        let taken = self
            .store
            .update(&|r| fsm::take_owed(r, &mut line.borrow_mut()));
        match (taken, line.take()) {
            (Ok(_), Some(line)) => {
                if let Some(ms) = receipt::duration_of(&line) {
                    self.metrics.drain_took(ms);
                }
                logs::info!("{line}")
            }
            (Ok(_), None) => {}
            (Err(e), _) => logs::warning!("event=state_unavailable role=health error=\"{e}\""),
        }
    }

    /// pilot-agent says the pod got its SIGTERM while a preStop answer is
    /// held (`termination`): the drain is cut short before CLOSED. The worker
    /// that writes it into the receipt counts it and says so; the receipt
    /// line (`ended=SIGTERM`) follows a tick later.
    pub fn sigterm(&self) {
        let now = self.host().now();
        let cut = Cell::new(None);
        let written = self.store.update(&|r| {
            let next = fsm::cut_short(r, self.tally_of(r), now);
            cut.set(next.as_ref().map(|_| r.state));
            next
        });
        match (written, cut.get()) {
            (Ok(_), Some(state)) => {
                self.metrics.drain_cut_short();
                logs::warning!("event=sigterm_before_closed state={}", state.name());
            }
            (Ok(_), None) => {}
            (Err(e), _) => logs::warning!("event=state_unavailable role=health error=\"{e}\""),
        }
    }

    /// What the drain of `rec` counted so far (nothing before a first drain).
    pub(super) fn tally_of(&self, rec: &Record) -> receipt::Tally {
        rec.receipt_base
            .map(|base| self.metrics.tally().since(&base))
            .unwrap_or_default()
    }
}
