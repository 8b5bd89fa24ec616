//! The gate: count every stream, keep the state machine, flip the LB check when
//! the last stream of a drain ends, and answer every audience from the state —
//! everything drain-gate decides on, in one room. Each concern is one place: its
//! pure part (`mod.rs`, no proxy-wasm types) beside its host part (`host.rs`).
//!
//! - [`fsm`]: the states, the transition table, `advance()`; [`fsm::host`]: the
//!   FSM record in shared data, one per `vm_id`, written only by
//!   compare-and-swap (and the LB and clock-step records beside it);
//! - [`answer`]: what every audience is answered;
//! - [`count`]: the active count across every worker (host; a lease, never
//!   reads 0 while unreliable); [`count::traffic`]: the traffic roles that
//!   count every stream and connection and flip on the last one of a drain;
//! - [`liveness`]: whether the traffic role is there and alive, and when the
//!   count is unreliable; [`liveness::host`]: the traffic roots' registry and
//!   beats, the health role's watch;
//! - [`placeholder`]: a traffic filter whose own configuration did not load
//!   keeps a new gateway out and drains one in service; [`placeholder::host`]:
//!   the placeholder role;
//! - [`lb`]: what each LB checker has been answered: LB-observed-down, the
//!   soft-drain gate;
//! - [`clock`]: the clock the timers run on (monotonic), and the wall clock's
//!   steps;
//! - [`refusal`]: which new requests a refusing drain refuses, and how (traffic
//!   roles);
//! - [`rotation`]: connection rotation, Envoy's own drain at the flip or the
//!   gate; [`rotation::host`]: the health root's one admin call and its record.

pub mod answer;
pub mod clock;
pub mod count;
pub mod fsm;
pub mod lb;
pub mod liveness;
pub mod placeholder;
pub mod refusal;
pub mod rotation;
