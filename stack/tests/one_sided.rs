//! One-sided READ and WRITE over a channel, on the simulator, in every engine mode.
//!
//! The server registers a region with REMOTE_READ | REMOTE_WRITE and returns its 49-byte
//! descriptor ([`RemoteRegion::encode`]) as the response of an RPC; the client decodes it and
//! WRITEs and READs the region.

use bypass::hal::{self, Device};
use bypass::sim::{Engine, SimNic};
use bypass::*;
use std::future::Future;
use std::ops::Deref;
use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

mod common;
use common::ids::{ECHO, REGION};
use common::rig::{real, STEPPED};

type Region = <SimNic as Device>::Region;

const REGION_LEN: usize = 4096;
const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// A waker that does nothing: [`Rig::wait`] polls in a loop anyway.
struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// The shared rig whose server exposes a region (REGION answers its descriptor).
struct Rig {
    rig: common::rig::Rig,
    /// The server's exposed region (the test reads it to check WRITEs).
    exposed: Arc<Region>,
}

impl Deref for Rig {
    type Target = common::rig::Rig;
    fn deref(&self) -> &common::rig::Rig {
        &self.rig
    }
}

impl Rig {
    fn new(eng: Engine, queues: usize) -> Rig {
        // The region is registered on the rig's server NIC, which exists once the rig is built;
        // REGION is called after that.
        let slot: Arc<OnceLock<Arc<Region>>> = Arc::default();
        let r = slot.clone();
        let rig = common::rig::Rig::build(eng, |s| {
            // The descriptor travels as the response of an ordinary RPC.
            s.functions.register(REGION, move |req| {
                let _ = req.reply(&r.get().expect("the region is registered").remote().encode());
            });
            s.channel.queues = queues;
            // A queue failed by a remote access error stays failed here (the RC semantics these
            // tests check); `tests/recovery.rs` brings such a queue back.
            s.channel.recovery = None;
        });
        let mut region = rig
            .snic
            .register(REGION_LEN, Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE)
            .unwrap();
        let init: Vec<u8> = (0..REGION_LEN).map(|i| (i % 251) as u8).collect();
        region.write(0, &init).unwrap();
        let exposed = Arc::new(region);
        assert!(slot.set(exposed.clone()).is_ok());
        Rig { rig, exposed }
    }

    /// Drives until `fut` resolves.
    fn wait<F: Future>(&self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        let waker = Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        let start = Instant::now();
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            assert!(start.elapsed() < WAIT_LIMIT, "{:?}: gave up waiting", self.engine);
            self.pump();
        }
    }

    fn descriptor(&self) -> RemoteRegion {
        let fut = self.channel.call_future(&CallOptions::default(), REGION, b"").unwrap();
        let bytes = self.wait(fut).unwrap();
        assert_eq!(bytes.len(), RemoteRegion::ENCODED_LEN);
        RemoteRegion::decode(&bytes).unwrap()
    }

    /// A local region of `len` bytes with `bytes` at `off` (written before it is shared).
    fn local_with(&self, len: usize, off: usize, bytes: &[u8]) -> Arc<Region> {
        let mut r = self.cnic.register(len, Access::LOCAL_WRITE).unwrap();
        r.write(off, bytes).unwrap();
        Arc::new(r)
    }

    fn local(&self, len: usize) -> Arc<Region> {
        Arc::new(self.cnic.register(len, Access::LOCAL_WRITE).unwrap())
    }

    /// A WRITE: blocking on the real engines, a future on Stepped.
    fn write(
        &self,
        local: &[LocalRange<'_, Region>],
        remote: &RemoteRegion,
        off: u64,
    ) -> Result<(), RpcError> {
        let opts = OpOptions::default();
        if !real(self.engine) {
            let fut = self.channel.write_future(local, remote, off, &opts)?;
            self.wait(fut)
        } else {
            self.channel.write(local, remote, off, &opts)
        }
    }

    fn read(
        &self,
        local: &[LocalRange<'_, Region>],
        remote: &RemoteRegion,
        off: u64,
    ) -> Result<(), RpcError> {
        let opts = OpOptions::default();
        if !real(self.engine) {
            let fut = self.channel.read_future(local, remote, off, &opts)?;
            self.wait(fut)
        } else {
            self.channel.read(local, remote, off, &opts)
        }
    }

    fn exposed_bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.exposed.read(off, &mut v).unwrap();
        v
    }

    fn settled(&self) {
        self.until("every send context back", || self.channel.stats().tx_in_use == 0);
    }
}

