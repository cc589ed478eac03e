//! The server object behind an `OckRpcServer` handle: created (config parsed, device opened,
//! services recorded), started (bound and serving), destroyed.
//!
//! For the memory side: [`lookup`] a handle, then [`ServerObj::dev`] is the device to register
//! regions on (match it with [`bypass::match_any!`]) and [`ServerObj::regions`] is where
//! registered regions are recorded so rendezvous calls and hooks find them.

use crate::backend::{self, Opened};
use crate::client::{ClientKind, ClientObj, CLIENTS};
use crate::config::Settings;
use crate::ctx::{Ctx, CTXS};
use crate::handle::{Handle, HandleTable};
use crate::regions::RegionRegistry;
use crate::types::*;
use bypass::backend::{AnyDevice, AnyServer, Connections, Nic, Requests, Servers};
use bypass::{
    AllocFns, ConnectionEvents, FunctionId, Functions, Keepalive, PollMode, Request, RndvBuf, RpcError,
    Server, ServerConfig, WorkerConfig, WorkerGroup,
};
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Message ids are 0..MAX_ID.
pub const MAX_ID: u16 = 1000;
/// The name every bypass server of this library has at the stack level: the C names are local
/// (the reference does not compare them with the remote side).
pub const STACK_NAME: &str = "hcom4db";
/// Bytes added to `segsize` for the stack's headers (a segment holds `segsize` bytes of data).
pub const HEADROOM: usize = 64;

/// Largest eager segment data: a `server.create.segsize` above it still sets the largest
/// message, but messages above this go by rendezvous (the reference's default segment, 64 KiB).
/// Eager buffers are preallocated per connection and in the shared receive pool, so a 16 MiB
/// (or 1 GiB) segment must not size them.
pub const EAGER_MAX: usize = 64 << 10;

/// The eager message size (header room included) of a server of `segsize` on a device whose
/// largest message is `max_msg`.
pub fn eager_size(segsize: usize, max_msg: u32) -> usize {
    (segsize.min(EAGER_MAX) + HEADROOM).min(max_msg as usize)
}

/// The stack function of message `id` (plain or rendezvous service).
pub fn function_id(id: u16, rndv: bool) -> FunctionId {
    FunctionId::new(0xDB, if rndv { 2 } else { 1 }, true, u32::from(id)).expect("ids below 1000 fit")
}

/// The stack function of a one-way message of `id` too large for the eager segment: it travels
/// as a call (rendezvous needs an answer to free the sender's memory), and the server answers
/// it empty once its handler is done ([`Ctx::auto_reply`]).
pub fn oneway_function_id(id: u16) -> FunctionId {
    FunctionId::new(0xDB, 3, true, u32::from(id)).expect("ids below 1000 fit")
}

/// Registers every id's plain, rendezvous and large one-way function.
fn register_all<D: Nic>(functions: &mut Functions<D>, obj: &Arc<ServerObj>) {
    for id in 0..MAX_ID {
        for (rndv, auto) in [(false, false), (true, false), (false, true)] {
            let d = obj.dispatch.clone();
            let f = if auto { oneway_function_id(id) } else { function_id(id, rndv) };
            functions.register(f, move |req| on_request(&d, id, rndv, auto, req));
        }
    }
}

/// The services: handler addresses by id (0: none), replaced atomically.
#[derive(Debug)]
pub struct Services {
    plain: Box<[AtomicUsize]>,
    rndv: Box<[AtomicUsize]>,
}

impl Services {
    fn new() -> Self {
        let table = || (0..MAX_ID).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>().into_boxed_slice();
        Services { plain: table(), rndv: table() }
    }

    /// Sets the handler of `id`.
    pub fn set(&self, rndv: bool, id: u16, f: usize) {
        let t = if rndv { &self.rndv } else { &self.plain };
        t[id as usize].store(f, Ordering::Release);
    }

    /// The handler of `id` (0: none).
    pub fn get(&self, rndv: bool, id: u16) -> usize {
        let t = if rndv { &self.rndv } else { &self.plain };
        t.get(id as usize).map_or(0, |a| a.load(Ordering::Acquire))
    }
}

