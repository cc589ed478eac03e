//! The conformance scenarios: one function per behaviour of the hal contract, generic over an
//! [`Env`]. Each asserts only what the doc comments of the hal promise, so a correct backend passes
//! whether it is the simulator, a real NIC or Soft-RoCE.
//!
//! Conventions: device A is the requester and B the responder; every `wr_id` is chosen so that a
//! completion names the request it belongs to; payloads come from [`pattern`] (or [`numbered`]
//! where messages must be told apart) so a misplaced byte is caught, not just a missing one; all
//! waiting goes through the helpers of the parent module, so time is virtual on the simulator.
//!
//! Where a scenario reads memory a peer wrote with a one-sided WRITE, it first waits for the
//! receive completion of a later message on the same queue: on a reliable connection that is what
//! guarantees the WRITE's bytes are in place, on every backend.

use super::{
    collect, connect, expect_none, pair, pattern, read_region, side, wait_for, wait_one, Env, Pair, Side,
    WAIT_BUDGET, WAIT_TICK,
};
use crate::{
    Access, AckTimeout, ArmMode, Completion, CompletionQueue, CqOpcode, Device, DeviceCaps, Error,
    EventChannel, MemoryRegion, Queue, QueueConfig, QueueState, RecvWr, RemoteAddr, RemoteKey, RemoteRegion,
    RnrTimer, SendOp, SendWr, Sge, Status, WrFlags,
};
use std::time::Duration;

mod shared_recv;
pub use shared_recv::*;

/// How long "nothing more arrives" is watched for.
const QUIET: Duration = Duration::from_millis(5);

/// The largest message the size scenarios send, whatever the device allows.
const MAX_TESTED_MSG: usize = 4 << 20;

/// A registered region of the device under test.
type Region<E> = <<E as Env>::Dev as Device>::Region;

/// What a completion must say: `wr_id`, opcode and status.
type Want = (u64, CqOpcode, Status);

/// A piece of a gather or scatter list: (index of the region, offset, length).
type Piece = (usize, usize, usize);

/// Local and remote access for a region peers WRITE into and READ from.
const REMOTE_RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

// ------------------------------------------------------------------------------------------------
// Scenarios
// ------------------------------------------------------------------------------------------------

/// SEND delivers messages of 0 B, 1 B, 64 B and the largest message size (capped at 4 MiB) whole:
/// the receive completes as `Recv` with `byte_len` equal to the message size and no immediate, the
/// bytes land at the start of the receive buffer, and the send completes successfully.
pub fn send_recv_sizes<E: Env>(env: &E) {
    let max = max_msg(env);
    let mut p = default_pair(env);
    let mut src = region(env.a(), max, Access::empty(), "send source");
    let dst = sink(env.b(), max);
    for (i, len) in [0, 1, 64, max].into_iter().enumerate() {
        let c = deliver(env, &mut p.a, &mut src, &mut p.b, &dst, i as u64, &pattern(i as u8 + 1, len));
        assert_eq!(c.imm, None, "a plain SEND of {len} B carries no immediate: {c:?}");
    }
}

/// A SEND gathers several SGEs (from two regions, out of address order) into one message; a
/// receive scatters a message over several SGEs in order, filling each before the next (the last
/// one only partly); both at once with unaligned boundaries; a WRITE gathers and a READ scatters
/// the same way. Uses as many SGEs as the devices and the `QueueConfig` allow, up to four.
pub fn gather_and_scatter<E: Env>(env: &E) {
    let cfg = fit(env, QueueConfig { max_send_sge: 4, max_recv_sge: 4, ..Default::default() });
    let (n_send, n_recv) = (cfg.max_send_sge as usize, cfg.max_recv_sge as usize);
    let mut p = pair(env, &cfg);
    let srcs = [source(env.a(), &pattern(1, 4096)), source(env.a(), &pattern(2, 4096))];
    let dsts = [sink(env.b(), 4096), sink(env.b(), 4096)];
    let gather: Vec<Piece> = [(0, 3000, 100), (1, 17, 1), (0, 1500, 200), (1, 700, 64)][..n_send].to_vec();
    let gather_len = pieces_len(&gather);

    let what = format!("SEND gathering {n_send} SGE(s)");
    send_gather_scatter(env, &mut p, (&srcs, &gather), (&dsts, &scatter_layout(1, gather_len)), 1, &what);

    let what = format!("receive scattering over {n_recv} SGE(s)");
    send_gather_scatter(
        env,
        &mut p,
        (&srcs, &[(0, 0, 333)]),
        (&dsts, &scatter_layout(n_recv, 333)),
        2,
        &what,
    );

    let what = format!("{n_send} SGE(s) gathered, scattered over {n_recv}");
    send_gather_scatter(
        env,
        &mut p,
        (&srcs, &gather),
        (&dsts, &scatter_layout(n_recv, gather_len)),
        3,
        &what,
    );

    // One-sided: WRITE gathers into the remote region, READ scatters out of it.
    let mut remote_mr = region(env.b(), 4096, REMOTE_RW, "remote region");
    let remote = remote_mr.remote();
    let note = sink(env.b(), 1);
    let what = format!("WRITE gathering {n_send} SGE(s)");
    let wrote = gathered(&srcs, &gather);
    let sges = sges_of(&srcs, &gather);
    post_recv_buf(&mut p.b, 4, &note, 0, 1);
    let notify = SendWr::send(5, &[]);
    p.a.queue
        .post_send(&[SendWr::send(4, &sges).with_op(SendOp::Write(remote.at(64))), notify])
        .expect("post WRITE");
    recv_ok(env, &mut p.b, 4, CqOpcode::Recv, &what);
    expect_done(
        env,
        &mut p.a.send_cq,
        p.a.queue.qpn(),
        &[ok(4, CqOpcode::Write), ok(5, CqOpcode::Send)],
        &what,
    );
    check_region(&remote_mr, 64, &wrote, &what);

    let what = format!("READ scattering over {n_send} SGE(s)");
    let theirs = pattern(3, 4096);
    remote_mr.write(0, &theirs).expect("fill the remote region");
    let targets = [sink(env.a(), 4096), sink(env.a(), 4096)];
    let layout = scatter_layout(n_send, 500);
    let sges = sges_of(&targets, &layout);
    let read_len = pieces_len(&layout);
    p.a.queue.post_send(&[SendWr::send(6, &sges).with_op(SendOp::Read(remote.at(128)))]).expect("post READ");
    let c = send_ok(env, &mut p.a, 6, CqOpcode::Read, &what);
    assert_eq!(c.byte_len as usize, read_len, "{what}: byte_len is the bytes read: {c:?}");
    assert_scattered(&targets, &layout, &theirs[128..128 + read_len], &what);
}

/// SEND_IMM delivers its immediate in the receive completion (`imm == Some(x)`, also for 0 and for
/// an empty payload) next to the payload, while a plain SEND's receive carries `imm == None`; the
/// sender's completion says `Send` either way.
pub fn send_imm_delivers_immediate<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let mut src = region(env.a(), 64, Access::empty(), "send source");
    let mut dst = sink(env.b(), 64);
    for (i, (imm, len)) in
        [(Some(0xDEAD_BEEF), 32), (Some(0), 0), (None, 8), (Some(7), 64)].into_iter().enumerate()
    {
        let what =
            format!("{} of {len} B with immediate {imm:?}", if imm.is_some() { "SEND_IMM" } else { "SEND" });
        let data = pattern(0x30 + i as u8, len);
        src.write(0, &data).expect("fill send source");
        dst.write(0, &[0; 64]).expect("clear receive buffer");
        post_recv_buf(&mut p.b, i as u64, &dst, 0, 64);
        post_op(&mut p.a, 100 + i as u64, imm.map_or(SendOp::Send, SendOp::SendImm), &src, 0, len);
        let c = recv_ok(env, &mut p.b, i as u64, CqOpcode::Recv, &what);
        assert_eq!((c.imm, c.byte_len as usize), (imm, len), "{what}: immediate and length: {c:?}");
        check_region(&dst, 0, &data, &what);
        send_ok(env, &mut p.a, 100 + i as u64, CqOpcode::Send, &what);
    }
}

/// WRITE_IMM puts its bytes in the remote region and consumes one receive at the peer: that
/// receive completes as `RecvWriteImm` with the immediate and `byte_len` = bytes written (also for
/// an empty WRITE_IMM), its buffer stays untouched, and the next SEND takes the next receive. A
/// plain WRITE consumes no receive.
pub fn write_imm_consumes_receive<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let data = pattern(3, 256);
    let src = source(env.a(), &data);
    let target = region(env.b(), 4096, REMOTE_RW, "WRITE target");
    let remote = target.remote();
    let mut bufs = sink(env.b(), 3 * 128);
    let untouched = pattern(0xEE, 3 * 128);
    bufs.write(0, &untouched).expect("fill receive buffers");
    for i in 0..3 {
        post_recv_buf(&mut p.b, i + 1, &bufs, i as usize * 128, 128);
    }

    post_op(&mut p.a, 10, SendOp::Write(remote.at(0)), &src, 0, 64);
    send_ok(env, &mut p.a, 10, CqOpcode::Write, "plain WRITE");
    expect_none(env, &mut p.b.recv_cq, QUIET, "a plain WRITE consumes no receive");

    let what = "WRITE_IMM of 100 B";
    post_op(&mut p.a, 11, SendOp::WriteImm(remote.at(1000), 0x1234_5678), &src, 64, 100);
    let c = recv_ok(env, &mut p.b, 1, CqOpcode::RecvWriteImm, what);
    assert_eq!((c.imm, c.byte_len), (Some(0x1234_5678), 100), "{what}: immediate and bytes written: {c:?}");
    check_region(&target, 1000, &data[64..164], what);
    check_region(&target, 0, &data[..64], "the earlier plain WRITE");
    check_region(&bufs, 0, &untouched[..128], "WRITE_IMM leaves the receive buffer alone");
    send_ok(env, &mut p.a, 11, CqOpcode::Write, what);

    let what = "empty WRITE_IMM";
    post_op(&mut p.a, 12, SendOp::WriteImm(remote.at(0), 0), &src, 0, 0);
    let c = recv_ok(env, &mut p.b, 2, CqOpcode::RecvWriteImm, what);
    assert_eq!((c.imm, c.byte_len), (Some(0), 0), "{what}: immediate and bytes written: {c:?}");
    check_region(&bufs, 128, &untouched[128..256], what);
    send_ok(env, &mut p.a, 12, CqOpcode::Write, what);

    let what = "SEND after two WRITE_IMMs takes the third receive";
    post_op(&mut p.a, 13, SendOp::Send, &src, 200, 16);
    let c = recv_ok(env, &mut p.b, 3, CqOpcode::Recv, what);
    assert_eq!((c.imm, c.byte_len), (None, 16), "{what}: {c:?}");
    check_region(&bufs, 256, &data[200..216], what);
    send_ok(env, &mut p.a, 13, CqOpcode::Send, what);
}

/// WRITE and READ move exactly the named bytes between registered regions: at offset 0, at odd
/// offsets on both sides, ending on the region's last byte, the last byte alone, and the whole
/// region; bytes outside the range stay as they were on both ends, and a READ completes with
/// `byte_len` = bytes read.
pub fn write_and_read_regions<E: Env>(env: &E) {
    let len = max_msg(env).min(64 << 10);
    assert!(len >= 1024, "the device's max_msg_size ({len} B) is too small for this scenario");
    let mut p = default_pair(env);
    let mut remote_mr = region(env.b(), len, REMOTE_RW, "remote region");
    let remote = remote_mr.remote();
    let mut local = region(env.a(), len, Access::LOCAL_WRITE, "local region");
    let note = sink(env.b(), 1);
    // (remote offset, local offset, length)
    let cases =
        [(0, 0, 1000), (len / 3 + 1, 13, 333), (len - 100, 7, 100), (len - 1, len - 1, 1), (0, 0, len)];

    for (k, &(roff, loff, n)) in cases.iter().enumerate() {
        let what = format!("WRITE of {n} B from local offset {loff} to remote offset {roff} of {len}");
        let (id, mine, mut expected) = (k as u64, pattern(0x10 + k as u8, len), pattern(0xB0, len));
        local.write(0, &mine).expect("fill local region");
        remote_mr.write(0, &expected).expect("fill remote region");
        expected[roff..roff + n].copy_from_slice(&mine[loff..loff + n]);
        post_recv_buf(&mut p.b, id, &note, 0, 1);
        let sges = [sge(&local, loff, n)];
        let write = SendWr::send(id, &sges).with_op(SendOp::Write(remote.at(roff as u64)));
        p.a.queue.post_send(&[write, SendWr::send(100 + id, &[])]).expect("post WRITE and notification");
        recv_ok(env, &mut p.b, id, CqOpcode::Recv, &what);
        expect_done(
            env,
            &mut p.a.send_cq,
            p.a.queue.qpn(),
            &[ok(id, CqOpcode::Write), ok(100 + id, CqOpcode::Send)],
            &what,
        );
        check_region(&remote_mr, 0, &expected, &what);
    }

    for (k, &(roff, loff, n)) in cases.iter().enumerate() {
        let what = format!("READ of {n} B from remote offset {roff} of {len} to local offset {loff}");
        let (id, theirs, mut expected) = (200 + k as u64, pattern(0x50 + k as u8, len), pattern(0xA0, len));
        remote_mr.write(0, &theirs).expect("fill remote region");
        local.write(0, &expected).expect("fill local region");
        expected[loff..loff + n].copy_from_slice(&theirs[roff..roff + n]);
        post_op(&mut p.a, id, SendOp::Read(remote.at(roff as u64)), &local, loff, n);
        let c = send_ok(env, &mut p.a, id, CqOpcode::Read, &what);
        assert_eq!(c.byte_len as usize, n, "{what}: byte_len is the bytes read: {c:?}");
        check_region(&local, 0, &expected, &what);
    }
}

