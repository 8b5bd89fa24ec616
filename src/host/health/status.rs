//! The status view: what every status and wait answer shows, read at once.

use super::Health;

use crate::api::{self, CountInfo, Reply, RotationView, TrafficInfo, View};
use crate::clock::{self, Now};
use crate::fsm::Record;
use crate::host::count::CountReading;
use crate::host::in_flight;
use crate::host::logs;
use crate::host::placeholder;
use crate::host::wasm_host::Host;
use crate::in_flight::InFlight;
use crate::lb::Checkers;
use crate::rotation;

/// What a status answer shows beyond the FSM record, read at once.
struct Snapshot {
    /// When it was read (after the count).
    now: Now,
    reading: CountReading,
    /// The workers' summaries, read before the count and set beside it.
    in_flight: InFlight,
    checkers: Checkers,
    traffic: TrafficInfo,
    rotation: Option<rotation::Record>,
    /// One above the highest registry id ever handed out.
    ids_high: u64,
}

impl<H: Host> Health<H> {
    /// Everything a status answer shows, read now.
    fn snapshot(&self) -> Snapshot {
        let checkers = self.store.lb_checkers().unwrap_or_else(|e| {
            logs::warning!("event=lb_record_unavailable error=\"{e}\"");
            Checkers::default()
        });
        let rotation = crate::host::rotation::load(self.host()).unwrap_or_else(|e| {
            logs::warning!("event=rotation_record_unavailable error=\"{e}\"");
            None
        });
        let (reg, verdict, watch) = self.watch.snapshot();
        let placeholders = placeholder::read(self.host());
        let traffic = TrafficInfo {
            seen: !verdict.waiting,
            roots: reg.roots.len(),
            lost: (reg.lost.len() as u64).saturating_add(reg.dropped_lost),
            lost_total: reg.lost_total,
            back_total: reg.back_total,
            refused: reg.refused,
            stalls: watch.stalls,
            longest_stall_ms: watch.longest_stall_ms,
            placeholders: placeholders.present(),
            placeholders_serving: placeholders.serving(),
        };
        // The registered roots' summaries first, then the count: a listed
        // stream still in flight is in the count (`InFlight::beside_count`).
        let published = in_flight::published(self.host(), reg.roots.iter().map(|r| r.id));
        let reading = self.active.read();
        let now = self.host().now();
        let in_flight = crate::in_flight::merge(&published, now.timer_ms()).beside_count(
            reading.active,
            reading.reliable,
            now.timer_ms(),
        );
        Snapshot {
            now,
            reading,
            in_flight,
            checkers,
            traffic,
            rotation,
            ids_high: reg.ids_high,
        }
    }

    fn view<'a>(&'a self, rec: &'a Record, snap: &'a Snapshot) -> View<'a> {
        let reading = &snap.reading;
        View {
            rec,
            active: reading.active,
            now: snap.now,
            clock: self.clock_info(),
            in_flight: snap.in_flight,
            count: CountInfo {
                source: self.active.source_name(),
                reliable: reading.reliable,
                http_streams: reading.streams,
                tcp_connections: reading.connections,
                unreliable_reason: reading.why.map(|w| w.name()),
            },
            traffic: snap.traffic,
            draining_lb_status: self.config.draining_lb_status,
            checkers: &snap.checkers,
            ignored_checks: self.metrics.lb_checks_ignored(),
            lb_fall: self.config.lb_fall,
            close_after: self.config.close_after,
            lb_wait: self.lb_wait(),
            rotation: RotationView {
                cluster: self.rotator.cluster(),
                last: snap.rotation.as_ref(),
            },
            footprint: api::Footprint {
                metric_definitions: crate::host::metrics::definitions(),
                shared_keys: crate::host::keys::created(snap.ids_high),
            },
            receipt: self.tally_of(rec),
            new_requests: self.config.shared.draining_new_requests.name(),
            refusal: self.config.shared.refusal,
            durations: crate::host::sizing::read(self.host()),
            closing_ms: self.config.max_closing_ms(),
            scrape_ms: self.config.scrape_interval_ms,
        }
    }

    pub(super) fn status_reply(&self, rec: &Record) -> Reply {
        api::status(&self.view(rec, &self.snapshot()))
    }

    pub(super) fn wait_reply(&self, end: api::WaitEnd, rec: &Record) -> Reply {
        api::wait_reply(end, &self.view(rec, &self.snapshot()))
    }

    /// Which clock the timers run on, and the wall-clock steps seen so far.
    fn clock_info(&self) -> api::ClockInfo {
        let steps = self.store.clock_steps().unwrap_or_else(|e| {
            logs::warning!("event=clock_record_unavailable error=\"{e}\"");
            clock::Steps::default()
        });
        api::ClockInfo::new(self.host().now().timers(), &steps)
    }
}
