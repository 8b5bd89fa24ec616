//! The host shell: translates between proxy-wasm and the pure core. Nothing
//! here decides anything the core can decide.

pub mod clock;
pub mod count;
pub mod health;
pub mod in_flight;
pub mod liveness;
pub mod metrics;
pub mod root;
pub mod rotation;
pub mod shared;
pub mod store;
pub mod traffic;

pub use clock::{now, wall_ms};
