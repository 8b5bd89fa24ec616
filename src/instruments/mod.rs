//! The instruments: what drain-gate measures and shows about a drain, each in its
//! own room, its pure part (`mod.rs`, no proxy-wasm types) beside its host part
//! (`host.rs`). They hang off the gate's events — a stream ended and how, a
//! transition, a tick — and the gate decides nothing on what they measure: one
//! could be removed without changing a decision of the gate, only its call at
//! the event.
//!
//! - [`receipt`]: how every stream of a drain ended, and what the LB cut (the
//!   traffic roles sort each end); [`receipt::host`]: its record in shared
//!   data, fed by the gate's transitions and the traffic roles' completed ends;
//!   the receipt keeper, `keeper.rs`, is a module of the health role,
//!   `crate::host::health`;
//! - [`in_flight`]: how old the streams in flight are; [`in_flight::host`]:
//!   each worker's summary through shared data (the traffic roles publish it at
//!   their tick, the health role reads);
//! - [`sizing`]: how long streams last, and the `drain_timeout` and grace
//!   period they call for; [`sizing::host`]: each traffic root's durations,
//!   once a tick, into shared data and counters;
//! - [`termination`]: the pod's SIGTERM in pilot-agent's readiness;
//!   [`termination::host`]: the health role asks it while a preStop answer is
//!   held;
//! - [`status`]: the status document and the final answer of a held
//!   `wait=closed`; its view (`host.rs`) is a module of the health role,
//!   `crate::host::health`.

pub mod in_flight;
pub mod receipt;
pub mod sizing;
pub mod status;
pub mod termination;