/// Long WRITEs and READs, many posted at once, put every byte in its place: a region of 16
/// chunks and one byte (1 MiB + 1 with the devices' usual limits) is written from A to B with
/// all its WRITEs posted in one batch, then read back from B into a fresh region of A with all
/// its READs posted in one batch (the queue keeps `max_rd_atomic` of them outstanding and the
/// rest wait their turn). Each chunk carries its own pattern, so a segment placed at another
/// offset, a repeated or a stale one is caught as well as a lost one. Streams this long are
/// where retransmission from the middle of a message (a lost segment, a READ asked again after
/// a timeout) has to resume at exactly the right byte, and the last READ, one byte in one
/// segment, is the one an acknowledgement that reached too far would complete with nothing
/// placed (docs/vfio.md, "A wrong echo with the server on rxe").
pub fn large_writes_and_reads_keep_every_byte<E: Env>(env: &E) {
    let chunk = max_msg(env).min(64 << 10);
    let len = 16 * chunk + 1;
    let mut p = pair(env, &fit(env, QueueConfig::default().with_depths(64, 64)));
    let mut remote_mr = region(env.b(), len, REMOTE_RW, "remote region");
    let remote = remote_mr.remote();
    let mut local = region(env.a(), len, Access::LOCAL_WRITE, "local region");
    let mut back = region(env.a(), len, Access::LOCAL_WRITE, "read-back region");
    let note = sink(env.b(), 1);
    let parts: Vec<(usize, usize)> = (0..len).step_by(chunk).map(|o| (o, chunk.min(len - o))).collect();
    let mut data = Vec::with_capacity(len);
    for (k, &(_, n)) in parts.iter().enumerate() {
        data.extend_from_slice(&pattern(0x21 + 3 * k as u8, n));
    }
    local.write(0, &data).expect("fill local region");
    remote_mr.write(0, &pattern(0xE7, len)).expect("fill remote region");
    back.write(0, &pattern(0x5A, len)).expect("fill read-back region");

    let what = format!("{} WRITEs of {len} B in all, posted at once", parts.len());
    post_recv_buf(&mut p.b, 900, &note, 0, 1);
    let mut want = post_chunks(&mut p.a, &local, &parts, 0, |o| SendOp::Write(remote.at(o)), CqOpcode::Write);
    p.a.queue.post_send(&[SendWr::send(900, &[])]).expect("post the notification after the WRITEs");
    want.push(ok(900, CqOpcode::Send));
    expect_done_within(env, &mut p.a.send_cq, p.a.queue.qpn(), &want, &what, LONG_WAIT);
    recv_ok(env, &mut p.b, 900, CqOpcode::Recv, &what);
    check_region(&remote_mr, 0, &data, &what);

    let what = format!("{} READs of {len} B in all, posted at once", parts.len());
    let want = post_chunks(&mut p.a, &back, &parts, 100, |o| SendOp::Read(remote.at(o)), CqOpcode::Read);
    expect_done_within(env, &mut p.a.send_cq, p.a.queue.qpn(), &want, &what, LONG_WAIT);
    check_region(&back, 0, &data, &what);
}

/// How long transfers of megabytes may take: six times the usual budget (an emulated guest
/// moves a few MiB/s).
const LONG_WAIT: Duration = Duration::from_secs(6 * WAIT_BUDGET.as_secs());

/// Posts, in one batch, one signaled request per chunk `(offset, length)` of `mr`, `op` saying
/// what to do with the chunk at an offset, `wr_id`s counting from `first_id`; returns the
/// completions they must end with (as `opcode`), in order.
#[track_caller]
fn post_chunks<D: Device>(
    side: &mut Side<D>,
    mr: &D::Region,
    parts: &[(usize, usize)],
    first_id: u64,
    op: impl Fn(u64) -> SendOp,
    opcode: CqOpcode,
) -> Vec<Want> {
    let sges: Vec<[Sge; 1]> = parts.iter().map(|&(o, n)| [sge(mr, o, n)]).collect();
    let wrs: Vec<SendWr<'_>> = parts
        .iter()
        .zip(&sges)
        .zip(first_id..)
        .map(|((&(o, _), s), id)| SendWr::send(id, s).with_op(op(o as u64)))
        .collect();
    side.queue.post_send(&wrs).expect("post the chunks' requests");
    wrs.iter().map(|w| ok(w.wr_id, opcode)).collect()
}

/// Unsignaled requests produce no completion yet execute in order: rounds of 7 unsignaled SENDs
/// and one signaled SEND deliver all 8 in order while the sender sees exactly one completion per
/// round; the rounds together post far more requests than the send queue holds, so the signaled
/// completion must reclaim the unsignaled slots. An unsignaled WRITE is in place once a later
/// signaled SEND was received.
pub fn unsignaled_requests_are_ordered<E: Env>(env: &E) {
    const UNSIGNALED: u64 = 7;
    const ROUNDS: u64 = 5;
    const LEN: usize = 32;
    let per_round = UNSIGNALED + 1;
    let total = ROUNDS * per_round;
    let cfg = fit(env, QueueConfig { send_depth: 16, recv_depth: 64, ..Default::default() });
    assert!(
        u64::from(cfg.send_depth) >= per_round && total > u64::from(cfg.send_depth),
        "send depth {} must hold one round ({per_round}) and be outgrown by all rounds ({total})",
        cfg.send_depth
    );
    assert!(
        u64::from(cfg.recv_depth) > total,
        "receive depth {} too small for {total} messages",
        cfg.recv_depth
    );
    let mut p = pair(env, &cfg);
    let (_src, sges) = numbered_source(env.a(), total, LEN);
    let dst = sink(env.b(), (total as usize + 1) * LEN);
    for i in 0..=total {
        post_recv_buf(&mut p.b, 1000 + i, &dst, i as usize * LEN, LEN);
    }

    for round in 0..ROUNDS {
        let what = format!("round {round}: {UNSIGNALED} unsignaled SENDs, then a signaled one");
        let ids = round * per_round..(round + 1) * per_round;
        let last = ids.end - 1;
        let wrs: Vec<SendWr<'_>> = ids
            .clone()
            .map(|i| {
                let wr = SendWr::send(i, &sges[i as usize]);
                if i == last {
                    wr
                } else {
                    wr.with_flags(WrFlags::empty())
                }
            })
            .collect();
        if round % 2 == 0 {
            for wr in &wrs {
                p.a.queue.post_send(std::slice::from_ref(wr)).expect("post SEND");
            }
        } else {
            p.a.queue.post_send(&wrs).expect("post round as one batch");
        }
        send_ok(env, &mut p.a, last, CqOpcode::Send, &what);
        let got = wait_for(env, &mut p.b.recv_cq, per_round as usize, &what);
        for (c, i) in got.iter().zip(ids) {
            check_numbered(c, p.b.queue.qpn(), 1000 + i, &dst, i as usize * LEN, i, LEN, &what);
        }
    }

    let what = "unsignaled WRITE, then a signaled SEND";
    let data = pattern(0x77, 256);
    let wsrc = source(env.a(), &data);
    let target = region(env.b(), 256, REMOTE_RW, "WRITE target");
    let wsges = [sge(&wsrc, 0, 256)];
    let write =
        SendWr::send(500, &wsges).with_op(SendOp::Write(target.remote().at(0))).with_flags(WrFlags::empty());
    p.a.queue.post_send(&[write, SendWr::send(501, &[])]).expect("post WRITE and SEND");
    recv_ok(env, &mut p.b, 1000 + total, CqOpcode::Recv, what);
    check_region(&target, 0, &data, what);
    send_ok(env, &mut p.a, 501, CqOpcode::Send, what);
    expect_none(env, &mut p.a.send_cq, QUIET, "unsignaled requests never complete");
}

/// A zero-length WRITE names no memory (IBA C9-88; rxe skips the key check for it too): with no
/// SGE, address 0 and a key no region has, it completes successfully, in order behind unsignaled
/// SENDs, and the queue stays usable. The stack posts one as a marker whose completion retires
/// the unsignaled sends before it.
pub fn zero_length_write_needs_no_key<E: Env>(env: &E) {
    const LEN: usize = 32;
    let cfg = fit(env, QueueConfig { send_depth: 16, recv_depth: 16, ..Default::default() });
    let mut p = pair(env, &cfg);
    let (_src, sges) = numbered_source(env.a(), 3, LEN);
    let dst = sink(env.b(), 3 * LEN);
    for i in 0..3 {
        post_recv_buf(&mut p.b, 1000 + i, &dst, i as usize * LEN, LEN);
    }
    let nowhere = RemoteAddr { addr: 0, key: RemoteKey::from_rkey(0) };
    let what = "two unsignaled SENDs, then a signaled zero-length WRITE to no region";
    let wrs = [
        SendWr::send(0, &sges[0]).with_flags(WrFlags::empty()),
        SendWr::send(1, &sges[1]).with_flags(WrFlags::empty()),
        SendWr::send(2, &[]).with_op(SendOp::Write(nowhere)),
    ];
    p.a.queue.post_send(&wrs).expect("post");
    send_ok(env, &mut p.a, 2, CqOpcode::Write, what);
    let got = wait_for(env, &mut p.b.recv_cq, 2, what);
    for (c, i) in got.iter().zip(0..2) {
        check_numbered(c, p.b.queue.qpn(), 1000 + i, &dst, i as usize * LEN, i, LEN, what);
    }
    expect_none(env, &mut p.b.recv_cq, QUIET, "a WRITE without immediate consumes no receive");
    assert_eq!(p.a.queue.state(), QueueState::Ready, "{what}: the queue is still READY");
    let what = "a SEND after the zero-length WRITE";
    p.a.queue.post_send(&[SendWr::send(3, &sges[2])]).expect("post");
    send_ok(env, &mut p.a, 3, CqOpcode::Send, what);
    let c = wait_one(env, &mut p.b.recv_cq, what);
    check_numbered(&c, p.b.queue.qpn(), 1002, &dst, 2 * LEN, 2, LEN, what);
}

