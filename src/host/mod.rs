//! The host shell: translates between proxy-wasm and the pure core. Nothing
//! here decides anything the core can decide. Every host call goes through
//! the [`wasm_host::Host`] trait, so the shell runs in `cargo test` against a
//! stand-in host ([`sim`]) as well as in Envoy.
//!
//! Where a core module's shell lives: in the file of the same name here
//! (`liveness`, `in_flight`, `rotation`, `placeholder`, `receipt`), which reads and
//! writes that module's records in shared data and makes its host calls. The
//! records whose core module has no such file — the FSM record (`crate::fsm`),
//! the LB view (`crate::lb`), the clock steps (`crate::clock`), all the health
//! role's — are in [`store`].

pub mod count;
pub mod health;
pub mod in_flight;
pub mod keys;
pub mod liveness;
pub mod logs;
pub mod metrics;
pub mod placeholder;
pub mod receipt;
pub mod root;
pub mod rotation;
pub mod shared;
#[cfg(not(target_arch = "wasm32"))]
pub mod sim;
pub mod sizing;
pub mod store;
pub mod termination;
pub mod traffic;
pub mod wasm_host;
