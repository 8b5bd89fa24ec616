//! Every metric drain-gate emits, in one list: name and type (each one's
//! meaning is in the test-only `HELP` table below, out of the module). Pure:
//! the host shell (`host::metrics`) defines them. The metrics table of
//! envoyfilter/docs/observability.md is checked against both by `readme_table_lists_every_metric` below.
//!
//! Envoy exports wasm metrics under the `wasmcustom` namespace, which its
//! Prometheus endpoint strips: these names appear as they are written here.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// An Envoy histogram (`_bucket`, `_count`, `_sum` on Prometheus).
    Histogram,
    /// A histogram of counters, summed over every worker once a tick
    /// (`host::sizing`): `_bucket` with an `le` tag, `_count`, `_sum`.
    Buckets,
}

use crate::instruments::sizing::EXPORT_LE_MS;

/// A metric: its name and its kind.
pub type Metric = (&'static str, Kind);

/// Declares each metric once: its name as a constant, its [`Id`] (its place
/// in [`ALL`]), and [`ALL`], every one of them with its kind, in the order given.
macro_rules! metrics {
    ($($id:ident $name:ident = $metric:literal: $kind:ident,)*) => {
        $(pub const $name: &str = $metric;)*

        /// A metric, by its place in [`ALL`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Id {
            $($id,)*
        }

        pub const ALL: [Metric; [$($name),*].len()] = [$(($name, Kind::$kind)),*];
    };
}

metrics! {
    ActiveRequests ACTIVE_REQUESTS = "drain_gate_active_requests": Gauge,
    ActiveConnections ACTIVE_CONNECTIONS = "drain_gate_active_connections": Gauge,
    State STATE = "drain_gate_state": Gauge,
    // The transition counters, in `State::ALL`'s order (`host::metrics`
    // finds each from the first).
    TransitionsToOpen TRANSITIONS_TO_OPEN = "drain_gate_transitions_to_open": Counter,
    TransitionsToDraining TRANSITIONS_TO_DRAINING = "drain_gate_transitions_to_draining": Counter,
    TransitionsToClosing TRANSITIONS_TO_CLOSING = "drain_gate_transitions_to_closing": Counter,
    TransitionsToClosed TRANSITIONS_TO_CLOSED = "drain_gate_transitions_to_closed": Counter,
    TransitionsToFault TRANSITIONS_TO_FAULT = "drain_gate_transitions_to_fault": Counter,
    ForcedCloses FORCED_CLOSES = "drain_gate_forced_closes": Counter,
    CountErrors COUNT_ERRORS = "drain_gate_count_errors": Counter,
    // 1 (`true`) while the count is not trusted.
    CountUnreliable COUNT_UNRELIABLE = "drain_gate_count_unreliable": Gauge,
    TrafficRolesLost TRAFFIC_ROLES_LOST = "drain_gate_traffic_roles_lost": Counter,
    // In whole seconds, as the name says (Envoy gauges are integers).
    OldestInFlight OLDEST_IN_FLIGHT = "drain_gate_oldest_in_flight_seconds": Gauge,
    ClockSteps CLOCK_STEPS = "drain_gate_clock_steps": Counter,
    LbChecksIgnored LB_CHECKS_IGNORED = "drain_gate_lb_checks_ignored": Counter,
    Cut CUT = "drain_gate_cut": Counter,
    CutLb CUT_LB = "drain_gate_cut_lb": Counter,
    CutTcp CUT_TCP = "drain_gate_cut_tcp": Counter,
    DrainCompleted DRAIN_COMPLETED = "drain_gate_drain_completed": Counter,
    DrainEndedUpstream DRAIN_ENDED_UPSTREAM = "drain_gate_drain_ended_upstream": Counter,
    Refused REFUSED = "drain_gate_refused": Counter,
    DrainsCutShort DRAINS_CUT_SHORT = "drain_gate_drains_cut_short": Counter,
    TerminationWatchUnavailable TERMINATION_WATCH_UNAVAILABLE = "drain_gate_termination_watch_unavailable": Counter,
    StreamDuration STREAM_DURATION = "drain_gate_stream_duration_ms": Buckets,
    UpgradedDuration UPGRADED_DURATION = "drain_gate_upgraded_duration_ms": Buckets,
    TcpDuration TCP_DURATION = "drain_gate_tcp_duration_ms": Buckets,
    // The configured `drain_timeout`, in whole seconds.
    DrainTimeout DRAIN_TIMEOUT = "drain_gate_drain_timeout_seconds": Gauge,
    // A drain's receipt line was logged: how long it took, in ms.
    DrainDuration DRAIN_DURATION = "drain_gate_drain_duration_ms": Histogram,
    // The LB's detection as measured now (`crate::gate::lb::Detection`).
    LbCheckInterval LB_CHECK_INTERVAL = "drain_gate_lb_check_interval_ms": Gauge,
    LbBufferShort LB_BUFFER_SHORT = "drain_gate_lb_buffer_short_ms": Gauge,
}

