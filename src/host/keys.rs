//! Every shared-data key drain-gate uses, in one place. Shared data is per
//! `vm_id` and process-wide: every role of one Envoy reads and writes these.
//! A `.v1` suffix names the value's format; a new format takes a new key.

/// Declares each fixed key once, and [`FIXED`], every one of them.
macro_rules! fixed {
    ($($(#[$doc:meta])* $name:ident = $key:literal,)*) => {
        $($(#[$doc])* pub const $name: &str = $key;)*

        /// Every key above: one each per process.
        pub const FIXED: [&str; [$($name),*].len()] = [$($name),*];
    };
}

fixed! {
    /// The FSM record (`crate::gate::fsm::Record`, JSON), written by compare-and-swap.
    FSM = "drain_gate.fsm.v1",
    /// What every LB checker has been answered (`crate::gate::lb::Checkers`, JSON;
    /// times on the timer clock).
    LB = "drain_gate.lb.v2",
    /// The clock-step record (`crate::gate::clock::Steps`, JSON).
    CLOCK = "drain_gate.clock.v1",
    /// The connection rotation of the last drain (`crate::gate::rotation::Record`, JSON).
    ROTATION = "drain_gate.rotation.v1",
    /// HTTP streams in flight when the gauge is not live (u64, little-endian).
    ACTIVE_STREAMS = "drain_gate.active.v1",
    /// TCP connections in flight when the gauge is not live (u64, little-endian).
    ACTIVE_CONNECTIONS = "drain_gate.active_connections.v1",
    /// Streams in flight that could not be counted (u64): the count is
    /// unreliable while it is above 0.
    UNCOUNTED = "drain_gate.uncounted.v1",
    /// The liveness verdict (the registry generation it was judged at, u64, then
    /// a `crate::gate::liveness::Unreliable` name; no name: trusted), written by the health
    /// role's judge.
    VERDICT = "drain_gate.verdict.v1",
    /// Who judges the registry, and since when (`crate::gate::liveness::Judging`, its
    /// fixed little-endian form).
    WATCH = "drain_gate.watch.v2",
    /// Which of drain-gate's gauges are live (JSON), probed once per process.
    GAUGES = "drain_gate.gauges.v1",
    /// Set by every traffic root at configure time: a traffic role counts in this vm_id.
    TRAFFIC_PRESENT = "drain_gate.traffic_present.v1",
    /// The traffic roots registered for liveness (`crate::gate::liveness::Registry`, JSON).
    REGISTRY = "drain_gate.traffic.v2",
    /// The placeholders running (`crate::gate::placeholder::Placeholders`, JSON).
    PLACEHOLDERS = "drain_gate.placeholders.v1",
    /// The stream durations of every traffic root since the process started
    /// (the fixed little-endian form `crate::instruments::sizing::Durations::from_bytes`
    /// reads), added to once a tick.
    DURATIONS = "drain_gate.durations.v1",
    /// The receipt's record (`crate::instruments::receipt::Record`, JSON): the latest drain's
    /// base and flip, and the line of a drain that ended until it is logged.
    RECEIPT = "drain_gate.receipt.v1",
}

/// How many keys drain-gate has created in this process: the fixed ones and,
/// per registry id ever handed out (`ids_high`), a beat and an in-flight key.
pub fn created(ids_high: u64) -> u64 {
    (FIXED.len() as u64).saturating_add(ids_high.saturating_mul(2))
}

/// A traffic root's heartbeat: the timer-clock time of its last tick (u64).
/// One per registry id; ids are reused, so these stay bounded.
pub fn beat(id: u64) -> String {
    keyed("drain_gate.beat.v1.", id)
}

/// The prefix (ending in `.`) then the id in decimal: built by every tick,
/// without the formatting machinery (`format!` costs several times more).
fn keyed(prefix: &str, id: u64) -> String {
    /// Appends `n` in decimal.
    fn push_decimal(key: &mut String, n: u64) {
        if n >= 10 {
            push_decimal(key, n / 10);
        }
        key.push(char::from(b'0' + (n % 10) as u8));
    }
    let mut key = String::with_capacity(prefix.len() + 20);
    key.push_str(prefix);
    push_decimal(&mut key, id);
    key
}

/// A traffic root's in-flight summary (`crate::instruments::in_flight::Published`, its
/// fixed little-endian form), under its registry id: written when it changed.
pub fn in_flight(id: u64) -> String {
    keyed("drain_gate.in_flight.v3.", id)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_keyed_key_is_its_prefix_and_its_id_in_decimal() {
        for id in [0, 7, 10, 512, u64::MAX] {
            assert_eq!(super::beat(id), format!("drain_gate.beat.v1.{id}"));
            assert_eq!(
                super::in_flight(id),
                format!("drain_gate.in_flight.v3.{id}")
            );
        }
    }
}