fn bytes_of(r: &Region, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    r.read(off, &mut v).unwrap();
    v
}

/// Records every outcome a callback delivers.
type Log = Arc<Mutex<Vec<Result<(), String>>>>;

fn logger(log: &Log) -> impl FnOnce(Result<(), RpcError>) + Send + 'static {
    let log = log.clone();
    move |r| log.lock().unwrap().push(r.map_err(|e| format!("{e:?}")))
}

common::per_engine!(stepped: round_trip, gather_scatter, bad_key_and_range, callbacks, close_outstanding);

fn round_trip(eng: Engine) {
    let rig = Rig::new(eng, 1);
    let remote = rig.descriptor();
    assert_eq!(remote.len, REGION_LEN as u64);
    let data: Vec<u8> = (0..64u8).map(|i| i ^ 0x5a).collect();
    let src = rig.local_with(256, 10, &data);
    rig.write(&[LocalRange::new(&src, 10, 64)], &remote, 100).unwrap();
    assert_eq!(rig.exposed_bytes(100, 64), data, "{eng:?}: the WRITE placed the bytes");
    let dst = rig.local(128);
    rig.read(&[LocalRange::new(&dst, 0, 64)], &remote, 100).unwrap();
    assert_eq!(bytes_of(&dst, 0, 64), data, "{eng:?}: the READ got them back");
    // Untouched bytes around it.
    let mut whole = vec![0; 128];
    rig.read(&[LocalRange::whole(&dst)], &remote, 36).unwrap();
    dst.read(0, &mut whole).unwrap();
    assert_eq!(&whole[64..128], &data[..], "{eng:?}");
    assert_eq!(whole[0], 36, "the initial pattern (i % 251) at offset 36");
    rig.settled();
    let s = rig.channel.stats();
    assert_eq!((s.ready_queues, s.tx_in_use, s.table_in_use), (1, 0, 0), "{s:?}");
}

fn gather_scatter(eng: Engine) {
    let rig = Rig::new(eng, 1);
    let remote = rig.descriptor();
    let a = rig.local_with(64, 0, &[1; 64]);
    let b = rig.local_with(64, 0, &[2; 64]);
    // Gather: 10 bytes of a, 20 of b, 5 more of a (at another offset).
    let gather = [LocalRange::new(&a, 3, 10), LocalRange::new(&b, 0, 20), LocalRange::new(&a, 50, 5)];
    rig.write(&gather, &remote, 1000).unwrap();
    let mut want = vec![1u8; 10];
    want.extend([2u8; 20]);
    want.extend([1u8; 5]);
    assert_eq!(rig.exposed_bytes(1000, 35), want, "{eng:?}: gathered in order");
    // Scatter the same 35 bytes into three ranges of two regions.
    let x = rig.local(64);
    let y = rig.local(64);
    let scatter = [LocalRange::new(&x, 0, 15), LocalRange::new(&y, 7, 15), LocalRange::new(&x, 40, 5)];
    rig.read(&scatter, &remote, 1000).unwrap();
    assert_eq!(bytes_of(&x, 0, 15), want[..15], "{eng:?}");
    assert_eq!(bytes_of(&y, 7, 15), want[15..30], "{eng:?}");
    assert_eq!(bytes_of(&x, 40, 5), want[30..], "{eng:?}");
    // Too many ranges, an empty list, a range outside its region: refused before posting.
    let five: Vec<_> = (0..MAX_SGES + 1).map(|i| LocalRange::new(&x, i, 1)).collect();
    assert!(matches!(rig.write(&five, &remote, 0), Err(RpcError::InvalidArgument(_))));
    assert!(matches!(rig.write(&[], &remote, 0), Err(RpcError::InvalidArgument(_))));
    assert!(matches!(rig.read(&[LocalRange::new(&x, 60, 8)], &remote, 0), Err(RpcError::InvalidArgument(_))));
    // A READ into a region the NIC may not write.
    let ro = Arc::new(rig.cnic.register(64, Access::empty()).unwrap());
    assert!(matches!(rig.read(&[LocalRange::whole(&ro)], &remote, 0), Err(RpcError::InvalidArgument(_))));
    rig.settled();
    assert_eq!(rig.channel.stats().ready_queues, 1, "refusals before posting fail no queue");
}

