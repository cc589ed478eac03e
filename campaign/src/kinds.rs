//! The fault kinds a run can be under, what plan each sets, and which outcomes each explains.

use crate::tally::Outcome;
use bypass_sim::FaultPlan;
use std::time::Duration;

/// One fault kind per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// No fault: the baseline (only the calls' own shapes explain errors).
    None,
    /// 1 % of packets and 1 % of acknowledgements lost.
    Drop,
    /// 2 % of packets delivered twice.
    Duplicate,
    /// 2 % of packets delivered after the next one.
    Reorder,
    /// 5 % of packets held for up to 2 ms.
    Delay,
    /// 1 % of packets with a bit flipped (the ICRC catches them).
    Corrupt,
    /// Links between the server's NIC and a client NIC cut, seeded: mostly for tens of
    /// milliseconds, sometimes for seconds (past every retry).
    Cut,
    /// The last client NIC killed after a fifth of the calls; its channels' calls fail, the
    /// others must not notice.
    Kill,
    /// 10 % of memory registrations refused, and channels connected and dropped meanwhile.
    Regfail,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::None,
        FaultKind::Drop,
        FaultKind::Duplicate,
        FaultKind::Reorder,
        FaultKind::Delay,
        FaultKind::Corrupt,
        FaultKind::Cut,
        FaultKind::Kill,
        FaultKind::Regfail,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::None => "none",
            FaultKind::Drop => "drop",
            FaultKind::Duplicate => "duplicate",
            FaultKind::Reorder => "reorder",
            FaultKind::Delay => "delay",
            FaultKind::Corrupt => "corrupt",
            FaultKind::Cut => "cut",
            FaultKind::Kill => "kill",
            FaultKind::Regfail => "regfail",
        }
    }

    pub fn parse(s: &str) -> Result<Vec<FaultKind>, String> {
        if s == "all" {
            return Ok(Self::ALL.to_vec());
        }
        s.split(',')
            .map(|w| {
                Self::ALL.iter().copied().find(|k| k.name() == w.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "unknown fault kind {w:?}: use all, or a comma-separated list of {}",
                        names.join(", ")
                    )
                })
            })
            .collect()
    }

    /// The fabric's plan while the faults are on (cuts and kills come from the chaos thread).
    pub fn plan(self, seed: u64) -> FaultPlan {
        let p = FaultPlan { controls: true, seed, ..FaultPlan::NONE };
        match self {
            FaultKind::None | FaultKind::Cut | FaultKind::Kill => p,
            FaultKind::Drop => FaultPlan { drop_ppm: 10_000, ack_drop_ppm: 10_000, ..p },
            FaultKind::Duplicate => FaultPlan { duplicate_ppm: 20_000, ..p },
            FaultKind::Reorder => FaultPlan { reorder_ppm: 20_000, ..p },
            FaultKind::Delay => FaultPlan { delay_ppm: 50_000, delay_max: Duration::from_millis(2), ..p },
            FaultKind::Corrupt => FaultPlan { corrupt_ppm: 10_000, ..p },
            FaultKind::Regfail => FaultPlan { register_fail_ppm: 100_000, ..p },
        }
    }

    /// Whether this fault accounts for `outcome` of a call (beyond what the call's own shape
    /// explains: see [`Shape`]). `victim`: the call's channel is on the NIC a kill targets.
    pub fn explains(self, outcome: Outcome, shape: Shape, victim: bool) -> bool {
        match outcome {
            Outcome::Ok => true,
            Outcome::Timeout if shape.may_time_out => true,
            Outcome::Declined if shape.may_decline => true,
            Outcome::Declined if self == FaultKind::Regfail && shape.registers => true,
            // The stack registers its send buffers lazily, a chunk at a time, on either side: a
            // refused registration fails a call at the client at once (`Device`); the server's
            // reply waits for a registered send context instead, so it costs no call.
            Outcome::Timeout | Outcome::Queue | Outcome::Closed | Outcome::Broken => {
                self == FaultKind::Cut || (self == FaultKind::Kill && victim)
            }
            Outcome::Device => (self == FaultKind::Kill && victim) || self == FaultKind::Regfail,
            Outcome::Declined | Outcome::Other => false,
        }
    }

    /// Whether this fault may close a channel (then it is reconnected, and its closing counted).
    pub fn may_close(self, victim: bool) -> bool {
        self == FaultKind::Cut || (self == FaultKind::Kill && victim)
    }
}

/// What a call's own shape explains, whatever the fault.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    /// A short deadline, or a handler that drops or delays its request.
    pub may_time_out: bool,
    /// A handler that panics (SERVER_DECLINE).
    pub may_decline: bool,
    /// The call registers memory, on either side: the campaign's own buffers, the client's
    /// rendezvous copies, the server's rendezvous buffers (the server then declines the call).
    pub registers: bool,
    /// What kind of call it is, for messages.
    pub op: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_explain_only_what_they_cause() {
        assert_eq!(FaultKind::parse("all").unwrap().len(), 9);
        assert_eq!(FaultKind::parse("cut, kill").unwrap(), [FaultKind::Cut, FaultKind::Kill]);
        assert!(FaultKind::parse("flood").unwrap_err().contains("regfail"));
        let plain = Shape::default();
        for k in FaultKind::ALL {
            assert!(k.explains(Outcome::Ok, plain, false));
            assert!(!k.explains(Outcome::Other, plain, true), "{k:?}");
            assert!(!k.explains(Outcome::Declined, plain, true), "{k:?}: only a panicking handler declines");
        }
        for k in [FaultKind::None, FaultKind::Drop, FaultKind::Delay, FaultKind::Corrupt, FaultKind::Regfail]
        {
            assert!(!k.explains(Outcome::Timeout, plain, false), "{k:?}: a long deadline never passes");
            assert!(!k.explains(Outcome::Closed, plain, false), "{k:?}");
        }
        assert!(FaultKind::Cut.explains(Outcome::Queue, plain, false));
        assert!(FaultKind::Kill.explains(Outcome::Closed, plain, true));
        assert!(!FaultKind::Kill.explains(Outcome::Closed, plain, false), "a kill leaves other NICs alone");
        assert!(FaultKind::Regfail.explains(Outcome::Device, plain, false));
        assert!(FaultKind::None.explains(Outcome::Timeout, Shape { may_time_out: true, ..plain }, false));
    }
}
