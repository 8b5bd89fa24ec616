//! A traffic filter whose own configuration did not load, as its placeholder
//! reports it. Pure.
//!
//! An ECDS filter (Istio's WasmPlugin) that Envoy cannot configure — its
//! module was fetched but does not load, or its configuration is refused —
//! has no configuration, and Envoy answers every request of its listener 500,
//! while the health listener, another listener, answers the LB 200. Envoy runs
//! an ECDS filter's `default_config` until its own configuration arrives, and
//! instead of it when it never does. drain-gate's chart gives a canary's filter
//! one: drain-gate in the `placeholder` role. A placeholder passes every
//! request on and counts nothing (the fleet's traffic filter beside it counts);
//! it registers here on its first tick (it is **present**) and marks its first
//! request (it **served**: the listener went live without the filter's own
//! configuration). When that configuration arrives, Envoy removes the
//! placeholder and it says goodbye. A placeholder whose VM died never does:
//! the gateway then stays out, which is the safe way to be wrong.
//!
//! What the health role does about it ([`action`]):
//!
//! - a gateway not yet **announced** (no LB check answered 200 since the
//!   process started: the LB has sent it nothing) with a placeholder present
//!   is kept out: LB check and readiness 503, `waiting_for: "filter_config"`.
//!   A new pod whose canary module is being fetched waits so too, and is
//!   announced once the module loaded;
//! - an announced gateway is only drained, never flipped: a placeholder that
//!   **served** starts a drain that holds CLOSING (a maintenance drain), so the
//!   LB check turns 503 when the last request ends, and nothing is cut. A
//!   placeholder that is only present is the filter of a listener still
//!   warming (Envoy waits for the module; the previous listener serves): no
//!   action, since the module may still load.

pub mod host;

use crate::gate::fsm::State;
use crate::json::record;

/// Most placeholders remembered at once (one per worker VM and placeholder
/// configuration, and the main thread's); past it a registration counts as
/// present and served for the life of the process.
pub const MAX_PLACEHOLDERS: usize = 512;

record! {
    /// One placeholder root context.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Placeholder {
        pub id: u64,
        pub since_ms: u64,
        pub served: bool,
    }
}

record! {
    /// Every placeholder of one `vm_id`, in shared data (compare-and-swap).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Placeholders {
        /// The next id to hand out.
        pub next_id: u64,
        pub list: Vec<Placeholder>,
        /// Registrations refused at `MAX_PLACEHOLDERS`: present and served from then on.
        pub refused: u64,
    }
}

/// What the health role does about the placeholders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do.
    None,
    /// Do not announce the gateway (LB check and readiness 503).
    KeepOut,
    /// Start a drain that holds CLOSING (the gateway is OPEN and announced).
    Drain,
}

impl Placeholders {
    /// Registers a placeholder; `None` when `MAX_PLACEHOLDERS` are registered.
    pub fn register(&mut self, now_ms: u64) -> Option<u64> {
        if self.list.len() >= MAX_PLACEHOLDERS {
            self.refused = self.refused.saturating_add(1);
            return None;
        }
        let id = self.next_id;
        self.next_id = self.next_id.saturating_add(1);
        self.list.push(Placeholder {
            id,
            since_ms: now_ms,
            served: false,
        });
        Some(id)
    }

    /// Marks a request through placeholder `id`. Returns whether it changed.
    pub fn serve(&mut self, id: u64) -> bool {
        let unmarked = self.list.iter_mut().find(|p| p.id == id && !p.served);
        unmarked.map(|p| p.served = true).is_some()
    }

    /// Placeholder `id` was removed (its filter got its own configuration).
    pub fn goodbye(&mut self, id: u64) -> bool {
        let at = self.list.iter().position(|p| p.id == id);
        at.map(|i| self.list.remove(i)).is_some()
    }

    /// Placeholders running now (a refused registration counts for ever).
    pub fn present(&self) -> u64 {
        (self.list.len() as u64).saturating_add(self.refused)
    }

    /// Placeholders that passed a request on.
    pub fn serving(&self) -> u64 {
        (self.list.iter().filter(|p| p.served).count() as u64).saturating_add(self.refused)
    }
}

/// What to do with `present` / `serving` placeholders on a gateway in
/// `state`, `announced` or not (see the module doc).
pub fn action(present: u64, serving: u64, announced: bool, state: State) -> Action {
    match (present, announced) {
        (0, _) => Action::None,
        (_, false) => Action::KeepOut,
        (_, true) if serving > 0 && state == State::Open => Action::Drain,
        (_, true) => Action::None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn present_served_and_gone() {
        let mut p = Placeholders::default();
        let a = p.register(10).unwrap();
        let b = p.register(10).unwrap();
        assert_ne!(a, b);
        assert_eq!((p.present(), p.serving()), (2, 0));
        assert!(p.serve(a) && !p.serve(a), "once");
        assert_eq!((p.present(), p.serving()), (2, 1));
        assert!(p.goodbye(a) && !p.goodbye(a));
        assert!(p.goodbye(b));
        assert_eq!((p.present(), p.serving()), (0, 0));
        assert!(!p.serve(b), "a placeholder gone serves nothing");
    }

    #[test]
    fn past_the_bound_a_registration_is_present_and_served_for_ever() {
        let mut p = Placeholders::default();
        for _ in 0..MAX_PLACEHOLDERS {
            p.register(0).unwrap();
        }
        assert_eq!(p.register(0), None);
        let ids: Vec<u64> = p.list.iter().map(|x| x.id).collect();
        for id in ids {
            p.goodbye(id);
        }
        assert_eq!((p.present(), p.serving()), (1, 1));
    }

    #[test]
    fn a_new_gateway_waits_an_announced_one_drains_only_once_a_placeholder_served() {
        use Action::*;
        assert_eq!(action(0, 0, false, State::Open), None);
        assert_eq!(action(3, 0, false, State::Open), KeepOut, "a new pod waits");
        assert_eq!(action(3, 3, false, State::Open), KeepOut);
        assert_eq!(
            action(3, 0, true, State::Open),
            None,
            "a listener still warming: the previous one serves, the module may load"
        );
        assert_eq!(action(3, 1, true, State::Open), Drain);
        for s in [State::Draining, State::Closing, State::Closed, State::Fault] {
            assert_eq!(
                action(3, 1, true, s),
                None,
                "{s:?}: already out, or on its way"
            );
        }
    }

    #[test]
    fn the_record_reads_back() {
        let mut p = Placeholders::default();
        p.register(5).unwrap();
        p.serve(0);
        let bytes = serde_json::to_vec(&p).unwrap();
        let back: Placeholders = crate::json::from_slice(&bytes).unwrap();
        assert_eq!(back, p);
    }
}
