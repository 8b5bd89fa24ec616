//! Shared data over the [`Host`] trait: the one compare-and-swap loop
//! ([`cas_update`]) every writer of a shared value goes through — the state
//! record, the LB and clock records, the count, the registries — its JSON
//! forms, and the one error type of a shared-data access.

use proxy_wasm::types::Status;
use std::borrow::Borrow;
use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use super::wasm_host::Host;
use crate::json::{self, FromJson, Unreadable};

/// Compare-and-swap retries before an update gives up (only under
/// pathological contention).
pub const RETRIES: usize = 64;

/// Why a shared-data access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedError {
    Read(Status),
    Write(Status),
    /// `RETRIES` writers in a row came first.
    Contention,
    /// The value is not what drain-gate writes there.
    Unreadable {
        key: &'static str,
        why: Unreadable,
    },
    /// The value could not be serialized (never expected: plain records).
    Unwritable {
        key: &'static str,
    },
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read(s) => write!(f, "shared data read failed: {s:?}"),
            Self::Write(s) => write!(f, "shared data write failed: {s:?}"),
            Self::Contention => write!(f, "too much contention on shared data"),
            Self::Unreadable { key, why } => write!(f, "unreadable {key}: {why}"),
            Self::Unwritable { key } => write!(f, "{key}: the value could not be serialized"),
        }
    }
}

/// What an update decides for the value it was shown.
pub enum Decision<R, V = Vec<u8>> {
    /// Write this value (if nobody wrote meanwhile) and return `R`.
    Write(V, R),
    /// Write nothing and return `R`.
    Keep(R),
}

/// The one compare-and-swap loop: reads `key`, lets `f` decide from the
/// current bytes (`None`: absent) and their version (`None`: absent; a
/// [`Seen`] value needs it), writes with the version it read, and
/// starts again when another writer came first. An absent key is written
/// unconditionally: shared data has no create-if-absent, so two writers that
/// both find a key absent both write, and one update is lost. Every key that
/// several writers share is therefore created on configure
/// (`host::root::create_shared`), which Envoy runs on the main thread before
/// any worker VM exists; the count's keys refuse an absent value outright.
pub fn cas_update<H: Host + ?Sized, R, E: From<SharedError>>(
    host: &H,
    key: &str,
    mut f: impl FnMut(Option<&[u8]>, Option<u32>) -> Result<Decision<R>, E>,
) -> Result<R, E> {
    for _ in 0..RETRIES {
        let (bytes, cas) = host.get(key).map_err(SharedError::Read)?;
        match f(bytes.as_deref(), cas)? {
            Decision::Keep(r) => return Ok(r),
            Decision::Write(next, r) => match host.set(key, &next, cas) {
                Ok(()) => return Ok(r),
                Err(Status::CasMismatch) => continue,
                Err(e) => return Err(SharedError::Write(e).into()),
            },
        }
    }
    Err(SharedError::Contention.into())
}

