//! The library through its C ABI: the built `liburma.so` is `dlopen`ed by path and every call
//! goes through a function pointer of the type `bypass-urma-abi` declares, as a C program's
//! would. Two devices of one process (the in-process wire) play the two hosts.

mod common;

use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::fns;
use bypass_urma_abi::status::*;
use std::ffi::{c_void, CString};
use std::ptr::{null_mut, NonNull};
use std::sync::OnceLock;

/// The library's functions, resolved once.
struct Lib {
    get_device_by_name: fns::UrmaGetDeviceByName,
    get_device_list: fns::UrmaGetDeviceList,
    free_device_list: fns::UrmaFreeDeviceList,
    get_eid_list: fns::UrmaGetEidList,
    free_eid_list: fns::UrmaFreeEidList,
    query_device: fns::UrmaQueryDevice,
    create_context: fns::UrmaCreateContext,
    create_jfce: fns::UrmaCreateJfce,
    create_jfc: fns::UrmaCreateJfc,
    rearm_jfc: fns::UrmaRearmJfc,
    wait_jfc: fns::UrmaWaitJfc,
    ack_jfc: fns::UrmaAckJfc,
    poll_jfc: fns::UrmaPollJfc,
    create_jfr: fns::UrmaCreateJfr,
    create_jetty: fns::UrmaCreateJetty,
    modify_jetty: fns::UrmaModifyJetty,
    query_jetty: fns::UrmaQueryJetty,
    import_jetty: fns::UrmaImportJetty,
    bind_jetty: fns::UrmaBindJetty,
    register_seg: fns::UrmaRegisterSeg,
    import_seg: fns::UrmaImportSeg,
    unimport_seg: fns::UrmaUnimportSeg,
    post_send: fns::UrmaPostJettySendWr,
    post_recv: fns::UrmaPostJettyRecvWr,
    get_async_event: fns::UrmaGetAsyncEvent,
    ack_async_event: fns::UrmaAckAsyncEvent,
    get_rjetty: fns::UrmaGetRjetty,
    put_rjetty: fns::UrmaPutRjetty,
    get_seg_ctx: fns::UrmaGetSegCtx,
    put_seg_ctx: fns::UrmaPutSegCtx,
}

macro_rules! sym {
    ($h:expr, $name:literal, $t:ty) => {{
        let n = CString::new($name).unwrap();
        // SAFETY: `$h` is a live dlopen handle and `n` a NUL-terminated name.
        let p = unsafe { libc::dlsym($h, n.as_ptr()) };
        assert!(!p.is_null(), "{} is not exported", $name);
        // SAFETY: the export has the C type bypass-urma-abi declares (checked at compile time in
        // the library's `signatures` module); function pointers are pointer-sized.
        unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
    }};
}

fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = CString::new(common::library().to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; the library's constructors are Rust statics only.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {path:?} failed");
        let init: fns::UrmaInit = sym!(h, "urma_init", fns::UrmaInit);
        // SAFETY: NULL conf is allowed.
        let st = unsafe { init(null_mut()) };
        assert_eq!(st, URMA_SUCCESS, "urma_init");
        // SAFETY: as above; a second init is refused, not a crash.
        assert_eq!(unsafe { init(null_mut()) }, URMA_EEXIST);
        Lib {
            get_device_by_name: sym!(h, "urma_get_device_by_name", fns::UrmaGetDeviceByName),
            get_device_list: sym!(h, "urma_get_device_list", fns::UrmaGetDeviceList),
            free_device_list: sym!(h, "urma_free_device_list", fns::UrmaFreeDeviceList),
            get_eid_list: sym!(h, "urma_get_eid_list", fns::UrmaGetEidList),
            free_eid_list: sym!(h, "urma_free_eid_list", fns::UrmaFreeEidList),
            query_device: sym!(h, "urma_query_device", fns::UrmaQueryDevice),
            create_context: sym!(h, "urma_create_context", fns::UrmaCreateContext),
            create_jfce: sym!(h, "urma_create_jfce", fns::UrmaCreateJfce),
            create_jfc: sym!(h, "urma_create_jfc", fns::UrmaCreateJfc),
            rearm_jfc: sym!(h, "urma_rearm_jfc", fns::UrmaRearmJfc),
            wait_jfc: sym!(h, "urma_wait_jfc", fns::UrmaWaitJfc),
            ack_jfc: sym!(h, "urma_ack_jfc", fns::UrmaAckJfc),
            poll_jfc: sym!(h, "urma_poll_jfc", fns::UrmaPollJfc),
            create_jfr: sym!(h, "urma_create_jfr", fns::UrmaCreateJfr),
            create_jetty: sym!(h, "urma_create_jetty", fns::UrmaCreateJetty),
            modify_jetty: sym!(h, "urma_modify_jetty", fns::UrmaModifyJetty),
            query_jetty: sym!(h, "urma_query_jetty", fns::UrmaQueryJetty),
            import_jetty: sym!(h, "urma_import_jetty", fns::UrmaImportJetty),
            bind_jetty: sym!(h, "urma_bind_jetty", fns::UrmaBindJetty),
            register_seg: sym!(h, "urma_register_seg", fns::UrmaRegisterSeg),
            import_seg: sym!(h, "urma_import_seg", fns::UrmaImportSeg),
            unimport_seg: sym!(h, "urma_unimport_seg", fns::UrmaUnimportSeg),
            post_send: sym!(h, "urma_post_jetty_send_wr", fns::UrmaPostJettySendWr),
            post_recv: sym!(h, "urma_post_jetty_recv_wr", fns::UrmaPostJettyRecvWr),
            get_async_event: sym!(h, "urma_get_async_event", fns::UrmaGetAsyncEvent),
            ack_async_event: sym!(h, "urma_ack_async_event", fns::UrmaAckAsyncEvent),
            get_rjetty: sym!(h, "urma_get_rjetty", fns::UrmaGetRjetty),
            put_rjetty: sym!(h, "urma_put_rjetty", fns::UrmaPutRjetty),
            get_seg_ctx: sym!(h, "urma_get_seg_ctx", fns::UrmaGetSegCtx),
            put_seg_ctx: sym!(h, "urma_put_seg_ctx", fns::UrmaPutSegCtx),
        }
    })
}

const TOKEN: u32 = 0xACFE;
const LEN: usize = 4096;

/// One side: context, JFCE, JFC, JFR, jetty and a registered 4 KiB buffer.
struct Side {
    ctx: *mut abi::UrmaContext,
    jfce: *mut abi::UrmaJfce,
    jfc: *mut abi::UrmaJfc,
    jetty: *mut abi::UrmaJetty,
    seg: *mut abi::UrmaTargetSeg,
    buf: Box<[u8; LEN]>,
    tjetty: *mut abi::UrmaTargetJetty,
}

fn nn<T>(p: *mut T, what: &str) -> *mut T {
    assert!(NonNull::new(p).is_some(), "{what} returned NULL (errno {})", std::io::Error::last_os_error());
    p
}

