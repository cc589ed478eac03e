//! virtio-net's data path over two split virtqueues: frames in and out as an [`L2Port`].
//!
//! Independent of how the device is reached: the engine owns the DMA region (queues and buffers)
//! and calls a [`Notify`] to ring the device, so tests drive it with the software device and the
//! VFIO driver with a write into the notify BAR.
//!
//! - Every frame travels behind the 12-byte `virtio_net_hdr` of a `VIRTIO_F_VERSION_1` device
//!   (no offloads are negotiated, so the driver sends it zeroed and ignores it on receive).
//! - Transmit: one descriptor per frame, pointing at one of the queue's own buffers; the frame is
//!   copied there (the caller may reuse its buffer at once). Finished buffers are reclaimed at
//!   the next `send`. One `send` publishes once and notifies at most once.
//! - Receive: every receive buffer stays posted. `recv` copies a frame out of its buffer, posts
//!   the buffer again, then hands the copy to the caller (so a panicking callback loses no
//!   buffer), and publishes the re-posted buffers once at the end.

use super::dma::DmaRegion;
use super::dma_queue::{DmaQueue, QueueLayout};
use super::virtqueue::{Buffer, QueueMemory, SplitQueue};
use crate::l2::{L2Port, Mac, ETH_HEADER_LEN};
use crate::{Error, Result};
use std::sync::Arc;

/// Length of `virtio_net_hdr` with `VIRTIO_F_VERSION_1` (`num_buffers` included).
pub const NET_HDR_LEN: usize = 12;
/// Size of each receive and transmit buffer: a header and a frame of up to 2022 payload bytes.
pub const BUF_SIZE: usize = 2048;
/// The largest MTU the engine's buffers carry.
pub const MAX_MTU: usize = BUF_SIZE - NET_HDR_LEN - ETH_HEADER_LEN;
/// virtio-net's first receive queue.
pub const RX_QUEUE: u16 = 0;
/// virtio-net's first transmit queue.
pub const TX_QUEUE: u16 = 1;

/// Rings the device: tells it queue `queue` has new available entries.
pub trait Notify: Send {
    /// Notifies queue `queue`.
    fn notify(&mut self, queue: u16);
}

/// Where the receive queue, the transmit queue and their buffers lie in one DMA region.
#[derive(Debug, Clone, Copy)]
pub struct NetLayout {
    /// The receive queue.
    pub rx: QueueLayout,
    /// The transmit queue.
    pub tx: QueueLayout,
    /// Offset of the receive buffers (`rx.size` of [`BUF_SIZE`]).
    pub rx_bufs: usize,
    /// Offset of the transmit buffers (`tx.size` of [`BUF_SIZE`]).
    pub tx_bufs: usize,
    /// Bytes of the whole region.
    pub len: usize,
}

impl NetLayout {
    /// Queues of `rx_size` and `tx_size` descriptors and their buffers.
    pub fn new(rx_size: u16, tx_size: u16) -> NetLayout {
        let rx = QueueLayout::new(rx_size, 0);
        let tx = QueueLayout::new(tx_size, rx.end);
        let rx_bufs = tx.end.next_multiple_of(4096);
        let tx_bufs = rx_bufs + usize::from(rx_size) * BUF_SIZE;
        let len = (tx_bufs + usize::from(tx_size) * BUF_SIZE).next_multiple_of(4096);
        NetLayout { rx, tx, rx_bufs, tx_bufs, len }
    }
}

/// The data path of one virtio-net device: its two queues, their buffers, its MAC and MTU.
#[derive(Debug)]
pub struct NetEngine<N> {
    region: Arc<DmaRegion>,
    rx: SplitQueue<DmaQueue>,
    tx: SplitQueue<DmaQueue>,
    /// Per receive descriptor: the buffer it points to.
    rx_addr: Vec<u64>,
    /// Per transmit descriptor: the buffer it points to.
    tx_addr: Vec<u64>,
    /// Transmit buffers not in flight.
    tx_free: Vec<u64>,
    mac: Mac,
    mtu: usize,
    notify: N,
    scratch: Vec<u8>,
    rx_dropped: u64,
}

impl<N: Notify> NetEngine<N> {
    /// Builds the engine over `region` (zeroed, laid out as `layout`), posts every receive buffer
    /// and notifies the receive queue. The device must already know the queues' addresses.
    pub fn new(
        region: Arc<DmaRegion>,
        layout: NetLayout,
        event_idx: bool,
        mac: Mac,
        mtu: usize,
        notify: N,
    ) -> Result<NetEngine<N>> {
        if mtu > MAX_MTU {
            return Err(Error::Unsupported(format!(
                "MTU {mtu}: this driver's buffers carry at most {MAX_MTU} bytes of payload \
                 (no mergeable receive buffers); lower the device's MTU"
            )));
        }
        let rx_q = DmaQueue::new(region.clone(), layout.rx);
        let tx_q = DmaQueue::new(region.clone(), layout.tx);
        let rx = SplitQueue::new(rx_q, layout.rx.size, event_idx)?;
        let tx = SplitQueue::new(tx_q, layout.tx.size, event_idx)?;
        let base = region.iova();
        let tx_free = (0..u64::from(layout.tx.size))
            .rev()
            .map(|i| base + layout.tx_bufs as u64 + i * BUF_SIZE as u64)
            .collect();
        let mut engine = NetEngine {
            rx_addr: vec![0; usize::from(layout.rx.size)],
            tx_addr: vec![0; usize::from(layout.tx.size)],
            tx_free,
            region,
            rx,
            tx,
            mac,
            mtu,
            notify,
            scratch: vec![0; BUF_SIZE],
            rx_dropped: 0,
        };
        for i in 0..u64::from(layout.rx.size) {
            engine.post_rx(base + layout.rx_bufs as u64 + i * BUF_SIZE as u64)?;
        }
        if engine.rx.publish() {
            engine.notify.notify(RX_QUEUE);
        }
        Ok(engine)
    }

