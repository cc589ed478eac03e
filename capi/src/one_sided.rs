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
/// Size of the packed `OckRpcSglRequest`.
pub(crate) const SGL_REQUEST_SIZE: usize = 10;

/// READ or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Read => "OckRpcRead",
            Kind::Write => "OckRpcWrite",
        }
    }
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
    pub cb: extern "C" fn(i32, *mut c_void),
    pub arg: *mut c_void,
}

// SAFETY: `arg` is the caller's opaque pointer; the API documents that `cb` runs with it on a
// worker thread, so the caller made it usable from there. We never dereference it.
unsafe impl Send for Done {}
// SAFETY: as above; shared only to be copied out and passed back to `cb`.
unsafe impl Sync for Done {}

impl Done {
    fn call(&self, status: i32) {
        (self.cb)(status, self.arg);
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
    kind: Kind,
    reqs: &dyn Fn(usize) -> Request,
    count: usize,
    resolve: Resolve<'_, R>,
) -> Result<(), Failure> {
    if count == 0 {
        return Err(Failure {
            status: status::INVALID_PARAM,
            message: format!("{}: an SGL request needs at least one entry (iovCount is 0)", kind.name()),
        });
    }
    for i in 0..count {
        let r = reqs(i);
        if r.size == 0 {
            return Err(Failure {
                status: status::INVALID_PARAM,
                message: format!(
                    "{}: request {i} has size 0 (give the number of bytes to move)",
                    kind.name()
                ),
            });
        }
        resolve(r.l_key, r.l_address, u64::from(r.size)).map_err(|m| Failure {
            status: status::INVALID_PARAM,
            message: format!("{}: request {i}: {m}", kind.name()),
        })?;
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
    validate(kind, reqs, count, resolve)?;
    let opts = OpOptions { timeout, ..OpOptions::default() };
    let fail = |i: usize, e: RpcError| Failure {
        status: status_of(kind, &e),
        message: format!("{}: request {i}: {e}", kind.name()),
    };
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

use crate::memory::interim::{entry, log_error};
use crate::memory::Registry;
use std::sync::OnceLock;

/// What one-sided I/O needs of a client connection, whatever its backend.
pub(crate) trait OneSidedHost: Send + Sync {
    /// Runs `count` requests (see [`run`]).
    fn run(
        &self,
        kind: Kind,
        reqs: &dyn Fn(usize) -> Request,
        count: usize,
        timeout: Option<Duration>,
        done: Option<Done>,
    ) -> Result<(), Failure>;
}

/// A connection and the registry of the device it runs on: the regions its requests may name
/// as local memory. The client object of each backend holds one.
#[derive(Debug)]
pub(crate) struct ClientMemory<D: Device + Clone> {
    pub channel: Arc<Channel<D>>,
    pub registry: Arc<Registry<D::Region>>,
}

impl<D: Device + Clone> OneSidedHost for ClientMemory<D> {
    fn run(
        &self,
        kind: Kind,
        reqs: &dyn Fn(usize) -> Request,
        count: usize,
        timeout: Option<Duration>,
        done: Option<Done>,
    ) -> Result<(), Failure> {
        let resolve = |k: u32, a: u64, l: u64| self.registry.resolve(k, a, l);
        run(&self.channel, kind, reqs, count, &resolve, timeout, done)
    }
}

/// How the one-sided functions find clients: the foundation's client table answers with the
/// connection's [`OneSidedHost`] and the timeout `OckRpcClientSetTimeout` set for it.
pub(crate) static CLIENT_ONE_SIDED: OnceLock<ClientLookup> = OnceLock::new();

/// The client table's lookup of a connection's one-sided side and its timeout.
pub(crate) type ClientLookup = fn(u64) -> Option<(Arc<dyn OneSidedHost>, Option<Duration>)>;

/// `OckRpcCallDone` as C lays it out.
#[repr(C)]
struct CallDone {
    cb: Option<extern "C" fn(i32, *mut c_void)>,
    arg: *mut c_void,
}

/// Decodes the `cb` argument: NULL is a blocking call.
///
/// # Safety
/// `cb` is NULL or points to a readable `OckRpcCallDone`.
unsafe fn done_of(func: &str, cb: *const CallDone) -> Result<Option<Done>, Failure> {
    if cb.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller passes a readable struct (read without alignment).
    let d = unsafe { std::ptr::read_unaligned(cb) };
    match d.cb {
        Some(f) => Ok(Some(Done { cb: f, arg: d.arg })),
        None => Err(Failure { status: status::INVALID_PARAM, message: format!("{func}: cb->cb is NULL") }),
    }
}

fn client_of(func: &str, client: usize) -> Result<(Arc<dyn OneSidedHost>, Option<Duration>), Failure> {
    CLIENT_ONE_SIDED.get().and_then(|f| f(client as u64)).ok_or_else(|| Failure {
        status: status::INVALID_PARAM,
        message: format!(
            "{func}: client handle {client:#x} is not a live connection (never connected, or disconnected)"
        ),
    })
}

fn finish(result: Result<(), Failure>) -> i32 {
    match result {
        Ok(()) => status::OK,
        Err(f) => {
            log_error(&f.message);
            f.status
        }
    }
}

/// One request (`OckRpcRead` / `OckRpcWrite`).
///
/// # Safety
/// `req` is NULL or points to a readable `OckRpcRequest`; `cb` NULL or a readable `OckRpcCallDone`.
unsafe fn single(func: &'static str, kind: Kind, client: usize, req: *const u8, cb: *const CallDone) -> i32 {
    entry(func, || {
        finish((|| {
            // SAFETY: forwarded from this function's contract.
            let done = unsafe { done_of(func, cb) }?;
            if req.is_null() {
                return Err(Failure {
                    status: status::INVALID_PARAM,
                    message: format!("{func}: req must not be NULL"),
                });
            }
            let (host, timeout) = client_of(func, client)?;
            // SAFETY: non-NULL, and the caller passes one readable request.
            let r = unsafe { Request::read(req, 0) };
            host.run(kind, &|_| r, 1, timeout, done)
        })())
    })
}

/// An SGL (`OckRpcReadSgl` / `OckRpcWriteSgl`).
///
/// # Safety
/// `sgl` is NULL or points to a readable `OckRpcSglRequest` whose `iov` holds `iovCount`
/// readable requests; `cb` NULL or a readable `OckRpcCallDone`.
unsafe fn sgl(func: &'static str, kind: Kind, client: usize, sgl: *const u8, cb: *const CallDone) -> i32 {
    entry(func, || {
        finish((|| {
            // SAFETY: forwarded from this function's contract.
            let done = unsafe { done_of(func, cb) }?;
            if sgl.is_null() {
                return Err(Failure {
                    status: status::INVALID_PARAM,
                    message: format!("{func}: req must not be NULL"),
                });
            }
            // SAFETY: non-NULL and readable (the struct is packed: read it as bytes).
            let b = unsafe { std::ptr::read_unaligned(sgl.cast::<[u8; SGL_REQUEST_SIZE]>()) };
            let iov = usize::from_ne_bytes(b[0..8].try_into().expect("8 bytes")) as *const u8;
            let count = usize::from(u16::from_ne_bytes([b[8], b[9]]));
            if iov.is_null() && count > 0 {
                return Err(Failure {
                    status: status::INVALID_PARAM,
                    message: format!("{func}: req->iov is NULL with iovCount {count}"),
                });
            }
            let (host, timeout) = client_of(func, client)?;
            // SAFETY: `iov` holds `count` readable requests (the caller's contract); `i < count`.
            let at = |i: usize| unsafe { Request::read(iov, i) };
            host.run(kind, &at, count, timeout, done)
        })())
    })
}

/// `OckRpcRead`.
///
/// # Safety
/// See the C header: `req` a readable `OckRpcRequest`, `cb` NULL or a readable `OckRpcCallDone`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcRead(client: usize, req: *const u8, cb: *const c_void) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { single("OckRpcRead", Kind::Read, client, req, cb.cast()) }
}

/// `OckRpcWrite`.
///
/// # Safety
/// As [`OckRpcRead`].
#[no_mangle]
pub unsafe extern "C" fn OckRpcWrite(client: usize, req: *const u8, cb: *const c_void) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { single("OckRpcWrite", Kind::Write, client, req, cb.cast()) }
}

/// `OckRpcReadSgl`.
///
/// # Safety
/// See the C header: `req` a readable `OckRpcSglRequest` with `iovCount` readable requests.
#[no_mangle]
pub unsafe extern "C" fn OckRpcReadSgl(client: usize, req: *const u8, cb: *const c_void) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { sgl("OckRpcReadSgl", Kind::Read, client, req, cb.cast()) }
}