impl Side {
    fn open(dev: &str) -> Side {
        let l = lib();
        let name = CString::new(dev).unwrap();
        // SAFETY: every call passes handles the library returned and structs built here, as the
        // URMA API prescribes.
        unsafe {
            let d = nn((l.get_device_by_name)(name.as_ptr() as *mut _), "get_device_by_name");
            let ctx = nn((l.create_context)(d, 0), "create_context");
            let jfce = nn((l.create_jfce)(ctx), "create_jfce");
            let mut jc = abi::UrmaJfcCfg { depth: 256, flag: 0, ceqn: 0, jfce, user_ctx: 0 };
            let jfc = nn((l.create_jfc)(ctx, &mut jc), "create_jfc");
            let mut rc: abi::UrmaJfrCfg = std::mem::zeroed();
            rc.depth = 64;
            rc.trans_mode = URMA_TM_RC;
            rc.max_sge = 1;
            rc.min_rnr_timer = 12;
            rc.jfc = jfc;
            rc.token_value = abi::UrmaToken { token: TOKEN };
            let jfr = nn((l.create_jfr)(ctx, &mut rc), "create_jfr");
            let mut cfg: abi::UrmaJettyCfg = std::mem::zeroed();
            cfg.flag = JETTY_FLAG_SHARE_JFR;
            cfg.jfs_cfg.depth = 64;
            cfg.jfs_cfg.trans_mode = URMA_TM_RC;
            cfg.jfs_cfg.max_sge = 1;
            cfg.jfs_cfg.rnr_retry = 7;
            cfg.jfs_cfg.err_timeout = 10;
            cfg.jfs_cfg.jfc = jfc;
            cfg.recv.shared = abi::UrmaJettyShared { jfr, jfc };
            let jetty = nn((l.create_jetty)(ctx, &mut cfg), "create_jetty");
            assert_eq!((cfg.jfs_cfg.flag & JFS_FLAG_ORDER_TYPE_MASK) >> JFS_FLAG_ORDER_TYPE_SHIFT, URMA_OL);
            let mut buf = Box::new([0u8; LEN]);
            let mut sc: abi::UrmaSegCfg = std::mem::zeroed();
            sc.va = buf.as_mut_ptr() as u64;
            sc.len = LEN as u64;
            sc.token_value = abi::UrmaToken { token: TOKEN };
            sc.flag = (URMA_ACCESS_READ | URMA_ACCESS_WRITE) << REG_SEG_ACCESS_SHIFT;
            let seg = nn((l.register_seg)(ctx, &mut sc), "register_seg");
            Side { ctx, jfce, jfc, jetty, seg, buf, tjetty: null_mut() }
        }
    }

    fn bind_to(&mut self, peer: &Side) {
        let l = lib();
        // SAFETY: live handles; the rjetty is built from the peer's public jetty id.
        unsafe {
            let mut rj: abi::UrmaRjetty = std::mem::zeroed();
            rj.jetty_id = (*peer.jetty).jetty_id;
            rj.trans_mode = URMA_TM_RC;
            rj.type_ = URMA_JETTY;
            let mut t = abi::UrmaToken { token: TOKEN };
            self.tjetty = nn((l.import_jetty)(self.ctx, &mut rj, &mut t), "import_jetty");
            assert_eq!((l.bind_jetty)(self.jetty, self.tjetty), URMA_SUCCESS);
            assert_eq!((l.bind_jetty)(self.jetty, self.tjetty), URMA_EEXIST);
        }
    }

    fn import(&self, peer: &Side, token: u32, access: u32) -> *mut abi::UrmaTargetSeg {
        let mut t = abi::UrmaToken { token };
        // SAFETY: live handles; the peer's public segment is read from its target segment.
        unsafe {
            let mut s = (*peer.seg).seg;
            (lib().import_seg)(self.ctx, &mut s, &mut t, 0, access << IMPORT_SEG_ACCESS_SHIFT)
        }
    }

    fn post_recv(&self, off: usize, len: u32, id: u64) {
        let mut sge = abi::UrmaSge {
            addr: self.buf.as_ptr() as u64 + off as u64,
            len,
            tseg: self.seg,
            user_tseg: null_mut(),
        };
        let mut wr =
            abi::UrmaJfrWr { src: abi::UrmaSg { sge: &mut sge, num_sge: 1 }, user_ctx: id, next: null_mut() };
        let mut bad = null_mut();
        // SAFETY: live jetty; the WR and its SGE live across the call.
        assert_eq!(unsafe { (lib().post_recv)(self.jetty, &mut wr, &mut bad) }, URMA_SUCCESS);
    }

