//! `OckRpcRead`, `OckRpcReadSgl`, `OckRpcWrite`, `OckRpcWriteSgl`: one-sided RDMA READ and WRITE
//! on a client connection, between a local registered region (named by `lAddress`/`lKey`) and a
//! peer's region (`rAddress`/`rKey`, as the peer's `OckRpcGetMemoryRegionInfo` reported them and
//! sent them over, typically in an RPC).
//!
//! # Semantics
//!
//! - The local side is checked here, before anything is posted: an unknown `lKey`, a range
//!   outside its region or a zero `size` is `OCK_RPC_ERR_INVALID_PARAM` with a log line, and the
//!   connection is untouched. For an SGL every request is checked before the first is posted.
//! - The remote side can only be checked by the peer's NIC. A bad `rKey` or a range outside the
//!   peer's region comes back as `OCK_RPC_ERR_INVALID_RKEY`; as on a real reliable connection,
//!   the queue that carried it enters the error state, so the connection may be broken
//!   afterwards (later calls fail with `OCK_RPC_ERR_CONN_BROKEN`). Nothing crashes.
//! - `cb == NULL`: the call returns when every request has completed (or the first failed; the
//!   rest of an SGL is then not posted). Otherwise it returns once every request is posted and
//!   `cb->cb(status, cb->arg)` runs exactly once when the last one completes, with the first
//!   error or `OCK_RPC_OK`; if the call itself returns an error, `cb` is never run (requests of an
//!   SGL posted before the failing one still complete, silently).
//! - The client's timeout (`OckRpcClientSetTimeout`) applies to each request.

use bypass::hal::{Device, RemoteKey, RemoteRegion};
use bypass::{Channel, LocalRange, OpOptions, RpcError};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Status codes used here (the values of `OckRpcStatus`).
pub(crate) mod status {
    pub const OK: i32 = 0;
    pub const ERR: i32 = -1;
    pub const INVALID_PARAM: i32 = -2;
    pub const UCP_PUT: i32 = -12;
    pub const UCP_GET: i32 = -13;
    pub const UCP_TIMEOUT: i32 = -19;
    pub const CONN_BROKEN: i32 = -21;
    pub const INVALID_RKEY: i32 = -22;
}

/// Size of the packed `OckRpcRequest`.
pub(crate) const REQUEST_SIZE: usize = 28;

/// READ or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// One `OckRpcRequest`, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Request {
    pub l_address: u64,
    pub r_address: u64,
    pub l_key: u32,
    pub r_key: u32,
    pub size: u32,
}

impl Request {
    /// Decodes the packed layout: lAddress @0, rAddress @8, lKey @16, rKey @20, size @24.
    pub(crate) fn from_bytes(b: &[u8; REQUEST_SIZE]) -> Request {
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Request {
            l_address: u64_at(0),
            r_address: u64_at(8),
            l_key: u32_at(16),
            r_key: u32_at(20),
            size: u32_at(24),
        }
    }

    /// Reads request `index` of the array at `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to at least `index + 1` readable `OckRpcRequest`s (any alignment).
    pub(crate) unsafe fn read(ptr: *const u8, index: usize) -> Request {
        // SAFETY: the caller guarantees the bytes are readable; the struct is packed, so read it
        // as bytes without alignment.
        let bytes =
            unsafe { std::ptr::read_unaligned(ptr.add(index * REQUEST_SIZE).cast::<[u8; REQUEST_SIZE]>()) };
        Request::from_bytes(&bytes)
    }

    /// The peer's region this request targets (the peer's NIC checks key and bounds).
    fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.r_address,
            len: u64::from(self.size),
            key: RemoteKey::from_rkey(self.r_key),
        }
    }
}

/// The C completion callback (`OckRpcCallDone`'s `cb` and `arg`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    pub cb: unsafe extern "C" fn(i32, *mut c_void),
    pub arg: *mut c_void,
}

