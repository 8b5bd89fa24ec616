//! The receipt's record in shared data (`keys::RECEIPT`,
//! `crate::instruments::receipt::Record`), beside the FSM's and written on the events of
//! a drain: whoever writes a transition raises the drain's beginning and its
//! end (`transition`, which the roles' stores raise: `Store::raising`); a traffic root adds the
//! completed ends it counted at its tick (`Record::add_completed`); the
//! health role records the flip and the pod's SIGTERM, and logs the line
//! (`health::receipt`).

use crate::gate::clock::Now;
use crate::gate::fsm::{self, State};
use crate::host::keys::RECEIPT;
use crate::host::logs;
use crate::host::metrics::Metrics;
use crate::host::shared;
use crate::host::wasm_host::Host;
use crate::instruments::receipt::{Record, Tally};

/// Changes the record as `change` says (compare-and-swap, retried; written
/// when it says it changed it). Whether it was written (a failure is logged).
/// One copy of the update for every change: the module's size is budgeted.
pub fn change<H: Host>(host: &H, change: &mut dyn FnMut(&mut Record) -> bool) -> bool {
    shared::Seen::new(RECEIPT)
        .edit(host, change)
        .map_err(|e| logs::warning!("event=receipt_unavailable error=\"{e}\""))
        .unwrap_or(false)
}

/// The record as it is now (`None`: unreadable, and logged).
pub fn read<H: Host>(host: &H) -> Option<Record> {
    let mut read = None;
    change(host, &mut |r| {
        read = Some(r.clone());
        false
    });
    read
}

/// Writes the line of the drain `rec` holds, ended as `ended`
/// (`Record::write_line`), and logs at once a line it displaces. Whether it wrote.
pub fn write_line<H: Host>(host: &H, rec: &fsm::Record, ended: &str, t: Tally, now: Now) -> bool {
    let mut displaced = None;
    let written = change(host, &mut |r| {
        let line = r.write_line(rec, ended, t, now);
        line.map(|line| displaced = line).is_some()
    });
    if let Some(line) = displaced.filter(|_| written) {
        logs::info!("{line}"); // a second drain ended within a tick of the first
    }
    written
}

/// A transition was written (`next`, at `now`): a drain that began takes
/// the counters as its base; one that ended (CLOSED, a reopen, FAULT) has
/// its line written, logged a tick later by the health role.
pub fn transition<H: Host>(host: &H, next: &fsm::Record, now: Now, metrics: &Metrics<H>) {
    let Some(drain) = next.drain_id.filter(|_| next.state != State::Closing) else {
        return;
    };
    let counters = metrics.tally();
    if next.state == State::Draining {
        change(host, &mut |r| r.began(drain, counters));
    } else {
        write_line(host, next, next.state.name(), counters, now);
    }
}
