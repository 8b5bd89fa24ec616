//! The gate: count every stream, keep the state machine, flip the LB check
//! when the last stream of a drain ends, and answer every audience from the
//! state. Each concern's pure part (`mod.rs`) sits beside its host part
//! (`host.rs`); README.md's code map says what each one holds.

pub mod answer;
pub mod clock;
pub mod count;
pub mod fsm;
pub mod lb;
pub mod liveness;
pub mod placeholder;
pub mod refusal;
pub mod rotation;