    /// Posts one signaled WR; `remote` is (imported segment, offset) for WRITE and READ.
    fn post(
        &self,
        opcode: u32,
        off: usize,
        len: u32,
        remote: Option<(*mut abi::UrmaTargetSeg, &Side, usize)>,
        imm: u64,
        id: u64,
    ) -> i32 {
        let mut local = abi::UrmaSge {
            addr: self.buf.as_ptr() as u64 + off as u64,
            len,
            tseg: self.seg,
            user_tseg: null_mut(),
        };
        let mut rsge = remote.map(|(t, peer, roff)| abi::UrmaSge {
            addr: peer.buf.as_ptr() as u64 + roff as u64,
            len,
            tseg: t,
            user_tseg: null_mut(),
        });
        // SAFETY: plain C data.
        let mut wr: abi::UrmaJfsWr = unsafe { std::mem::zeroed() };
        wr.opcode = opcode;
        wr.flag = WR_FLAG_COMPLETE_ENABLE;
        wr.tjetty = self.tjetty;
        wr.user_ctx = id;
        let l_sg = abi::UrmaSg { sge: &mut local, num_sge: 1 };
        let r_sg = |r: &mut Option<abi::UrmaSge>| abi::UrmaSg {
            sge: r.as_mut().map_or(null_mut(), |s| s as *mut _),
            num_sge: 1,
        };
        match opcode {
            URMA_OPC_SEND | URMA_OPC_SEND_IMM => {
                wr.body.send = abi::UrmaSendWr { src: l_sg, target_hint: 0, imm_data: imm, tseg: null_mut() }
            }
            URMA_OPC_READ => {
                wr.body.rw = abi::UrmaRwWr { src: r_sg(&mut rsge), dst: l_sg, target_hint: 0, notify_data: 0 }
            }
            _ => {
                wr.body.rw =
                    abi::UrmaRwWr { src: l_sg, dst: r_sg(&mut rsge), target_hint: 0, notify_data: imm }
            }
        }
        let mut bad = null_mut();
        // SAFETY: live jetty; the WR and its SGEs live across the call.
        unsafe { (lib().post_send)(self.jetty, &mut wr, &mut bad) }
    }

    /// The next record, polling (bounded).
    fn cr(&self) -> abi::UrmaCr {
        // SAFETY: plain C data.
        let mut cr: abi::UrmaCr = unsafe { std::mem::zeroed() };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            // SAFETY: live JFC, room for one record.
            let n = unsafe { (lib().poll_jfc)(self.jfc, 1, &mut cr) };
            assert!(n >= 0, "poll_jfc {n}");
            if n == 1 {
                return cr;
            }
            assert!(std::time::Instant::now() < deadline, "no completion within 20 s");
            std::thread::yield_now();
        }
    }

    fn state(&self) -> u32 {
        // SAFETY: live jetty; outputs are locals.
        unsafe {
            let mut cfg: abi::UrmaJettyCfg = std::mem::zeroed();
            let mut attr = abi::UrmaJettyAttr { mask: 0, rx_threshold: 0, state: 99 };
            assert_eq!((lib().query_jetty)(self.jetty, &mut cfg, &mut attr), URMA_SUCCESS);
            attr.state
        }
    }

    fn modify(&self, state: u32) {
        let mut a = abi::UrmaJettyAttr { mask: JETTY_STATE, rx_threshold: 0, state };
        // SAFETY: live jetty.
        assert_eq!(unsafe { (lib().modify_jetty)(self.jetty, &mut a) }, URMA_SUCCESS);
    }
}

fn pair() -> (Side, Side) {
    let (mut a, mut b) = (Side::open("bypass_sim0"), Side::open("bypass_sim1"));
    a.bind_to(&b);
    b.bind_to(&a);
    (a, b)
}

#[test]
fn devices_eids_and_queries() {
    let l = lib();
    let mut n = 0;
    // SAFETY: the calls' outputs are locals or lists the library allocated and we free.
    unsafe {
        let list = nn((l.get_device_list)(&mut n), "get_device_list");
        assert_eq!(n, 2, "BYPASS_SIM_URMA unset: two devices");
        let mut eids = Vec::new();
        for i in 0..n as usize {
            let d = *list.add(i);
            let name = std::ffi::CStr::from_ptr((*d).name.as_ptr()).to_str().unwrap().to_string();
            assert_eq!(name, format!("bypass_sim{i}"));
            let mut cnt = 0;
            let e = nn((l.get_eid_list)(d, &mut cnt), "get_eid_list");
            assert_eq!((cnt, (*e).eid_index), (1, 0));
            eids.push((*e).eid);
            (l.free_eid_list)(e);
            let mut attr: abi::UrmaDeviceAttr = std::mem::zeroed();
            assert_eq!((l.query_device)(d, &mut attr), URMA_SUCCESS);
            assert!(attr.dev_cap.max_jfc_depth >= 1024 && attr.dev_cap.max_jfs_sge >= 1);
            assert_eq!((attr.port_cnt, attr.port_attr[0].state), (1, 4));
        }
        assert_ne!(eids[0], eids[1], "each device has its own EID");
        (l.free_device_list)(list);
    }
}