// SAFETY: `arg` is the caller's opaque pointer; the API documents that `cb` runs with it on a
// worker thread, so the caller made it usable from there. We never dereference it.
unsafe impl Send for Done {}
// SAFETY: as above; shared only to be copied out and passed back to `cb`.
unsafe impl Sync for Done {}

impl Done {
    fn call(&self, status: i32) {
        // SAFETY: the caller's callback with its own argument, as the API documents.
        unsafe { (self.cb)(status, self.arg) };
    }
}

/// The status code of a failed operation.
pub(crate) fn status_of(kind: Kind, e: &RpcError) -> i32 {
    match e {
        RpcError::Timeout => status::UCP_TIMEOUT,
        RpcError::RemoteAccess(_) => status::INVALID_RKEY,
        RpcError::LocalAccess(_) | RpcError::InvalidArgument(_) => status::INVALID_PARAM,
        RpcError::Closed | RpcError::ConnectionBroken(_) => status::CONN_BROKEN,
        RpcError::Queue(_) | RpcError::Device(_) => match kind {
            Kind::Read => status::UCP_GET,
            Kind::Write => status::UCP_PUT,
        },
        _ => status::ERR,
    }
}

/// Finds the local region of a request: `resolve(lKey, lAddress, size)` returns the region and
/// the offset of `lAddress` in it, or what is wrong.
pub(crate) type Resolve<'a, R> = &'a dyn Fn(u32, u64, u64) -> Result<(Arc<R>, usize), String>;

/// Why a call failed before its outcome could be delivered through `cb`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The status to return.
    pub status: i32,
    /// What to log.
    pub message: String,
}

/// Checks the local side of every request (see the module docs).
fn validate<R>(
    reqs: &dyn Fn(usize) -> Request,
    count: usize,
    resolve: Resolve<'_, R>,
) -> Result<(), Failure> {
    if count == 0 {
        return Err(Failure {
            status: status::INVALID_PARAM,
            message: "an SGL request needs at least one entry (iovCount is 0)".into(),
        });
    }
    for i in 0..count {
        let r = reqs(i);
        if r.size == 0 {
            return Err(Failure {
                status: status::INVALID_PARAM,
                message: format!("request {i} has size 0 (give the number of bytes to move)"),
            });
        }
        resolve(r.l_key, r.l_address, u64::from(r.size))
            .map_err(|m| Failure { status: status::INVALID_PARAM, message: format!("request {i}: {m}") })?;
    }
    Ok(())
}

/// The outcome of an asynchronous SGL: `cb` runs when the last operation (or the starter, once
/// everything is posted) finishes, unless starting failed.
struct Gather {
    /// Operations still running, plus one held by the starter until everything is posted.
    remaining: AtomicUsize,
    /// First error status (0 while none).
    first_error: AtomicI32,
    /// Starting failed: the call returned an error, so `cb` must not run.
    abandoned: AtomicBool,
    done: Done,
}

