//! The host shell: translates between proxy-wasm and the pure core. Nothing
//! here decides anything the core can decide. Every host call goes through
//! the [`wasm_host::Host`] trait, so the shell runs in `cargo test` against a
//! stand-in host ([`sim`]) as well as in Envoy.
//!
//! Here: the root context ([`root`]), the traffic roles ([`traffic`]) and the health role ([`health`]), shared
//! data ([`shared`], its keys in [`keys`]), the metrics and the logs. A
//! concern's own host part lives in its room, beside its pure part
//! (`crate::gate`, `crate::instruments`): `host.rs`.

pub mod health;
pub mod keys;
pub mod logs;
pub mod metrics;
pub mod root;
pub mod shared;
#[cfg(not(target_arch = "wasm32"))]
pub mod sim;
pub mod traffic;
pub mod wasm_host;