/// A JSON record in shared data: its key, and its value as this reader
/// parsed it last, with the version (`cas`) and length of the bytes it was
/// parsed from. Shared data is versioned — every write moves the key's `cas`
/// on — so bytes of the version parsed last are the bytes parsed then: read
/// again, they cost the host's copy and no parse. One per reader (a role's
/// root context): a tick that finds nothing changed parses nothing. A writer
/// without one (`load`, `edit`, `update`) parses afresh and keeps nothing.
#[derive(Debug)]
pub struct Seen<T>(&'static str, RefCell<Option<(u32, usize, Rc<T>)>>);

impl<T: FromJson> Seen<T> {
    pub const fn new(key: &'static str) -> Seen<T> {
        Seen(key, RefCell::new(None))
    }

    /// The value of `bytes`, version `cas`: the one parsed last when the
    /// version did not move, else parsed now (and kept).
    fn value(&self, bytes: &[u8], cas: Option<u32>) -> Result<Rc<T>, SharedError> {
        if let Some((seen, len, value)) = &*self.1.borrow() {
            if Some(*seen) == cas && *len == bytes.len() {
                return Ok(Rc::clone(value));
            }
        }
        let value = Rc::new(parse(self.0, bytes)?);
        *self.1.borrow_mut() = cas.map(|c| (c, bytes.len(), Rc::clone(&value)));
        Ok(value)
    }

    /// The value now (`None`: absent).
    pub fn read<H: Host + ?Sized>(&self, host: &H) -> Result<Option<Rc<T>>, SharedError> {
        let (bytes, cas) = host.get(self.0).map_err(SharedError::Read)?;
        bytes.map(|b| self.value(&b, cas)).transpose()
    }
}

impl<T: FromJson + serde::Serialize> Seen<T> {
    /// `cas_update` of the record: `f` decides from the value (`None`:
    /// absent), parsed only when its version moved since this reader parsed
    /// it, and the value it says to write is written.
    pub fn change<H: Host + ?Sized, R, V: Borrow<T>>(
        &self,
        host: &H,
        mut f: impl FnMut(Option<Rc<T>>) -> Decision<R, V>,
    ) -> Result<R, SharedError> {
        cas_update(host, self.0, |bytes, cas| {
            let seen = bytes.map(|b| self.value(b, cas)).transpose()?;
            Ok(match f(seen) {
                Decision::Write(v, r) => Decision::Write(encode(self.0, v.borrow())?, r),
                Decision::Keep(r) => Decision::Keep(r),
            })
        })
    }
}

/// A record that reads `T::default()` when absent, parsed afresh: for
/// readers and writers that keep nothing.
impl<T: FromJson + serde::Serialize + Default> Seen<T> {
    /// The value now.
    pub fn load<H: Host + ?Sized>(&self, host: &H) -> Result<T, SharedError> {
        let (bytes, _) = host.get(self.0).map_err(SharedError::Read)?;
        bytes.map_or_else(|| Ok(T::default()), |b| parse(self.0, &b))
    }

    /// `cas_update` of the record that changes the value with `f` and writes
    /// it when `f` says it changed it; whether it did.
    pub fn edit<H: Host + ?Sized>(
        &self,
        host: &H,
        f: &mut dyn FnMut(&mut T) -> bool,
    ) -> Result<bool, SharedError> {
        cas_update(host, self.0, |bytes, _| {
            let mut value = bytes.map_or_else(|| Ok(T::default()), |b| parse(self.0, b))?;
            Ok(match f(&mut value) {
                true => Decision::Write(encode(self.0, &value)?, true),
                false => Decision::Keep(false),
            })
        })
    }

    /// `edit` that always writes; what `f` returned.
    pub fn update<H: Host + ?Sized, R: Default>(
        &self,
        host: &H,
        mut f: impl FnMut(&mut T) -> R,
    ) -> Result<R, SharedError> {
        let mut r = R::default();
        self.edit(host, &mut |value| {
            r = f(value);
            true
        })
        .map(|_| r)
    }
}

/// Parses a JSON value drain-gate wrote under `key`.
pub fn parse<T: FromJson>(key: &'static str, bytes: &[u8]) -> Result<T, SharedError> {
    json::from_slice(bytes).map_err(|why| SharedError::Unreadable { key, why })
}

/// Serializes a value for `key`.
pub fn encode<T: serde::Serialize>(key: &'static str, value: &T) -> Result<Vec<u8>, SharedError> {
    serde_json::to_vec(value).map_err(|_| SharedError::Unwritable { key })
}

/// A little-endian `u64` (the counts, the beats), `None` when absent or of
/// another shape.
pub fn read_u64<H: Host + ?Sized>(host: &H, key: &str) -> Result<Option<u64>, SharedError> {
    let (bytes, _) = host.get(key).map_err(SharedError::Read)?;
    Ok(bytes.as_deref().and_then(u64_of))
}

/// The `u64` in these bytes, if they are one.
pub fn u64_of(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_le_bytes)
}

/// Creates `key` holding `value` as JSON unless it exists (configure-time
/// creation: `create`); a failure is logged, naming the key.
pub fn ensure_json<H: Host + ?Sized, T: serde::Serialize>(host: &H, key: &'static str, value: &T) {
    let created = encode(key, value).and_then(|bytes| create(host, key, &bytes));
    logged(log::Level::Error, key, created);
}

/// `create` whose failure is logged, naming the key.
pub fn ensure<H: Host + ?Sized>(host: &H, key: &str, value: &[u8]) {
    logged(log::Level::Error, key, create(host, key, value));
}

/// The value of an access to `key`; a failure is logged at `level`
/// (`event=shared_data_error`).
pub fn logged<T>(level: log::Level, key: &str, result: Result<T, SharedError>) -> Option<T> {
    if let Err(e) = &result {
        super::logs::emit(
            level,
            format_args!("event=shared_data_error key={key} error=\"{e}\""),
        );
    }
    result.ok()
}

/// Writes `value` under `key` unless the key already exists (configure-time
/// creation, see `cas_update`).
pub fn create<H: Host + ?Sized>(host: &H, key: &str, value: &[u8]) -> Result<(), SharedError> {
    match host.get(key).map_err(SharedError::Read)? {
        (Some(_), _) => Ok(()),
        (None, _) => host.set(key, value, None).map_err(SharedError::Write),
    }
}