/// Completions arrive in post order per queue, across operation kinds and batch boundaries: a mix
/// of SEND, SEND_IMM, WRITE, WRITE_IMM and READ posted in batches of varied size completes on the
/// sender in exactly that order (each with its kind, READs with their data), and the receives the
/// two-sided ones consume complete in the order they were posted, each with the right message.
pub fn completions_in_post_order<E: Env>(env: &E) {
    use Kind::*;
    const LEN: usize = 64;
    let kinds: Vec<Kind> = [Send; 8]
        .into_iter()
        .chain([Write, SendImm, Read, WriteImm, Send, Read, Write, Send].repeat(4))
        .collect();
    let n = kinds.len();
    let cfg = fit(env, QueueConfig::default());
    assert!(
        cfg.send_depth as usize >= n && cfg.recv_depth as usize >= n,
        "queues too small for {n} requests: {cfg:?}"
    );
    let mut p = pair(env, &cfg);

    let (local, sges) = numbered_source(env.a(), n as u64, LEN);
    let mut remote_mr = region(env.b(), n * LEN, REMOTE_RW, "remote region");
    let remote = remote_mr.remote();
    let theirs = |i: usize| numbered(10_000 + i as u64, LEN);
    for (i, _) in kinds.iter().enumerate().filter(|(_, k)| **k == Read) {
        remote_mr.write(i * LEN, &theirs(i)).expect("fill remote slot");
    }
    let consumers: Vec<usize> = (0..n).filter(|&i| kinds[i].consumes_receive()).collect();
    let bufs = sink(env.b(), consumers.len() * LEN);
    for j in 0..consumers.len() {
        post_recv_buf(&mut p.b, 1000 + j as u64, &bufs, j * LEN, LEN);
    }

    let wr = |i: usize| {
        let at = remote.at((i * LEN) as u64);
        let op = match kinds[i] {
            Send => SendOp::Send,
            SendImm => SendOp::SendImm(i as u32),
            Write => SendOp::Write(at),
            WriteImm => SendOp::WriteImm(at, i as u32),
            Read => SendOp::Read(at),
        };
        SendWr::send(i as u64, &sges[i]).with_op(op)
    };
    let mut next = 0;
    for batch in [8, 1, 3, 2, 5].into_iter().cycle() {
        let end = (next + batch).min(n);
        let wrs: Vec<SendWr<'_>> = (next..end).map(wr).collect();
        p.a.queue.post_send(&wrs).expect("post batch");
        next = end;
        if next == n {
            break;
        }
    }

    let what = "sender completions of a mixed batch";
    let got = wait_for(env, &mut p.a.send_cq, n, what);
    for (i, c) in got.iter().enumerate() {
        assert_ok(c, p.a.queue.qpn(), i as u64, kinds[i].opcode(), what);
        if kinds[i] == Read {
            assert_eq!(c.byte_len as usize, LEN, "{what}: READ byte_len: {c:?}");
            check_region(&local, i * LEN, &theirs(i), &format!("data of READ {i}"));
        }
    }
    let what = "receive completions of a mixed batch";
    let got = wait_for(env, &mut p.b.recv_cq, consumers.len(), what);
    for (j, (c, &i)) in got.iter().zip(&consumers).enumerate() {
        let imm = matches!(kinds[i], SendImm | WriteImm).then_some(i as u32);
        if kinds[i] == WriteImm {
            assert_ok(c, p.b.queue.qpn(), 1000 + j as u64, CqOpcode::RecvWriteImm, what);
            check_region(&remote_mr, i * LEN, &numbered(i as u64, LEN), &format!("data of WRITE_IMM {i}"));
        } else {
            assert_ok(c, p.b.queue.qpn(), 1000 + j as u64, CqOpcode::Recv, what);
            check_region(&bufs, j * LEN, &numbered(i as u64, LEN), &format!("data of SEND {i}"));
        }
        assert_eq!((c.imm, c.byte_len as usize), (imm, LEN), "{what}: request {i}: {c:?}");
    }
    for i in (0..n).filter(|&i| kinds[i] == Write) {
        check_region(&remote_mr, i * LEN, &numbered(i as u64, LEN), &format!("data of WRITE {i}"));
    }
    expect_none(env, &mut p.a.send_cq, QUIET, "sender after the mixed batch");
    expect_none(env, &mut p.b.recv_cq, QUIET, "receiver after the mixed batch");
}

/// A small completion queue that wraps a thousand times never loses, repeats or reorders an entry:
/// with send and receive CQs of depth 4 (then 7, not a power of two) and as many requests
/// outstanding as they hold, thousands of SENDs are polled as they go, a few entries per poll, and
/// every `wr_id` appears exactly once and in order on both CQs, with its own message.
pub fn cq_wraps_without_loss<E: Env>(env: &E) {
    for (depth, messages) in [(4, 4000), (7, 1400)] {
        cq_wrap_run(env, depth, messages);
    }
}

/// A receive buffer smaller than the inbound SEND: the receive completes with an error, and the
/// SEND completes with an error too. Hardware (mlx5) and the simulator report the receive as
/// `LocalLength`; Soft-RoCE reports `LocalQueueOperation` (kernel 6.1) or
/// `RemoteInvalidRequest` (later kernels) on it, so those are accepted too. The sender's status
/// differs between NICs (`RemoteInvalidRequest` on mlx5 and the simulator, `RemoteOperation` on
/// Soft-RoCE 6.1).
pub fn recv_too_small_fails_the_receive<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let src = source(env.a(), &pattern(5, 64));
    let dst = sink(env.b(), 64);
    post_recv_buf(&mut p.b, 1, &dst, 0, 16);
    send_bytes(&mut p.a, 2, &src, 0, 64);
    let what = "64 B SEND into a 16 B receive";
    let c = wait_one(env, &mut p.b.recv_cq, what);
    assert_eq!((c.wr_id, c.qpn, c.opcode), (1, p.b.queue.qpn(), CqOpcode::Recv), "{what}: {c:?}");
    assert!(
        matches!(c.status, Status::LocalLength | Status::RemoteInvalidRequest | Status::LocalQueueOperation),
        "{what}: the receive fails with LocalLength (or, on Soft-RoCE, LocalQueueOperation or RemoteInvalidRequest): {c:?}"
    );
    let c = wait_one(env, &mut p.a.send_cq, what);
    assert_eq!((c.wr_id, c.qpn), (2, p.a.queue.qpn()), "{what}: the sender's completion: {c:?}");
    assert_ne!(c.status, Status::Success, "{what}: the SEND cannot succeed: {c:?}");
}

/// A WRITE or READ with a wrong rkey, a range running past the region's end, or into a region
/// lacking the right (WRITE without REMOTE_WRITE, READ without REMOTE_READ) completes with
/// `RemoteAccess`; the requester's queue goes to ERROR and every request outstanding behind it —
/// four SENDs in the same batch and three posted receives — is flushed exactly once with `Flushed`
/// and its own kind. Each case runs on a fresh pair.
pub fn remote_access_errors_flush_exactly_once<E: Env>(env: &E) {
    let wrong_key: fn(&RemoteRegion) -> RemoteAddr =
        |r| RemoteAddr { addr: r.addr, key: RemoteKey::from_rkey(!r.key.rkey()) };
    let past_end: fn(&RemoteRegion) -> RemoteAddr = |r| r.at(r.len - 32);
    let start: fn(&RemoteRegion) -> RemoteAddr = |r| r.at(0);
    let no_write = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let no_read = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let cases = [
        ("WRITE with a wrong rkey", REMOTE_RW, false, wrong_key),
        ("READ with a wrong rkey", REMOTE_RW, true, wrong_key),
        ("WRITE running past the region's end", REMOTE_RW, false, past_end),
        ("READ running past the region's end", REMOTE_RW, true, past_end),
        ("WRITE into a region without REMOTE_WRITE", no_write, false, start),
        ("READ from a region without REMOTE_READ", no_read, true, start),
    ];
    for (what, access, read, addr) in cases {
        remote_access_case(env, what, access, read, addr);
    }
}

/// Posting to a queue in RESET (new, or reset after an error) is refused with `Error::BadState`
/// naming RESET, on both the send and the receive side, and the refused requests never execute or
/// complete. A queue in ERROR accepts posts, as hardware does (IBTA: work requests posted in the
/// Error state complete in error), and flushes each exactly once: nothing reaches the peer.
pub fn post_in_reset_refused_in_error_flushed<E: Env>(env: &E) {
    let cfg = fit(env, QueueConfig::default());
    let mut src = source(env.a(), &pattern(9, 64));
    let a_buf = sink(env.a(), 64);
    let b_buf = sink(env.b(), 64);
    let mut a = side(env.a(), &cfg);
    let mut b = side(env.b(), &cfg);
    assert_refused(&mut a, &src, &a_buf, QueueState::Reset);

    connect(&mut a, &mut b);
    deliver(env, &mut a, &mut src, &mut b, &b_buf, 1, &pattern(9, 64));
    post_recv_buf(&mut b, 2, &b_buf, 0, 64);

    a.queue.set_error().expect("set_error");
    assert_eq!(a.queue.state(), QueueState::Error, "after set_error");
    let qpn = a.queue.qpn();
    send_bytes(&mut a, 3, &src, 0, 64);
    post_recv_buf(&mut a, 4, &a_buf, 0, 64);
    let what = "requests posted to a queue in ERROR";
    expect_exactly(env, &mut a.send_cq, qpn, &[(3, CqOpcode::Send, Status::Flushed)], what);
    expect_exactly(env, &mut a.recv_cq, qpn, &[(4, CqOpcode::Recv, Status::Flushed)], what);
    assert_eq!(a.queue.state(), QueueState::Error, "{what}: the queue stays in ERROR");

    a.queue.reset().expect("reset");
    assert_eq!(a.queue.state(), QueueState::Reset, "after reset");
    assert_refused(&mut a, &src, &a_buf, QueueState::Reset);

    expect_none(env, &mut a.send_cq, QUIET, "refused sends never complete");
    expect_none(env, &mut a.recv_cq, QUIET, "refused receives never complete");
    expect_none(env, &mut b.recv_cq, QUIET, "a SEND posted in ERROR or RESET never reaches the peer");
}

/// A full send queue refuses a post with `WouldBlock` (`is_would_block()`, naming the send side,
/// the free slots and the batch size) and posts nothing: slots come back only when completions are
/// polled, a batch larger than the free slots is refused whole while one that fits goes in, and
/// after polling and retrying the receiver gets every message exactly once, in order.
pub fn send_queue_full_would_block<E: Env>(env: &E) {
    const LEN: usize = 16;
    let cfg = fit(env, QueueConfig { send_depth: 8, recv_depth: 32, ..Default::default() });
    let depth = u64::from(cfg.send_depth);
    let total = 3 * depth;
    assert!(depth >= 3 && u64::from(cfg.recv_depth) >= total, "device queues too small: {cfg:?}");
    let mut p = pair(env, &cfg);
    let (_src, sges) = numbered_source(env.a(), total, LEN);
    let dst = sink(env.b(), total as usize * LEN);
    for i in 0..total {
        post_recv_buf(&mut p.b, 1000 + i, &dst, i as usize * LEN, LEN);
    }
    let wr = |i: u64| SendWr::send(i, &sges[i as usize]);

    for i in 0..depth {
        p.a.queue.post_send(&[wr(i)]).expect("post within the send depth");
    }
    // Every message arrived, but nothing was polled on the sender: the queue is still full.
    let mut recvs = wait_for(env, &mut p.b.recv_cq, depth as usize, "the first send_depth messages");
    expect_would_block(p.a.queue.post_send(&[wr(depth)]), 0, 1, "one more SEND into a full queue");

    let mut sends = take(env, &mut p.a.send_cq, 2, "two send completions");
    expect_would_block(
        p.a.queue.post_send(&[wr(depth), wr(depth + 1), wr(depth + 2)]),
        2,
        3,
        "a batch of 3 into 2 free slots",
    );
    p.a.queue.post_send(&[wr(depth), wr(depth + 1)]).expect("a batch that fits the free slots");

    let mut next = depth + 2;
    while next < total {
        match p.a.queue.post_send(&[wr(next)]) {
            Ok(()) => next += 1,
            Err(e) if e.is_would_block() => {
                let got = collect(env, &mut p.a.send_cq, 1, WAIT_BUDGET);
                assert!(!got.is_empty(), "queue full and no send completion within {WAIT_BUDGET:?}");
                sends.extend(got);
            }
            Err(e) => panic!("post SEND {next}: {e}"),
        }
    }
    sends.extend(wait_for(
        env,
        &mut p.a.send_cq,
        total as usize - sends.len(),
        "the remaining send completions",
    ));
    recvs.extend(wait_for(env, &mut p.b.recv_cq, (total - depth) as usize, "the remaining messages"));
    for (i, c) in sends.iter().enumerate() {
        assert_ok(c, p.a.queue.qpn(), i as u64, CqOpcode::Send, "send completions in post order");
    }
    for (i, c) in (0..total).zip(&recvs) {
        check_numbered(
            c,
            p.b.queue.qpn(),
            1000 + i,
            &dst,
            i as usize * LEN,
            i,
            LEN,
            "every message once, in order",
        );
    }
    expect_none(env, &mut p.a.send_cq, QUIET, "sender after all messages");
    expect_none(env, &mut p.b.recv_cq, QUIET, "receiver after all messages");
}

