//! The driver's queue logic against the software device, on real (anonymous, non-IOMMU) DMA
//! mappings: no VM needed.

use super::dma::DmaRegion;
use super::dma_queue::{DmaQueue, QueueLayout};
use super::net::{NetEngine, NetLayout, Notify, BUF_SIZE, NET_HDR_LEN, RX_QUEUE, TX_QUEUE};
use super::soft_device::SoftDevice;
use super::virtqueue::{Buffer, QueueMemory, SplitQueue, Used};
use crate::l2::L2Port;
use crate::Error;
use std::sync::Arc;

const IOVA: u64 = 0x4000_0000;

/// A queue of `size` and room for `size` buffers of 256 bytes after it.
fn queue(size: u16, event_idx: bool) -> (SplitQueue<DmaQueue>, SoftDevice<DmaQueue>, u64) {
    let layout = QueueLayout::new(size, 0);
    let bufs = layout.end.next_multiple_of(4096);
    let region = Arc::new(DmaRegion::new(bufs + usize::from(size) * 256, IOVA).unwrap());
    let mem = DmaQueue::new(region, layout);
    let q = SplitQueue::new(mem.clone(), size, event_idx).unwrap();
    (q, SoftDevice::new(mem, size, event_idx), IOVA + bufs as u64)
}

fn out(addr: u64, bytes: &[u8], mem: &DmaQueue) -> Buffer {
    mem.write_buf(addr, bytes);
    Buffer { addr, len: bytes.len() as u32, device_writes: false }
}

#[test]
fn a_batch_of_chains_reaches_the_device_in_order_with_one_notification() {
    let (mut q, mut dev, bufs) = queue(8, false);
    let mem = q.memory().clone();
    // Three chains: one buffer, two buffers, one buffer.
    let a = out(bufs, b"first", &mem);
    let b1 = out(bufs + 256, b"sec", &mem);
    let b2 = out(bufs + 512, b"ond", &mem);
    let c = out(bufs + 768, b"third", &mem);
    let ha = q.add(&[a]).unwrap().unwrap();
    let hb = q.add(&[b1, b2]).unwrap().unwrap();
    let hc = q.add(&[c]).unwrap().unwrap();
    assert_eq!(q.num_free(), 4);
    assert_eq!(dev.pending(), 0, "nothing is visible before publish");
    assert!(q.publish(), "the device asked for notifications");
    assert!(!q.publish(), "a second publish with nothing new must not notify again");
    let mut seen = Vec::new();
    while let Some(chain) = dev.pop().unwrap() {
        seen.push((chain.head, dev.read(&chain)));
        dev.complete(chain.head, 0);
    }
    assert_eq!(seen, vec![(ha, b"first".to_vec()), (hb, b"second".to_vec()), (hc, b"third".to_vec())]);
    assert_eq!(q.pop_used().unwrap(), None, "nothing is used before the device publishes");
    dev.publish();
    let heads: Vec<u16> = std::iter::from_fn(|| q.pop_used().unwrap()).map(|u| u.head).collect();
    assert_eq!(heads, vec![ha, hb, hc]);
    assert_eq!(q.num_free(), 8);
}

#[test]
fn a_batch_of_receive_buffers_comes_back_with_the_device_bytes() {
    let (mut q, mut dev, bufs) = queue(4, false);
    for i in 0..4u64 {
        let b = Buffer { addr: bufs + i * 256, len: 256, device_writes: true };
        q.add(&[b]).unwrap().unwrap();
    }
    q.publish();
    for (i, frame) in [&b"alpha"[..], b"be", b"gamma-ray"].iter().enumerate() {
        let chain = dev.pop().unwrap().unwrap();
        assert_eq!(chain.descs[0].len, 256);
        assert_eq!(chain.descs[0].addr, bufs + i as u64 * 256);
        let n = dev.write(&chain, frame);
        dev.complete(chain.head, n);
    }
    dev.publish();
    let mut got = Vec::new();
    while let Some(Used { head, len }) = q.pop_used().unwrap() {
        let mut b = vec![0; len as usize];
        q.memory().read_buf(bufs + u64::from(head) * 256, &mut b);
        got.push(b);
    }
    assert_eq!(got, vec![b"alpha".to_vec(), b"be".to_vec(), b"gamma-ray".to_vec()]);
}