/// `OckRpcWriteSgl`.
///
/// # Safety
/// As [`OckRpcReadSgl`].
#[no_mangle]
pub unsafe extern "C" fn OckRpcWriteSgl(client: usize, req: *const u8, cb: *const c_void) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { sgl("OckRpcWriteSgl", Kind::Write, client, req, cb.cast()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Registry, REGION_ACCESS};
    use bypass::hal::{Device, MemoryRegion};
    use bypass::sim::{Engine, Fabric, SimNic};
    use bypass::{ChannelConfig, Functions, Server, ServerConfig};
    use std::sync::mpsc;

    struct Pair {
        _server: Server<SimNic>,
        channel: Channel<SimNic>,
        local: Registry<<SimNic as Device>::Region>,
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
        let local = Registry::default();
        let mine = Arc::new(c.register(4096, REGION_ACCESS).unwrap());
        local.insert(mine.clone()).unwrap();
        Pair { _server: server, channel, local, exposed, mine, _fabric: fabric }
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
        let resolve = |k, a, l| p.local.resolve(k, a, l);
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

    // ---- the C entry points, with a stand-in server/client table on the simulator ----

    use crate::memory::{
        destroy_regions_of, DeviceMemory, MemoryHost, OckRpcDestroyMemoryRegion, OckRpcGetMemoryRegionInfo,
        OckRpcRegisterAssignMemoryRegion, OckRpcRegisterMemoryRegion, RegionInfo, SERVER_MEMORY,
    };
    use std::sync::Mutex;

    struct World {
        servers: [(u64, Arc<DeviceMemory<SimNic>>); 2],
        client: (u64, Arc<ClientMemory<SimNic>>),
        _server: Server<SimNic>,
        _fabric: Fabric,
    }
    static WORLD: Mutex<Option<World>> = Mutex::new(None);

    fn server_lookup(h: u64) -> Option<Arc<dyn MemoryHost>> {
        let w = WORLD.lock().unwrap();
        let w = w.as_ref()?;
        w.servers.iter().find(|s| s.0 == h).map(|s| Arc::clone(&s.1) as Arc<dyn MemoryHost>)
    }

    fn client_lookup(h: u64) -> Option<(Arc<dyn OneSidedHost>, Option<Duration>)> {
        let w = WORLD.lock().unwrap();
        let w = w.as_ref()?;
        (w.client.0 == h)
            .then(|| (Arc::clone(&w.client.1) as Arc<dyn OneSidedHost>, Some(Duration::from_secs(10))))
    }

    fn request_bytes(r: &Request) -> [u8; REQUEST_SIZE] {
        let mut b = [0u8; REQUEST_SIZE];
        b[0..8].copy_from_slice(&r.l_address.to_ne_bytes());
        b[8..16].copy_from_slice(&r.r_address.to_ne_bytes());
        b[16..20].copy_from_slice(&r.l_key.to_ne_bytes());
        b[20..24].copy_from_slice(&r.r_key.to_ne_bytes());
        b[24..28].copy_from_slice(&r.size.to_ne_bytes());
        b
    }

    #[test]
    fn c_entry_points_register_read_write_and_refuse_bad_input() {
        let fabric = Fabric::new(Engine::Inline);
        let (s, c) = (fabric.add_nic(), fabric.add_nic());
        let server = Server::bind(&s, "127.0.0.1:0", ServerConfig::new("c"), Functions::new()).unwrap();
        let remote_host = Arc::new(DeviceMemory::new(s.clone()));
        let local_host = Arc::new(DeviceMemory::new(c.clone()));
        let channel = Arc::new(Channel::connect(&c, server.local_addr(), ChannelConfig::new("c")).unwrap());
        let client = Arc::new(ClientMemory { channel, registry: Arc::clone(&local_host.registry) });
        *WORLD.lock().unwrap() = Some(World {
            servers: [(0x5e01, remote_host), (0x5e02, local_host)],
            client: (0xc1, client),
            _server: server,
            _fabric: fabric,
        });
        let _ = SERVER_MEMORY.set(server_lookup);
        let _ = CLIENT_ONE_SIDED.set(client_lookup);

        // SAFETY: every pointer passed below is to a live local (or NULL on purpose).
        unsafe {
            let (mut remote_mr, mut local_mr) = (0usize, 0usize);
            assert_eq!(OckRpcRegisterMemoryRegion(0x5e01, 8192, &mut remote_mr), status::OK);
            let mut buf = vec![0u8; 4096];
            let addr = buf.as_mut_ptr() as usize;
            assert_eq!(OckRpcRegisterAssignMemoryRegion(0x5e02, addr, 4096, &mut local_mr), status::OK);
            let (mut ri, mut li) = (RegionInfo::default(), RegionInfo::default());
            assert_eq!(OckRpcGetMemoryRegionInfo(remote_mr, &mut ri), status::OK);
            assert_eq!(OckRpcGetMemoryRegionInfo(local_mr, &mut li), status::OK);
            assert_eq!((li.l_address, li.size), (addr, 4096));
            assert_eq!(ri.size, 8192);

            buf[..5].copy_from_slice(b"abcde");
            let w = Request {
                l_address: addr as u64,
                r_address: ri.l_address as u64 + 10,
                l_key: li.l_key,
                r_key: ri.l_key,
                size: 5,
            };
            let wb = request_bytes(&w);
            assert_eq!(OckRpcWrite(0xc1, wb.as_ptr(), std::ptr::null()), status::OK);
            let remote = std::slice::from_raw_parts(ri.l_address as *const u8, 8192);
            assert_eq!(&remote[10..15], b"abcde");

            // An SGL read back, with a callback.
            let rs = [
                Request { l_address: addr as u64 + 100, size: 2, ..w },
                Request { l_address: addr as u64 + 200, r_address: w.r_address + 2, size: 3, ..w },
            ];
            let iov: Vec<u8> = rs.iter().flat_map(request_bytes).collect();
            let mut sgl = [0u8; SGL_REQUEST_SIZE];
            sgl[0..8].copy_from_slice(&(iov.as_ptr() as usize).to_ne_bytes());
            sgl[8..10].copy_from_slice(&2u16.to_ne_bytes());
            let (tx, rx) = mpsc::channel::<i32>();
            let done = CallDone { cb: Some(to_channel), arg: &tx as *const _ as *mut c_void };
            assert_eq!(OckRpcReadSgl(0xc1, sgl.as_ptr(), (&done as *const CallDone).cast()), status::OK);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let st = loop {
                WORLD.lock().unwrap().as_ref().unwrap().client.1.channel.poll();
                if let Ok(s) = rx.try_recv() {
                    break s;
                }
                assert!(std::time::Instant::now() < deadline);
            };
            assert_eq!(st, status::OK);
            assert_eq!((&buf[100..102], &buf[200..203]), (&b"ab"[..], &b"cde"[..]));

            // Bad input.
            let mut out = 0usize;
            assert_eq!(OckRpcRegisterMemoryRegion(0x5e03, 64, &mut out), status::INVALID_PARAM);
            assert_eq!(OckRpcRegisterMemoryRegion(0x5e01, 0, &mut out), status::INVALID_PARAM);
            assert_eq!(OckRpcRegisterMemoryRegion(0x5e01, 64, std::ptr::null_mut()), status::INVALID_PARAM);
            assert_eq!(OckRpcRegisterMemoryRegion(0x5e01, 1 << 40, &mut out), status::INVALID_PARAM);
            assert_eq!(OckRpcRegisterAssignMemoryRegion(0x5e01, 0, 64, &mut out), status::INVALID_PARAM);
            assert_eq!(
                OckRpcRegisterAssignMemoryRegion(0x5e01, usize::MAX - 4, 64, &mut out),
                status::INVALID_PARAM
            );
            assert_eq!(out, 0);
            assert_eq!(OckRpcGetMemoryRegionInfo(remote_mr, std::ptr::null_mut()), status::INVALID_PARAM);
            assert_eq!(OckRpcGetMemoryRegionInfo(0xc1, &mut ri), status::INVALID_PARAM);
            assert_eq!(OckRpcWrite(0xc2, wb.as_ptr(), std::ptr::null()), status::INVALID_PARAM);
            assert_eq!(OckRpcWrite(0xc1, std::ptr::null(), std::ptr::null()), status::INVALID_PARAM);
            let null_cb = CallDone { cb: None, arg: std::ptr::null_mut() };
            assert_eq!(
                OckRpcWrite(0xc1, wb.as_ptr(), (&null_cb as *const CallDone).cast()),
                status::INVALID_PARAM
            );
            sgl[0..8].copy_from_slice(&0usize.to_ne_bytes());
            assert_eq!(OckRpcWriteSgl(0xc1, sgl.as_ptr(), std::ptr::null()), status::INVALID_PARAM);
            assert_eq!(OckRpcReadSgl(0xc1, std::ptr::null(), std::ptr::null()), status::INVALID_PARAM);

            // Destroy: with the wrong server nothing happens; then the handle and key are dead.
            OckRpcDestroyMemoryRegion(0x5e01, local_mr);
            assert_eq!(OckRpcGetMemoryRegionInfo(local_mr, &mut li), status::OK);
            OckRpcDestroyMemoryRegion(0x5e02, local_mr);
            assert_eq!(OckRpcGetMemoryRegionInfo(local_mr, &mut li), status::INVALID_PARAM);
            assert_eq!(OckRpcWrite(0xc1, wb.as_ptr(), std::ptr::null()), status::INVALID_PARAM);
            OckRpcDestroyMemoryRegion(0x5e02, local_mr);
            assert_eq!(destroy_regions_of(0x5e01), 1);
            assert_eq!(OckRpcGetMemoryRegionInfo(remote_mr, &mut ri), status::INVALID_PARAM);
            drop(buf);
        }
        *WORLD.lock().unwrap() = None;
    }
}