#[test]
fn send_write_imm_and_read_between_two_devices() {
    let l = lib();
    let (mut a, mut b) = pair();
    let to_b = a.import(&b, TOKEN, URMA_ACCESS_READ | URMA_ACCESS_WRITE);
    assert!(!to_b.is_null());
    b.post_recv(0, 64, 10);
    b.post_recv(64, 64, 11);
    a.buf[..5].copy_from_slice(b"hello");
    assert_eq!(a.post(URMA_OPC_SEND, 0, 5, None, 0, 1), URMA_SUCCESS);
    let (sa, rb) = (a.cr(), b.cr());
    assert_eq!((sa.status, sa.user_ctx, sa.flag & CR_FLAG_S_R), (URMA_CR_SUCCESS, 1, 0));
    assert_eq!(
        (rb.status, rb.user_ctx, rb.completion_len, rb.flag & CR_FLAG_S_R),
        (URMA_CR_SUCCESS, 10, 5, 1)
    );
    // SAFETY: the jetty id of a live jetty.
    assert_eq!(rb.remote_id, unsafe { (*a.jetty).jetty_id }, "remote_id names the sender");
    assert_eq!(&b.buf[..5], b"hello");

    a.buf[100..108].copy_from_slice(b"written!");
    assert_eq!(a.post(URMA_OPC_WRITE_IMM, 100, 8, Some((to_b, &b, 2000)), 0xbeef, 2), URMA_SUCCESS);
    assert_eq!(a.cr().status, URMA_CR_SUCCESS);
    let r = b.cr();
    assert_eq!((r.user_ctx, r.opcode, r.completion_len), (11, URMA_CR_OPC_WRITE_WITH_IMM, 8));
    // SAFETY: the union arm the record carries for WRITE_IMM.
    assert_eq!(unsafe { r.data.imm_data }, 0xbeef);
    assert_eq!(&b.buf[2000..2008], b"written!");

    b.buf[3000..3004].copy_from_slice(b"read");
    assert_eq!(a.post(URMA_OPC_READ, 200, 4, Some((to_b, &b, 3000)), 0, 3), URMA_SUCCESS);
    let r = a.cr();
    assert_eq!((r.status, r.user_ctx), (URMA_CR_SUCCESS, 3));
    assert_eq!(&a.buf[200..204], b"read");

    // A READ through an import without READ is refused by the owner's device.
    let write_only = a.import(&b, TOKEN, URMA_ACCESS_WRITE);
    assert_eq!(a.post(URMA_OPC_READ, 200, 4, Some((write_only, &b, 3000)), 0, 4), URMA_SUCCESS);
    assert_eq!(a.cr().status, URMA_CR_REM_ACCESS_ABORT_ERR);
    assert_eq!(a.state(), URMA_JETTY_STATE_ERROR);
    // SAFETY: live handles.
    unsafe {
        assert_eq!((l.unimport_seg)(write_only), URMA_SUCCESS);
        assert_eq!((l.unimport_seg)(to_b), URMA_SUCCESS);
    }
}

