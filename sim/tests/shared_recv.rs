//! A shared receive queue under the Threaded engine: four clients, each on its own thread, send
//! to four server queues that take their receives from one shared queue smaller than the
//! clients' combined window (so it runs dry and senders wait on RNR). Every message must land
//! exactly once, in order per connection, completing on the queue it came in on.

use bypass_hal::*;
use bypass_sim::{Engine, Fabric};
use std::time::{Duration, Instant};

const CLIENTS: usize = 4;
const MESSAGES: u64 = 400;
const WINDOW: u64 = 8;
const SRQ_DEPTH: u32 = 16;
const SLOT: usize = 64;
/// No run of this test comes near it; reaching it means a message was lost.
const BUDGET: Duration = Duration::from_secs(60);

fn payload(client: usize, seq: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&(client as u64).to_le_bytes());
    b[8..].copy_from_slice(&seq.to_le_bytes());
    b
}

#[test]
fn clients_on_threads_share_one_pool_of_receives() {
    let fabric = Fabric::new(Engine::Threaded);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let mut cfg = QueueConfig::default().with_depths(WINDOW as u32, 32);
    cfg.rnr_retry = 7;
    cfg.min_rnr_timer = RnrTimer::at_least(Duration::from_micros(20));
    let mut srq = nb.create_shared_recv(SRQ_DEPTH, 1).unwrap();
    let mut recv_cq = nb.create_cq(CLIENTS as u32 * 32 + 1).unwrap();
    let dst = nb.register(SRQ_DEPTH as usize * SLOT, Access::LOCAL_WRITE).unwrap();
    let mut server = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let scq = nb.create_cq(WINDOW as u32 + 1).unwrap();
        let mut sq = nb.create_queue_on_shared(&cfg, &scq, &recv_cq, &srq).unwrap();
        let ccq = na.create_cq(2 * WINDOW as u32 + 1).unwrap();
        let mut cq = na.create_queue(&cfg, &ccq, &ccq).unwrap();
        let (is, ic) = (sq.info(), cq.info());
        sq.connect(&ic).unwrap();
        cq.connect(&is).unwrap();
        server.push((sq, scq));
        clients.push((cq, ccq));
    }
    for slot in 0..SRQ_DEPTH as u64 {
        let sge = dst.sge(slot as usize * SLOT, SLOT).unwrap();
        srq.post_recv(&[RecvWr { wr_id: slot, sges: &[sge] }]).unwrap();
    }
    let qpn_to_client: Vec<u32> = server.iter().map(|(q, _)| q.qpn()).collect();
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(id, (mut q, mut cq))| {
            let src = na.register(MESSAGES as usize * 16, Access::empty()).unwrap();
            std::thread::spawn(move || {
                let mut src = src;
                for seq in 0..MESSAGES {
                    src.write(seq as usize * 16, &payload(id, seq)).unwrap();
                }
                let (mut sent, mut done) = (0u64, 0u64);
                let mut wc = [Completion::default(); 16];
                let start = Instant::now();
                while done < MESSAGES {
                    assert!(start.elapsed() < BUDGET, "client {id}: {done} of {MESSAGES} sends completed");
                    if sent < MESSAGES && sent - done < WINDOW {
                        let sge = src.sge(sent as usize * 16, 16).unwrap();
                        q.post_send(&[SendWr::send(sent, &[sge])]).unwrap();
                        sent += 1;
                    }
                    let n = cq.poll(&mut wc).unwrap();
                    for c in &wc[..n] {
                        assert_eq!((c.status, c.wr_id), (Status::Success, done), "client {id}: {c:?}");
                        done += 1;
                    }
                }
                q
            })
        })
        .collect();
    let mut next = [0u64; CLIENTS];
    let mut wc = [Completion::default(); 16];
    let mut generation = 1u64;
    let start = Instant::now();
    let mut got = 0u64;
    while got < CLIENTS as u64 * MESSAGES {
        assert!(start.elapsed() < BUDGET, "the server received {got} messages, expected {next:?} per client");
        let n = recv_cq.poll(&mut wc).unwrap();
        for c in &wc[..n] {
            assert_eq!((c.status, c.opcode, c.byte_len), (Status::Success, CqOpcode::Recv, 16), "{c:?}");
            let client =
                qpn_to_client.iter().position(|&q| q == c.qpn).expect("a completion names a server queue");
            let slot = (c.wr_id & 0xff) as usize;
            assert!(slot < SRQ_DEPTH as usize, "wr_id {} names no posted receive", c.wr_id);
            let mut b = [0u8; 16];
            dst.read(slot * SLOT, &mut b).unwrap();
            assert_eq!(b, payload(client, next[client]), "message {} of client {client}", next[client]);
            next[client] += 1;
            got += 1;
            let sge = dst.sge(slot * SLOT, SLOT).unwrap();
            srq.post_recv(&[RecvWr { wr_id: generation << 8 | slot as u64, sges: &[sge] }]).unwrap();
            generation += 1;
        }
    }
    for t in threads {
        t.join().expect("client thread");
    }
    assert_eq!(next, [MESSAGES; CLIENTS]);
    let stats = nb.stats();
    eprintln!("RNR NAKs sent by the server NIC: {}", stats.rnr_naks_sent);
    for (q, mut scq) in server {
        assert_eq!(q.state(), QueueState::Ready);
        assert_eq!(scq.poll(&mut wc).unwrap(), 0, "the server queues sent nothing");
    }
}