/// What the stack's handlers and connection callbacks share with the server object.
#[derive(Debug)]
pub struct Dispatch {
    /// The services.
    pub services: Services,
    /// Server-side client handles by channel id.
    pub conns: Mutex<HashMap<u32, Handle>>,
    /// The server's settings.
    pub settings: Settings,
    /// Contexts whose handles all ended, for reuse (bounded by [`CTX_POOL_MAX`]).
    pub ctx_pool: Mutex<Vec<Arc<Ctx>>>,
}

/// Where a server is in its life.
#[derive(Debug)]
pub enum State {
    /// Created, not started.
    Created,
    /// Serving.
    Started(AnyServer),
    /// Destroyed.
    Destroyed,
}

/// An `OckRpcServer`.
#[derive(Debug)]
pub struct ServerObj {
    /// Parsed configuration.
    pub settings: Settings,
    /// The IP it binds.
    pub ip: String,
    /// The port asked for (0: one of `server.create.range`).
    pub port: u16,
    /// Its backend and device.
    pub opened: Opened,
    /// Registered memory regions (the memory side adds them).
    pub regions: RegionRegistry,
    /// Shared with the stack's callbacks.
    pub dispatch: Arc<Dispatch>,
    /// Created / started / destroyed.
    pub state: Mutex<State>,
    /// The port bound once started.
    pub bound: Mutex<Option<std::net::SocketAddr>>,
    /// The thread polling this process's clients on the server's device (async calls' `done`).
    client_workers: Mutex<Option<Arc<WorkerGroup>>>,
}

/// Every live server.
pub static SERVERS: HandleTable<ServerObj> = HandleTable::new(0x5E);

/// The server behind `h`.
pub fn lookup(h: Handle) -> Option<Arc<ServerObj>> {
    SERVERS.get(h)
}

impl ServerObj {
    /// The device of the server (memory regions are registered on it; clients of this process
    /// connect with it).
    pub fn dev(&self) -> &AnyDevice {
        &self.opened.dev
    }

    /// The server's registered regions.
    pub fn regions(&self) -> &RegionRegistry {
        &self.regions
    }

    /// The worker group polling clients created on this server's device.
    pub fn client_workers(&self) -> Result<Arc<WorkerGroup>, std::io::Error> {
        let mut w = self.client_workers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = &*w {
            return Ok(g.clone());
        }
        let g = Arc::new(WorkerGroup::new(WorkerConfig {
            threads: 1,
            mode: if self.settings.busy_poll { PollMode::Busy } else { PollMode::Adaptive },
            name: format!("hcom4db-cli-{}", self.settings.name),
            ..WorkerConfig::default()
        })?);
        *w = Some(g.clone());
        Ok(g)
    }
}

/// Creates a server object: parses the config and opens the device.
pub fn create(ip: String, port: u16, settings: Settings) -> Result<Arc<ServerObj>, OckRpcStatus> {
    let opened = backend::open(settings.kind, &ip)?;
    let dispatch = Arc::new(Dispatch {
        services: Services::new(),
        conns: Mutex::new(HashMap::new()),
        settings: settings.clone(),
        ctx_pool: Mutex::new(Vec::new()),
    });
    Ok(Arc::new(ServerObj {
        settings,
        ip,
        port,
        opened,
        regions: RegionRegistry::default(),
        dispatch,
        state: Mutex::new(State::Created),
        bound: Mutex::new(None),
        client_workers: Mutex::new(None),
    }))
}

/// Maps a stack error to a status.
pub fn status_of(e: &RpcError) -> OckRpcStatus {
    match e {
        RpcError::Timeout => OCK_RPC_ERR_UCP_TIMEOUT,
        RpcError::Closed | RpcError::ConnectionBroken(_) | RpcError::Queue(_) => OCK_RPC_ERR_CONN_BROKEN,
        RpcError::InvalidArgument(_) | RpcError::TooLarge { .. } => OCK_RPC_ERR_INVALID_PARAM,
        RpcError::FunctionNotFound(_) => OCK_RPC_ERR_MISMATCH_MSG_ID,
        RpcError::RemoteAccess(_) => OCK_RPC_ERR_INVALID_RKEY,
        RpcError::Control(_) => OCK_RPC_ERR_CONN_UNCONNECTED,
        _ => OCK_RPC_ERR,
    }
}