/// Seeded wrong tokens, each through a WRITE: every one fails with REM_ACCESS_ABORT_ERR and
/// moves no byte; both jetties recover through ERROR → READY each time; the right token works.
#[test]
fn a_wrong_token_never_moves_a_byte_and_both_ends_recover() {
    let l = lib();
    let (mut a, mut b) = pair();
    b.buf[..].fill(0x5a);
    a.buf[..64].fill(0xee);
    let mut rng = 0x1234_5678_9abc_def0u64;
    for round in 0..200 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let token = (rng as u32) | 1;
        let token = if token == TOKEN { TOKEN ^ 2 } else { token };
        let bad = a.import(&b, token, URMA_ACCESS_READ | URMA_ACCESS_WRITE);
        assert_eq!(
            a.post(URMA_OPC_WRITE, 0, 64, Some((bad, &b, (round * 16) % 4000)), 0, round as u64),
            URMA_SUCCESS
        );
        let cr = a.cr();
        assert_eq!(
            (cr.status, cr.user_ctx),
            (URMA_CR_REM_ACCESS_ABORT_ERR, round as u64),
            "token {token:#x}"
        );
        assert!(b.buf.iter().all(|&x| x == 0x5a), "token {token:#x} moved a byte");
        // The responder's jetty failed too and says so with an async event.
        // SAFETY: live context; the event is a local.
        unsafe {
            let mut ev: abi::UrmaAsyncEvent = std::mem::zeroed();
            assert_eq!((l.get_async_event)(b.ctx, &mut ev), URMA_SUCCESS);
            assert_eq!((ev.event_type, ev.element.jetty), (URMA_EVENT_JETTY_ERR, b.jetty));
            (l.ack_async_event)(&mut ev);
            assert_eq!((*b.jetty).async_events_acked, round as u32 + 1);
            assert_eq!((l.unimport_seg)(bad), URMA_SUCCESS);
        }
        a.modify(URMA_JETTY_STATE_READY);
        b.modify(URMA_JETTY_STATE_READY);
        assert_eq!((a.state(), b.state()), (URMA_JETTY_STATE_READY, URMA_JETTY_STATE_READY));
    }
    let good = a.import(&b, TOKEN, URMA_ACCESS_READ | URMA_ACCESS_WRITE);
    assert_eq!(a.post(URMA_OPC_WRITE, 0, 64, Some((good, &b, 128)), 0, 999), URMA_SUCCESS);
    assert_eq!(a.cr().status, URMA_CR_SUCCESS);
    assert!(b.buf[128..192].iter().all(|&x| x == 0xee) && b.buf[..128].iter().all(|&x| x == 0x5a));
}

#[test]
fn event_mode_wait_ack_rearm() {
    let l = lib();
    let (a, b) = pair();
    let mut fired = [null_mut(); 2];
    // SAFETY: live handles; arrays are locals of the right length.
    unsafe {
        assert_eq!((l.rearm_jfc)(b.jfc, false), URMA_SUCCESS);
        assert_eq!((l.wait_jfc)(b.jfce, 2, 10, fired.as_mut_ptr()), 0, "nothing happened: timeout");
        b.post_recv(0, 64, 7);
        assert_eq!(a.post(URMA_OPC_SEND, 0, 3, None, 0, 1), URMA_SUCCESS);
        assert_eq!((l.wait_jfc)(b.jfce, 2, 10_000, fired.as_mut_ptr()), 1);
        assert_eq!(fired[0], b.jfc);
        let mut n = [1u32];
        (l.ack_jfc)(fired.as_mut_ptr(), n.as_mut_ptr(), 1);
        assert_eq!((*b.jfc).comp_events_acked, 1);
        assert_eq!(b.cr().user_ctx, 7);
        // Not rearmed: a second completion raises no event.
        b.post_recv(0, 64, 8);
        assert_eq!(a.post(URMA_OPC_SEND, 0, 3, None, 0, 2), URMA_SUCCESS);
        assert_eq!(b.cr().user_ctx, 8);
        assert_eq!((l.wait_jfc)(b.jfce, 2, 10, fired.as_mut_ptr()), 0);
    }
}