    /// The receive and transmit queues' memory (for the device's queue registers, and for the
    /// software device of tests).
    pub fn queues(&self) -> (&DmaQueue, &DmaQueue) {
        (self.rx.memory(), self.tx.memory())
    }

    /// The DMA region under both queues.
    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }

    /// Received frames dropped because the device returned fewer bytes than a header and an
    /// Ethernet header, or more than a buffer holds.
    pub fn rx_dropped(&self) -> u64 {
        self.rx_dropped
    }

    /// Asks the device for an interrupt at the next received frame; true if frames already wait.
    pub fn arm_rx(&mut self) -> bool {
        self.rx.enable_interrupts()
    }

    /// Both queues' indices and free descriptors, for failure messages.
    pub fn diagnostics(&self) -> String {
        let (r, t) = (self.rx.memory(), self.tx.memory());
        format!(
            "rx avail {} used {} free {}; tx avail {} used {} free {}",
            r.load_avail_idx(),
            r.load_used_idx(),
            self.rx.num_free(),
            t.load_avail_idx(),
            t.load_used_idx(),
            self.tx.num_free()
        )
    }

    /// The notifier (tests count its calls).
    pub fn notifier(&self) -> &N {
        &self.notify
    }

    fn post_rx(&mut self, addr: u64) -> Result<()> {
        let buf = Buffer { addr, len: BUF_SIZE as u32, device_writes: true };
        match self.rx.add(&[buf])? {
            Some(head) => {
                self.rx_addr[usize::from(head)] = addr;
                Ok(())
            }
            None => Err(Error::Device(
                "virtio-net: a receive buffer came back while its queue was full; reset the device".into(),
            )),
        }
    }

    /// Takes back every transmit buffer the device has finished with.
    fn reclaim_tx(&mut self) -> Result<()> {
        while let Some(used) = self.tx.pop_used()? {
            self.tx_free.push(self.tx_addr[usize::from(used.head)]);
        }
        Ok(())
    }
}

impl<N: Notify> L2Port for NetEngine<N> {
    fn mac(&self) -> Mac {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn send(&mut self, frames: &[&[u8]]) -> Result<usize> {
        for (i, f) in frames.iter().enumerate() {
            if f.len() < ETH_HEADER_LEN || f.len() - ETH_HEADER_LEN > self.mtu {
                return Err(Error::InvalidArgument(format!(
                    "frame {i} of the batch is {} bytes: an Ethernet frame is 14 header bytes and \
                     at most {} (the MTU) of payload; nothing of the batch was sent",
                    f.len(),
                    self.mtu
                )));
            }
        }
        self.reclaim_tx()?;
        let mut taken = 0;
        for f in frames {
            let Some(addr) = self.tx_free.pop() else { break };
            let len = NET_HDR_LEN + f.len();
            self.scratch[..NET_HDR_LEN].fill(0);
            self.scratch[NET_HDR_LEN..len].copy_from_slice(f);
            let mem = self.tx.memory();
            mem.write_buf(addr, &self.scratch[..len]);
            let buf = Buffer { addr, len: len as u32, device_writes: false };
            match self.tx.add(&[buf])? {
                Some(head) => self.tx_addr[usize::from(head)] = addr,
                None => {
                    self.tx_free.push(addr);
                    break;
                }
            }
            taken += 1;
        }
        if self.tx.publish() {
            self.notify.notify(TX_QUEUE);
        }
        Ok(taken)
    }

    fn recv(&mut self, max: usize, each: &mut dyn FnMut(&[u8])) -> Result<usize> {
        // A wake-up asked for by `arm` has served (or the caller polls anyway): no more until
        // the next `arm`.
        self.rx.disable_interrupts();
        let mut handed = 0;
        while handed < max {
            let Some(used) = self.rx.pop_used()? else { break };
            let addr = self.rx_addr[usize::from(used.head)];
            let len = used.len as usize;
            let ok = (NET_HDR_LEN + ETH_HEADER_LEN..=BUF_SIZE).contains(&len);
            if ok {
                self.rx.memory().read_buf(addr, &mut self.scratch[..len]);
            }
            // Post the buffer again before the callback: a callback that panics loses no buffer
            // (the next `recv` publishes it).
            self.post_rx(addr)?;
            if !ok {
                self.rx_dropped += 1;
                continue;
            }
            handed += 1;
            each(&self.scratch[NET_HDR_LEN..len]);
        }
        if self.rx.publish() {
            self.notify.notify(RX_QUEUE);
        }
        Ok(handed)
    }
}