#[test]
fn a_full_ring_refuses_chains_until_the_device_returns_some() {
    let (mut q, mut dev, bufs) = queue(4, false);
    let mem = q.memory().clone();
    for i in 0..4 {
        assert!(q.add(&[out(bufs + i * 256, b"x", &mem)]).unwrap().is_some());
    }
    assert_eq!(q.add(&[out(bufs, b"y", &mem)]).unwrap(), None, "ring full");
    q.publish();
    let first = dev.pop().unwrap().unwrap();
    dev.complete(first.head, 0);
    dev.publish();
    assert_eq!(q.pop_used().unwrap().map(|u| u.head), Some(first.head));
    // One descriptor free: a two-buffer chain still does not fit, a one-buffer chain does.
    let pair = [out(bufs, b"a", &mem), out(bufs + 256, b"b", &mem)];
    assert_eq!(q.add(&pair).unwrap(), None);
    assert_eq!(q.add(&[out(bufs, b"z", &mem)]).unwrap(), Some(first.head));
    assert!(matches!(q.add(&[]), Err(Error::InvalidArgument(_))));
}

#[test]
fn indices_wrap_past_65535_without_losing_or_repeating_a_chain() {
    let (mut q, mut dev, bufs) = queue(4, false);
    let mem = q.memory().clone();
    // 70 000 chains through a 4-deep queue, in batches of three: both 16-bit indices wrap.
    let mut next_out = 0u32;
    let mut next_in = 0u32;
    while next_in < 70_000 {
        for _ in 0..3 {
            let payload = next_out.to_le_bytes();
            let b = out(bufs + u64::from(next_out % 4) * 256, &payload, &mem);
            q.add(&[b]).unwrap().unwrap();
            next_out += 1;
        }
        q.publish();
        while let Some(chain) = dev.pop().unwrap() {
            let bytes = dev.read(&chain);
            assert_eq!(bytes, next_in.to_le_bytes(), "chain {next_in}");
            next_in += 1;
            dev.complete(chain.head, 0);
        }
        dev.publish();
        while q.pop_used().unwrap().is_some() {}
        assert_eq!(q.num_free(), 4);
    }
    assert_eq!(mem.load_avail_idx(), (70_002u32 % 65_536) as u16);
    assert_eq!(mem.load_used_idx(), mem.load_avail_idx());
}

#[test]
fn used_elements_out_of_order_free_the_right_chains() {
    let (mut q, mut dev, bufs) = queue(8, false);
    let mem = q.memory().clone();
    let chains: Vec<Vec<Buffer>> = (0..4u64)
        .map(|i| (0..2u64).map(|j| out(bufs + (2 * i + j) * 256, &[i as u8, j as u8], &mem)).collect())
        .collect();
    let heads: Vec<u16> = chains.iter().map(|c| q.add(c).unwrap().unwrap()).collect();
    assert_eq!(q.num_free(), 0);
    q.publish();
    let taken: Vec<_> = std::iter::from_fn(|| dev.pop().unwrap()).collect();
    // The device finishes the third, the first, the fourth, then the second chain.
    for &k in &[2usize, 0, 3, 1] {
        dev.complete(taken[k].head, k as u32);
        dev.publish();
        let used = q.pop_used().unwrap().unwrap();
        assert_eq!(used, Used { head: heads[k], len: k as u32 });
    }
    assert_eq!(q.num_free(), 8);
    // The free list survived: four new two-buffer chains reach the device intact.
    for i in 0..4u64 {
        let c = [out(bufs + i * 256, &[9, i as u8], &mem), out(bufs + 1024 + i * 256, &[7], &mem)];
        q.add(&c).unwrap().unwrap();
    }
    q.publish();
    for i in 0..4u8 {
        let chain = dev.pop().unwrap().unwrap();
        assert_eq!(dev.read(&chain), vec![9, i, 7]);
    }
}

#[test]
fn a_used_element_naming_no_outstanding_chain_is_a_device_error() {
    let (mut q, mut dev, bufs) = queue(4, false);
    let mem = q.memory().clone();
    let h = q.add(&[out(bufs, b"x", &mem)]).unwrap().unwrap();
    q.publish();
    dev.pop().unwrap().unwrap();
    dev.complete(h, 0);
    dev.complete(h, 0); // the same chain twice
    dev.publish();
    assert!(q.pop_used().unwrap().is_some());
    let err = q.pop_used().unwrap_err();
    assert!(matches!(&err, Error::Device(m) if m.contains("heads no outstanding chain")), "{err}");
    assert_eq!(q.num_free(), 4, "the bogus element freed nothing");
}