#[test]
fn handles_not_handed_out_are_refused_not_followed() {
    let l = lib();
    let (a, _b) = pair();
    // SAFETY: every pointer below is either live or deliberately wrong; the library must check
    // before it dereferences, which is what this test asserts.
    unsafe {
        let mut cr: abi::UrmaCr = std::mem::zeroed();
        let inside = (a.jfc as *mut u8).add(8) as *mut abi::UrmaJfc;
        assert_eq!((l.poll_jfc)(inside, 1, &mut cr), -1, "a pointer into a JFC is no JFC");
        assert_eq!((l.poll_jfc)(a.jetty as *mut abi::UrmaJfc, 1, &mut cr), -1, "a jetty is no JFC");
        assert_eq!((l.rearm_jfc)(a.seg as *mut abi::UrmaJfc, false), URMA_EINVAL);
        let mut bad = null_mut();
        let mut wr: abi::UrmaJfsWr = std::mem::zeroed();
        wr.opcode = URMA_OPC_SEND;
        assert_eq!((l.post_send)(a.jfc as *mut abi::UrmaJetty, &mut wr, &mut bad), URMA_EINVAL);
        // A WR naming a segment the library never returned: refused at post, bad_wr set.
        let mut fake: abi::UrmaTargetSeg = std::mem::zeroed();
        let mut sge =
            abi::UrmaSge { addr: a.buf.as_ptr() as u64, len: 4, tseg: &mut fake, user_tseg: null_mut() };
        wr.body.send = abi::UrmaSendWr {
            src: abi::UrmaSg { sge: &mut sge, num_sge: 1 },
            target_hint: 0,
            imm_data: 0,
            tseg: null_mut(),
        };
        assert_eq!((l.post_send)(a.jetty, &mut wr, &mut bad), URMA_EINVAL);
        assert_eq!(bad, &mut wr as *mut _);
        // Opcodes the simulator does not model are refused, not guessed at.
        wr.opcode = URMA_OPC_CAS;
        assert_eq!((l.post_send)(a.jetty, &mut wr, &mut bad), URMA_EINVAL);
        // get/put of the exchange blobs.
        let (mut rj, mut len) = (null_mut(), 0u32);
        assert_eq!((l.get_rjetty)(a.jetty, &mut rj, &mut len), URMA_SUCCESS);
        assert_eq!(
            (len as usize, (*rj).jetty_id),
            (std::mem::size_of::<abi::UrmaRjetty>(), (*a.jetty).jetty_id)
        );
        (l.put_rjetty)(rj);
        let (mut s, mut sl) = (null_mut(), 0u32);
        assert_eq!((l.get_seg_ctx)(a.seg, &mut s, &mut sl), URMA_SUCCESS);
        assert_eq!(({ (*s).ubva }.va, sl), ({ (*a.seg).seg.ubva }.va, 48));
        (l.put_seg_ctx)(s);
        (l.put_seg_ctx)(s); // a second put of the same blob is refused, not a double free
    }
}