/// A batch the queue cannot take whole is refused whole: one request with more SGEs than
/// `max_send_sge` (or a receive with more than `max_recv_sge`) after valid ones fails the post
/// with `InvalidArgument`, and none of the batch executes — the backend's obligation where the
/// provider (`ibv_post_send`) would post the prefix. The queue stays READY, and the same requests
/// without the bad one then go through, once each.
pub fn invalid_batch_posts_nothing<E: Env>(env: &E) {
    let cfg = fit(
        env,
        QueueConfig { send_depth: 8, recv_depth: 8, max_send_sge: 1, max_recv_sge: 1, ..Default::default() },
    );
    let mut p = pair(env, &cfg);
    let src = source(env.a(), &pattern(81, 64));
    let dst = sink(env.b(), 256);
    let (one, two) = ([sge(&src, 0, 32)], [sge(&src, 0, 16), sge(&src, 16, 16)]);
    let bad = [SendWr::send(1, &one), SendWr::send(2, &one), SendWr::send(3, &two)];
    match p.a.queue.post_send(&bad) {
        Err(Error::InvalidArgument(_)) => {}
        other => {
            panic!("a batch with a 2-SGE SEND on a 1-SGE queue: expected InvalidArgument, got {other:?}")
        }
    }
    let (r1, r2) = ([sge(&dst, 0, 64)], [sge(&dst, 64, 32), sge(&dst, 96, 32)]);
    match p.b.queue.post_recv(&[RecvWr { wr_id: 10, sges: &r1 }, RecvWr { wr_id: 11, sges: &r2 }]) {
        Err(Error::InvalidArgument(_)) => {}
        other => {
            panic!("a batch with a 2-SGE receive on a 1-SGE queue: expected InvalidArgument, got {other:?}")
        }
    }
    expect_none(env, &mut p.a.send_cq, QUIET, "nothing of the refused SEND batch completes");
    expect_none(env, &mut p.b.recv_cq, QUIET, "nothing of the refused receive batch completes");
    assert_eq!(p.a.queue.state(), QueueState::Ready, "a refused post leaves the queue READY");
    let what = "the valid requests, posted again";
    for i in 0..2u64 {
        p.b.queue
            .post_recv(&[RecvWr { wr_id: 20 + i, sges: &[sge(&dst, i as usize * 64, 64)] }])
            .expect("post receive");
    }
    p.a.queue.post_send(&bad[..2]).expect("post the valid SENDs");
    expect_exactly(
        env,
        &mut p.a.send_cq,
        p.a.queue.qpn(),
        &[ok(1, CqOpcode::Send), ok(2, CqOpcode::Send)],
        what,
    );
    expect_exactly(
        env,
        &mut p.b.recv_cq,
        p.b.queue.qpn(),
        &[ok(20, CqOpcode::Recv), ok(21, CqOpcode::Recv)],
        what,
    );
    check_region(&dst, 0, &pattern(81, 32), what);
    check_region(&dst, 64, &pattern(81, 32), what);
}

/// Receiver not ready with `rnr_retry = 7` (retry forever): a SEND to a peer with no receive
/// posted does not complete, even across many RNR timer periods, and the queue stays READY; once a
/// receive is posted the SEND completes successfully with its data.
pub fn rnr_then_success<E: Env>(env: &E) {
    let mut p = pair(env, &rnr_config(env, 7));
    let data = pattern(21, 100);
    let src = source(env.a(), &data);
    let dst = sink(env.b(), 128);
    send_bytes(&mut p.a, 1, &src, 0, 100);
    // 20 ms is 400 periods of the 50 µs RNR timer: far past any finite retry count.
    expect_none(env, &mut p.a.send_cq, Duration::from_millis(20), "a SEND while the peer has no receive");
    assert_eq!(p.a.queue.state(), QueueState::Ready, "RNR with rnr_retry = 7 is not an error");
    post_recv_buf(&mut p.b, 2, &dst, 0, 128);
    let what = "SEND after the receive was posted";
    let c = recv_ok(env, &mut p.b, 2, CqOpcode::Recv, what);
    assert_eq!(c.byte_len, 100, "{what}: {c:?}");
    check_region(&dst, 0, &data, what);
    send_ok(env, &mut p.a, 1, CqOpcode::Send, what);
}

/// Receiver not ready with a finite budget (`rnr_retry = 2`): the SEND completes with
/// `RnrRetryExceeded`, the queue goes to ERROR, and the rest of the batch and the queue's posted
/// receive are flushed exactly once.
pub fn rnr_retry_exceeded<E: Env>(env: &E) {
    let mut p = pair(env, &rnr_config(env, 2));
    let src = source(env.a(), &pattern(22, 64));
    let a_buf = sink(env.a(), 64);
    post_recv_buf(&mut p.a, 10, &a_buf, 0, 64);
    let (s1, s2) = ([sge(&src, 0, 32)], [sge(&src, 32, 32)]);
    p.a.queue.post_send(&[SendWr::send(1, &s1), SendWr::send(2, &s2)]).expect("post SENDs");
    let what = "SENDs to a peer that never posts a receive";
    let qpn = p.a.queue.qpn();
    let want = [(1, CqOpcode::Send, Status::RnrRetryExceeded), (2, CqOpcode::Send, Status::Flushed)];
    expect_exactly(env, &mut p.a.send_cq, qpn, &want, what);
    assert_eq!(p.a.queue.state(), QueueState::Error, "{what}: the queue fails");
    expect_exactly(env, &mut p.a.recv_cq, qpn, &[(10, CqOpcode::Recv, Status::Flushed)], what);
}

/// A peer that is gone (its queue in ERROR: it ignores every packet) with the default
/// `retry_count` of 7 — seven retransmissions, as IBTA defines it; only `rnr_retry` 7 means
/// forever — and a short ACK timeout: the SEND fails with `RetryExceeded` and the next one is
/// flushed; the requester's queue goes to ERROR. (Soft-RoCE reads a `retry_cnt` of 7 as forever;
/// the verbs backend gives it 6.)
pub fn retry_exceeded_when_the_peer_is_gone<E: Env>(env: &E) {
    let cfg = fit(
        env,
        QueueConfig { timeout: AckTimeout::at_least(Duration::from_millis(10)), ..QueueConfig::default() },
    );
    assert_eq!(cfg.retry_count, 7, "the default retry count");
    let mut p = pair(env, &cfg);
    p.b.queue.set_error().expect("the peer fails");
    let src = source(env.a(), &pattern(91, 32));
    let (s1, s2) = ([sge(&src, 0, 16)], [sge(&src, 16, 16)]);
    p.a.queue.post_send(&[SendWr::send(1, &s1), SendWr::send(2, &s2)]).expect("post SENDs");
    let what = "SENDs to a peer that is gone";
    let want = [(1, CqOpcode::Send, Status::RetryExceeded), (2, CqOpcode::Send, Status::Flushed)];
    expect_exactly(env, &mut p.a.send_cq, p.a.queue.qpn(), &want, what);
    assert_eq!(p.a.queue.state(), QueueState::Error, "{what}: the requester's queue fails");
}

/// Dropping a region revokes its keys: a peer's WRITE through a `RemoteRegion` handed out before
/// the drop (which worked before it) fails with `RemoteAccess`, and a SEND whose SGE was built
/// from a local region since dropped fails with `LocalProtection` (`LocalQueueOperation` on
/// Soft-RoCE) and delivers nothing; either way the requester's queue goes to ERROR.
pub fn deregistered_keys_stop_working<E: Env>(env: &E) {
    dropped_remote_region(env);
    dropped_local_region(env);
}

/// ERROR → RESET → READY recovers a connection: `set_error` flushes each queue's outstanding
/// receives exactly once (the drain the contract asks for before a reset), both queues reach
/// RESET, reconnect with fresh `info()`, and traffic flows both ways with no stale completion.
pub fn error_reset_ready_recovers<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let mut a_src = region(env.a(), 256, Access::empty(), "A's send source");
    let mut b_src = region(env.b(), 256, Access::empty(), "B's send source");
    let (a_dst, b_dst) = (sink(env.a(), 256), sink(env.b(), 256));
    deliver(env, &mut p.a, &mut a_src, &mut p.b, &b_dst, 1, &pattern(31, 200));

    post_recv_buf(&mut p.a, 10, &a_dst, 0, 128);
    post_recv_buf(&mut p.a, 11, &a_dst, 128, 128);
    post_recv_buf(&mut p.b, 20, &b_dst, 0, 256);
    let (aq, bq) = (p.a.queue.qpn(), p.b.queue.qpn());

    p.a.queue.set_error().expect("set_error on A");
    assert_eq!(p.a.queue.state(), QueueState::Error, "A after set_error");
    let flushed = [(10, CqOpcode::Recv, Status::Flushed), (11, CqOpcode::Recv, Status::Flushed)];
    expect_exactly(env, &mut p.a.recv_cq, aq, &flushed, "A's receives after set_error");
    expect_none(env, &mut p.a.send_cq, QUIET, "A had no send outstanding");

    p.b.queue.set_error().expect("set_error on B");
    expect_exactly(
        env,
        &mut p.b.recv_cq,
        bq,
        &[(20, CqOpcode::Recv, Status::Flushed)],
        "B's receive after set_error",
    );
    p.b.queue.reset().expect("reset B");
    assert_eq!(p.b.queue.state(), QueueState::Reset, "B after reset");
    p.a.queue.reset().expect("reset A");
    assert_eq!(p.a.queue.state(), QueueState::Reset, "A after reset");

    connect(&mut p.a, &mut p.b);
    deliver(env, &mut p.a, &mut a_src, &mut p.b, &b_dst, 2, &pattern(32, 200));
    deliver(env, &mut p.b, &mut b_src, &mut p.a, &a_dst, 3, &pattern(33, 150));
    for (cq, what) in [
        (&mut p.a.send_cq, "A send"),
        (&mut p.a.recv_cq, "A recv"),
        (&mut p.b.send_cq, "B send"),
        (&mut p.b.recv_cq, "B recv"),
    ] {
        expect_none(env, cq, QUIET, &format!("{what} CQ after recovery"));
    }
}

/// `reset` discards: a queue reset straight from READY, or from ERROR before its flushes were
/// polled, never delivers a completion of its earlier life — not after the reset, and not after
/// it is reconnected and used again (mlx5 purges the CQ on RESET; a backend over a provider that
/// does not must hide the stale entries). The new connection's completions are its own.
pub fn reset_discards_unpolled_completions<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let mut a_src = region(env.a(), 256, Access::empty(), "A's send source");
    let (a_dst, b_dst) = (sink(env.a(), 256), sink(env.b(), 256));
    let aq = p.a.queue.qpn();
    // From READY: two receives outstanding, reset without polling anything.
    post_recv_buf(&mut p.a, 10, &a_dst, 0, 128);
    post_recv_buf(&mut p.a, 11, &a_dst, 128, 128);
    p.a.queue.reset().expect("reset A from READY");
    assert_eq!(p.a.queue.state(), QueueState::Reset, "A after reset");
    expect_none(env, &mut p.a.recv_cq, QUIET, "A's discarded receives after reset");
    // From ERROR with the flush of a receive (and of a SEND posted in ERROR) not yet polled.
    p.b.queue.set_error().expect("set_error B");
    p.b.queue.reset().expect("reset B");
    connect(&mut p.a, &mut p.b);
    post_recv_buf(&mut p.a, 12, &a_dst, 0, 128);
    p.a.queue.set_error().expect("set_error A");
    send_bytes(&mut p.a, 13, &a_src, 0, 16);
    p.a.queue.reset().expect("reset A from ERROR");
    p.b.queue.set_error().expect("set_error B again");
    p.b.queue.reset().expect("reset B again");
    connect(&mut p.a, &mut p.b);
    let c = deliver(env, &mut p.a, &mut a_src, &mut p.b, &b_dst, 20, &pattern(35, 100));
    assert_eq!(c.wr_id, 20, "the new connection's first completion is its own");
    expect_none(env, &mut p.a.recv_cq, QUIET, "A's receive CQ: nothing of the earlier lives");
    expect_none(env, &mut p.a.send_cq, QUIET, "A's send CQ: nothing of the earlier lives");
    let _ = aq;
}

