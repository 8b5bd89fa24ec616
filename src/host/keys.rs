//! Every shared-data key drain-gate uses, in one place. Shared data is per
//! `vm_id` and process-wide: every role of one Envoy reads and writes these.
//! A `.v1` suffix names the value's format; a new format takes a new key.

/// The FSM record (`crate::fsm::Record`, JSON), written by compare-and-swap.
pub const FSM: &str = "drain_gate.fsm.v1";
/// What every LB checker has been answered (`crate::lb::Checkers`, JSON).
pub const LB: &str = "drain_gate.lb.v1";
/// The clock-step record (`crate::clock::Steps`, JSON).
pub const CLOCK: &str = "drain_gate.clock.v1";
/// The connection rotation of the last drain (`crate::rotation::Record`, JSON).
pub const ROTATION: &str = "drain_gate.rotation.v1";
/// HTTP streams in flight when the gauge is not live (u64, little-endian).
pub const ACTIVE_STREAMS: &str = "drain_gate.active.v1";
/// TCP connections in flight when the gauge is not live (u64, little-endian).
pub const ACTIVE_CONNECTIONS: &str = "drain_gate.active_connections.v1";
/// Why the count is not trusted (a `crate::liveness::Why` name; empty: trusted).
pub const UNRELIABLE: &str = "drain_gate.count_unreliable.v1";
/// Set by every traffic root at configure time: a traffic role counts in this vm_id.
pub const TRAFFIC_PRESENT: &str = "drain_gate.traffic_present.v1";
/// The traffic roots registered for liveness (`crate::liveness::Registry`, JSON).
pub const REGISTRY: &str = "drain_gate.traffic.v1";
/// How many in-flight slots have been claimed (u32, little-endian).
pub const IN_FLIGHT_SLOTS: &str = "drain_gate.in_flight.slots.v1";

/// A traffic root's heartbeat: the monotonic time of its last tick (u64).
pub fn beat(id: u64) -> String {
    format!("drain_gate.beat.v1.{id}")
}

/// A traffic root's in-flight summary (`crate::in_flight::Published`, JSON).
pub fn in_flight(slot: u32) -> String {
    format!("drain_gate.in_flight.v1.{slot}")
}