fn tls_for(s: &Settings) -> Result<Option<bypass::tls::TlsConfig>, OckRpcStatus> {
    match &s.tls {
        None => Ok(None),
        Some(cb) => crate::tls::build(cb).map(Some),
    }
}

/// Starts `obj`: binds its address (or the first free port of its range) and serves.
pub fn start(obj: &Arc<ServerObj>) -> OckRpcStatus {
    let mut state = obj.state.lock().unwrap_or_else(|e| e.into_inner());
    match &*state {
        State::Created => {}
        State::Started(_) => {
            crate::log!(crate::log::WARN, "OckRpcServerStart: the server is started already");
            return OCK_RPC_OK;
        }
        State::Destroyed => return OCK_RPC_ERR_INVALID_PARAM,
    }
    let started = bypass::match_any!(&obj.opened.dev, d => start_on(d, obj));
    match started {
        Ok((server, addr)) => {
            *obj.bound.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
            *state = State::Started(server);
            crate::log!(crate::log::INFO, "server {:?} listening on {addr}", obj.settings.name);
            OCK_RPC_OK
        }
        Err(st) => st,
    }
}

fn start_on<D: Nic>(
    dev: &D,
    obj: &Arc<ServerObj>,
) -> Result<(AnyServer, std::net::SocketAddr), OckRpcStatus> {
    let s = &obj.settings;
    let mut functions = Functions::<D>::new();
    register_all(&mut functions, obj);
    if let (true, Some(malloc), Some(mfree)) = (s.rndv, s.rndv_malloc, s.rndv_free) {
        let weak = Arc::downgrade(obj);
        let alloc = AllocFns {
            allocate: move |len: usize| -> Option<RndvBuf<D::Region>> {
                let obj = weak.upgrade()?;
                let (mut addr, mut key) = (0usize, 0u32);
                // SAFETY: the caller's OckRpcRndvMemAllocate, given two valid out-pointers.
                let rc = unsafe { malloc(len as u64, &mut addr, &mut key) };
                if rc != 0 {
                    crate::log!(crate::log::WARN, "server.rndv.malloc({len}) failed ({rc})");
                    return None;
                }
                match obj
                    .regions
                    .find(addr, len, key)
                    .and_then(|(e, off)| e.region.get::<D>().map(|r| (r.clone(), off)))
                {
                    Some((region, offset)) => Some(RndvBuf { region, offset, len }),
                    None => {
                        crate::log!(
                            crate::log::ERROR,
                            "server.rndv.malloc returned {addr:#x} key {key}, which is not in a region registered on \
                             this server (OckRpcRegisterMemoryRegion): freed, the call fails"
                        );
                        // SAFETY: handing back what the hook gave.
                        unsafe { mfree(addr) };
                        None
                    }
                }
            },
            free: move |buf: RndvBuf<D::Region>| {
                use bypass::hal::MemoryRegion;
                let addr = buf.region.as_ptr() as usize + buf.offset;
                // SAFETY: the caller's OckRpcRndvMemFree, given an address its malloc returned.
                unsafe { mfree(addr) };
            },
        };
        functions.rndv_allocator(Arc::new(alloc));
    }
    let segment = (s.segsize + HEADROOM) as u64;
    let config = ServerConfig {
        name: STACK_NAME.into(),
        msg_size: eager_size(s.segsize, dev.caps().max_msg_size),
        // A segment-sized argument being handled and a segment-sized response being written.
        rndv_memory_limit: bypass::DEFAULT_RNDV_MEMORY_LIMIT.max(2 * segment),
        workers: s.workers(),
        mode: if s.busy_poll { PollMode::Busy } else { PollMode::Adaptive },
        pin: s.pin(),
        keepalive: Some(Keepalive { interval: std::time::Duration::from_secs(s.heartbeat_idle), misses: 5 }),
        tls: tls_for(s)?,
        ..ServerConfig::default()
    };
    let ports: Vec<u16> = if obj.port != 0 { vec![obj.port] } else { (s.range.0..=s.range.1).collect() };
    let mut last = None;
    for port in ports {
        let d1 = obj.dispatch.clone();
        let d2 = obj.dispatch.clone();
        let server_handle = Arc::downgrade(obj);
        let events = ConnectionEvents::new()
            .on_connect(move |conn| {
                on_connect(
                    &d1,
                    &server_handle,
                    D::wrap::<Connections>(conn.clone()),
                    conn.channel_id(),
                    conn.client_info(),
                )
            })
            .on_break(move |conn, _reason| {
                on_break(&d2, conn.channel_id(), conn.context(), conn.client_info())
            });
        match Server::bind_with(
            dev,
            (obj.ip.as_str(), port),
            config.clone(),
            std::mem::take(&mut functions),
            events,
        ) {
            Ok(server) => {
                let addr = server.local_addr();
                return Ok((D::wrap::<Servers>(server), addr));
            }
            Err(RpcError::Control(e)) => {
                last = Some(e.to_string());
                // Functions were moved into the failed bind: rebuild them for the next port.
                functions = rebuild::<D>(obj);
            }
            Err(e) => {
                crate::log!(crate::log::ERROR, "OckRpcServerStart: {e}");
                return Err(status_of(&e));
            }
        }
    }
    crate::log!(
        crate::log::ERROR,
        "OckRpcServerStart: cannot listen on {} port {} (range {}-{}): {}",
        obj.ip,
        obj.port,
        s.range.0,
        s.range.1,
        last.unwrap_or_default()
    );
    Err(OCK_RPC_ERR)
}

