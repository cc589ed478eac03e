//! Rendezvous through the C API, driven from Rust through the exported functions: the server
//! enables `server.rndv.enable` with malloc/free hooks that hand out memory of a registered
//! region; a client sends 4 MiB from registered memory with `OckRpcClientCallRndv` and two
//! segments with `...RndvIov`; the handler sees the segments, replies with `ReplyRndv` and
//! cleans its context up. (Regions are registered here through the crate's own registry; the
//! C functions for that are the memory side's.)

use bypass::backend::{Nic, Regions};
use bypass::hal::{Access, MemoryRegion};
use hcom4db::api_client::*;
use hcom4db::api_server::*;
use hcom4db::regions::RegionEntry;
use hcom4db::types::*;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIG: usize = 4 << 20;

/// The hooks' arena: a region registered on the server, carved out by a bump pointer.
static ARENA: Mutex<Option<(usize, usize, u32, usize)>> = Mutex::new(None); // base, len, key, next
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static FREES: AtomicUsize = AtomicUsize::new(0);
static HANDLED: AtomicUsize = AtomicUsize::new(0);
static SEEN: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn rndv_malloc(size: u64, address: *mut usize, key: *mut u32) -> c_int {
    let mut a = ARENA.lock().unwrap();
    let Some((base, len, k, next)) = a.as_mut() else { return -1 };
    let size = size as usize;
    if *next + size > *len {
        *next = 0; // the test holds one buffer at a time: wrap
    }
    // SAFETY: out-pointers from the library.
    unsafe {
        *address = *base + *next;
        *key = *k;
    }
    *next += size;
    ALLOCS.fetch_add(1, Ordering::SeqCst);
    0
}

unsafe extern "C" fn rndv_free(_address: usize) -> c_int {
    FREES.fetch_add(1, Ordering::SeqCst);
    0
}

unsafe extern "C" fn handler(ctx: usize, msg: OckRpcRndvMessage) {
    let mut total = 0u64;
    let mut sum = 0u64;
    for m in &msg.msg[..msg.cnt as usize] {
        // SAFETY: the library's message bytes, valid in the handler.
        let b = unsafe { std::slice::from_raw_parts(m.data as *const u8, m.len) };
        total += b.len() as u64;
        sum = b.iter().fold(sum, |s, &x| s.wrapping_add(u64::from(x)));
    }
    SEEN.store(u64::from(msg.cnt), Ordering::SeqCst);
    let mut client = 0usize;
    // SAFETY: valid pointers.
    assert_eq!(unsafe { OckRpcGetRndvClient(ctx, &mut client) }, 0);
    let mut out = [total, sum];
    let mut reply = OckRpcMessage { data: out.as_mut_ptr() as *mut c_void, len: 16 };
    // Counted before the reply: the caller checks the count as soon as its call completes.
    HANDLED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { OckRpcServerReplyRndv(ctx, 9, &mut reply, std::ptr::null_mut()) }, OCK_RPC_OK);
    assert_eq!(OckRpcServerCleanupRndvCtx(ctx), 0);
    assert_ne!(OckRpcServerCleanupRndvCtx(ctx), 0, "cleaned up once");
}

