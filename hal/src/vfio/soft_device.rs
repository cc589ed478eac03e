//! The device's side of a split virtqueue, in software: what QEMU's virtio-net does with the rings,
//! so the driver's queue logic is tested (and model-checked under loom) without a VM.
//!
//! It follows the device's half of the discipline: load the available index, acquire fence, read
//! the ring slot and the descriptors; write used elements, release fence, store the used index.
//! It checks what a careful device checks (descriptor loops, chains longer than the queue) and
//! reports them as errors. It allocates freely: it is test equipment, not a data path.

use super::virtqueue::{
    need_event, Descriptor, QueueMemory, UsedElem, AVAIL_F_NO_INTERRUPT, DESC_F_NEXT, DESC_F_WRITE,
    USED_F_NO_NOTIFY,
};
use crate::sync::{fence, Ordering};

/// A chain the device took from the available ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// Head descriptor (what goes back in the used element).
    pub head: u16,
    /// The chain's descriptors, in order.
    pub descs: Vec<Descriptor>,
}

/// The device side of one split virtqueue.
#[derive(Debug)]
pub struct SoftDevice<M> {
    mem: M,
    size: u16,
    event_idx: bool,
    last_avail: u16,
    used_idx: u16,
}

impl<M: QueueMemory> SoftDevice<M> {
    /// The device side of the `size`-descriptor queue in `mem`. `event_idx`: `VIRTIO_F_EVENT_IDX`
    /// was negotiated (the device then publishes `avail_event` as it consumes).
    pub fn new(mem: M, size: u16, event_idx: bool) -> SoftDevice<M> {
        SoftDevice { mem, size, event_idx, last_avail: 0, used_idx: 0 }
    }

    /// Chains published and not yet taken.
    pub fn pending(&self) -> u16 {
        self.mem.load_avail_idx().wrapping_sub(self.last_avail)
    }

    /// Takes the next published chain, if any. A malformed chain is an `Err` with the reason.
    pub fn pop(&mut self) -> Result<Option<Chain>, String> {
        let avail = self.mem.load_avail_idx();
        if avail == self.last_avail {
            return Ok(None);
        }
        if avail.wrapping_sub(self.last_avail) > self.size {
            return Err(format!("available index {avail} runs {} ahead", avail - self.last_avail));
        }
        fence(Ordering::Acquire);
        let head = self.mem.read_avail(self.last_avail & (self.size - 1));
        self.last_avail = self.last_avail.wrapping_add(1);
        if self.event_idx {
            self.mem.store_avail_event(self.last_avail);
        }
        let mut descs = Vec::new();
        let mut i = head;
        loop {
            if i >= self.size {
                return Err(format!("descriptor index {i} outside a {}-entry table", self.size));
            }
            if descs.len() == usize::from(self.size) {
                return Err(format!("chain from {head} loops"));
            }
            let d = self.mem.read_desc(i);
            descs.push(d);
            if d.flags & DESC_F_NEXT == 0 {
                break;
            }
            i = d.next;
        }
        Ok(Some(Chain { head, descs }))
    }

    /// The bytes of the chain's device-readable buffers, concatenated (a transmitted frame).
    pub fn read(&self, chain: &Chain) -> Vec<u8> {
        let mut out = Vec::new();
        for d in chain.descs.iter().filter(|d| d.flags & DESC_F_WRITE == 0) {
            let start = out.len();
            out.resize(start + d.len as usize, 0);
            self.mem.read_buf(d.addr, &mut out[start..]);
        }
        out
    }

    /// Writes `bytes` into the chain's device-writable buffers (a received frame); returns how
    /// many fitted.
    pub fn write(&self, chain: &Chain, bytes: &[u8]) -> u32 {
        let mut rest = bytes;
        let mut written = 0u32;
        for d in chain.descs.iter().filter(|d| d.flags & DESC_F_WRITE != 0) {
            let n = rest.len().min(d.len as usize);
            self.mem.write_buf(d.addr, &rest[..n]);
            rest = &rest[n..];
            written += n as u32;
        }
        written
    }

    /// Puts chain `head` in the used ring with `len` bytes written; the driver sees it at the next
    /// [`publish`](Self::publish). Chains may be completed in any order.
    pub fn complete(&mut self, head: u16, len: u32) {
        self.mem.write_used(self.used_idx & (self.size - 1), UsedElem { id: u32::from(head), len });
        self.used_idx = self.used_idx.wrapping_add(1);
    }

    /// Publishes every completion so far: release fence, then the used index. Returns whether
    /// the device would now interrupt the driver (`AVAIL_F_NO_INTERRUPT`, or `used_event` with
    /// event index).
    pub fn publish(&mut self) -> bool {
        let old = self.mem.load_used_idx();
        fence(Ordering::Release);
        self.mem.store_used_idx(self.used_idx);
        fence(Ordering::SeqCst);
        if old == self.used_idx {
            false
        } else if self.event_idx {
            need_event(self.mem.load_used_event(), self.used_idx, old)
        } else {
            self.mem.load_avail_flags() & AVAIL_F_NO_INTERRUPT == 0
        }
    }

    /// Asks the driver not to notify (`VIRTQ_USED_F_NO_NOTIFY`), or to notify again.
    pub fn set_no_notify(&self, no_notify: bool) {
        self.mem.store_used_flags(if no_notify { USED_F_NO_NOTIFY } else { 0 });
    }

    /// In event-index mode: asks for a notification only once the driver publishes past `idx`.
    pub fn set_avail_event(&self, idx: u16) {
        self.mem.store_avail_event(idx);
    }

    /// The memory (to inspect `used_event`).
    pub fn memory(&self) -> &M {
        &self.mem
    }
}