fn rebuild<D: Nic>(obj: &Arc<ServerObj>) -> Functions<D> {
    let mut functions = Functions::<D>::new();
    register_all(&mut functions, obj);
    functions
}

fn on_connect(
    d: &Arc<Dispatch>,
    server: &std::sync::Weak<ServerObj>,
    conn: bypass::backend::AnyConnection,
    channel: u32,
    info: &str,
) -> Result<(), String> {
    let obj = ClientObj::new(ClientKind::In(conn), server.upgrade(), None);
    let h = CLIENTS.insert(obj);
    d.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(channel, h);
    if let Some(f) = d.settings.on_new {
        let payload = CString::new(info.replace('\0', "")).unwrap_or_default();
        // SAFETY: the caller's OckRpcClientHandler; the payload lives across the call.
        let rc = unsafe { f(h, 0, payload.as_ptr()) };
        if rc != 0 {
            d.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&channel);
            CLIENTS.remove(h);
            crate::log!(crate::log::INFO, "the new-client handler refused client {info:?} ({rc})");
            return Err(format!("refused by the server's new-client handler ({rc})"));
        }
    }
    Ok(())
}

fn on_break(d: &Arc<Dispatch>, channel: u32, context: u64, info: &str) {
    let h = d.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&channel);
    let Some(h) = h else { return };
    if let Some(f) = d.settings.on_break {
        let payload = CString::new(info.replace('\0', "")).unwrap_or_default();
        // SAFETY: the caller's OckRpcClientHandler; the payload lives across the call.
        unsafe { f(h, context, payload.as_ptr()) };
    }
    CLIENTS.remove(h);
}

