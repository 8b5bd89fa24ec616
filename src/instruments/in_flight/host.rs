//! Keeps each worker's in-flight ages (`crate::instruments::in_flight`) and
//! carries them through shared data: every traffic root context keeps its
//! streams in a `Book` and publishes its summary from its tick under its
//! registry id (`keys::in_flight`) when it changed, so the keys are as many
//! as the roots alive at once; a reader merges the summaries of the
//! registered roots, each as fresh as its root's beat.

use std::cell::{Cell, RefCell};

use crate::host::keys;
use crate::host::logs;
use crate::host::shared;
use crate::host::wasm_host::Host;
use crate::instruments::in_flight::{Ages, Published};

/// A traffic root's streams by start tick (`Ages`). A stream is stamped with
/// the time of the last tick, so starting and ending one makes no host call;
/// the tick publishes the summary.
#[derive(Debug)]
pub struct Book<H: Host> {
    host: H,
    ages: RefCell<Ages>,
    last_tick_ms: Cell<u64>,
    /// Streams in flight that started at `last_tick_ms`, counted here (a
    /// stream that starts and ends between two ticks borrows nothing) and
    /// moved into `ages` under that tick by the next tick.
    newest: Cell<u64>,
    tick_ms: u64,
    /// What this root wrote last, under which id: written again only when
    /// it changed.
    published: Cell<Option<(u64, Published)>>,
}

impl<H: Host> Book<H> {
    pub fn new(host: H, tick_ms: u64) -> Book<H> {
        Book {
            last_tick_ms: Cell::new(host.now().timer_ms()),
            host,
            ages: RefCell::new(Ages::default()),
            newest: Cell::new(0),
            tick_ms,
            published: Cell::new(None),
        }
    }

    /// A stream starts: the tick it is stamped with.
    pub fn enter(&self) -> u64 {
        self.newest.set(self.newest.get().saturating_add(1));
        self.last_tick_ms.get()
    }

    /// How long ago, on tick boundaries, a stream that entered at
    /// `started_ms` started (its duration when it ends now).
    pub fn since(&self, started_ms: u64) -> u64 {
        self.last_tick_ms.get().saturating_sub(started_ms)
    }

    /// A stream that entered at `started_ms` ends.
    pub fn exit(&self, started_ms: u64) {
        let newest = self.newest.get();
        if started_ms == self.last_tick_ms.get() && newest > 0 {
            self.newest.set(newest - 1);
        } else if let Ok(mut ages) = self.ages.try_borrow_mut() {
            ages.exit(started_ms);
        }
    }

    /// Writes the summary under the root's registry id (none yet: the root
    /// has not registered, and no reader looks for it) if it changed.
    pub fn tick(&self, id: Option<u64>) {
        let now = self.host.now().timer_ms();
        let newest = self.last_tick_ms.replace(now);
        let Ok(mut ages) = self.ages.try_borrow_mut() else {
            return;
        };
        ages.enter(newest, self.newest.take());
        let Some(id) = id else {
            return;
        };
        ages.compact();
        let summary = ages.publish(now, self.tick_ms);
        let same = |(was_id, was): (u64, Published)| was_id == id && was.same_as(&summary);
        if self.published.get().is_some_and(same) {
            return;
        }
        let key = keys::in_flight(id);
        match self.host.set(&key, &summary.to_bytes(), None) {
            Ok(()) => self.published.set(Some((id, summary))),
            Err(e) => logs::warning!("event=shared_data_error key={key} status={e:?}"),
        }
    }
}

/// The summaries of the roots `ids` (one that is missing is left out). A
/// root writes its summary only when it changed, and beats every tick: its
/// summary is as fresh as its beat.
pub fn published<H: Host>(host: &H, ids: impl IntoIterator<Item = u64>) -> Vec<Published> {
    ids.into_iter()
        .filter_map(|id| {
            let (bytes, _) = host.get(&keys::in_flight(id)).ok()?;
            let p = Published::from_bytes(&bytes?)?;
            let beat = shared::read_u64(host, &keys::beat(id)).ok().flatten();
            Some(Published {
                at_ms: beat.map_or(p.at_ms, |b| b.max(p.at_ms)),
                ..p
            })
        })
        .collect()
}