/// An INLINE SEND copies its payload at post time: overwriting the source right after
/// `post_send` returns does not change what the receiver gets, with one SGE and with two.
/// (Skipped with a message when the device supports no inline data.)
pub fn inline_send<E: Env>(env: &E) {
    let cfg = fit(env, QueueConfig::default());
    let n = cfg.max_inline.min(64) as usize;
    if n == 0 {
        eprintln!("inline_send: the device supports no inline data (max_inline = 0); nothing to check");
        return;
    }
    let mut p = pair(env, &cfg);
    let mut src = region(env.a(), 256, Access::empty(), "inline source");
    let dst = sink(env.b(), 256);
    let mut cases: Vec<Vec<Piece>> = vec![vec![(0, 0, n)]];
    if cfg.max_send_sge >= 2 && n >= 2 {
        cases.push(vec![(0, 100, n / 2), (0, 10, n - n / 2)]);
    }
    for (i, pieces) in cases.iter().enumerate() {
        let what = format!("INLINE SEND of {n} B in {} SGE(s)", pieces.len());
        src.write(0, &pattern(0x40 + i as u8, 256)).expect("fill inline source");
        let srcs = std::slice::from_ref(&src);
        let original = gathered(srcs, pieces);
        post_recv_buf(&mut p.b, i as u64, &dst, 0, 256);
        let sges = sges_of(srcs, pieces);
        let wr = SendWr::send(10 + i as u64, &sges).with_flags(WrFlags::SIGNALED | WrFlags::INLINE);
        p.a.queue.post_send(&[wr]).expect("post INLINE SEND");
        src.write(0, &pattern(0xEE, 256)).expect("overwrite the source after posting");
        let c = recv_ok(env, &mut p.b, i as u64, CqOpcode::Recv, &what);
        assert_eq!(c.byte_len as usize, n, "{what}: {c:?}");
        check_region(&dst, 0, &original, &what);
        send_ok(env, &mut p.a, 10 + i as u64, CqOpcode::Send, &what);
    }
}

/// The CQ event fd: an armed CQ has no event before a completion, gets one (`ack_events() >= 1`)
/// after a completion arrives, on the send and the receive side, and the completion is then
/// pollable; one arm gives one event (the next completion without re-arming raises none), and
/// re-arming gives another.
pub fn cq_event_fd_after_arm<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let src = source(env.a(), &pattern(41, 48));
    let dst = sink(env.b(), 48);
    for i in 0..3 {
        post_recv_buf(&mut p.b, 10 + i, &dst, i as usize * 16, 16);
    }
    assert!(p.a.send_cq.event_fd() >= 0, "event_fd is a file descriptor");
    p.a.send_cq.arm(ArmMode::Any).expect("arm send CQ");
    p.b.recv_cq.arm(ArmMode::Any).expect("arm recv CQ");
    env.progress();
    assert_eq!(p.a.send_cq.ack_events().expect("ack_events"), 0, "no completion, no event");

    send_bytes(&mut p.a, 1, &src, 0, 16);
    wait_event(env, &mut p.a.send_cq, "send CQ armed for any completion");
    send_ok(env, &mut p.a, 1, CqOpcode::Send, "the completion behind the send CQ's event");
    wait_event(env, &mut p.b.recv_cq, "recv CQ armed for any completion");
    recv_ok(env, &mut p.b, 10, CqOpcode::Recv, "the completion behind the recv CQ's event");

    send_bytes(&mut p.a, 2, &src, 16, 16);
    send_ok(env, &mut p.a, 2, CqOpcode::Send, "a SEND after the event, not re-armed");
    recv_ok(env, &mut p.b, 11, CqOpcode::Recv, "a SEND after the event, not re-armed");
    expect_no_event(env, &mut p.a.send_cq, "send CQ not re-armed after its event");
    expect_no_event(env, &mut p.b.recv_cq, "recv CQ not re-armed after its event");

    p.a.send_cq.arm(ArmMode::Any).expect("re-arm send CQ");
    send_bytes(&mut p.a, 3, &src, 32, 16);
    wait_event(env, &mut p.a.send_cq, "re-armed send CQ");
    send_ok(env, &mut p.a, 3, CqOpcode::Send, "the completion behind the re-armed event");
    recv_ok(env, &mut p.b, 12, CqOpcode::Recv, "the third SEND");
}

/// Arming a CQ that already holds an unpolled completion loses nothing: on devices that arm
/// against the consumer index the event comes at once ([`Env::arm_signals_queued_completions`]),
/// on others it may not, and on all a poll after arming finds the completion. Drained and armed
/// again, the CQ stays quiet until the next completion, which raises the event.
pub fn arm_with_a_completion_already_queued<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let src = source(env.a(), &pattern(47, 32));
    let dst = sink(env.b(), 32);
    post_recv_buf(&mut p.b, 10, &dst, 0, 16);
    post_recv_buf(&mut p.b, 11, &dst, 16, 16);
    p.b.recv_cq.arm(ArmMode::Any).expect("arm recv CQ");
    send_bytes(&mut p.a, 1, &src, 0, 16);
    wait_event(env, &mut p.b.recv_cq, "the first receive");
    send_ok(env, &mut p.a, 1, CqOpcode::Send, "the first SEND");

    // The receive is in the CQ, unpolled: arm again.
    p.b.recv_cq.arm(ArmMode::Any).expect("re-arm with a completion queued");
    env.progress();
    if env.arm_signals_queued_completions() {
        wait_event(env, &mut p.b.recv_cq, "arming with a completion already queued");
    }
    recv_ok(env, &mut p.b, 10, CqOpcode::Recv, "the completion queued before re-arming");

    p.b.recv_cq.arm(ArmMode::Any).expect("arm the drained CQ");
    // An event raised at arm time above may still be unread on devices that do not promise one.
    let _ = p.b.recv_cq.ack_events().expect("ack_events");
    expect_no_event(env, &mut p.b.recv_cq, "a drained, armed CQ before the next completion");
    send_bytes(&mut p.a, 2, &src, 16, 16);
    wait_event(env, &mut p.b.recv_cq, "the next completion");
    recv_ok(env, &mut p.b, 11, CqOpcode::Recv, "the completion behind the event");
    send_ok(env, &mut p.a, 2, CqOpcode::Send, "the second SEND");
}

/// A CQ armed with `ArmMode::Solicited` stays quiet for an ordinary receive and raises an event
/// for the receive of a SOLICITED message.
pub fn cq_event_solicited_only<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let src = source(env.a(), &pattern(42, 32));
    let dst = sink(env.b(), 32);
    post_recv_buf(&mut p.b, 10, &dst, 0, 16);
    post_recv_buf(&mut p.b, 11, &dst, 16, 16);
    p.b.recv_cq.arm(ArmMode::Solicited).expect("arm for solicited events");

    send_bytes(&mut p.a, 1, &src, 0, 16);
    recv_ok(env, &mut p.b, 10, CqOpcode::Recv, "an ordinary SEND");
    expect_no_event(env, &mut p.b.recv_cq, "an ordinary receive on a CQ armed for solicited events");

    let sges = [sge(&src, 16, 16)];
    let wr = SendWr::send(2, &sges).with_flags(WrFlags::SIGNALED | WrFlags::SOLICITED);
    p.a.queue.post_send(&[wr]).expect("post SOLICITED SEND");
    wait_event(env, &mut p.b.recv_cq, "the receive of a SOLICITED SEND");
    recv_ok(env, &mut p.b, 11, CqOpcode::Recv, "the SOLICITED SEND");
    expect_done(
        env,
        &mut p.a.send_cq,
        p.a.queue.qpn(),
        &[ok(1, CqOpcode::Send), ok(2, CqOpcode::Send)],
        "SENDs",
    );
}

/// One CQ may take both a queue's send and its receive completions: with a shared CQ on each
/// side, each CQ gets exactly its queue's send completion and receive completion, each naming the
/// queue.
pub fn shared_cq_for_send_and_recv<E: Env>(env: &E) {
    let cfg = fit(env, QueueConfig { send_depth: 8, recv_depth: 8, ..Default::default() });
    let shared = |dev: &E::Dev| {
        let cq = dev.create_cq(cfg.send_depth + cfg.recv_depth).expect("create shared CQ");
        let queue = dev.create_queue(&cfg, &cq, &cq).expect("create queue on a shared CQ");
        (queue, cq)
    };
    let ((mut qa, mut cqa), (mut qb, mut cqb)) = (shared(env.a()), shared(env.b()));
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).expect("connect A to B");
    qb.connect(&ia).expect("connect B to A");

    let (a_data, b_data) = (pattern(51, 40), pattern(52, 24));
    let (a_src, b_src) = (source(env.a(), &a_data), source(env.b(), &b_data));
    let (a_dst, b_dst) = (sink(env.a(), 64), sink(env.b(), 64));
    let recv = |q: &mut <E::Dev as Device>::Queue, id, mr: &Region<E>| {
        q.post_recv(&[RecvWr { wr_id: id, sges: &[sge(mr, 0, 64)] }]).expect("post receive")
    };
    recv(&mut qa, 10, &a_dst);
    recv(&mut qb, 20, &b_dst);
    qa.post_send(&[SendWr::send(1, &[sge(&a_src, 0, 40)])]).expect("post SEND A→B");
    qb.post_send(&[SendWr::send(2, &[sge(&b_src, 0, 24)])]).expect("post SEND B→A");

    for (cq, q, send_id, recv_id, len, what) in
        [(&mut cqa, &qa, 1, 10, 24, "A's shared CQ"), (&mut cqb, &qb, 2, 20, 40, "B's shared CQ")]
    {
        let mut got = wait_for(env, cq, 2, what);
        got.sort_by_key(|c| c.wr_id);
        assert_ok(&got[0], q.qpn(), send_id, CqOpcode::Send, what);
        assert_ok(&got[1], q.qpn(), recv_id, CqOpcode::Recv, what);
        assert_eq!(got[1].byte_len, len, "{what}: {:?}", got[1]);
        expect_none(env, cq, QUIET, what);
    }
    check_region(&b_dst, 0, &a_data, "A→B over shared CQs");
    check_region(&a_dst, 0, &b_data, "B→A over shared CQs");
}

/// Several CQs on one event channel: the channel's fd is each CQ's `event_fd`; nothing is pending
/// before a completion; a completion on an armed CQ makes `take_events` name that CQ's `id` and no
/// other; after polling and re-arming, a completion on the second CQ names the second.
pub fn shared_event_channel<E: Env>(env: &E) {
    use std::os::fd::{AsFd, AsRawFd};
    let cfg = fit(env, QueueConfig { send_depth: 8, recv_depth: 8, ..Default::default() });
    let channel = env.a().create_channel().expect("create event channel");
    let on_channel = || {
        let cq = env.a().create_cq_on(cfg.send_depth + cfg.recv_depth, &channel).expect("CQ on the channel");
        let queue = env.a().create_queue(&cfg, &cq, &cq).expect("create queue");
        (queue, cq)
    };
    let ((mut q1, mut cq1), (mut q2, mut cq2)) = (on_channel(), on_channel());
    assert_ne!(cq1.id(), cq2.id(), "two live CQs have different ids");
    let fd = channel.as_fd().as_raw_fd();
    assert_eq!((cq1.event_fd(), cq2.event_fd()), (fd, fd), "CQs on a channel report its fd");
    let mut peers = [side(env.b(), &cfg), side(env.b(), &cfg)];
    let [p1, p2] = &mut peers;
    for (q, peer) in [(&mut q1, p1), (&mut q2, p2)] {
        let (mine, theirs) = (q.info(), peer.queue.info());
        q.connect(&theirs).expect("connect A's queue");
        peer.queue.connect(&mine).expect("connect B's queue");
    }
    let dst = sink(env.a(), 128);
    let src = source(env.b(), &pattern(61, 32));
    for (i, q) in [&mut q1, &mut q2].into_iter().enumerate() {
        q.post_recv(&[RecvWr { wr_id: i as u64, sges: &[sge(&dst, i * 64, 64)] }]).expect("post receive");
    }
    cq1.arm(ArmMode::Any).expect("arm CQ 1");
    cq2.arm(ArmMode::Any).expect("arm CQ 2");
    let mut ids = [0u64; 8];
    env.progress();
    assert_eq!(channel.take_events(&mut ids).expect("take_events"), 0, "no event before a completion");
    for (i, (cq, id, other)) in [(&mut cq1, 0u64, cq2.id()), (&mut cq2, 1, 0)].into_iter().enumerate() {
        let what = format!("a SEND to the queue of CQ {}", i + 1);
        let want = cq.id();
        send_bytes(&mut peers[i], 100 + i as u64, &src, 0, 32);
        let mut waited = Duration::ZERO;
        let n = loop {
            env.progress();
            let n = channel.take_events(&mut ids).expect("take_events");
            if n > 0 {
                break n;
            }
            assert!(waited < WAIT_BUDGET, "{what}: no event on the channel within {WAIT_BUDGET:?}");
            env.advance(WAIT_TICK);
            waited += WAIT_TICK;
        };
        assert!(ids[..n].iter().all(|&x| x == want), "{what}: events {:?}, want only {want}", &ids[..n]);
        if i == 0 {
            assert!(!ids[..n].contains(&other), "{what}: the other CQ did not fire");
        }
        let c = wait_one(env, cq, &what);
        assert_ok(&c, c.qpn, id, CqOpcode::Recv, &what);
        cq.arm(ArmMode::Any).expect("re-arm");
    }
    check_region(&dst, 0, &pattern(61, 32), "the first SEND");
    check_region(&dst, 64, &pattern(61, 32), "the second SEND");
}

