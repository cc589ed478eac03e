//! An in-memory L2 pair: two [`L2Port`]s joined by a software "cable", so the L2 wire runs in
//! `cargo test` with no NIC, no VM and no privilege.
//!
//! Each direction is a bounded queue of frames (a receiver with no free buffer drops what
//! arrives, as a NIC whose receive ring is empty does). The cable can lose frames, seeded, so a
//! test sees the transport recover exactly as it does over a lossy link. Each end has an eventfd
//! for [`L2Port::arm`]: the sender signals it when the receiving end is armed. Buffers are
//! recycled, so a steady stream allocates nothing.

use crate::eventfd::EventFd;
use bypass_hal::l2::{L2Port, Mac, ETH_HEADER_LEN};
use bypass_hal::{Error, Result};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How an [`l2_pair`] cable behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairConfig {
    /// Both ends' MTU (largest payload after the Ethernet header).
    pub mtu: usize,
    /// Frames each direction holds before the receiver drops what arrives.
    pub depth: usize,
    /// Frames lost on the cable, in parts per million (each direction, independently).
    pub loss_ppm: u32,
    /// Seed of the loss pattern.
    pub seed: u64,
}

impl Default for PairConfig {
    /// A 1500-byte MTU, 1024 frames each way, no loss.
    fn default() -> Self {
        PairConfig { mtu: 1500, depth: 1024, loss_ppm: 0, seed: 1 }
    }
}

/// What a cable counted (both directions).
#[derive(Debug, Default)]
pub struct PairStats {
    /// Frames that reached the other end's queue.
    pub delivered: AtomicU64,
    /// Frames the cable lost (`loss_ppm`).
    pub lost: AtomicU64,
    /// Frames dropped because the receiving end's queue was full.
    pub overflowed: AtomicU64,
}

/// One direction of the cable: the receiving end's queue and its wake-up.
#[derive(Debug)]
struct Lane {
    state: Mutex<LaneState>,
    wake: EventFd,
}

#[derive(Debug, Default)]
struct LaneState {
    frames: VecDeque<Vec<u8>>,
    /// Spent buffers, reused for later frames.
    free: Vec<Vec<u8>>,
    /// The receiver asked for a wake-up at the next frame.
    armed: bool,
}

/// One end of an in-memory L2 cable (see the module docs).
#[derive(Debug)]
pub struct PairPort {
    mac: Mac,
    cfg: PairConfig,
    /// The far end's receive queue.
    tx: Arc<Lane>,
    /// This end's receive queue.
    rx: Arc<Lane>,
    rng: u64,
    stats: Arc<PairStats>,
}

/// Two L2 ports joined by a cable, with MACs `02:00:00:00:00:01` and `…:02`, and the cable's
/// counters.
pub fn l2_pair(cfg: PairConfig) -> std::io::Result<(PairPort, PairPort, Arc<PairStats>)> {
    let lane = || -> std::io::Result<Arc<Lane>> {
        Ok(Arc::new(Lane { state: Mutex::new(LaneState::default()), wake: EventFd::new()? }))
    };
    let (ab, ba) = (lane()?, lane()?);
    let stats = Arc::new(PairStats::default());
    let end = |n: u8, tx: &Arc<Lane>, rx: &Arc<Lane>| PairPort {
        mac: [0x02, 0, 0, 0, 0, n],
        cfg,
        tx: tx.clone(),
        rx: rx.clone(),
        rng: cfg.seed ^ u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        stats: stats.clone(),
    };
    let a = end(1, &ab, &ba);
    let b = end(2, &ba, &ab);
    Ok((a, b, stats))
}

/// The two ends of a new cable as attachments for
/// [`Fabric::try_with_l2`](crate::Fabric::try_with_l2): the first NIC added is 10.99.0.1, the
/// second 10.99.0.2 (a /24). What `sim+l2:pair` opens.
pub fn pair_attachments(cfg: PairConfig) -> std::io::Result<(Vec<super::L2Attachment>, Arc<PairStats>)> {
    let (a, b, stats) = l2_pair(cfg)?;
    let at = |port: PairPort, host: u8| super::L2Attachment {
        port: Box::new(port),
        addr: super::L2Addr::new(std::net::Ipv4Addr::new(10, 99, 0, host)),
    };
    Ok((vec![at(a, 1), at(b, 2)], stats))
}

impl PairPort {
    /// SplitMix64: the seeded loss pattern.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl L2Port for PairPort {
    fn mac(&self) -> Mac {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.cfg.mtu
    }

    fn send(&mut self, frames: &[&[u8]]) -> Result<usize> {
        for f in frames {
            if f.len() < ETH_HEADER_LEN || f.len() - ETH_HEADER_LEN > self.cfg.mtu {
                return Err(Error::InvalidArgument(format!(
                    "a {}-byte frame does not fit this port: frames are 14 to {} bytes (MTU {})",
                    f.len(),
                    ETH_HEADER_LEN + self.cfg.mtu,
                    self.cfg.mtu
                )));
            }
        }
        let mut keep = [false; 64];
        let mut taken = 0;
        for chunk in frames.chunks(64) {
            for (k, _) in chunk.iter().enumerate() {
                keep[k] =
                    self.cfg.loss_ppm == 0 || self.next_random() % 1_000_000 >= u64::from(self.cfg.loss_ppm);
            }
            let mut wake = false;
            {
                let mut st = self.tx.state.lock().unwrap_or_else(|e| e.into_inner());
                for (k, f) in chunk.iter().enumerate() {
                    if !keep[k] {
                        self.stats.lost.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if st.frames.len() >= self.cfg.depth {
                        self.stats.overflowed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let mut buf = st.free.pop().unwrap_or_default();
                    buf.clear();
                    buf.extend_from_slice(f);
                    st.frames.push_back(buf);
                    self.stats.delivered.fetch_add(1, Ordering::Relaxed);
                    if st.armed {
                        st.armed = false;
                        wake = true;
                    }
                }
            }
            if wake {
                self.tx.wake.signal();
            }
            taken += chunk.len();
        }
        Ok(taken)
    }

    fn recv(&mut self, max: usize, each: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = 0;
        let mut st = self.rx.state.lock().unwrap_or_else(|e| e.into_inner());
        while n < max {
            let Some(buf) = st.frames.pop_front() else { break };
            each(&buf);
            st.free.push(buf);
            n += 1;
        }
        Ok(n)
    }

    fn event_fd(&self) -> Option<RawFd> {
        Some(self.rx.wake.raw())
    }

    fn arm(&mut self) -> Result<bool> {
        let mut st = self.rx.state.lock().unwrap_or_else(|e| e.into_inner());
        if !st.frames.is_empty() {
            return Ok(true);
        }
        st.armed = true;
        Ok(false)
    }
}
