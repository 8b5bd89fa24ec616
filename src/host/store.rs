//! The FSM record in Envoy shared data: one value per `vm_id`, process-wide,
//! written only by compare-and-swap so that every worker sees one state and
//! two racing callers of a transition get one success and one 409.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::metrics::Metrics;
use super::{now, wall_ms};
use crate::clock::{Look, Now, Steps};
use crate::fsm::{self, Illegal, Move, Record};
use crate::lb::Checkers;
use crate::rotation;

const KEY: &str = "drain_gate.fsm.v1";
const LB_KEY: &str = "drain_gate.lb.v1";
const CLOCK_KEY: &str = "drain_gate.clock.v1";
/// CAS retries before a transition gives up (only under pathological contention).
const RETRIES: usize = 64;

#[derive(Debug)]
pub enum Error {
    /// The move is not legal from the current state (HTTP 409).
    Illegal(Illegal),
    /// Shared data could not be read or written (HTTP 503).
    Store(String),
}

fn read() -> Result<Option<(Record, u32)>, String> {
    match hostcalls::get_shared_data(KEY) {
        Ok((Some(bytes), Some(cas))) => serde_json::from_slice(&bytes)
            .map(|r| Some((r, cas)))
            .map_err(|e| format!("unreadable state record: {e}")),
        Ok(_) => Ok(None),
        Err(e) => Err(format!("shared data read failed: {e:?}")),
    }
}

fn write(rec: &Record, cas: Option<u32>) -> Result<(), Status> {
    write_json(KEY, rec, cas)
}

/// The current record and its CAS version, creating the OPEN record on first use.
pub fn load_versioned() -> Result<(Record, u32), String> {
    for _ in 0..RETRIES {
        if let Some(found) = read()? {
            return Ok(found);
        }
        // First VM in the process: create the initial record. Another VM may
        // do the same concurrently; both write OPEN before any transition can
        // have happened, and the read above then picks up the stored one.
        write(&Record::new(wall_ms()), None)
            .map_err(|e| format!("shared data write failed: {e:?}"))?;
    }
    Err("state record missing after create".to_string())
}

pub fn load() -> Result<Record, String> {
    load_versioned().map(|(r, _)| r)
}

/// Applies `fsm::advance` with the move `choose` picks for the current record,
/// retrying on CAS conflicts. The winner logs and counts the transition.
pub fn advance(
    choose: impl Fn(&Record) -> Move,
    active: u64,
    metrics: &Metrics,
) -> Result<Record, Error> {
    for _ in 0..RETRIES {
        let (rec, cas) = load_versioned().map_err(Error::Store)?;
        let mv = choose(&rec);
        let next = fsm::advance(&rec, mv, now(), active).map_err(Error::Illegal)?;
        match write(&next, Some(cas)) {
            Ok(()) => {
                log::info!(
                    "event=transition from={} to={} reason={} active={} forced={} seq={}",
                    rec.state.name(),
                    next.state.name(),
                    next.reason.name(),
                    active,
                    next.forced,
                    next.seq
                );
                metrics.transition(&next);
                return Ok(next);
            }
            Err(Status::CasMismatch) => continue,
            Err(e) => return Err(Error::Store(format!("shared data write failed: {e:?}"))),
        }
    }
    Err(Error::Store(
        "too much contention on the state record".to_string(),
    ))
}

/// Rewrites the record with what `change` makes of it (a lease or a plan
/// change, not a transition), retrying on CAS conflicts; `None` from
/// `change` writes nothing. Returns the record as it now stands.
pub fn update(change: impl Fn(&Record) -> Option<Record>) -> Result<Record, String> {
    for _ in 0..RETRIES {
        let (rec, cas) = load_versioned()?;
        let Some(next) = change(&rec) else {
            return Ok(rec);
        };
        match write(&next, Some(cas)) {
            Ok(()) => return Ok(next),
            Err(Status::CasMismatch) => continue,
            Err(e) => return Err(format!("shared data write failed: {e:?}")),
        }
    }
    Err("too much contention on the state record".to_string())
}