/// Memory the caller owns, registered with `register_external`: a SEND lands in it, a peer's READ
/// and WRITE reach it, and dropping the region leaves the memory (and what the NIC wrote) to the
/// caller.
pub fn caller_memory_registration<E: Env>(env: &E) {
    const LEN: usize = 4096;
    let mut p = default_pair(env);
    let mut mine = vec![0u8; LEN].into_boxed_slice();
    mine[2048..2048 + 64].copy_from_slice(&pattern(71, 64));
    // SAFETY: `mine` is a live heap allocation of LEN bytes that is neither moved nor freed
    // before `mr` is dropped below, and is not touched through `mine` while `mr` lives.
    let mr =
        unsafe { env.a().register_external(mine.as_mut_ptr(), LEN, REMOTE_RW) }.expect("register_external");
    assert_eq!((mr.len(), mr.addr()), (LEN, mine.as_ptr() as u64), "the region is the caller's memory");
    post_recv_buf(&mut p.a, 1, &mr, 0, 128);
    let data = pattern(72, 100);
    let src = source(env.b(), &data);
    send_bytes(&mut p.b, 2, &src, 0, 100);
    let what = "a SEND into caller memory";
    recv_ok(env, &mut p.a, 1, CqOpcode::Recv, what);
    send_ok(env, &mut p.b, 2, CqOpcode::Send, what);
    let remote = mr.remote();
    let got = sink(env.b(), 64);
    post_op(&mut p.b, 3, SendOp::Read(remote.at(2048)), &got, 0, 64);
    send_ok(env, &mut p.b, 3, CqOpcode::Read, "a READ from caller memory");
    check_region(&got, 0, &pattern(71, 64), "a READ from caller memory");
    let w = source(env.b(), &pattern(73, 32));
    post_op(&mut p.b, 4, SendOp::Write(remote.at(1024)), &w, 0, 32);
    send_ok(env, &mut p.b, 4, CqOpcode::Write, "a WRITE into caller memory");
    drop(mr);
    assert_bytes(&mine[..100], &data, "the SEND's bytes, in the caller's memory after the region is gone");
    assert_bytes(&mine[1024..1056], &pattern(73, 32), "the WRITE's bytes, in the caller's memory");
}

// ------------------------------------------------------------------------------------------------
// Parts of scenarios
// ------------------------------------------------------------------------------------------------

/// One run of [`cq_wraps_without_loss`]: CQs of `depth`, `messages` SENDs, `depth` in flight.
fn cq_wrap_run<E: Env>(env: &E, depth: u32, messages: u64) {
    const LEN: usize = 16;
    let what = format!("CQs of depth {depth}, {messages} SENDs");
    let cfg = fit(env, QueueConfig { send_depth: depth, recv_depth: depth, ..Default::default() });
    assert_eq!(
        (cfg.send_depth, cfg.recv_depth),
        (depth, depth),
        "{what}: the device cannot make such queues"
    );
    let side_with_cq = |dev: &E::Dev| {
        let send_cq = dev.create_cq(depth).expect("create send CQ");
        let recv_cq = dev.create_cq(depth).expect("create recv CQ");
        let queue = dev.create_queue(&cfg, &send_cq, &recv_cq).expect("create queue");
        Side::<E::Dev> { queue, send_cq, recv_cq }
    };
    let (mut a, mut b) = (side_with_cq(env.a()), side_with_cq(env.b()));
    connect(&mut a, &mut b);
    let (aq, bq) = (a.queue.qpn(), b.queue.qpn());
    let in_flight = u64::from(depth);
    let slot = |i: u64| (i % in_flight) as usize * LEN;
    let mut src = region(env.a(), depth as usize * LEN, Access::empty(), "send slots");
    let dst = sink(env.b(), depth as usize * LEN);
    for i in 0..in_flight {
        post_recv_buf(&mut b, i, &dst, slot(i), LEN);
    }

    let (mut sent, mut send_done, mut recv_done) = (0u64, 0u64, 0u64);
    let mut buf = [Completion::default(); 3];
    let mut idle = Duration::ZERO;
    while send_done < messages || recv_done < messages {
        let mut moved = false;
        while sent < messages && sent - send_done < in_flight {
            src.write(slot(sent), &numbered(sent, LEN)).expect("fill send slot");
            send_bytes(&mut a, sent, &src, slot(sent), LEN);
            sent += 1;
            moved = true;
        }
        env.progress();
        let n = a.send_cq.poll(&mut buf).unwrap_or_else(|e| panic!("{what}: poll send CQ: {e}"));
        for c in &buf[..n] {
            assert_ok(c, aq, send_done, CqOpcode::Send, &what);
            send_done += 1;
        }
        let m = b.recv_cq.poll(&mut buf).unwrap_or_else(|e| panic!("{what}: poll recv CQ: {e}"));
        for c in &buf[..m] {
            check_numbered(c, bq, recv_done, &dst, slot(recv_done), recv_done, LEN, &what);
            let next = recv_done + in_flight;
            if next < messages {
                post_recv_buf(&mut b, next, &dst, slot(next), LEN);
            }
            recv_done += 1;
        }
        if moved || n > 0 || m > 0 {
            idle = Duration::ZERO;
        } else {
            assert!(
                idle < WAIT_BUDGET,
                "{what}: stalled with {send_done} send and {recv_done} receive completions of {messages}"
            );
            env.advance(WAIT_TICK);
            idle += WAIT_TICK;
        }
    }
    expect_none(env, &mut a.send_cq, QUIET, &what);
    expect_none(env, &mut b.recv_cq, QUIET, &what);
}

/// One case of [`remote_access_errors_flush_exactly_once`], on a fresh pair: a WRITE (or READ if
/// `read`) of 64 B at `addr(target)` into a 4 KiB region registered with `access`, followed in the
/// same batch by four SENDs, with three receives posted on the requester.
fn remote_access_case<E: Env>(
    env: &E,
    what: &str,
    access: Access,
    read: bool,
    addr: fn(&RemoteRegion) -> RemoteAddr,
) {
    let mut p = default_pair(env);
    let target = region(env.b(), 4096, access, "target region");
    let local = region(env.a(), 5 * 64, Access::LOCAL_WRITE, "local buffer");
    // Receives on B, so a SEND wrongly carried out after the failure would complete and show.
    let b_bufs = sink(env.b(), 4 * 64);
    for i in 0..4 {
        post_recv_buf(&mut p.b, 300 + i, &b_bufs, i as usize * 64, 64);
    }
    let a_bufs = sink(env.a(), 3 * 64);
    for i in 0..3 {
        post_recv_buf(&mut p.a, 200 + i, &a_bufs, i as usize * 64, 64);
    }

    let remote = addr(&target.remote());
    let (op, opcode) =
        if read { (SendOp::Read(remote), CqOpcode::Read) } else { (SendOp::Write(remote), CqOpcode::Write) };
    let sges: Vec<[Sge; 1]> = (0..5).map(|i| [sge(&local, i * 64, 64)]).collect();
    let mut batch = vec![SendWr::send(100, &sges[0]).with_op(op)];
    batch.extend((1..5).map(|i| SendWr::send(100 + i as u64, &sges[i])));
    p.a.queue.post_send(&batch).expect("post the failing request and four SENDs");

    let qpn = p.a.queue.qpn();
    let got = wait_for(env, &mut p.a.send_cq, 5, what);
    assert_nak_status(env, &got[0], qpn, (100, opcode, Status::RemoteAccess), what);
    for (c, id) in got[1..].iter().zip(101..) {
        assert_done(c, qpn, (id, CqOpcode::Send, Status::Flushed), what);
    }
    assert_eq!(p.a.queue.state(), QueueState::Error, "{what}: the requester's queue fails");
    let flushed: Vec<Want> = (200..203).map(|id| (id, CqOpcode::Recv, Status::Flushed)).collect();
    expect_done(env, &mut p.a.recv_cq, qpn, &flushed, what);
    // Each request completed once: nothing more on either CQ.
    expect_none(env, &mut p.a.send_cq, QUIET, what);
    expect_none(env, &mut p.a.recv_cq, QUIET, what);
}

/// First half of [`deregistered_keys_stop_working`]: a remote region dropped after its
/// `RemoteRegion` was handed out.
fn dropped_remote_region<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let src = source(env.a(), &pattern(11, 64));
    let target = region(env.b(), 4096, REMOTE_RW, "WRITE target");
    let remote = target.remote();
    post_op(&mut p.a, 1, SendOp::Write(remote.at(0)), &src, 0, 64);
    send_ok(env, &mut p.a, 1, CqOpcode::Write, "WRITE before the target is dropped");
    drop(target);

    let what = "WRITE to a dropped region";
    post_op(&mut p.a, 2, SendOp::Write(remote.at(0)), &src, 0, 64);
    let c = wait_one(env, &mut p.a.send_cq, what);
    assert_nak_status(env, &c, p.a.queue.qpn(), (2, CqOpcode::Write, Status::RemoteAccess), what);
    expect_none(env, &mut p.a.send_cq, QUIET, what);
    assert_eq!(p.a.queue.state(), QueueState::Error, "{what}: the requester's queue fails");
}

/// Second half of [`deregistered_keys_stop_working`]: an SGE of a local region that was dropped.
fn dropped_local_region<E: Env>(env: &E) {
    let mut p = default_pair(env);
    let dst = sink(env.b(), 128);
    let data = pattern(12, 64);
    let stale = source(env.a(), &data);
    let sges = [sge(&stale, 0, 64)];
    post_recv_buf(&mut p.b, 1, &dst, 0, 64);
    post_recv_buf(&mut p.b, 2, &dst, 64, 64);
    p.a.queue.post_send(&[SendWr::send(10, &sges)]).expect("post SEND");
    send_ok(env, &mut p.a, 10, CqOpcode::Send, "SEND before the source is dropped");
    recv_ok(env, &mut p.b, 1, CqOpcode::Recv, "SEND before the source is dropped");
    check_region(&dst, 0, &data, "SEND before the source is dropped");
    drop(stale);

    let what = "SEND from a dropped region";
    // Posting checks no key; the device does, when it moves the data.
    p.a.queue.post_send(&[SendWr::send(11, &sges)]).expect("post SEND with a stale lkey");
    let c = wait_one(env, &mut p.a.send_cq, what);
    assert_eq!((c.wr_id, c.qpn, c.opcode), (11, p.a.queue.qpn(), CqOpcode::Send), "{what}: {c:?}");
    // mlx5 and the simulator: LOC_PROT_ERR. Soft-RoCE (6.1) fails the key lookup as an invalid
    // request and reports LOC_QP_OP_ERR.
    assert!(
        matches!(c.status, Status::LocalProtection | Status::LocalQueueOperation),
        "{what}: LocalProtection (or LocalQueueOperation on Soft-RoCE): {c:?}"
    );
    expect_none(env, &mut p.a.send_cq, QUIET, what);
    assert_eq!(p.a.queue.state(), QueueState::Error, "{what}: the requester's queue fails");
    expect_none(env, &mut p.b.recv_cq, QUIET, "a SEND from a dropped region delivers nothing");
}

/// A SEND gathering `send` pieces of `srcs` on A, received by a receive scattering over `recv`
/// pieces of `dsts` on B.
#[track_caller]
fn send_gather_scatter<E: Env>(
    env: &E,
    p: &mut Pair<E::Dev>,
    (srcs, send): (&[Region<E>], &[Piece]),
    (dsts, recv): (&[Region<E>], &[Piece]),
    wr_id: u64,
    what: &str,
) {
    let msg = gathered(srcs, send);
    let (send_sges, recv_sges) = (sges_of(srcs, send), sges_of(dsts, recv));
    p.b.queue.post_recv(&[RecvWr { wr_id, sges: &recv_sges }]).expect("post scattering receive");
    p.a.queue.post_send(&[SendWr::send(wr_id, &send_sges)]).expect("post gathering SEND");
    let c = recv_ok(env, &mut p.b, wr_id, CqOpcode::Recv, what);
    assert_eq!(c.byte_len as usize, msg.len(), "{what}: {c:?}");
    assert_scattered(dsts, recv, &msg, what);
    send_ok(env, &mut p.a, wr_id, CqOpcode::Send, what);
}

// ------------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------------

/// The kinds of send-side request, for scenarios that mix them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
}