#[test]
fn notifications_follow_the_device_suppression() {
    let (mut q, dev, bufs) = queue(8, false);
    let mem = q.memory().clone();
    dev.set_no_notify(true);
    q.add(&[out(bufs, b"x", &mem)]).unwrap();
    assert!(!q.publish(), "VIRTQ_USED_F_NO_NOTIFY");
    dev.set_no_notify(false);
    q.add(&[out(bufs, b"x", &mem)]).unwrap();
    assert!(q.publish());

    // Event index: the device wants a kick only when the index passes avail_event.
    let (mut q, mut dev, bufs) = queue(8, true);
    let mem = q.memory().clone();
    dev.set_avail_event(2); // notify when entry 2 is published
    q.add(&[out(bufs, b"a", &mem)]).unwrap();
    q.add(&[out(bufs, b"b", &mem)]).unwrap();
    assert!(!q.publish(), "indices 0 and 1 do not cross avail_event 2");
    q.add(&[out(bufs, b"c", &mem)]).unwrap();
    assert!(q.publish(), "index 2 crosses it");
    // Interrupts stay off while the driver polls; asked for, at the next used index.
    let c = dev.pop().unwrap().unwrap();
    dev.complete(c.head, 0);
    assert!(!dev.publish(), "a polling driver gets no interrupt");
    q.pop_used().unwrap().unwrap();
    assert!(!q.enable_interrupts());
    assert_eq!(dev.memory().load_used_event(), 1);
}

/// Records each notification.
#[derive(Debug, Default)]
struct Doorbells(Vec<u16>);

impl Notify for Doorbells {
    fn notify(&mut self, queue: u16) {
        self.0.push(queue);
    }
}

fn net(rx: u16, tx: u16) -> (NetEngine<Doorbells>, SoftDevice<DmaQueue>, SoftDevice<DmaQueue>) {
    let layout = NetLayout::new(rx, tx);
    let region = Arc::new(DmaRegion::new(layout.len, IOVA).unwrap());
    let mac = [0x02, 0, 0, 0, 0, 1];
    let e = NetEngine::new(region, layout, false, mac, 1500, Doorbells::default()).unwrap();
    let (rxq, txq) = e.queues();
    let rx_dev = SoftDevice::new(rxq.clone(), rx, false);
    let tx_dev = SoftDevice::new(txq.clone(), tx, false);
    (e, rx_dev, tx_dev)
}

fn frame(tag: u8, len: usize) -> Vec<u8> {
    let mut f = vec![tag; len];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    f
}

#[test]
fn sent_frames_reach_the_device_behind_a_zeroed_header_with_one_doorbell() {
    let (mut e, _rx, mut tx) = net(8, 4);
    assert_eq!(e.notifier().0, vec![RX_QUEUE], "receive buffers posted at start");
    let (a, b, c) = (frame(1, 60), frame(2, 1514), frame(3, 14));
    assert_eq!(e.send(&[&a, &b, &c]).unwrap(), 3);
    assert_eq!(e.notifier().0, vec![RX_QUEUE, TX_QUEUE], "one doorbell for the batch");
    for f in [&a, &b, &c] {
        let chain = tx.pop().unwrap().unwrap();
        let bytes = tx.read(&chain);
        assert_eq!(&bytes[..NET_HDR_LEN], &[0; NET_HDR_LEN]);
        assert_eq!(&bytes[NET_HDR_LEN..], &f[..]);
        tx.complete(chain.head, 0);
    }
    tx.publish();
    // A full transmit ring takes what fits, and the rest once the device has finished.
    let frames: Vec<Vec<u8>> = (0..6).map(|i| frame(i, 64)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    assert_eq!(e.send(&refs).unwrap(), 4, "4 descriptors");
    assert_eq!(e.send(&refs[4..]).unwrap(), 0, "ring full");
    for _ in 0..4 {
        let chain = tx.pop().unwrap().unwrap();
        tx.complete(chain.head, 0);
    }
    tx.publish();
    assert_eq!(e.send(&refs[4..]).unwrap(), 2);
    let mut last = Vec::new();
    while let Some(chain) = tx.pop().unwrap() {
        last.push(tx.read(&chain)[NET_HDR_LEN..].to_vec());
    }
    assert_eq!(last, &frames[4..], "the two refused frames, once the ring had room");
}

#[test]
fn a_malformed_frame_refuses_the_whole_batch() {
    let (mut e, _rx, mut tx) = net(8, 4);
    let good = frame(1, 60);
    for bad in [vec![0u8; 13], frame(2, 14 + 1501)] {
        let err = e.send(&[&good, &bad]).unwrap_err();
        assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("frame 1")), "{err}");
    }
    assert_eq!(tx.pop().unwrap(), None, "nothing of the batch was sent");
}

