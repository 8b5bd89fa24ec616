//! Placeholders in shared data (the decisions are `crate::gate::placeholder`).
//!
//! A placeholder root registers on its first tick (present), marks its first
//! request (served: one compare-and-swap per root, then a `Cell` read per
//! request) and leaves when Envoy removes it (its filter got its own
//! configuration). It registers on its first tick, not on configure, for the
//! reason the traffic roots do (`crate::gate::liveness::host::Heartbeat`): the root Envoy
//! configures in the main thread's base VM to validate the plugin never
//! ticks, carries no request and is never removed.

use std::cell::Cell;
use std::rc::Rc;

use crate::gate::liveness::host::Member;
use crate::gate::placeholder::Placeholders;
use crate::host::keys;
use crate::host::logs;
use crate::host::shared::{self, Seen};
use crate::host::wasm_host::{Envoy, Host};

/// Creates the record if absent (configure runs on the main thread before any
/// worker VM, so this cannot race another creator).
pub fn ensure<H: Host>(host: &H) {
    shared::ensure_json(host, keys::PLACEHOLDERS, &Placeholders::default());
}

/// The placeholders of this `vm_id` (none when unreadable: the error is
/// logged), parsed only when the record changed since `seen` parsed it.
pub fn read_seen<H: Host>(host: &H, seen: &Seen<Placeholders>) -> Rc<Placeholders> {
    let read = seen.read(host);
    let read = shared::logged(log::Level::Warn, keys::PLACEHOLDERS, read);
    read.flatten().unwrap_or_default()
}

/// One per placeholder root context.
#[derive(Debug)]
pub struct Stand<H: Host = Envoy> {
    host: H,
    member: Member,
    served: Cell<bool>,
}

impl<H: Host> Stand<H> {
    pub fn new(host: H) -> Stand<H> {
        Stand {
            host,
            member: Member::default(),
            served: Cell::new(false),
        }
    }

    /// From the tick: registers, once.
    pub fn tick(&self) {
        self.member.ensure(|| self.register());
    }

    fn register(&self) -> Option<u64> {
        let now = self.host.now().timer_ms();
        let id = Seen::new(keys::PLACEHOLDERS)
            .update(&self.host, |p: &mut Placeholders| p.register(now))
            .unwrap_or_else(|e| {
                logs::error!("event=placeholder_unregistered error=\"{e}\"");
                None
            })?;
        logs::warning!(
            "event=placeholder_present id={id} what=\"a traffic filter runs drain-gate's placeholder: \
             its own configuration has not loaded (yet); a gateway not announced stays out\""
        );
        Some(id)
    }

    /// From each request it passes on (uncounted): the first one marks it served.
    pub fn serve(&self) {
        // Once gone, `ensure` has no id: nothing to mark.
        if self.served.replace(true) {
            return;
        }
        let Some(id) = self.member.ensure(|| self.register()) else {
            return;
        };
        match Seen::new(keys::PLACEHOLDERS).edit(&self.host, &mut |p: &mut Placeholders| p.serve(id)) {
            Ok(_) => logs::error!(
                "event=placeholder_served id={id} what=\"a request passed a traffic filter that runs without \
                 its own configuration: the module did not load; an announced gateway drains\""
            ),
            Err(e) => logs::error!("event=placeholder_unregistered id={id} error=\"{}\"", e),
        }
    }

    /// Leaves the record (Envoy removed this placeholder). Idempotent.
    pub fn goodbye(&self) {
        let Some(id) = self.member.gone() else { return };
        match Seen::new(keys::PLACEHOLDERS)
            .edit(&self.host, &mut |p: &mut Placeholders| p.goodbye(id))
        {
            Ok(_) => logs::info!("event=placeholder_gone id={id}"),
            Err(e) => logs::error!("event=placeholder_goodbye_failed id={id} error=\"{}\"", e),
        }
    }
}

impl<H: Host> Drop for Stand<H> {
    fn drop(&mut self) {
        self.goodbye();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::host::sim::Sim;

    /// The placeholders now, parsed afresh.
    fn read<H: Host>(host: &H) -> Placeholders {
        Placeholders::clone(&read_seen(host, &Seen::new(keys::PLACEHOLDERS)))
    }

    #[test]
    fn present_on_its_first_tick_served_on_its_first_request_gone_when_dropped() {
        let sim = Sim::at(1_000);
        ensure(&&sim);
        let stand = Stand::new(&sim);
        assert_eq!(
            read(&&sim).present(),
            0,
            "registered on its first tick, not before"
        );
        stand.tick();
        stand.tick();
        assert_eq!((read(&&sim).present(), read(&&sim).serving()), (1, 0));
        stand.serve();
        let writes = sim.host_calls.get();
        stand.serve();
        assert_eq!(
            sim.host_calls.get(),
            writes,
            "a request after the first costs no host call"
        );
        assert_eq!(read(&&sim).serving(), 1);
        drop(stand);
        assert_eq!(read(&&sim).present(), 0);
    }

    #[test]
    fn a_request_before_the_first_tick_registers_it_served() {
        let sim = Sim::at(1_000);
        ensure(&&sim);
        let stand = Stand::new(&sim);
        stand.serve();
        assert_eq!((read(&&sim).present(), read(&&sim).serving()), (1, 1));
        stand.goodbye();
        stand.tick();
        assert_eq!(
            read(&&sim).present(),
            0,
            "never registers again after its goodbye"
        );
    }
}