/// A bad key and an out-of-range offset each fail with `RemoteAccess` and fail the queue they
/// used (RC semantics); the channel goes on with its other queues, and closes when none is left.
fn bad_key_and_range(eng: Engine) {
    let rig = Rig::new(eng, 3);
    let remote = rig.descriptor();
    let buf = rig.local_with(64, 0, &[7; 64]);
    let on = |q| OpOptions { queue: Some(q), ..Default::default() };
    let write_on = |q, r: &RemoteRegion, off| {
        if !real(eng) {
            let fut = rig.channel.write_future(&[LocalRange::whole(&buf)], r, off, &on(q)).unwrap();
            rig.wait(fut)
        } else {
            rig.channel.write(&[LocalRange::whole(&buf)], r, off, &on(q))
        }
    };
    // A wrong key.
    let mut bad = remote;
    bad.key = RemoteKey::from_rkey(remote.key.rkey() ^ 0xdead);
    let r = write_on(0, &bad, 0);
    assert!(matches!(r, Err(RpcError::RemoteAccess(hal::Status::RemoteAccess))), "{eng:?}: {r:?}");
    assert_eq!(rig.exposed_bytes(0, 4), [0, 1, 2, 3], "nothing was written");
    rig.until("queue 0 failed", || rig.channel.stats().ready_queues == 2);
    // Past the end of the region (the descriptor's length is not trusted: the peer NIC checks).
    let r = write_on(1, &remote, REGION_LEN as u64 - 8);
    assert!(matches!(r, Err(RpcError::RemoteAccess(hal::Status::RemoteAccess))), "{eng:?}: {r:?}");
    rig.until("queue 1 failed", || rig.channel.stats().ready_queues == 1);
    assert!(!rig.channel.is_closed());
    // Calls and operations go on over queue 2.
    let fut = rig.channel.call_future(&CallOptions::default(), ECHO, b"still here").unwrap();
    assert_eq!(rig.wait(fut).unwrap(), b"still here");
    rig.read(&[LocalRange::new(&buf, 0, 8)], &remote, 8).unwrap();
    assert_eq!(bytes_of(&buf, 0, 8), (8..16).collect::<Vec<u8>>());
    // The last queue: the peer's last queue fails too and it closes the connection, which may
    // overtake the NAK (then the operation is flushed and ends `Closed`).
    let r = write_on(2, &bad, 0);
    assert!(matches!(r, Err(RpcError::RemoteAccess(_) | RpcError::Closed)), "{eng:?}: {r:?}");
    rig.until("the channel closed", || rig.channel.is_closed());
    assert!(matches!(rig.read(&[LocalRange::whole(&buf)], &remote, 0), Err(RpcError::Closed)));
    rig.settled();
}