/// A request arrived for message `id`: run its service with a context handle (`auto`: a large
/// one-way message, answered empty if the handler does not answer it).
fn on_request<D: Nic>(d: &Arc<Dispatch>, id: u16, rndv: bool, auto: bool, req: Request<D>) {
    let f = d.services.get(rndv, id);
    if f == 0 {
        crate::log!(
            crate::log::WARN,
            "a {} message with id {id} arrived, but no service has that id: dropped",
            if rndv { "rendezvous" } else { "plain" }
        );
        if auto {
            // The sender of a large one-way message waits for the answer that frees its memory.
            let _ = req.reply(&[]);
        }
        return;
    }
    let channel = req.channel_id();
    let mut parts = [OckRpcMessage { data: std::ptr::null_mut(), len: 0 }; 4];
    let mut cnt = 0u16;
    if rndv {
        let segs = req.segments().count();
        if segs <= 4 {
            for (i, s) in req.segments().enumerate() {
                parts[i] = OckRpcMessage { data: s.as_ptr() as *mut _, len: s.len() };
            }
            cnt = segs as u16;
        } else {
            let a = req.args();
            parts[0] = OckRpcMessage { data: a.as_ptr() as *mut _, len: a.len() };
            cnt = 1;
        }
    } else {
        let a = req.args();
        parts[0] = OckRpcMessage { data: a.as_ptr() as *mut _, len: a.len() };
    }
    // The message bytes live in the request's receive buffer (or its gathered rendezvous
    // memory), which stays put while the request is alive, wherever the `Request` moves.
    let ctx = take_ctx(d, D::wrap::<Requests>(req), id, channel, rndv, auto);
    let h = CTXS.insert(ctx);
    if rndv {
        // SAFETY: `f` was stored from an OckRpcMsgRndvHandler by OckRpcServerAddRndvService.
        let handler: unsafe extern "C" fn(Handle, OckRpcRndvMessage) = unsafe { std::mem::transmute(f) };
        // SAFETY: the caller's handler with a live context and message.
        unsafe { handler(h, OckRpcRndvMessage { cnt, msg: parts }) };
        // A rendezvous context lives until OckRpcServerCleanupRndvCtx.
    } else {
        // SAFETY: `f` was stored from an OckRpcMsgHandler by OckRpcServerAddService.
        let handler: unsafe extern "C" fn(Handle, OckRpcMessage) = unsafe { std::mem::transmute(f) };
        // SAFETY: the caller's handler with a live context and message.
        unsafe { handler(h, parts[0]) };
        if let Some(ctx) = CTXS.remove(h) {
            recycle(d, ctx);
        }
    }
}

/// Most idle contexts a server keeps.
pub const CTX_POOL_MAX: usize = 1024;

/// A context for `req`: a pooled one if there is one, else a new one.
fn take_ctx(
    d: &Arc<Dispatch>,
    req: bypass::backend::AnyRequest,
    msg_id: u16,
    channel: u32,
    rndv: bool,
    auto_reply: bool,
) -> Arc<Ctx> {
    let pooled = d.ctx_pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
    if let Some(mut ctx) = pooled {
        if let Some(c) = Arc::get_mut(&mut ctx) {
            *c.req.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(req);
            c.msg_id = msg_id;
            c.channel = channel;
            c.rndv = rndv;
            c.auto_reply = auto_reply;
            return ctx;
        }
    }
    Arc::new(Ctx { req: Mutex::new(Some(req)), msg_id, channel, dispatch: d.clone(), rndv, auto_reply })
}

/// Takes back a context whose handler returned: into the pool if no clone holds it.
fn recycle(d: &Arc<Dispatch>, mut ctx: Arc<Ctx>) {
    let Some(c) = Arc::get_mut(&mut ctx) else { return }; // a clone lives on
                                                          // A request nobody answered ends here (dropped: the client times out; a large one-way
                                                          // message is answered empty), outside the pool lock.
    c.end();
    let mut pool = d.ctx_pool.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < CTX_POOL_MAX {
        pool.push(ctx);
    }
}

/// Destroys the server: stops serving, closes its connections (break handlers run).
pub fn destroy(obj: &Arc<ServerObj>) {
    let old = std::mem::replace(&mut *obj.state.lock().unwrap_or_else(|e| e.into_inner()), State::Destroyed);
    // Shut down outside the lock: break handlers run and may call back into the library.
    if let State::Started(server) = old {
        bypass::match_any!(server, s => {
            let mut s = s;
            s.shutdown()
        });
    }
    let workers = obj.client_workers.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(workers); // clients of this device keep their own reference
                   // Pooled contexts point back at the dispatch state: break the cycle.
    obj.dispatch.ctx_pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eager_buffers_stop_at_64_kib_and_at_the_devices_largest_message() {
        // The default segment is eager as it is; a 16 MiB or 1 GiB one is not sized into every
        // buffer (its messages go by rendezvous), and no device limit is exceeded.
        assert_eq!(eager_size(65536, 16 << 20), 65536 + HEADROOM);
        assert_eq!(eager_size(256, 16 << 20), 256 + HEADROOM);
        assert_eq!(eager_size(16 << 20, 16 << 20), EAGER_MAX + HEADROOM);
        assert_eq!(eager_size(1 << 30, 16 << 20), EAGER_MAX + HEADROOM);
        assert_eq!(eager_size(1 << 20, 4096), 4096);
    }
}