impl Gather {
    fn finish_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 && !self.abandoned.load(Ordering::Acquire) {
            self.done.call(self.first_error.load(Ordering::Acquire));
        }
    }

    fn record(&self, status: i32) {
        if status != status::OK {
            let _ =
                self.first_error.compare_exchange(status::OK, status, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

/// Runs `count` requests (`reqs(i)` gives request `i`) on `channel`.
pub(crate) fn run<D: Device + Clone>(
    channel: &Channel<D>,
    kind: Kind,
    reqs: &dyn Fn(usize) -> Request,
    count: usize,
    resolve: Resolve<'_, D::Region>,
    timeout: Option<Duration>,
    done: Option<Done>,
) -> Result<(), Failure> {
    validate(reqs, count, resolve)?;
    let opts = OpOptions { timeout, ..OpOptions::default() };
    let fail =
        |i: usize, e: RpcError| Failure { status: status_of(kind, &e), message: format!("request {i}: {e}") };
    let Some(done) = done else {
        for i in 0..count {
            let r = reqs(i);
            let (region, off) = resolve(r.l_key, r.l_address, u64::from(r.size))
                .map_err(|m| Failure { status: status::INVALID_PARAM, message: m })?;
            let local = [LocalRange::new(&region, off, r.size as usize)];
            let result = match kind {
                Kind::Read => channel.read(&local, &r.remote(), 0, &opts),
                Kind::Write => channel.write(&local, &r.remote(), 0, &opts),
            };
            result.map_err(|e| fail(i, e))?;
        }
        return Ok(());
    };
    let gather = Arc::new(Gather {
        remaining: AtomicUsize::new(count + 1),
        first_error: AtomicI32::new(status::OK),
        abandoned: AtomicBool::new(false),
        done,
    });
    for i in 0..count {
        let r = reqs(i);
        let started = resolve(r.l_key, r.l_address, u64::from(r.size))
            .map_err(|m| Failure { status: status::INVALID_PARAM, message: m })
            .and_then(|(region, off)| {
                let local = [LocalRange::new(&region, off, r.size as usize)];
                let g = Arc::clone(&gather);
                let cb = move |res: Result<(), RpcError>| {
                    g.record(res.as_ref().map_or_else(|e| status_of(kind, e), |()| status::OK));
                    g.finish_one();
                };
                match kind {
                    Kind::Read => channel.read_callback(&local, &r.remote(), 0, &opts, cb),
                    Kind::Write => channel.write_callback(&local, &r.remote(), 0, &opts, cb),
                }
                .map_err(|e| fail(i, e))
            });
        if let Err(f) = started {
            gather.abandoned.store(true, Ordering::Release);
            gather.finish_one();
            return Err(f);
        }
    }
    gather.finish_one();
    Ok(())
}

// ---- the C entry points ---------------------------------------------------------------------

use crate::client;
use crate::guard::guard;
use crate::regions::RegionRegistry;
use crate::types::{Handle, OckRpcCallDone, OckRpcRequest, OckRpcSglRequest};
use bypass::backend::Nic;

/// Runs the requests on `channel`, finding local memory in `regions` (the regions of the server
/// whose device the channel runs on).
fn run_on<D: Nic>(
    channel: &Channel<D>,
    regions: &RegionRegistry,
    kind: Kind,
    reqs: &dyn Fn(usize) -> Request,
    count: usize,
    timeout: Duration,
    done: Option<Done>,
) -> Result<(), Failure> {
    let resolve = |key: u32, addr: u64, len: u64| -> Result<(Arc<D::Region>, usize), String> {
        let found = regions
            .find(addr as usize, len as usize, key)
            .and_then(|(e, off)| e.region.get::<D>().map(|r| (Arc::clone(r), off)));
        found.ok_or_else(|| {
            format!(
                "local range {addr:#x}+{len} with lKey {key:#x} is not inside a region registered on this client's \
                 server (OckRpcRegisterMemoryRegion / OckRpcRegisterAssignMemoryRegion, or a block of an allocator \
                 over one)"
            )
        })
    };
    run(channel, kind, reqs, count, &resolve, Some(timeout), done)
}

/// Decodes the `cb` argument: NULL is a blocking call.
///
/// # Safety
/// `cb` is NULL or points to a readable `OckRpcCallDone`.
unsafe fn done_of(cb: *const OckRpcCallDone) -> Result<Option<Done>, Failure> {
    if cb.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller passes a readable struct (read without alignment).
    let d = unsafe { std::ptr::read_unaligned(cb) };
    match d.cb {
        Some(f) => Ok(Some(Done { cb: f, arg: d.arg })),
        None => Err(Failure { status: status::INVALID_PARAM, message: "cb->cb is NULL".into() }),
    }
}

/// Runs the requests on client `h`.
fn on_client(
    h: Handle,
    kind: Kind,
    reqs: &dyn Fn(usize) -> Request,
    count: usize,
    done: Option<Done>,
) -> Result<(), Failure> {
    let dead = || Failure {
        status: status::INVALID_PARAM,
        message: format!("client handle {h:#x} is not a live connection (never connected, or disconnected)"),
    };
    let obj = client::lookup(h).ok_or_else(dead)?;
    let channel = obj.channel().ok_or_else(|| Failure {
        status: status::INVALID_PARAM,
        message: format!("client {h:#x} is a server-side connection; one-sided I/O needs a connected client"),
    })?;
    let server = obj.server().ok_or_else(dead)?;
    let timeout = obj.timeout();
    bypass::match_any!(channel, ch => run_on(ch, server.regions(), kind, reqs, count, timeout, done))
}

fn finish(func: &str, result: Result<(), Failure>) -> i32 {
    match result {
        Ok(()) => status::OK,
        Err(f) => {
            crate::log!(crate::log::ERROR, "{}", format!("{func}: {}", f.message));
            f.status
        }
    }
}

/// One request (`OckRpcRead` / `OckRpcWrite`).
///
/// # Safety
/// `req` is NULL or points to a readable `OckRpcRequest`; `cb` NULL or a readable `OckRpcCallDone`.
unsafe fn single(
    func: &'static str,
    kind: Kind,
    client: Handle,
    req: *const OckRpcRequest,
    cb: *const OckRpcCallDone,
) -> i32 {
    guard(func, status::ERR, || {
        finish(
            func,
            (|| {
                // SAFETY: forwarded from this function's contract.
                let done = unsafe { done_of(cb) }?;
                if req.is_null() {
                    return Err(Failure {
                        status: status::INVALID_PARAM,
                        message: "req must not be NULL".into(),
                    });
                }
                // SAFETY: non-NULL, and the caller passes one readable request.
                let r = unsafe { Request::read(req.cast(), 0) };
                on_client(client, kind, &|_| r, 1, done)
            })(),
        )
    })
}

/// An SGL (`OckRpcReadSgl` / `OckRpcWriteSgl`).
///
/// # Safety
/// `sgl` is NULL or points to a readable `OckRpcSglRequest` whose `iov` holds `iovCount`
/// readable requests; `cb` NULL or a readable `OckRpcCallDone`.
unsafe fn sgl(
    func: &'static str,
    kind: Kind,
    client: Handle,
    sgl: *const OckRpcSglRequest,
    cb: *const OckRpcCallDone,
) -> i32 {
    guard(func, status::ERR, || {
        finish(
            func,
            (|| {
                // SAFETY: forwarded from this function's contract.
                let done = unsafe { done_of(cb) }?;
                if sgl.is_null() {
                    return Err(Failure {
                        status: status::INVALID_PARAM,
                        message: "req must not be NULL".into(),
                    });
                }
                // SAFETY: non-NULL and readable (the struct is packed: read it without alignment).
                let s = unsafe { std::ptr::read_unaligned(sgl) };
                let (iov, count) = (s.iov as *const u8, usize::from(s.iov_count));
                if iov.is_null() && count > 0 {
                    return Err(Failure {
                        status: status::INVALID_PARAM,
                        message: format!("req->iov is NULL with iovCount {count}"),
                    });
                }
                // SAFETY: `iov` holds `count` readable requests (the caller's contract); `i < count`.
                let at = |i: usize| unsafe { Request::read(iov, i) };
                on_client(client, kind, &at, count, done)
            })(),
        )
    })
}

/// `OckRpcRead`.
///
/// # Safety
/// See the C header: `req` a readable `OckRpcRequest`, `cb` NULL or a readable `OckRpcCallDone`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcRead(client: Handle, req: *mut OckRpcRequest, cb: *mut OckRpcCallDone) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { single("OckRpcRead", Kind::Read, client, req, cb) }
}

/// `OckRpcWrite`.
///
/// # Safety
/// As [`OckRpcRead`].
#[no_mangle]
pub unsafe extern "C" fn OckRpcWrite(
    client: Handle,
    req: *mut OckRpcRequest,
    cb: *mut OckRpcCallDone,
) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { single("OckRpcWrite", Kind::Write, client, req, cb) }
}

/// `OckRpcReadSgl`.
///
/// # Safety
/// See the C header: `req` a readable `OckRpcSglRequest` with `iovCount` readable requests.
#[no_mangle]
pub unsafe extern "C" fn OckRpcReadSgl(
    client: Handle,
    req: *mut OckRpcSglRequest,
    cb: *mut OckRpcCallDone,
) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { sgl("OckRpcReadSgl", Kind::Read, client, req, cb) }
}

