//! The FSM record in Envoy shared data: one value per `vm_id`, process-wide,
//! written only by compare-and-swap so that every worker sees one state and
//! two racing callers of a transition get one success and one 409.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

use super::metrics::Metrics;
use super::shared::{cas_update, json_read, json_update, Envoy, Host, Step, RETRIES};
use super::{now, wall_ms};
use crate::clock::{Look, Now, Steps};
use crate::fsm::{self, Illegal, Move, Record};
use crate::lb::Checkers;
use crate::rotation;

const KEY: &str = "drain_gate.fsm.v1";
const LB_KEY: &str = "drain_gate.lb.v1";
const CLOCK_KEY: &str = "drain_gate.clock.v1";

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
    let bytes = serde_json::to_vec(rec).map_err(|_| Status::SerializationFailure)?;
    hostcalls::set_shared_data(KEY, Some(&bytes), cas)
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
    load_versioned().map_err(Error::Store)?; // created on first use
    let moved = cas_update(&Envoy, KEY, |bytes| {
        let rec: Record = serde_json::from_slice(bytes.unwrap_or_default())
            .map_err(|e| Error::Store(format!("unreadable state record: {e}")))?;
        let next = fsm::advance(&rec, choose(&rec), now(), active).map_err(Error::Illegal)?;
        let out = serde_json::to_vec(&next).map_err(|e| Error::Store(e.to_string()))?;
        Ok(Step::Write(out, (rec.state, next)))
    });
    let (from, next) = moved.map_err(|f| f.refused().unwrap_or_else(Error::Store))?;
    log::info!(
        "event=transition from={} to={} reason={} active={} forced={} seq={}",
        from.name(),
        next.state.name(),
        next.reason.name(),
        active,
        next.forced,
        next.seq
    );
    metrics.transition(&next);
    Ok(next)
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
        let Some(mv) = fsm::due_gated(&rec, now(), active, lb_down_ms, lb_saw_drain(&rec)) else {
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

/// For a gated soft drain: whether every live checker has been served the
/// 404 since the drain began (unreadable: not yet; `drain_timeout` bounds it).
fn lb_saw_drain(rec: &Record) -> bool {
    let gated = rec.state == fsm::State::Draining && rec.plan.is_some_and(|p| p.lb_gate);
    if !gated {
        return true;
    }
    let since = rec.drain_started_ms.unwrap_or(0);
    lb_checkers().is_ok_and(|c| c.saw_drain(since, wall_ms()))
}

/// What every LB checker has been answered so far.
pub fn lb_checkers() -> Result<Checkers, String> {
    json_read(&Envoy, LB_KEY)
}

/// Records an answer served to an LB checker (compare-and-swap, retried).
pub fn lb_observe(source: &str, status: u16, lb_fall: u32) -> Result<(), String> {
    json_update(&Envoy, LB_KEY, |c: &mut Checkers| {
        c.observe(source, status, wall_ms(), lb_fall);
        Ok::<_, String>(())
    })
    .map_err(|e| e.to_string())
}

/// The rotation record of the last drain (`crate::rotation`): written only by
/// the worker that owns that drain's rotation, read by any status answer.
const ROTATION_KEY: &str = "drain_gate.rotation.v1";

pub fn rotation_load() -> Result<Option<rotation::Record>, String> {
    json_read(&Envoy, ROTATION_KEY)
}

/// One writer per drain, so no compare-and-swap: the last write wins.
pub fn rotation_save(rec: &rotation::Record) -> Result<(), String> {
    let bytes = serde_json::to_vec(rec).map_err(|e| e.to_string())?;
    Envoy
        .set(ROTATION_KEY, &bytes, None)
        .map_err(|e| format!("shared data write failed: {e:?}"))
}

/// The clock-step record (see `crate::clock::Steps`).
pub fn clock_steps() -> Result<Steps, String> {
    json_read(&Envoy, CLOCK_KEY)
}

/// Compares the clocks with the clock-step record and updates it. Returns the
/// step when this caller recorded one (so that each step is logged and
/// counted once, by the worker that saw it first).
pub fn clock_look(now: Now, threshold_ms: u64) -> Result<Option<(Steps, i64)>, String> {
    cas_update(&Envoy, CLOCK_KEY, |bytes| {
        let steps: Steps = match bytes {
            Some(b) => {
                serde_json::from_slice(b).map_err(|e| format!("unreadable clock record: {e}"))?
            }
            None => Steps::default(),
        };
        let (next, step) = match steps.look(now, threshold_ms) {
            Look::Same => return Ok(Step::Keep(None)),
            Look::Crept(next) => (next, None),
            Look::Stepped(next, by) => (next, Some(by)),
        };
        let out = serde_json::to_vec(&next).map_err(|e| e.to_string())?;
        Ok(Step::Write(out, step.map(|by| (next, by))))
    })
    .map_err(|f| f.refused().unwrap_or_else(|e| e))
}