/// Applies every automatic transition that is due (active=0 flip, drain
/// timeout, lb_buffer, LB observed DOWN) and returns the resulting record.
pub fn apply_due(
    active: u64,
    lb_down_ms: Option<u64>,
    metrics: &Metrics,
) -> Result<Record, String> {
    let mut rec = load()?;
    // At most two automatic steps can follow each other (CLOSING, then CLOSED
    // when lb_buffer is 0).
    for _ in 0..3 {
        let Some(mv) = fsm::due(&rec, now(), active, lb_down_ms) else {
            return Ok(rec);
        };
        rec = match advance(|_| mv, active, metrics) {
            Ok(next) => next,
            // Another worker moved first: look again at what it left.
            Err(Error::Illegal(_)) => load()?,
            Err(Error::Store(e)) => return Err(e),
        };
    }
    Ok(rec)
}

/// A record that starts as its default, and its CAS version.
fn read_or_default<T: DeserializeOwned + Default>(
    key: &str,
    what: &str,
) -> Result<(T, Option<u32>), String> {
    match hostcalls::get_shared_data(key) {
        Ok((Some(bytes), cas)) => serde_json::from_slice(&bytes)
            .map(|c| (c, cas))
            .map_err(|e| format!("unreadable {what} record: {e}")),
        Ok((None, cas)) => Ok((T::default(), cas)),
        Err(e) => Err(format!("shared data read failed: {e:?}")),
    }
}

fn write_json(key: &str, value: &impl Serialize, cas: Option<u32>) -> Result<(), Status> {
    let bytes = serde_json::to_vec(value).map_err(|_| Status::SerializationFailure)?;
    hostcalls::set_shared_data(key, Some(&bytes), cas)
}

fn lb_read() -> Result<(Checkers, Option<u32>), String> {
    read_or_default(LB_KEY, "checker")
}

/// What every LB checker has been answered so far.
pub fn lb_checkers() -> Result<Checkers, String> {
    lb_read().map(|(c, _)| c)
}

/// Records an answer served to an LB checker (compare-and-swap, retried).
pub fn lb_observe(source: &str, status: u16, lb_fall: u32) -> Result<(), String> {
    for _ in 0..RETRIES {
        let (mut checkers, cas) = lb_read()?;
        checkers.observe(source, status, wall_ms(), lb_fall);
        match write_json(LB_KEY, &checkers, cas) {
            Ok(()) => return Ok(()),
            Err(Status::CasMismatch) => continue,
            Err(e) => return Err(format!("shared data write failed: {e:?}")),
        }
    }
    Err("too much contention on the checker record".to_string())
}

/// The rotation record of the last drain (`crate::rotation`): written only by
/// the worker that owns that drain's rotation, read by any status answer.
const ROTATION_KEY: &str = "drain_gate.rotation.v1";

pub fn rotation_load() -> Result<Option<rotation::Record>, String> {
    match hostcalls::get_shared_data(ROTATION_KEY) {
        Ok((Some(bytes), _)) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("unreadable rotation record: {e}")),
        Ok((None, _)) => Ok(None),
        Err(e) => Err(format!("shared data read failed: {e:?}")),
    }
}

/// One writer per drain, so no compare-and-swap: the last write wins.
pub fn rotation_save(rec: &rotation::Record) -> Result<(), String> {
    write_json(ROTATION_KEY, rec, None).map_err(|e| format!("shared data write failed: {e:?}"))
}

/// The clock-step record (see `crate::clock::Steps`).
pub fn clock_steps() -> Result<Steps, String> {
    read_or_default(CLOCK_KEY, "clock").map(|(s, _)| s)
}

/// Compares the clocks with the clock-step record and updates it. Returns the
/// step when this caller recorded one (so that each step is logged and
/// counted once, by the worker that saw it first).
pub fn clock_look(now: Now, threshold_ms: u64) -> Result<Option<(Steps, i64)>, String> {
    for _ in 0..RETRIES {
        let (steps, cas) = read_or_default::<Steps>(CLOCK_KEY, "clock")?;
        let (next, step) = match steps.look(now, threshold_ms) {
            Look::Same => return Ok(None),
            Look::Crept(next) => (next, None),
            Look::Stepped(next, by) => (next, Some(by)),
        };
        match write_json(CLOCK_KEY, &next, cas) {
            Ok(()) => return Ok(step.map(|by| (next, by))),
            Err(Status::CasMismatch) => continue,
            Err(e) => return Err(format!("shared data write failed: {e:?}")),
        }
    }
    Err("too much contention on the clock record".to_string())
}
