//! What a server lets its clients commit, over all its connections together: how many may be
//! open at once ([`ServerConfig::max_connections`]) and how many bytes of memory they may
//! commit ([`ServerConfig::max_memory`]), besides each connection's own
//! [`ServerConfig::memory_limit`]. A connection's cost ([`conn_bytes`]) is counted from its
//! opening until it is dropped (closed, and let go of by its worker and by any handler still
//! holding one of its requests); the shared receive pool is counted from the server's start.
//! A client past either limit is refused in the handshake, with a reason naming the field.

#![forbid(unsafe_code)]

use super::*;
use std::sync::atomic::AtomicUsize;

/// Bytes one connection of `queues` queues at `window` commits with `msg_size`-byte messages:
/// its buffers (every send context's, and its own receive buffers unless it receives from the
/// `shared` pool; all counted, although send buffers are registered as they are first used)
/// and its queues' rings and completion queues. Every send ring holds all the connection's
/// send contexts (see `conn::endpoint`), so the rings grow with `queues²`: 64 queues at a
/// window of 128 are 2 million send ring entries.
pub(super) fn conn_bytes(queues: usize, window: u32, msg_size: usize, shared: bool) -> u64 {
    use crate::limits::{CQE_BYTES, RECV_WQE_BYTES, SEND_WQE_BYTES};
    let (send, recv, _) = server_depths(window);
    let buffers = buffer_bytes(queues, (send, if shared { 0 } else { recv }), msg_size);
    let q = queues as u64;
    let contexts = q.saturating_mul(u64::from(send));
    let ring = |entries: u64| entries.checked_next_power_of_two().unwrap_or(u64::MAX);
    let rings = q.saturating_mul(
        ring(contexts)
            .saturating_mul(SEND_WQE_BYTES)
            .saturating_add(ring(u64::from(recv)).saturating_mul(RECV_WQE_BYTES)),
    );
    let cqs = (contexts + q * u64::from(recv) + 2).saturating_mul(CQE_BYTES);
    buffers.saturating_add(rings).saturating_add(cqs)
}

/// The server's count of open connections and committed bytes, against its limits.
pub(super) struct Admission {
    conns: AtomicUsize,
    bytes: AtomicU64,
    max_conns: usize,
    max_bytes: u64,
}

/// One admitted connection's share of the [`Admission`]; given back when dropped (with the
/// connection).
pub(super) struct Admitted {
    admission: Arc<Admission>,
    bytes: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.conns.fetch_sub(1, Ordering::AcqRel);
        self.admission.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl Admission {
    /// Limits from `config`; `fixed` bytes (the shared receive pool) are committed for good.
    pub(super) fn new(config: &ServerConfig, fixed: u64) -> Self {
        Admission {
            conns: AtomicUsize::new(0),
            bytes: AtomicU64::new(fixed),
            max_conns: config.max_connections,
            max_bytes: config.max_memory,
        }
    }

    /// Bytes committed now (the shared pool's, and every connection's not yet dropped).
    pub(super) fn committed(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// The most a new connection may commit (`memory_limit` or what is left of `max_memory`,
    /// whichever is less), or why no connection may be opened now.
    pub(super) fn room(&self, memory_limit: u64) -> Result<u64, String> {
        let open = self.conns.load(Ordering::Acquire);
        if open >= self.max_conns {
            return Err(format!(
                "the server has {open} connections open, its most (ServerConfig.max_connections is {}): \
                 try again once one closes",
                self.max_conns
            ));
        }
        Ok(memory_limit.min(self.max_bytes.saturating_sub(self.committed())))
    }

    /// Counts a connection of `bytes`; refused (with the reason) if it no longer fits.
    pub(super) fn admit(self: &Arc<Self>, bytes: u64) -> Result<Admitted, String> {
        let over = |committed: u64| committed.checked_add(bytes).map_or(true, |total| total > self.max_bytes);
        if let Err(committed) =
            self.bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (!over(c)).then(|| c + bytes))
        {
            return Err(self.full(committed, bytes));
        }
        if self
            .conns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max_conns).then(|| n + 1))
            .is_err()
        {
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
            return Err(format!(
                "the server has its most connections open (ServerConfig.max_connections is {}): try again \
                 once one closes",
                self.max_conns
            ));
        }
        Ok(Admitted { admission: self.clone(), bytes })
    }

    /// Why a connection of `needs` bytes is refused when `committed` are taken.
    pub(super) fn full(&self, committed: u64, needs: u64) -> String {
        format!(
            "the server's connections already commit {committed} of its {} bytes (ServerConfig.max_memory), \
             and this one needs {needs} even at a window of 1: try again once connections close, or ask for \
             fewer queues or a smaller window",
            self.max_bytes
        )
    }
}