fn register<D: Nic>(d: &D, len: usize, fill: u8) -> RegionEntry {
    let mut r = d.register(len, Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    r.write(0, &vec![fill; len]).unwrap();
    let r = Arc::new(r);
    RegionEntry { base: r.as_ptr() as usize, len, key: r.lkey(), region: D::wrap::<Regions>(r) }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

#[test]
fn rendezvous_calls_with_the_malloc_hooks() {
    let base = 10000 + std::process::id() % 9000;
    let range = cstr(&format!("{base}-{}", base + 200));
    let keys = [cstr("server.create.type"), cstr("server.create.range"), cstr("server.rndv.enable")];
    let (tcp, yes) = (cstr("TCP"), cstr("yes"));
    let (k_malloc, k_free) = (cstr("server.rndv.malloc"), cstr("server.rndv.mfree"));
    let mut pairs = [
        RpcConfigPair { key: keys[0].as_ptr(), value: tcp.as_ptr() },
        RpcConfigPair { key: keys[1].as_ptr(), value: range.as_ptr() },
        RpcConfigPair { key: keys[2].as_ptr(), value: yes.as_ptr() },
        RpcConfigPair { key: k_malloc.as_ptr(), value: rndv_malloc as *const () as *const c_char },
        RpcConfigPair { key: k_free.as_ptr(), value: rndv_free as *const () as *const c_char },
    ];
    let mut cfg = OckRpcCreateConfig {
        mask: OCK_RPC_CONFIG_USE_RPC_CONFIGS,
        configs: RpcConfigs { size: pairs.len() as c_int, pairs: pairs.as_mut_ptr() },
        server_ctx_builder: None,
        server_ctx_cleanup: None,
        get_ca_and_verify: None,
        get_cert: None,
        get_pri_key: None,
    };
    let ip = cstr("127.0.0.1");
    let mut server = 0usize;
    // SAFETY: valid pointers.
    assert_eq!(unsafe { OckRpcServerCreateWithCfg(ip.as_ptr(), 0, &mut server, &mut cfg) }, OCK_RPC_OK);
    let obj = hcom4db::server::lookup(server).unwrap();
    // The hooks' arena and the client's source buffers, registered on the server's device.
    let arena = bypass::match_any!(obj.dev(), d => register(d, 2 * BIG, 0));
    *ARENA.lock().unwrap() = Some((arena.base, arena.len, arena.key, 0));
    obj.regions().insert(arena);
    let src = obj.regions().insert(bypass::match_any!(obj.dev(), d => register(d, BIG, 3)));
    let mut svc = OckRpcRndvService { id: 9, handler: Some(handler) };
    // SAFETY: valid pointers.
    assert_eq!(unsafe { OckRpcServerAddRndvService(server, &mut svc) }, OCK_RPC_OK);
    assert_eq!(OckRpcServerStart(server), OCK_RPC_OK);
    let port = hcom4db::server::lookup(server).unwrap().bound.lock().unwrap().unwrap().port();
    let mut client = 0usize;
    // SAFETY: a config is plain data; all zero is mask 0, every key at its default.
    let mut defaults: OckRpcCreateConfig = unsafe { std::mem::zeroed() };
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { OckRpcClientConnectWithCfg(ip.as_ptr(), port, &mut client, &mut defaults) },
        OCK_RPC_OK
    );
    OckRpcClientSetTimeout(client, 30_000);

    let mut out = [0u64; 2];
    let mut rsp = OckRpcMessage { data: out.as_mut_ptr() as *mut c_void, len: 16 };
    let mut info = OckRpcMessageInfo { l_address: src.base, l_key: src.key, size: BIG as u32 };
    // SAFETY: valid pointers.
    let st = unsafe { OckRpcClientCallRndv(client, 9, &mut info, &mut rsp, std::ptr::null_mut()) };
    assert_eq!(st, OCK_RPC_OK);
    assert_eq!(rsp.len, 16);
    assert_eq!(out, [BIG as u64, 3 * BIG as u64], "the handler saw all 4 MiB");
    assert_eq!(SEEN.load(Ordering::SeqCst), 1);

    // Two segments, and a done that runs once.
    static DONE: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn done(st: OckRpcStatus, _arg: *mut c_void) {
        assert_eq!(st, OCK_RPC_OK);
        DONE.fetch_add(1, Ordering::SeqCst);
    }
    let mut infos = [
        OckRpcMessageInfo { l_address: src.base, l_key: src.key, size: 1000 },
        OckRpcMessageInfo { l_address: src.base + 5000, l_key: src.key, size: 300_000 },
    ];
    let mut iov = OckRpcMessageInfoIov { count: 2, reqs: infos.as_mut_ptr() };
    rsp.len = 16;
    let mut d = OckRpcCallDone { cb: Some(done), arg: std::ptr::null_mut() };
    // SAFETY: valid pointers.
    let st = unsafe { OckRpcClientCallRndvIov(client, 9, &mut iov, &mut rsp, &mut d) };
    assert_eq!(st, OCK_RPC_OK);
    let start = Instant::now();
    while DONE.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "done never ran");
        std::thread::yield_now();
    }
    assert_eq!(DONE.load(Ordering::SeqCst), 1);
    assert_eq!(out, [301_000, 3 * 301_000]);
    assert_eq!(SEEN.load(Ordering::SeqCst), 2, "two segments reach the handler as two messages");
    assert_eq!(HANDLED.load(Ordering::SeqCst), 2);
    assert!(ALLOCS.load(Ordering::SeqCst) >= 2, "the server took its READ targets from the hook");

    // A key that does not match the region is refused before anything is sent.
    info.l_key ^= 1;
    // SAFETY: valid pointers.
    let st = unsafe { OckRpcClientCallRndv(client, 9, &mut info, &mut rsp, std::ptr::null_mut()) };
    assert_eq!(st, OCK_RPC_ERR_INVALID_PARAM);

    OckRpcClientDisconnect(client);
    OckRpcServerDestroy(server);
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        FREES.load(Ordering::SeqCst),
        "every hook allocation was freed"
    );
}