impl Kind {
    /// The opcode of the request's own completion.
    fn opcode(self) -> CqOpcode {
        match self {
            Kind::Send | Kind::SendImm => CqOpcode::Send,
            Kind::Write | Kind::WriteImm => CqOpcode::Write,
            Kind::Read => CqOpcode::Read,
        }
    }

    /// Whether it takes a receive at the peer.
    fn consumes_receive(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::WriteImm)
    }
}

/// Atomics, where both devices do them ([`DeviceCaps::atomics`]; skipped otherwise): a
/// fetch-and-add and two compare-and-swaps (one that matches, one that does not) return the
/// word's old value in their 8-byte SGE, complete as `FetchAdd` / `CompareSwap` with byte count 8,
/// and leave the word as a CPU's atomics would; a batch of eight fetch-and-adds on one word sees
/// eight distinct old values. An SGE of another size, an INLINE atomic and an unaligned word are
/// refused at post (rxe's provider refuses the last itself); a region without `REMOTE_ATOMIC` is
/// a `RemoteAccess` that fails the requester's queue.
pub fn atomics_compare_swap_and_fetch_add<E: Env>(env: &E) {
    if !caps(env).atomics {
        eprintln!("atomics_compare_swap_and_fetch_add: skipped, a device does not do atomics");
        return;
    }
    let word = |v: u64| v.to_ne_bytes();
    let access = Access::LOCAL_WRITE | Access::REMOTE_ATOMIC;
    let mut p = default_pair(env);
    let mut target = region(env.b(), 4096, access, "atomic target");
    target.write(8, &word(100)).expect("initialise the word");
    let remote = target.remote();
    let local = region(env.a(), 16 * 8, Access::LOCAL_WRITE, "old values");
    let what = "FETCH_ADD 5 on 100";
    post_op(&mut p.a, 1, SendOp::FetchAdd { remote: remote.at(8), add: 5 }, &local, 0, 8);
    let c = send_ok(env, &mut p.a, 1, CqOpcode::FetchAdd, what);
    assert_eq!(c.byte_len, 8, "{what}: byte_len {c:?}");
    check_region(&local, 0, &word(100), what);
    check_region(&target, 8, &word(105), what);
    let what = "COMPARE_SWAP 105 -> 7 on 105";
    post_op(&mut p.a, 2, SendOp::CompareSwap { remote: remote.at(8), compare: 105, swap: 7 }, &local, 8, 8);
    send_ok(env, &mut p.a, 2, CqOpcode::CompareSwap, what);
    check_region(&local, 8, &word(105), what);
    check_region(&target, 8, &word(7), what);
    let what = "COMPARE_SWAP 999 -> 1 on 7 (no match)";
    post_op(&mut p.a, 3, SendOp::CompareSwap { remote: remote.at(8), compare: 999, swap: 1 }, &local, 16, 8);
    send_ok(env, &mut p.a, 3, CqOpcode::CompareSwap, what);
    check_region(&local, 16, &word(7), what);
    check_region(&target, 8, &word(7), what);

    let what = "eight FETCH_ADDs of 1 in one batch";
    let sges: Vec<[Sge; 1]> = (0..8).map(|i| [sge(&local, 64 + i * 8, 8)]).collect();
    let batch: Vec<SendWr<'_>> = (0..8)
        .map(|i| {
            SendWr::send(10 + i as u64, &sges[i]).with_op(SendOp::FetchAdd { remote: remote.at(8), add: 1 })
        })
        .collect();
    p.a.queue.post_send(&batch).expect("post eight FETCH_ADDs");
    let want: Vec<Want> = (10..18).map(|id| (id, CqOpcode::FetchAdd, Status::Success)).collect();
    expect_done(env, &mut p.a.send_cq, p.a.queue.qpn(), &want, what);
    let olds: Vec<u8> = (7..15u64).flat_map(word).collect();
    check_region(&local, 64, &olds, what);
    check_region(&target, 8, &word(15), what);

    let fa = SendOp::FetchAdd { remote: remote.at(8), add: 1 };
    let short = [sge(&local, 0, 4)];
    let err = p.a.queue.post_send(&[SendWr::send(20, &short).with_op(fa)]);
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "a 4-byte atomic SGE is refused at post: {err:?}");
    let one = [sge(&local, 0, 8)];
    let inline = SendWr::send(21, &one).with_op(fa).with_flags(WrFlags::SIGNALED | WrFlags::INLINE);
    let err = p.a.queue.post_send(&[inline]);
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "an INLINE atomic is refused at post: {err:?}");
    let unaligned = SendOp::CompareSwap { remote: remote.at(12), compare: 0, swap: 1 };
    let err = p.a.queue.post_send(&[SendWr::send(22, &one).with_op(unaligned)]);
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "an unaligned atomic is refused at post: {err:?}");
    expect_none(env, &mut p.a.send_cq, QUIET, "refused atomics");
    check_region(&target, 8, &word(15), "refused atomics leave the word alone");

    let what = "FETCH_ADD on a region without REMOTE_ATOMIC";
    let mut p = default_pair(env);
    let target = region(env.b(), 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE, "no-atomic target");
    let local = region(env.a(), 8, Access::LOCAL_WRITE, "old value");
    post_op(&mut p.a, 30, SendOp::FetchAdd { remote: target.remote().at(8), add: 1 }, &local, 0, 8);
    let c = wait_one(env, &mut p.a.send_cq, what);
    assert_nak_status(env, &c, p.a.queue.qpn(), (30, CqOpcode::FetchAdd, Status::RemoteAccess), what);
    assert_eq!(p.a.queue.state(), QueueState::Error, "{what}: the requester's queue fails");
}

/// Queues come and go: 1,000 queues created and destroyed one after another on one CQ are all
/// created, each with a number that its info gives peers and that differs from the number of the
/// queue destroyed just before it (verbs: 24-bit QPNs; the simulator: a reused slot gets a new
/// generation; Soft-RoCE allocates cyclically). A queue destroyed while its peer
/// still sends to it delivers nothing to a later queue of its device, even one connected to the
/// same sender (so expecting the PSNs it sends) that may have taken the destroyed queue's number
/// (the simulator reuses the slot at once, with a new generation; Soft-RoCE and NICs reuse
/// numbers only after a long cycle): packets for a number not in use are dropped.
pub fn destroyed_queue_numbers_never_deliver<E: Env>(env: &E) {
    let small = fit(
        env,
        QueueConfig {
            send_depth: 1,
            recv_depth: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
            ..QueueConfig::default()
        },
    );
    let cq = env.a().create_cq(2).expect("create CQ");
    let mut previous = None;
    for i in 0..1000 {
        let q = env.a().create_queue(&small, &cq, &cq);
        let q = q.unwrap_or_else(|e| panic!("create queue #{i} (the others are destroyed): {e}"));
        assert_eq!(q.qpn(), q.info().qpn, "queue #{i}: its number is the one its info gives peers");
        assert_ne!(Some(q.qpn()), previous, "queue #{i} has the number of the queue destroyed just before");
        previous = Some(q.qpn());
    }
    drop(cq);
    let cfg = fit(env, QueueConfig::default());
    let (mut a, mut b) = (side(env.a(), &cfg), side(env.b(), &cfg));
    let info_a = a.queue.info();
    connect(&mut a, &mut b);
    drop(b);
    let mut b2 = side(env.b(), &cfg);
    b2.queue.connect(&info_a).expect("connect the later queue to the same sender");
    let dst = sink(env.b(), 4 * 64);
    for i in 0..4 {
        post_recv_buf(&mut b2, 100 + i as u64, &dst, i * 64, 64);
    }
    let src = source(env.a(), &pattern(57, 4 * 64));
    for i in 0..4 {
        send_bytes(&mut a, i as u64, &src, i * 64, 64);
    }
    let what = "SENDs to a destroyed queue";
    expect_none(env, &mut b2.recv_cq, Duration::from_millis(20), what);
    check_region(&dst, 0, &[0; 4 * 64], what);
}

/// The limits both devices support.
fn caps<E: Env>(env: &E) -> DeviceCaps {
    let (a, b) = (env.a().caps(), env.b().caps());
    DeviceCaps {
        max_queue_depth: a.max_queue_depth.min(b.max_queue_depth),
        max_cq_depth: a.max_cq_depth.min(b.max_cq_depth),
        max_send_sge: a.max_send_sge.min(b.max_send_sge),
        max_recv_sge: a.max_recv_sge.min(b.max_recv_sge),
        max_inline: a.max_inline.min(b.max_inline),
        max_msg_size: a.max_msg_size.min(b.max_msg_size),
        max_region_size: a.max_region_size.min(b.max_region_size),
        max_rd_atomic: a.max_rd_atomic.min(b.max_rd_atomic),
        max_dest_rd_atomic: a.max_dest_rd_atomic.min(b.max_dest_rd_atomic),
        atomics: a.atomics && b.atomics,
        max_shared_recv: a.max_shared_recv.min(b.max_shared_recv),
        max_shared_recv_depth: a.max_shared_recv_depth.min(b.max_shared_recv_depth),
    }
}

/// `cfg` clamped to what both devices support; queue depths leave room for the CQs of depth + 1
/// that [`side`] creates. A default ACK timeout becomes the environment's
/// ([`Env::ack_timeout`]), if it has one.
fn fit<E: Env>(env: &E, cfg: QueueConfig) -> QueueConfig {
    let c = caps(env);
    let depth = c.max_queue_depth.min(c.max_cq_depth.saturating_sub(1));
    let timeout = match env.ack_timeout() {
        Some(t) if cfg.timeout == QueueConfig::default().timeout => t,
        _ => cfg.timeout,
    };
    QueueConfig {
        timeout,
        send_depth: cfg.send_depth.min(depth),
        recv_depth: cfg.recv_depth.min(depth),
        max_send_sge: cfg.max_send_sge.min(c.max_send_sge),
        max_recv_sge: cfg.max_recv_sge.min(c.max_recv_sge),
        max_inline: cfg.max_inline.min(c.max_inline),
        ..cfg
    }
}

/// A connected pair with the default configuration, within the devices' limits.
fn default_pair<E: Env>(env: &E) -> Pair<E::Dev> {
    pair(env, &fit(env, QueueConfig::default()))
}

/// A configuration for the RNR scenarios: `rnr_retry` retries, a 50 µs RNR timer.
fn rnr_config<E: Env>(env: &E, rnr_retry: u8) -> QueueConfig {
    let cfg = QueueConfig {
        rnr_retry,
        min_rnr_timer: RnrTimer::at_least(Duration::from_micros(50)),
        ..QueueConfig::default()
    };
    fit(env, cfg)
}

/// The largest message the scenarios send: the devices' limit, at most [`MAX_TESTED_MSG`].
fn max_msg<E: Env>(env: &E) -> usize {
    let c = caps(env);
    let region = usize::try_from(c.max_region_size).unwrap_or(usize::MAX);
    (c.max_msg_size as usize).min(MAX_TESTED_MSG).min(region)
}

/// Registers `len` bytes with `access`.
#[track_caller]
fn region<D: Device>(dev: &D, len: usize, access: Access, what: &str) -> D::Region {
    dev.register(len, access).unwrap_or_else(|e| panic!("register {len} B for the {what}: {e}"))
}

/// Registers a send source (local read only) holding `data`.
#[track_caller]
fn source<D: Device>(dev: &D, data: &[u8]) -> D::Region {
    let mut mr = region(dev, data.len().max(1), Access::empty(), "send source");
    mr.write(0, data).expect("fill send source");
    mr
}

/// Registers a receive buffer (`LOCAL_WRITE`) of `len` bytes.
#[track_caller]
fn sink<D: Device>(dev: &D, len: usize) -> D::Region {
    region(dev, len, Access::LOCAL_WRITE, "receive buffer")
}

