//! Outcomes: one slot per call, counting how many times it ended (exactly once is the rule), and
//! counters per kind of outcome; and the violations found, each with enough to replay it.

use bypass::{CloseReason, RpcError};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// How a call ended, as the table counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Timeout,
    /// The server answered an error status (SERVER_DECLINE from a handler that panicked).
    Declined,
    /// The queue the call used failed (`RpcError::Queue`, `RemoteAccess`, `LocalAccess`).
    Queue,
    Closed,
    Broken,
    /// The device refused something (`RpcError::Device`): a refused registration, a dead NIC.
    Device,
    Other,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Ok,
        Outcome::Timeout,
        Outcome::Declined,
        Outcome::Queue,
        Outcome::Closed,
        Outcome::Broken,
        Outcome::Device,
        Outcome::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Timeout => "timeout",
            Outcome::Declined => "declined",
            Outcome::Queue => "queue",
            Outcome::Closed => "closed",
            Outcome::Broken => "broken",
            Outcome::Device => "device",
            Outcome::Other => "other",
        }
    }

    pub fn of(e: &RpcError) -> Outcome {
        match e {
            RpcError::Timeout => Outcome::Timeout,
            RpcError::Status(_) => Outcome::Declined,
            RpcError::Queue(_) | RpcError::RemoteAccess(_) | RpcError::LocalAccess(_) => Outcome::Queue,
            RpcError::Closed => Outcome::Closed,
            RpcError::ConnectionBroken(_) => Outcome::Broken,
            RpcError::Device(_) => Outcome::Device,
            // The stack's word for a registration it could not make on the call path (the
            // rendezvous copy of the arguments): counted with the device's refusals.
            RpcError::WouldBlock(why) if why.contains("register") => Outcome::Device,
            _ => Outcome::Other,
        }
    }
}

/// Whether a channel's close reason is one the faults explain.
pub fn close_explained(reason: Option<CloseReason>) -> bool {
    matches!(
        reason,
        Some(
            CloseReason::KeepaliveTimeout
                | CloseReason::QueuesFailed
                | CloseReason::RecoveryExhausted
                | CloseReason::ControlLost
        )
    )
}

#[derive(Debug)]
pub struct Tally {
    /// How many times each call ended (by call id).
    ends: Vec<AtomicU8>,
    next: AtomicUsize,
    counts: [AtomicU64; 8],
    pub doubled: AtomicU64,
    pub bad_data: AtomicU64,
    pub unexplained: AtomicU64,
    violations: Mutex<Vec<String>>,
}

impl Tally {
    pub fn new(capacity: usize) -> Self {
        Tally {
            ends: (0..capacity).map(|_| AtomicU8::new(0)).collect(),
            next: AtomicUsize::new(0),
            counts: Default::default(),
            doubled: AtomicU64::new(0),
            bad_data: AtomicU64::new(0),
            unexplained: AtomicU64::new(0),
            violations: Mutex::new(Vec::new()),
        }
    }

    /// A new call's id, or `None` once the run's calls are all started.
    pub fn begin(&self) -> Option<usize> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        (id < self.ends.len()).then_some(id)
    }

    /// Calls started so far.
    pub fn started(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.ends.len())
    }

    /// Call `id` ended with `outcome`; `explained` says whether the fault (or the call's own
    /// shape: a short deadline, a handler that drops or panics) accounts for it.
    pub fn end(&self, id: usize, outcome: Outcome, explained: bool, what: impl FnOnce() -> String) {
        if self.ends[id].fetch_add(1, Ordering::AcqRel) != 0 {
            self.doubled.fetch_add(1, Ordering::Relaxed);
            self.violation(format!("call {id} ended twice ({})", what()));
            return;
        }
        self.counts[Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(7)]
            .fetch_add(1, Ordering::Relaxed);
        if !explained {
            self.unexplained.fetch_add(1, Ordering::Relaxed);
            self.violation(format!("call {id}: {} not explained by the fault ({})", outcome.name(), what()));
        }
    }

    pub fn bad_data(&self, id: usize, what: String) {
        self.bad_data.fetch_add(1, Ordering::Relaxed);
        self.violation(format!("call {id}: wrong data: {what}"));
    }

    pub fn count(&self, o: Outcome) -> u64 {
        self.counts[Outcome::ALL.iter().position(|x| *x == o).unwrap_or(7)].load(Ordering::Relaxed)
    }

    /// Started calls that have not ended.
    pub fn pending(&self) -> u64 {
        self.ends[..self.started()].iter().filter(|e| e.load(Ordering::Acquire) == 0).count() as u64
    }

    /// Records a violation (the first few are kept to print).
    pub fn violation(&self, v: String) {
        let mut vs = self.violations.lock().unwrap_or_else(|e| e.into_inner());
        if vs.len() < 20 {
            vs.push(v);
        }
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_ended_twice_or_never_is_counted() {
        let t = Tally::new(3);
        let (a, b, c) = (t.begin().unwrap(), t.begin().unwrap(), t.begin().unwrap());
        assert_eq!(t.begin(), None, "no more calls than the run's");
        t.end(a, Outcome::Ok, true, String::new);
        t.end(b, Outcome::Timeout, true, String::new);
        t.end(b, Outcome::Ok, true, || "again".into());
        assert_eq!(t.doubled.load(Ordering::Relaxed), 1);
        assert_eq!(t.pending(), 1, "call {c} never ended");
        assert_eq!((t.count(Outcome::Ok), t.count(Outcome::Timeout)), (1, 1), "a second end is not counted");
        t.end(c, Outcome::Closed, false, || "closed".into());
        assert_eq!(t.unexplained.load(Ordering::Relaxed), 1);
        assert!(t.violations().iter().any(|v| v.contains("ended twice")));
        assert!(t.violations().iter().any(|v| v.contains("closed not explained")));
    }
}
