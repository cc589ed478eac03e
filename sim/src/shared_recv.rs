//! The driver half of a shared receive queue: a receive ring the application fills, which every
//! queue created on it takes from (the device half is `QpCtx::have_recv`; the protocol between
//! them is on [`SrqShared`]).

use crate::driver::write_recvs;
use crate::fabric::FabricOwner;
use crate::layout;
use crate::nic::Nic;
use crate::ring::WorkRing;
use crate::shared::{SideTable, SrqShared};
use crate::sync::{self, AtomicU32, Ordering};
use bypass_hal::trace::{self, Track};
use bypass_hal::{Error, RecvWr, Result, SharedRecv};
use std::sync::Arc;

/// A shared receive queue on a simulated NIC (see [`bypass_hal::SharedRecv`]).
#[derive(Debug)]
pub struct SimSharedRecv {
    pub(crate) nic: Arc<Nic>,
    _owner: Arc<FabricOwner>,
    pub(crate) shared: Arc<SrqShared>,
    pi: u32,
    /// Where WQEs are assembled before they are copied into the ring.
    wqe: Box<[u8]>,
}

impl SimSharedRecv {
    pub(crate) fn new(nic: Arc<Nic>, owner: Arc<FabricOwner>, depth: u32, max_sge: u32) -> Result<Self> {
        let caps = nic.caps;
        if caps.max_shared_recv == 0 {
            return Err(Error::Unsupported("this NIC has no shared receive queues".into()));
        }
        if depth == 0 || depth > caps.max_shared_recv_depth {
            return Err(Error::InvalidArgument(format!(
                "shared receive queue depth {depth} is outside 1..={}",
                caps.max_shared_recv_depth
            )));
        }
        if max_sge == 0 || max_sge > caps.max_recv_sge {
            return Err(Error::InvalidArgument(format!(
                "shared receive queue max_sge {max_sge} is outside 1..={}",
                caps.max_recv_sge
            )));
        }
        {
            let mut dev = sync::lock(&nic.dev);
            if dev.shared_recvs >= caps.max_shared_recv {
                return Err(Error::OutOfResources(format!(
                    "the NIC has all {} shared receive queues in use",
                    caps.max_shared_recv
                )));
            }
            dev.shared_recvs += 1;
        }
        let depth = depth.next_power_of_two();
        let stride = layout::wqe_stride(max_sge, 0);
        let shared = Arc::new(SrqShared {
            nic: nic.addr,
            max_sge,
            ring: WorkRing::new(depth, stride),
            ids: SideTable::new(depth),
            ci: AtomicU32::new(0),
            users: AtomicU32::new(0),
        });
        Ok(SimSharedRecv { nic, _owner: owner, shared, pi: 0, wqe: vec![0u8; stride].into() })
    }
}

impl SimSharedRecv {
    /// Takes every receive still in the ring (posted, not yet taken by a queue) out of it and
    /// returns their `wr_id`s, oldest first: what a receive queue moved to ERROR flushes (URMA's
    /// `urma_modify_jfr`). Runs under the device lock, so no queue takes one meanwhile; a receive
    /// a queue took already is that queue's and completes there.
    pub fn take_posted(&mut self) -> Vec<u64> {
        let sh = &self.shared;
        let _dev = sync::lock(&self.nic.dev);
        let ci = sh.ci.load(Ordering::Acquire);
        let pi = sh.ring.producer();
        let n = pi.wrapping_sub(ci);
        // SAFETY: slots ci..pi were written by this poster (the only one: `&mut self`) and not
        // taken by the device, which is held off by the lock.
        let ids = (0..n).map(|i| unsafe { sh.ids.get(ci.wrapping_add(i)) }).collect();
        sh.ci.store(pi, Ordering::Release);
        ids
    }
}

impl SharedRecv for SimSharedRecv {
    fn depth(&self) -> u32 {
        self.shared.ring.depth()
    }

    fn max_sge(&self) -> u32 {
        self.shared.max_sge
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let sh = &self.shared;
        if !write_recvs(&sh.ring, &sh.ids, &sh.ci, &mut self.pi, &mut self.wqe, sh.max_sge, wrs)? {
            return Ok(());
        }
        if trace::is_enabled() {
            let args = [("pi", self.pi.into()), ("wqes", wrs.len().into())];
            trace::instant(Track::Nic(sh.nic), "doorbell srq", &args);
        }
        // No kick: the device reads the ring when a message arrives for one of its queues, and a
        // sender that was told "not ready" retries on its own RNR timer.
        sh.ring.ring_doorbell(self.pi);
        Ok(())
    }

    fn destroy(self) -> Result<(), (Self, Error)> {
        let users = self.shared.users.load(Ordering::Acquire);
        if users > 0 {
            let e = Error::Busy(format!(
                "the shared receive queue is used by {users} queue(s): drop them before destroying it"
            ));
            return Err((self, e));
        }
        Ok(())
    }
}

impl Drop for SimSharedRecv {
    fn drop(&mut self) {
        sync::lock(&self.nic.dev).shared_recvs -= 1;
    }
}
