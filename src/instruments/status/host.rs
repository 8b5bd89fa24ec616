//! The status view: what every status and wait answer shows, read at once.

use super::Health;

use crate::api::{self, Reply, View};
use crate::gate::fsm::Record;
use crate::gate::placeholder::host as placeholder;
use crate::gate::rotation;
use crate::host::wasm_host::Host;
use crate::host::{logs, metrics::Id};
use crate::instruments::in_flight::host as in_flight;

impl<H: Host> Health<H> {
    /// The status answer (`end`: `None`) or a held wait's final answer, from
    /// the FSM record and everything else it shows, read now.
    pub(super) fn status(&self, rec: &Record, end: Option<api::WaitEnd>) -> Reply {
        let checkers = or_warn(self.store.lb_checkers(), "lb");
        let rotation = or_warn(rotation::host::load(self.host()), "rotation");
        let steps = or_warn(self.store.clock_steps(), "clock");
        let (reg, watch) = self.watch.snapshot();
        let placeholders = placeholder::read_seen(self.host(), &self.placeholders_seen);
        // The registered roots' summaries first, then the count, then the
        // time: a listed stream still in flight is in the count
        // (`InFlight::beside_count`).
        let published = in_flight::published(self.host(), reg.roots.iter().map(|r| r.id));
        let reading = self.active.read();
        let now = self.host().now();
        let view = View {
            rec,
            now,
            steps,
            in_flight: crate::instruments::in_flight::merge(&published, now.timer_ms())
                .beside_count(reading.active, reading.reliable, now.timer_ms()),
            count: reading,
            count_source: self.active.source_name(),
            registry: &reg,
            watch,
            placeholders: &placeholders,
            config: &self.config,
            checkers: &checkers,
            ignored_checks: self.metrics.read(Id::LbChecksIgnored),
            rotation: rotation.as_ref(),
            metric_definitions: crate::host::metrics::definitions(),
            shared_keys: crate::host::keys::created(reg.ids_high),
            receipt: self.tally_of(rec),
            durations: crate::instruments::sizing::host::read(self.host()),
        };
        api::status(&view, end)
    }
}

/// The record read, or (logged) its default when it cannot be read.
fn or_warn<T: Default, E: std::fmt::Display>(read: Result<T, E>, record: &str) -> T {
    read.unwrap_or_else(|e| {
        logs::warning!("event={record}_record_unavailable error=\"{e}\"");
        T::default()
    })
}