#[test]
fn received_frames_come_up_in_order_and_their_buffers_stay_posted() {
    let (mut e, mut rx, _tx) = net(4, 4);
    let frames: Vec<Vec<u8>> = (0..10).map(|i| frame(i, 60 + usize::from(i))).collect();
    let mut got = Vec::new();
    for batch in frames.chunks(3) {
        for f in batch {
            let chain = rx.pop().unwrap().expect("a receive buffer is posted");
            let mut wire = vec![0u8; NET_HDR_LEN];
            wire.extend_from_slice(f);
            let n = rx.write(&chain, &wire);
            rx.complete(chain.head, n);
        }
        rx.publish();
        let n = e.recv(usize::MAX, &mut |f| got.push(f.to_vec())).unwrap();
        assert_eq!(n, batch.len());
        assert_eq!(rx.pending(), 4, "every buffer posted again");
    }
    assert_eq!(got, frames);
    assert_eq!(e.recv(8, &mut |_| panic!("no frame waits")).unwrap(), 0);
}

#[test]
fn a_panicking_receive_callback_loses_no_buffer() {
    let (mut e, mut rx, _tx) = net(2, 2);
    for i in 0..2 {
        let chain = rx.pop().unwrap().unwrap();
        let mut wire = vec![0u8; NET_HDR_LEN];
        wire.extend_from_slice(&frame(i, 60));
        let n = rx.write(&chain, &wire);
        rx.complete(chain.head, n);
    }
    rx.publish();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        e.recv(2, &mut |_| panic!("user callback")).unwrap();
    }));
    assert!(r.is_err());
    let mut got = Vec::new();
    assert_eq!(e.recv(2, &mut |f| got.push(f[14])).unwrap(), 1, "the second frame is still there");
    assert_eq!(got, vec![1]);
    assert_eq!(rx.pending(), 2, "both buffers posted again");
}

#[test]
fn a_runt_from_the_device_is_dropped_and_its_buffer_reposted() {
    let (mut e, mut rx, _tx) = net(2, 2);
    let chain = rx.pop().unwrap().unwrap();
    rx.complete(chain.head, NET_HDR_LEN as u32 + 5);
    let chain = rx.pop().unwrap().unwrap();
    rx.complete(chain.head, BUF_SIZE as u32 + 1);
    rx.publish();
    assert_eq!(e.recv(4, &mut |_| panic!("no frame")).unwrap(), 0);
    assert_eq!(e.rx_dropped(), 2);
    assert_eq!(rx.pending(), 2);
}

#[test]
fn an_armed_receive_queue_interrupts_once_and_a_disarmed_one_never() {
    for event_idx in [false, true] {
        let layout = NetLayout::new(4, 4);
        let region = Arc::new(DmaRegion::new(layout.len, IOVA).unwrap());
        let mac = [0x02, 0, 0, 0, 0, 1];
        let mut e = NetEngine::new(region, layout, event_idx, mac, 1500, Doorbells::default()).unwrap();
        let mut rx = SoftDevice::new(e.queues().0.clone(), 4, event_idx);
        let deliver = |rx: &mut SoftDevice<DmaQueue>| {
            let chain = rx.pop().unwrap().unwrap();
            let mut wire = vec![0u8; NET_HDR_LEN];
            wire.extend_from_slice(&frame(1, 60));
            let n = rx.write(&chain, &wire);
            rx.complete(chain.head, n);
            rx.publish()
        };
        assert!(!deliver(&mut rx), "not armed: no interrupt (event_idx {event_idx})");
        assert!(e.arm_rx(), "a frame already waits: poll, do not sleep");
        assert_eq!(e.recv(8, &mut |_| {}).unwrap(), 1);
        assert!(!e.arm_rx(), "nothing waits");
        assert!(deliver(&mut rx), "armed: the next frame interrupts (event_idx {event_idx})");
        assert_eq!(e.recv(8, &mut |_| {}).unwrap(), 1);
        assert!(!deliver(&mut rx), "recv disarmed it (event_idx {event_idx})");
    }
}
