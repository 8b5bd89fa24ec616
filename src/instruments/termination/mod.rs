//! The pod's SIGTERM in pilot-agent's readiness (`termination_watch`): which
//! answer is pilot-agent's, and when its 503 is the SIGTERM. The host shell
//! (`host::termination`) asks and translates; every decision is here.
//!
//! pilot-agent's `/healthz/ready` (Istio's `pilot/cmd/pilot-agent/status`,
//! `handleReadyProbe`) writes a status line and nothing else — the reason for
//! a 503 goes to pilot-agent's own log. It answers 503 until Envoy first is
//! ready (its first configuration received, `server.state` LIVE, its workers
//! started), and caches both facts for the life of the process: from its
//! first 200 on, the only 503 it gives is "server is terminated", its context
//! cancelled at SIGTERM (or `/quitquitquit`, which ends the pod's proxy too).
//! So a 503 is the SIGTERM only after a 200 from the same pilot-agent; a 503
//! before any 200 is pilot-agent not ready, for another reason.
//!
//! When no upstream answers — nothing listens on the cluster's port, a connect
//! timeout, a reset, the call's own timeout — Envoy answers the call itself:
//! 503 or 504 with the cause in its body ("upstream connect error or
//! disconnect/reset before headers. reset reason: remote connection failure"),
//! and without `x-envoy-upstream-service-time`, which Envoy's router adds to
//! every answer an upstream gave. An answer is pilot-agent's readiness only
//! with that header and no body: two marks none of Envoy's own replies has
//! (so in Envoy 1.36, 1.38 and 1.40: tests/envoy/test_termination.py).
//!
//! What the watch cannot read, it says once ([`Unavailable`]); it goes on
//! asking, so that a pilot-agent that turns ready (200) is watched from then on.

pub mod host;

use std::fmt;

/// The header Envoy's router adds to an upstream's answer, never to its own.
pub const UPSTREAM_MARK: &str = "x-envoy-upstream-service-time";

/// One answer to a readiness call, as the host delivered it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// `:status`; `None`: the call ended with no answer.
    pub status: Option<u16>,
    /// It carries [`UPSTREAM_MARK`]: an upstream answered, not Envoy itself.
    pub upstream: bool,
    /// The body's size in bytes.
    pub body_bytes: usize,
}

/// Why the watch cannot see the pod's SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// Envoy refused to send the call (no such cluster).
    CallRefused,
    /// The call ended with no answer at all.
    NoAnswer,
    /// Envoy answered itself: no upstream answered (nothing listens on the
    /// cluster's port, a connect timeout, a reset, the call's timeout).
    LocalReply(u16),
    /// An upstream answered, not as pilot-agent's readiness does (another
    /// status, or a body).
    NotPilotAgent(u16),
    /// pilot-agent answered 503 before any 200: not ready, and not for a
    /// SIGTERM.
    NotReady,
}

/// `reason=… [status=…] detail="…"`: the warning line's fields.
impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (reason, detail) = match *self {
            Self::CallRefused => ("call_refused", "Envoy refused the call: no such cluster?"),
            Self::NoAnswer => ("no_answer", "the call ended without an answer"),
            Self::LocalReply(_) => (
                "local_reply",
                "Envoy answered itself: nothing answered on the cluster's port",
            ),
            Self::NotPilotAgent(_) => (
                "not_pilot_agent",
                "not the answer of pilot-agent's readiness",
            ),
            Self::NotReady => ("not_ready", "pilot-agent not ready: 503 before any 200"),
        };
        write!(f, "reason={reason}")?;
        match *self {
            Self::LocalReply(s) | Self::NotPilotAgent(s) => write!(f, " status={s}")?,
            Self::NotReady => f.write_str(" status=503")?,
            Self::CallRefused | Self::NoAnswer => {}
        }
        write!(
            f,
            " detail=\"{detail}; the pod's SIGTERM goes unseen meanwhile\""
        )
    }
}

/// pilot-agent's readiness in `a`: `Ok(true)` ready, `Ok(false)` not ready
/// (503); `Err` when `a` is not pilot-agent's readiness answer.
pub fn readiness(a: Answer) -> Result<bool, Unavailable> {
    match (a.status, a.upstream, a.body_bytes) {
        (None, _, _) => Err(Unavailable::NoAnswer),
        (Some(s), false, _) => Err(Unavailable::LocalReply(s)),
        (Some(200), true, 0) => Ok(true),
        (Some(503), true, 0) => Ok(false),
        (Some(s), true, _) => Err(Unavailable::NotPilotAgent(s)),
    }
}

/// What the watch makes of an answer (or of a call Envoy refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do.
    Nothing,
    /// The pod got its SIGTERM.
    Sigterm,
    /// Say it (once): the watch cannot see the SIGTERM, and why.
    Unavailable(Unavailable),
}

/// What one watch has learned of pilot-agent so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watch {
    /// pilot-agent has answered 200.
    ready_seen: bool,
    /// The watch has said it is unavailable.
    said: bool,
    /// The SIGTERM was seen.
    sigterm: bool,
}

impl Watch {
    /// The answer to one readiness call.
    pub fn answered(&mut self, a: Answer) -> Verdict {
        if self.sigterm {
            return Verdict::Nothing;
        }
        match readiness(a) {
            Ok(true) => {
                self.ready_seen = true;
                Verdict::Nothing
            }
            Ok(false) if self.ready_seen => {
                self.sigterm = true;
                Verdict::Sigterm
            }
            Ok(false) => self.unavailable(Unavailable::NotReady),
            Err(why) => self.unavailable(why),
        }
    }