/// The exports URPC needs beyond the plain RC sequence, through their declared C types:
/// `urma_modify_jfc` (validated as UDMA validates), `urma_modify_jfr` / `urma_query_jfr` (the JFR
/// state machine), `urma_user_ctl` (refused with `URMA_ENOPERM`) and `urma_unregister_log_func`.
#[test]
fn urpc_exports() {
    let l = lib();
    let path = CString::new(common::library().to_str().unwrap()).unwrap();
    // SAFETY: the library is loaded already (lib()); dlopen returns the same handle.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    let modify_jfc = sym!(h, "urma_modify_jfc", fns::UrmaModifyJfc);
    let modify_jfr = sym!(h, "urma_modify_jfr", fns::UrmaModifyJfr);
    let query_jfr = sym!(h, "urma_query_jfr", fns::UrmaQueryJfr);
    let user_ctl = sym!(h, "urma_user_ctl", fns::UrmaUserCtl);
    let unregister = sym!(h, "urma_unregister_log_func", fns::UrmaUnregisterLogFunc);
    // SAFETY: handles the library returned and structs built here, as the API prescribes.
    unsafe {
        let name = CString::new("bypass_sim0").unwrap();
        let d = nn((l.get_device_by_name)(name.as_ptr() as *mut _), "get_device_by_name");
        let mut attr: abi::UrmaDeviceAttr = std::mem::zeroed();
        assert_eq!((l.query_device)(d, &mut attr), URMA_SUCCESS);
        let cap = &attr.dev_cap;
        assert_eq!(cap.rc_tp_cap & TP_TYPE_RTP, TP_TYPE_RTP, "RC runs over RTP");
        assert_eq!(cap.rc_order_cap & ORDER_CAP_OL, ORDER_CAP_OL, "RC offers OL");
        assert!(
            cap.priority_info.iter().any(|p| p.tp_type == TP_TYPE_RTP),
            "a priority whose transport set is RTP alone: {:?}",
            cap.priority_info
        );

        let ctx = nn((l.create_context)(d, 0), "create_context");
        let mut jc = abi::UrmaJfcCfg { depth: 64, flag: 0, ceqn: 0, jfce: null_mut(), user_ctx: 0 };
        let jfc = nn((l.create_jfc)(ctx, &mut jc), "create_jfc");
        for (mask, count, period, want) in [
            (JFC_MODERATE_COUNT, 1, 0, URMA_SUCCESS),
            (JFC_MODERATE_PERIOD, 0, 16384, URMA_SUCCESS),
            (0, 1, 0, URMA_EINVAL),
            (JFC_MODERATE_COUNT, 1024, 0, URMA_EINVAL),
            (JFC_MODERATE_PERIOD, 0, 5, URMA_EINVAL),
            (0x4, 0, 0, URMA_EINVAL),
        ] {
            let mut a = abi::UrmaJfcAttr { mask, moderate_count: count, moderate_period: period };
            assert_eq!(modify_jfc(jfc, &mut a), want, "modify_jfc mask {mask} count {count} period {period}");
        }
        assert_eq!(modify_jfc(jfc, null_mut()), URMA_EINVAL);

        let mut rc: abi::UrmaJfrCfg = std::mem::zeroed();
        rc.depth = 32;
        rc.trans_mode = URMA_TM_RC;
        rc.max_sge = 1;
        rc.jfc = jfc;
        let jfr = nn((l.create_jfr)(ctx, &mut rc), "create_jfr");
        let (mut qc, mut qa): (abi::UrmaJfrCfg, abi::UrmaJfrAttr) = (std::mem::zeroed(), std::mem::zeroed());
        assert_eq!(query_jfr(jfr, &mut qc, &mut qa), URMA_SUCCESS);
        assert_eq!((qc.depth, qc.jfc, qa.state), (32, jfc, URMA_JFR_STATE_READY));
        for (state, want) in [
            (URMA_JFR_STATE_RESET, URMA_EINVAL),
            (URMA_JFR_STATE_ERROR, URMA_SUCCESS),
            (URMA_JFR_STATE_READY, URMA_EINVAL),
            (URMA_JFR_STATE_RESET, URMA_SUCCESS),
            (URMA_JFR_STATE_READY, URMA_SUCCESS),
            (URMA_JFR_STATE_READY, URMA_SUCCESS),
        ] {
            let mut a = abi::UrmaJfrAttr { mask: JFR_STATE, rx_threshold: 0, state };
            assert_eq!(modify_jfr(jfr, &mut a), want, "modify_jfr to {state}");
        }
        let mut a = abi::UrmaJfrAttr { mask: JFR_RX_THRESHOLD, rx_threshold: 8, state: 0 };
        assert_eq!(modify_jfr(jfr, &mut a), URMA_SUCCESS);
        assert_eq!(query_jfr(jfr, &mut qc, &mut qa), URMA_SUCCESS);
        assert_eq!((qa.state, qa.rx_threshold), (URMA_JFR_STATE_READY, 8));
        assert_eq!(query_jfr(jfr, null_mut(), &mut qa), URMA_EINVAL);

        let mut i = abi::UrmaUserCtlIn { addr: 0, len: 0, opcode: 1 };
        let mut o = abi::UrmaUserCtlOut::default();
        assert_eq!(user_ctl(ctx, &mut i, &mut o), URMA_ENOPERM);
        assert_eq!(user_ctl(ctx, null_mut(), &mut o), URMA_EINVAL);
        assert_eq!(unregister(), URMA_SUCCESS);
    }
}