/// `OckRpcWriteSgl`.
///
/// # Safety
/// As [`OckRpcReadSgl`].
#[no_mangle]
pub unsafe extern "C" fn OckRpcWriteSgl(
    client: Handle,
    req: *mut OckRpcSglRequest,
    cb: *mut OckRpcCallDone,
) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { sgl("OckRpcWriteSgl", Kind::Write, client, req, cb) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::REGION_ACCESS;
    use bypass::hal::{Device, MemoryRegion};
    use bypass::{ChannelConfig, Functions, Server, ServerConfig};
    use bypass_sim::{Engine, Fabric, SimNic};
    use std::sync::mpsc;

    struct Pair {
        _server: Server<SimNic>,
        channel: Channel<SimNic>,
        exposed: Arc<<SimNic as Device>::Region>,
        mine: Arc<<SimNic as Device>::Region>,
        _fabric: Fabric,
    }

    fn pair() -> Pair {
        let fabric = Fabric::new(Engine::Inline);
        let (s, c) = (fabric.add_nic(), fabric.add_nic());
        let exposed = Arc::new(s.register(4096, REGION_ACCESS).unwrap());
        let server = Server::bind(&s, "127.0.0.1:0", ServerConfig::new("os"), Functions::new()).unwrap();
        let mut cfg = ChannelConfig::new("os");
        cfg.queues = 2;
        let channel = Channel::connect(&c, server.local_addr(), cfg).unwrap();
        let mine = Arc::new(c.register(4096, REGION_ACCESS).unwrap());
        Pair { _server: server, channel, exposed, mine, _fabric: fabric }
    }

    fn req(p: &Pair, l_off: u64, r_off: u64, size: u32) -> Request {
        Request {
            l_address: p.mine.addr() + l_off,
            r_address: p.exposed.addr() + r_off,
            l_key: crate::memory::c_key(&*p.mine).unwrap(),
            r_key: crate::memory::c_key(&*p.exposed).unwrap(),
            size,
        }
    }

    fn go(p: &Pair, kind: Kind, reqs: &[Request], done: Option<Done>) -> Result<(), Failure> {
        let key = crate::memory::c_key(&*p.mine).unwrap();
        let base = p.mine.as_ptr() as u64;
        let resolve = |k: u32, a: u64, l: u64| {
            if k == key && a >= base && a + l <= base + 4096 {
                Ok((Arc::clone(&p.mine), (a - base) as usize))
            } else {
                Err(format!("no region for {k:#x} {a:#x}+{l}"))
            }
        };
        run(&p.channel, kind, &|i| reqs[i], reqs.len(), &resolve, Some(Duration::from_secs(10)), done)
    }

    #[test]
    fn sync_write_then_read_back_and_local_errors() {
        let p = pair();
        // SAFETY: nothing else touches the region meanwhile.
        unsafe { p.mine.write_shared(0, b"hello, remote").unwrap() };
        go(&p, Kind::Write, &[req(&p, 0, 100, 13)], None).unwrap();
        let mut seen = [0u8; 13];
        p.exposed.read(100, &mut seen).unwrap();
        assert_eq!(&seen, b"hello, remote");
        // SGL READ of two pieces into other offsets.
        go(&p, Kind::Read, &[req(&p, 1000, 100, 7), req(&p, 2000, 107, 6)], None).unwrap();
        let mut a = [0u8; 7];
        let mut b = [0u8; 6];
        p.mine.read(1000, &mut a).unwrap();
        p.mine.read(2000, &mut b).unwrap();
        assert_eq!((&a[..], &b[..]), (&b"hello, "[..], &b"remote"[..]));
        // Local errors are caught before anything is posted.
        let bad_key = Request { l_key: 0xdead_0000, ..req(&p, 0, 0, 8) };
        assert_eq!(go(&p, Kind::Read, &[bad_key], None).unwrap_err().status, status::INVALID_PARAM);
        assert_eq!(
            go(&p, Kind::Read, &[req(&p, 4090, 0, 8)], None).unwrap_err().status,
            status::INVALID_PARAM
        );
        assert_eq!(go(&p, Kind::Write, &[req(&p, 0, 0, 0)], None).unwrap_err().status, status::INVALID_PARAM);
        assert_eq!(go(&p, Kind::Write, &[], None).unwrap_err().status, status::INVALID_PARAM);
        assert!(!p.channel.is_closed());
    }

    extern "C" fn to_channel(status: i32, arg: *mut c_void) {
        // SAFETY: the tests pass a live `mpsc::Sender<i32>`.
        let tx = unsafe { &*(arg as *const mpsc::Sender<i32>) };
        tx.send(status).unwrap();
    }

    #[test]
    fn async_sgl_calls_back_once_and_remote_errors_come_back() {
        let p = pair();
        let (tx, rx) = mpsc::channel::<i32>();
        let done = Done { cb: to_channel, arg: &tx as *const _ as *mut c_void };
        // SAFETY: nothing else touches the region meanwhile.
        unsafe { p.mine.write_shared(0, &[7u8; 64]).unwrap() };
        let reqs: Vec<Request> = (0..5).map(|i| req(&p, i * 8, 512 + i * 8, 8)).collect();
        go(&p, Kind::Write, &reqs, Some(done)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            p.channel.poll();
            if let Ok(s) = rx.try_recv() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "no callback");
        };
        assert_eq!(status, status::OK);
        let mut seen = [0u8; 40];
        p.exposed.read(512, &mut seen).unwrap();
        assert_eq!(seen, [7u8; 40]);
        // A remote range outside the peer's region: its NIC refuses.
        let out = Request { r_address: p.exposed.addr() + 4090, ..req(&p, 0, 0, 64) };
        assert_eq!(go(&p, Kind::Read, &[out], None).unwrap_err().status, status::INVALID_RKEY);
        // A wrong remote key, asynchronously: the error arrives through the callback.
        let bad = Request { r_key: 0x7777_0000, ..req(&p, 0, 0, 8) };
        go(&p, Kind::Write, &[bad], Some(done)).unwrap();
        let status = loop {
            p.channel.poll();
            if let Ok(s) = rx.try_recv() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "no callback");
        };
        assert!(status == status::INVALID_RKEY || status == status::CONN_BROKEN, "{status}");
        // Exactly once.
        for _ in 0..100 {
            p.channel.poll();
        }
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn packed_request_layout() {
        let mut b = [0u8; REQUEST_SIZE];
        b[0..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_ne_bytes());
        b[8..16].copy_from_slice(&0x99aa_bbcc_ddee_ff00u64.to_ne_bytes());
        b[16..20].copy_from_slice(&7u32.to_ne_bytes());
        b[20..24].copy_from_slice(&8u32.to_ne_bytes());
        b[24..28].copy_from_slice(&4096u32.to_ne_bytes());
        let r = Request::from_bytes(&b);
        assert_eq!(
            r,
            Request {
                l_address: 0x1122_3344_5566_7788,
                r_address: 0x99aa_bbcc_ddee_ff00,
                l_key: 7,
                r_key: 8,
                size: 4096
            }
        );
        let two = [b, b].concat();
        // SAFETY: `two` holds two requests.
        assert_eq!(unsafe { Request::read(two.as_ptr().wrapping_add(0), 1) }, r);
    }
}