/// Callback delivery, and futures of both kinds, exactly once each.
fn callbacks(eng: Engine) {
    let rig = Rig::new(eng, 1);
    let remote = rig.descriptor();
    let log: Log = Arc::default();
    let src = rig.local_with(32, 0, b"0123456789abcdef0123456789ABCDEF");
    let dst = rig.local(32);
    let opts = OpOptions::default();
    rig.channel.write_callback(&[LocalRange::whole(&src)], &remote, 512, &opts, logger(&log)).unwrap();
    rig.until("the write callback", || log.lock().unwrap().len() == 1);
    rig.channel.read_callback(&[LocalRange::whole(&dst)], &remote, 512, &opts, logger(&log)).unwrap();
    rig.until("the read callback", || log.lock().unwrap().len() == 2);
    assert_eq!(*log.lock().unwrap(), vec![Ok(()), Ok(())]);
    assert_eq!(bytes_of(&dst, 0, 32), b"0123456789abcdef0123456789ABCDEF");
    let f = rig.channel.read_future(&[LocalRange::new(&dst, 0, 4)], &remote, 0, &opts).unwrap();
    rig.wait(f).unwrap();
    assert_eq!(bytes_of(&dst, 0, 4), [0, 1, 2, 3]);
    rig.settled();
    assert_eq!(log.lock().unwrap().len(), 2, "no second delivery");
}

/// Closing the channel with an operation outstanding ends it exactly once (`Closed`, or `Ok` on
/// the real engines if it already completed); the context comes back.
fn close_outstanding(eng: Engine) {
    let rig = Rig::new(eng, 1);
    let remote = rig.descriptor();
    let log: Log = Arc::default();
    let src = rig.local_with(1024, 0, &[9; 1024]);
    let opts = OpOptions::default();
    rig.channel.write_callback(&[LocalRange::whole(&src)], &remote, 0, &opts, logger(&log)).unwrap();
    let dst = rig.local(1024);
    rig.channel.read_callback(&[LocalRange::whole(&dst)], &remote, 0, &opts, logger(&log)).unwrap();
    rig.channel.close();
    rig.until("both outcomes", || log.lock().unwrap().len() == 2);
    for _ in 0..100 {
        rig.pump();
    }
    let got = log.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{eng:?}: exactly once each: {got:?}");
    if !real(eng) {
        assert_eq!(got, vec![Err("Closed".to_string()), Err("Closed".to_string())]);
    } else {
        assert!(got.iter().all(|r| r.is_ok() || r.as_ref().unwrap_err() == "Closed"), "{got:?}");
    }
    assert_eq!(rig.channel.stats().tx_in_use, 0, "{eng:?}: contexts back");
    assert!(matches!(
        rig.channel.write(&[LocalRange::whole(&src)], &remote, 0, &opts),
        Err(RpcError::Closed)
    ));
}

/// A deadline on the virtual clock: the operation times out exactly once, keeps its regions
/// alive until its work request completes, and its late completion is not delivered again.
#[test]
fn deadline_expiry_stepped() {
    let rig = Rig::new(STEPPED, 1);
    let remote = rig.descriptor();
    let log: Log = Arc::default();
    let dst = rig.local(64);
    let short = OpOptions { timeout: Some(Duration::from_millis(50)), ..Default::default() };
    rig.channel.read_callback(&[LocalRange::whole(&dst)], &remote, 64, &short, logger(&log)).unwrap();
    assert_eq!(Arc::strong_count(&dst), 2, "the operation holds the region");
    rig.fabric.advance(Duration::from_millis(51));
    assert_eq!(rig.channel.check_timeouts(), 1);
    assert_eq!(*log.lock().unwrap(), vec![Err("Timeout".to_string())]);
    assert_eq!(rig.channel.stats().timeouts, 1);
    assert_eq!(Arc::strong_count(&dst), 2, "still held: the READ may still write it");
    rig.settled();
    assert_eq!(Arc::strong_count(&dst), 1, "released at the work request's completion");
    assert_eq!(log.lock().unwrap().len(), 1, "the late completion is not delivered");
    // The channel is fine afterwards.
    rig.read(&[LocalRange::whole(&dst)], &remote, 0).unwrap();
    assert_eq!(bytes_of(&dst, 0, 3), [0, 1, 2]);
}

/// The descriptor round-trips through its 49 bytes.
#[test]
fn descriptor_travels_in_an_rpc() {
    let rig = Rig::new(Engine::Inline, 1);
    let d = rig.descriptor();
    assert_eq!(d, rig.exposed.remote());
    assert_eq!(RemoteRegion::decode(&d.encode()).unwrap(), d);
}