/// The payload of message `i`: a pattern with the number in its first bytes, so a lost, repeated
/// or reordered message is caught as well as a misplaced byte.
fn numbered(i: u64, len: usize) -> Vec<u8> {
    let mut v = pattern(i as u8, len);
    let n = len.min(8);
    v[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    v
}

/// A source region holding `count` numbered messages of `len` bytes, and an SGE for each.
fn numbered_source<D: Device>(dev: &D, count: u64, len: usize) -> (D::Region, Vec<[Sge; 1]>) {
    let mut mr = region(dev, count as usize * len, Access::LOCAL_WRITE, "numbered messages");
    for i in 0..count {
        mr.write(i as usize * len, &numbered(i, len)).expect("fill message slot");
    }
    let sges = (0..count as usize).map(|i| [sge(&mr, i * len, len)]).collect();
    (mr, sges)
}

/// An SGE for `len` bytes at `offset` of `mr`.
#[track_caller]
fn sge<R: MemoryRegion>(mr: &R, offset: usize, len: usize) -> Sge {
    mr.sge(offset, len).expect("SGE inside its region")
}

/// SGEs for `pieces` of `regions`.
fn sges_of<R: MemoryRegion>(regions: &[R], pieces: &[Piece]) -> Vec<Sge> {
    pieces.iter().map(|&(r, off, len)| sge(&regions[r], off, len)).collect()
}

/// The bytes `pieces` of `regions` hold, concatenated: what a gather sends.
fn gathered<R: MemoryRegion>(regions: &[R], pieces: &[Piece]) -> Vec<u8> {
    pieces.iter().flat_map(|&(r, off, len)| read_region(&regions[r], off, len)).collect()
}

/// Total length of `pieces`.
fn pieces_len(pieces: &[Piece]) -> usize {
    pieces.iter().map(|p| p.2).sum()
}

/// `n` scatter pieces over two 4 KiB regions, out of address order, for a message of `msg_len`
/// bytes: the first ones of 10, 20 and 30 bytes, the last one with 5 bytes to spare.
fn scatter_layout(n: usize, msg_len: usize) -> Vec<Piece> {
    let spots = [(1, 900, 10), (0, 50, 20), (1, 3000, 30), (0, 1200, 0)];
    let mut pieces: Vec<Piece> = spots[..n - 1].to_vec();
    let (r, off, _) = spots[n - 1];
    let rest = msg_len.checked_sub(pieces_len(&pieces)).expect("message longer than the fixed pieces");
    pieces.push((r, off, rest + 5));
    pieces
}

/// Asserts `msg` lies scattered over `pieces` of `regions` in order, each filled before the next.
#[track_caller]
fn assert_scattered<R: MemoryRegion>(regions: &[R], pieces: &[Piece], msg: &[u8], what: &str) {
    let mut rest = msg;
    for (k, &(r, off, len)) in pieces.iter().enumerate() {
        let n = len.min(rest.len());
        check_region(&regions[r], off, &rest[..n], &format!("{what}: SGE {k}"));
        rest = &rest[n..];
    }
    assert!(rest.is_empty(), "{what}: {} byte(s) did not fit the SGEs", rest.len());
}

/// Posts one receive of `len` bytes at `offset` of `mr`.
#[track_caller]
fn post_recv_buf<D: Device>(side: &mut Side<D>, wr_id: u64, mr: &D::Region, offset: usize, len: usize) {
    let sges = [sge(mr, offset, len)];
    side.queue.post_recv(&[RecvWr { wr_id, sges: &sges }]).expect("post receive");
}

/// Posts one signaled request `op` over `len` bytes at `offset` of `mr` (no SGE when `len` is 0).
#[track_caller]
fn post_op<D: Device>(side: &mut Side<D>, wr_id: u64, op: SendOp, mr: &D::Region, offset: usize, len: usize) {
    let sges = [sge(mr, offset, len)];
    let sges = if len == 0 { &sges[..0] } else { &sges[..] };
    side.queue.post_send(&[SendWr::send(wr_id, sges).with_op(op)]).expect("post send-side request");
}

/// Posts one signaled SEND of `len` bytes at `offset` of `mr`.
#[track_caller]
fn send_bytes<D: Device>(side: &mut Side<D>, wr_id: u64, mr: &D::Region, offset: usize, len: usize) {
    post_op(side, wr_id, SendOp::Send, mr, offset, len)
}

/// Sends `data` from `from` (via `src`) to `to` (into `dst`), both requests named `wr_id`, and
/// checks that it arrived whole and both sides completed; returns the receive completion.
#[track_caller]
fn deliver<E: Env>(
    env: &E,
    from: &mut Side<E::Dev>,
    src: &mut Region<E>,
    to: &mut Side<E::Dev>,
    dst: &Region<E>,
    wr_id: u64,
    data: &[u8],
) -> Completion {
    let what = format!("SEND {wr_id} of {} B", data.len());
    src.write(0, data).expect("fill send source");
    post_recv_buf(to, wr_id, dst, 0, dst.len());
    send_bytes(from, wr_id, src, 0, data.len());
    let c = recv_ok(env, to, wr_id, CqOpcode::Recv, &what);
    assert_eq!(c.byte_len as usize, data.len(), "{what}: byte_len: {c:?}");
    check_region(dst, 0, data, &what);
    send_ok(env, from, wr_id, CqOpcode::Send, &what);
    c
}

/// A successful completion of `wr_id` as `opcode`.
fn ok(wr_id: u64, opcode: CqOpcode) -> Want {
    (wr_id, opcode, Status::Success)
}

/// Asserts `c` is the completion `want` of the queue `qpn`.
#[track_caller]
fn assert_done(c: &Completion, qpn: u32, want: Want, what: &str) {
    assert_eq!((c.wr_id, c.opcode, c.status), want, "{what}: (wr_id, opcode, status) of {c:?}");
    assert_eq!(c.qpn, qpn, "{what}: the completion names another queue: {c:?}");
}

/// Asserts `c` is the completion `want` of the queue `qpn`, whose status is the one a responder's
/// NAK carries; where the link loses packets, `RetryExceeded` is that request's other correct end
/// (the NAK was lost and the responder, in ERROR since, answers nothing: [`Env::loses_packets`]).
#[track_caller]
fn assert_nak_status<E: Env>(env: &E, c: &Completion, qpn: u32, want: Want, what: &str) {
    if env.loses_packets() && c.status == Status::RetryExceeded {
        assert_done(c, qpn, (want.0, want.1, Status::RetryExceeded), what);
    } else {
        assert_done(c, qpn, want, what);
    }
}

/// Asserts `c` is the successful completion of `wr_id` as `opcode` on the queue `qpn`.
#[track_caller]
fn assert_ok(c: &Completion, qpn: u32, wr_id: u64, opcode: CqOpcode, what: &str) {
    assert_done(c, qpn, ok(wr_id, opcode), what)
}

/// Asserts `c` is the receive `wr_id` of message `i` (`len` bytes, landed at `offset` of `mr`).
#[allow(clippy::too_many_arguments)]
#[track_caller]
fn check_numbered<R: MemoryRegion>(
    c: &Completion,
    qpn: u32,
    wr_id: u64,
    mr: &R,
    offset: usize,
    i: u64,
    len: usize,
    what: &str,
) {
    assert_ok(c, qpn, wr_id, CqOpcode::Recv, what);
    assert_eq!(c.byte_len as usize, len, "{what}: message {i}: {c:?}");
    check_region(mr, offset, &numbered(i, len), &format!("{what}: message {i}"));
}

/// Waits for the one completion on `side`'s send CQ and asserts it is `wr_id`, done as `opcode`.
#[track_caller]
fn send_ok<E: Env>(env: &E, side: &mut Side<E::Dev>, wr_id: u64, opcode: CqOpcode, what: &str) -> Completion {
    let c = wait_one(env, &mut side.send_cq, what);
    assert_ok(&c, side.queue.qpn(), wr_id, opcode, what);
    c
}

/// Waits for the one completion on `side`'s receive CQ and asserts it is `wr_id`, done as `opcode`.
#[track_caller]
fn recv_ok<E: Env>(env: &E, side: &mut Side<E::Dev>, wr_id: u64, opcode: CqOpcode, what: &str) -> Completion {
    let c = wait_one(env, &mut side.recv_cq, what);
    assert_ok(&c, side.queue.qpn(), wr_id, opcode, what);
    c
}

/// Waits for exactly the completions `want` of queue `qpn` on `cq`, in that order.
#[track_caller]
fn expect_done<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, qpn: u32, want: &[Want], what: &str) {
    expect_done_within(env, cq, qpn, want, what, WAIT_BUDGET);
}

/// [`expect_done`] with a budget other than [`WAIT_BUDGET`].
#[track_caller]
fn expect_done_within<E: Env, C: CompletionQueue>(
    env: &E,
    cq: &mut C,
    qpn: u32,
    want: &[Want],
    what: &str,
    budget: Duration,
) {
    let got = collect(env, cq, want.len(), budget);
    let n = want.len();
    assert_eq!(got.len(), n, "{what}: expected {n} completion(s) within {budget:?}, got {got:?}");
    for (c, w) in got.iter().zip(want) {
        assert_done(c, qpn, *w, what);
    }
}

/// [`expect_done`], then nothing more arrives: each request completed exactly once.
#[track_caller]
fn expect_exactly<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, qpn: u32, want: &[Want], what: &str) {
    expect_done(env, cq, qpn, want, what);
    expect_none(env, cq, QUIET, what);
}

/// Polls exactly `n` completions from `cq`, never asking for more, letting time pass.
#[track_caller]
fn take<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, n: usize, what: &str) -> Vec<Completion> {
    let mut got = vec![Completion::default(); n];
    let (mut have, mut waited) = (0, Duration::ZERO);
    loop {
        env.progress();
        have += cq.poll(&mut got[have..]).expect("poll");
        if have == n {
            return got;
        }
        assert!(waited < WAIT_BUDGET, "{what}: {have} of {n} completion(s) within {WAIT_BUDGET:?}: {got:?}");
        env.advance(WAIT_TICK);
        waited += WAIT_TICK;
    }
}

/// Lets time pass until `cq` has an event and acknowledges it; panics after [`WAIT_BUDGET`].
#[track_caller]
fn wait_event<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, what: &str) {
    let mut waited = Duration::ZERO;
    loop {
        env.progress();
        if cq.ack_events().expect("ack_events") >= 1 {
            return;
        }
        assert!(waited < WAIT_BUDGET, "{what}: no event within {WAIT_BUDGET:?}");
        env.advance(WAIT_TICK);
        waited += WAIT_TICK;
    }
}

/// Asserts `cq` raises no event while [`QUIET`] passes.
#[track_caller]
fn expect_no_event<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, what: &str) {
    let mut waited = Duration::ZERO;
    while waited < QUIET {
        env.progress();
        assert_eq!(cq.ack_events().expect("ack_events"), 0, "{what}: expected no event");
        env.advance(WAIT_TICK);
        waited += WAIT_TICK;
    }
}

/// Asserts a post was refused with `WouldBlock` on the send side, with `free` slots for `wanted`.
#[track_caller]
fn expect_would_block(r: crate::Result<()>, free: u32, wanted: usize, what: &str) {
    match r {
        Err(e) if e.is_would_block() => match &e {
            Error::WouldBlock { side, free: f, wanted: w } => {
                assert_eq!((*side, *f, *w), ("send", free, wanted), "{what}: (side, free, wanted) of {e}")
            }
            other => panic!("{what}: is_would_block() is true for {other:?}"),
        },
        other => panic!("{what}: expected Err(WouldBlock), got {other:?}"),
    }
}

/// Asserts a post was refused with `BadState` naming `state`.
#[track_caller]
fn expect_bad_state(r: crate::Result<()>, state: QueueState, what: &str) {
    match r {
        Err(Error::BadState { state: s, .. }) if s == state => {}
        other => panic!("{what}: expected Err(BadState {{ state: {state:?}, .. }}), got {other:?}"),
    }
}

/// Asserts that a SEND and a receive posted to `side`, whose queue is in `state`, are refused.
#[track_caller]
fn assert_refused<D: Device>(side: &mut Side<D>, src: &D::Region, dst: &D::Region, state: QueueState) {
    let s = [sge(src, 0, src.len())];
    expect_bad_state(
        side.queue.post_send(&[SendWr::send(90, &s)]),
        state,
        &format!("post_send in {state:?}"),
    );
    let d = [sge(dst, 0, dst.len())];
    let r = side.queue.post_recv(&[RecvWr { wr_id: 91, sges: &d }]);
    expect_bad_state(r, state, &format!("post_recv in {state:?}"));
}

/// Asserts `mr` holds `want` at `offset`.
#[track_caller]
fn check_region<R: MemoryRegion>(mr: &R, offset: usize, want: &[u8], what: &str) {
    assert_bytes(&read_region(mr, offset, want.len()), want, what);
}

/// Asserts two byte strings are equal, reporting the first difference rather than every byte.
#[track_caller]
fn assert_bytes(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let at = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or(got.len().min(want.len()));
    let window = |v: &[u8]| v[at..v.len().min(at + 16)].to_vec();
    panic!(
        "{what}: {} of {} byte(s) differ, first at {at}: got {:?}…, want {:?}…",
        got.iter().zip(want).filter(|(g, w)| g != w).count() + got.len().abs_diff(want.len()),
        want.len(),
        window(got),
        window(want)
    );
}