    /// The SIGTERM was seen: there is nothing more to ask (pilot-agent stops
    /// accepting connections from then on, and exits soon after).
    pub fn done(self) -> bool {
        self.sigterm
    }

    /// Envoy refused to send the call.
    pub fn refused(&mut self) -> Verdict {
        self.unavailable(Unavailable::CallRefused)
    }

    fn unavailable(&mut self, why: Unavailable) -> Verdict {
        if std::mem::replace(&mut self.said, true) {
            Verdict::Nothing
        } else {
            Verdict::Unavailable(why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(status: u16, body_bytes: usize) -> Answer {
        Answer {
            status: Some(status),
            upstream: true,
            body_bytes,
        }
    }

    /// Envoy's own reply, as Envoy 1.36–1.40 answer a call to a closed port.
    fn local(status: u16) -> Answer {
        Answer {
            status: Some(status),
            upstream: false,
            body_bytes: 98,
        }
    }

    #[test]
    fn pilot_agent_s_answer_is_200_or_503_from_an_upstream_with_no_body() {
        assert_eq!(readiness(upstream(200, 0)), Ok(true));
        assert_eq!(readiness(upstream(503, 0)), Ok(false));
        assert_eq!(readiness(local(503)), Err(Unavailable::LocalReply(503)));
        assert_eq!(readiness(local(504)), Err(Unavailable::LocalReply(504)));
        let empty_local = Answer {
            body_bytes: 0,
            ..local(503)
        };
        assert_eq!(
            readiness(empty_local),
            Err(Unavailable::LocalReply(503)),
            "without the upstream's mark, Envoy answered: whatever the body"
        );
        assert_eq!(
            readiness(upstream(503, 19)),
            Err(Unavailable::NotPilotAgent(503)),
            "a body: not pilot-agent's readiness"
        );
        assert_eq!(
            readiness(upstream(200, 3)),
            Err(Unavailable::NotPilotAgent(200))
        );
        assert_eq!(
            readiness(upstream(404, 0)),
            Err(Unavailable::NotPilotAgent(404))
        );
        assert_eq!(
            readiness(upstream(500, 0)),
            Err(Unavailable::NotPilotAgent(500))
        );
        assert_eq!(readiness(Answer::default()), Err(Unavailable::NoAnswer));
    }

    #[test]
    fn a_503_is_the_sigterm_only_after_a_200() {
        let mut w = Watch::default();
        assert_eq!(w.answered(upstream(200, 0)), Verdict::Nothing);
        assert_eq!(w.answered(upstream(200, 0)), Verdict::Nothing);
        assert!(!w.done());
        assert_eq!(w.answered(upstream(503, 0)), Verdict::Sigterm);
        assert!(w.done(), "nothing more to ask");
        assert_eq!(w.answered(upstream(503, 0)), Verdict::Nothing, "once");
        assert_eq!(
            w.answered(local(503)),
            Verdict::Nothing,
            "pilot-agent gone after its SIGTERM: nothing to say"
        );
    }

    #[test]
    fn a_503_before_any_200_is_a_pilot_agent_not_ready_said_once() {
        let mut w = Watch::default();
        assert_eq!(
            w.answered(upstream(503, 0)),
            Verdict::Unavailable(Unavailable::NotReady)
        );
        assert_eq!(w.answered(upstream(503, 0)), Verdict::Nothing, "said once");
        assert_eq!(w.answered(upstream(200, 0)), Verdict::Nothing);
        assert_eq!(
            w.answered(upstream(503, 0)),
            Verdict::Sigterm,
            "ready since: watched from then on"
        );
    }

    #[test]
    fn envoy_s_own_reply_is_never_the_sigterm_even_after_a_200() {
        for a in [local(503), local(504), upstream(503, 40), Answer::default()] {
            let mut w = Watch::default();
            assert_eq!(w.answered(upstream(200, 0)), Verdict::Nothing);
            assert!(matches!(w.answered(a), Verdict::Unavailable(_)), "{a:?}");
            assert_eq!(w.answered(a), Verdict::Nothing, "said once: {a:?}");
            assert_eq!(
                w.answered(upstream(503, 0)),
                Verdict::Sigterm,
                "pilot-agent's own 503 still is"
            );
        }
    }

    #[test]
    fn a_refused_call_is_said_once() {
        let mut w = Watch::default();
        assert_eq!(w.refused(), Verdict::Unavailable(Unavailable::CallRefused));
        assert_eq!(w.refused(), Verdict::Nothing);
        assert_eq!(w.answered(local(503)), Verdict::Nothing);
    }

    #[test]
    fn the_warning_names_the_reason_and_the_status() {
        let line = |u: Unavailable| u.to_string();
        let fields = |u: Unavailable| {
            let l = line(u);
            l.split(" detail=").next().unwrap_or_default().to_string()
        };
        assert_eq!(
            fields(Unavailable::LocalReply(503)),
            "reason=local_reply status=503"
        );
        assert_eq!(fields(Unavailable::NotReady), "reason=not_ready status=503");
        assert_eq!(
            fields(Unavailable::NotPilotAgent(404)),
            "reason=not_pilot_agent status=404"
        );
        assert_eq!(fields(Unavailable::CallRefused), "reason=call_refused");
        assert_eq!(fields(Unavailable::NoAnswer), "reason=no_answer");
        assert_eq!(
            line(Unavailable::LocalReply(503)),
            "reason=local_reply status=503 detail=\"Envoy answered itself: nothing answered on \
             the cluster's port; the pod's SIGTERM goes unseen meanwhile\""
        );
    }
}