/// Counters per histogram of counters (`STREAM_DURATION`, `UPGRADED_DURATION`,
/// `TCP_DURATION`): one per exported `le`, `+Inf`, `_count`, `_sum`.
pub const HISTOGRAM_COUNTERS: usize = EXPORT_LE_MS.len() + 3;

/// The name of a family's `j`-th counter: its buckets in `crate::instruments::sizing::EXPORT_LE_MS`'s
/// order, `+Inf`, `_count`, `_sum`.
pub fn histogram_counter(base: &str, j: usize) -> String {
    let n = EXPORT_LE_MS.len();
    match EXPORT_LE_MS.get(j) {
        Some(le) => format!("le=.={le};.;{base}_bucket"),
        None if j == n => format!("le=.=+Inf;.;{base}_bucket"),
        None if j == n + 1 => format!("{base}_count"),
        None => format!("{base}_sum"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_s_transition_counter_is_the_first_one_plus_its_code() {
        // `host::metrics` finds a transition's counter this way.
        for state in crate::gate::fsm::State::ALL {
            let at = Id::TransitionsToOpen as usize + *state as usize;
            let name = ALL.get(at).map(|m| m.0);
            let want = format!("drain_gate_transitions_to_{}", state.name().to_lowercase());
            assert_eq!(name, Some(want.as_str()), "{state:?}");
        }
    }

    #[test]
    #[allow(clippy::indexing_slicing)]
    fn histogram_counters_carry_their_le_in_istio_s_tag_form() {
        let names: Vec<String> = (0..HISTOGRAM_COUNTERS)
            .map(|j| histogram_counter("d", j))
            .collect();
        assert_eq!(names[0], "le=.=25;.;d_bucket");
        assert_eq!(names[15], "le=.=3000000;.;d_bucket");
        assert_eq!(names[16], "le=.=+Inf;.;d_bucket");
        assert_eq!(names[17..], ["d_count", "d_sum"]);
    }

    /// What each metric means (the envoyfilter/docs/observability.md table; kept out of the
    /// module), keyed by name.
    const HELP: [(&str, &str); 30] = [
        (ACTIVE_REQUESTS, "HTTP streams in flight on the traffic listeners (all workers)"),
        (ACTIVE_CONNECTIONS, "connections in flight on the TCP and TLS-passthrough chains (all workers)"),
        (STATE, "0 OPEN, 1 DRAINING, 2 CLOSING, 3 CLOSED, 4 FAULT"),
        (TRANSITIONS_TO_OPEN, "transitions into OPEN (reopen)"),
        (TRANSITIONS_TO_DRAINING, "transitions into DRAINING"),
        (TRANSITIONS_TO_CLOSING, "transitions into CLOSING (LB check flips to 503)"),
        (TRANSITIONS_TO_CLOSED, "transitions into CLOSED (readiness flips to 503)"),
        (TRANSITIONS_TO_FAULT, "transitions into FAULT"),
        (FORCED_CLOSES, "drains closed by drain_timeout with requests still in flight"),
        (COUNT_ERRORS, "streams the filter could not count (the drain then waits for drain_timeout)"),
        (COUNT_UNRELIABLE, "1 while the health role does not trust the count (count.unreliable_reason in /drain/status says why)"),
        (TRAFFIC_ROLES_LOST, "traffic root contexts declared lost: silent without a goodbye (a failed VM, or a worker late by seconds: traffic.back_total counts those that came back)"),
        (OLDEST_IN_FLIGHT, "age of the oldest stream in flight, all workers (0 when none; to one tick)"),
        (CLOCK_STEPS, "wall-clock steps seen (the drain timers run on the monotonic clock and ignore them)"),
        (LB_CHECKS_IGNORED, "LB checks from sources outside lb_checkers: answered, not recorded (an LB behind SNAT or a wrong CIDR)"),
        (CUT, "streams and connections the downstream ended before they completed, during a drain (the LB's reset at DOWN, or a client that gave up; also a websocket its client closed, [Limits](limits.md#limits))"),
        (CUT_LB, "of drain_gate_cut, those the LB made: within 2 s of an LB checker's DOWN (its lb_fall-th consecutive 503), or, from that checker's own address, within 2 s of one of its next lb_fall 503s (a second backend of one LB)"),
        (CUT_TCP, "of drain_gate_cut, TCP and TLS-passthrough connections (the rest are HTTP streams)"),
        (DRAIN_COMPLETED, "streams and connections that completed during a drain: the upstream's answer (or the route's direct response) ended (each worker adds its own up and counts them at its next tick)"),
        (DRAIN_ENDED_UPSTREAM, "streams and connections ended by the upstream or by Envoy itself during a drain (an upstream reset or timeout; a local reply: Envoy's 504 on a route timeout, its 503 on a connect failure, whatever reached the client)"),
        (REFUSED, "new HTTP requests refused while draining (draining_new_requests: refuse: answered 503 or reset), never forwarded"),
        (DRAINS_CUT_SHORT, "drains cut short: the pod's SIGTERM came before CLOSED, while its preStop answer was held (pilot-agent's readiness turned 503, termination_watch); the drain's receipt line says ended=SIGTERM"),
        (TERMINATION_WATCH_UNAVAILABLE, "termination_watch cannot see the pod's SIGTERM: Envoy answered the call itself (nothing listens on the cluster's port), no such cluster, an answer that is not pilot-agent's readiness, or pilot-agent's 503 before any 200 (not ready); counted once per worker that watches, its event=termination_watch_unavailable warning says why. The drain goes on; a SIGTERM before CLOSED is then not in its receipt"),
        (STREAM_DURATION, "how long HTTP streams lasted that were not upgraded, since the pod started (to one tick; counted at each worker's tick): _bucket{le}, _count, _sum"),
        (UPGRADED_DURATION, "how long upgraded streams (WebSocket, CONNECT) of 1 s or more lasted; a shorter one is in drain_gate_stream_duration_ms"),
        (TCP_DURATION, "how long connections of the TCP and TLS-passthrough chains lasted"),
        (DRAIN_TIMEOUT, "the configured drain_timeout (DrainTimeoutBelowTraffic compares it with the streams' p99.9)"),
        (DRAIN_DURATION, "how long drains took, start to end, as their receipt lines say (duration_ms)"),
        (LB_CHECK_INTERVAL, "the LB's check interval as drain-gate measures it: of the live checkers, the longest median of a checker's last 8 gaps between checks, each gap after a check answered 200 or 404 (0 until a checker has 3 gaps; set each second by the health role's tick)"),
        (LB_BUFFER_SHORT, "how much lb_buffer (lb_down_timeout with close_after: lb_observed_down) falls short of the LB's detection, lb_fall × drain_gate_lb_check_interval_ms: CLOSED, and the pod's exit, may come before the LB marks the gateway DOWN (0 when it covers it or nothing is measured; /drain/status lb.detection names the checker)"),
    ];

    fn help(name: &str) -> &'static str {
        HELP.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, h)| *h)
            .unwrap_or_default()
    }

    #[test]
    fn every_metric_has_one_help_text() {
        let names: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
        let helped: Vec<&str> = HELP.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names, helped,
            "metric_names::ALL vs the help table, in order"
        );
    }

    /// The rows of envoyfilter/docs/observability.md's metrics table as (name, type, meaning), with
    /// the Markdown backticks removed.
    fn readme_rows() -> Vec<(String, String, String)> {
        let readme = include_str!("../envoyfilter/docs/observability.md");
        let table = readme
            .split("\n## Metrics\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .unwrap_or_default();
        table
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<String> = l
                    .trim_matches('|')
                    .split(" | ")
                    .map(|c| c.trim().replace('`', ""))
                    .collect();
                let cell = |i: usize| cells.get(i).cloned().unwrap_or_default();
                (cell(0), cell(1), cell(2))
            })
            .collect()
    }

    #[test]
    fn readme_table_lists_every_metric() {
        let rows = readme_rows();
        let listed: Vec<(String, String, String)> = ALL
            .iter()
            .map(|(name, kind)| {
                let kind = match kind {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                    Kind::Histogram => "histogram",
                    Kind::Buckets => "histogram (counters)",
                };
                (name.to_string(), kind.to_string(), help(name).to_string())
            })
            .collect();
        assert_eq!(
            rows, listed,
            "envoyfilter/docs/observability.md ## Metrics table vs metric_names::ALL"
        );
    }
}
