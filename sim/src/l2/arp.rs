//! ARP (RFC 826) for the L2 wire: the packets, and a small neighbour table that resolves a peer's
//! IPv4 address to its MAC, retrying with backoff and holding a bounded queue of frames until it
//! answers.
//!
//! The table is tiny (one entry per peer host a NIC talks to) and lives under the wire's lock.
//! A request goes out at once, then again after 100, 200, 400 and 800 ms; after [`TRIES`]
//! unanswered requests the entry fails: its queued frames are dropped and whoever waits for it
//! (a queue connecting) gets an error naming the address. Any ARP packet from a host (a request
//! to us, a reply, a gratuitous announcement) updates its entry, so a peer whose MAC changes is
//! followed. Entries are not aged: a resolved MAC is used until an ARP packet says otherwise.

use super::encap::ETHERTYPE_ARP;
use bypass_hal::l2::Mac;
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Bytes of an Ethernet/IPv4 ARP packet after the Ethernet header.
pub(crate) const ARP_LEN: usize = 28;
/// An ARP frame as sent: padded to Ethernet's 60-byte minimum (without FCS).
pub(crate) const ARP_FRAME_LEN: usize = 60;
/// Requests sent before a neighbour is given up.
pub(crate) const TRIES: u32 = 5;
/// Wait after the first request; it doubles after each.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(100);
/// Frames held for one unresolved neighbour; more are dropped (the transport retransmits).
pub(crate) const PENDING_MAX: usize = 64;
/// Neighbours the table holds; a new one then replaces a failed or the least recently added.
pub(crate) const TABLE_MAX: usize = 64;

/// An ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Request,
    Reply,
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arp {
    pub op: Op,
    pub sender_mac: Mac,
    pub sender_ip: Ipv4Addr,
    pub target_mac: Mac,
    pub target_ip: Ipv4Addr,
}

impl Arp {
    /// Parses the ARP packet of an Ethernet frame whose EtherType is ARP; `None` if it is not
    /// Ethernet/IPv4 ARP (other hardware or protocol types, other opcodes, too short).
    pub(crate) fn parse(frame: &[u8]) -> Option<Arp> {
        let a = frame.get(14..14 + ARP_LEN)?;
        if a[0..2] != [0, 1] || a[2..4] != [0x08, 0x00] || a[4] != 6 || a[5] != 4 {
            return None;
        }
        let op = match u16::from_be_bytes([a[6], a[7]]) {
            1 => Op::Request,
            2 => Op::Reply,
            _ => return None,
        };
        let mac = |at: usize| -> Mac { a[at..at + 6].try_into().expect("6 bytes") };
        let ip = |at: usize| Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]);
        Some(Arp { op, sender_mac: mac(8), sender_ip: ip(14), target_mac: mac(18), target_ip: ip(24) })
    }

    /// Writes this packet as a whole Ethernet frame from `self.sender_mac` to `dst` (broadcast for
    /// a request), padded to 60 bytes.
    pub(crate) fn write(&self, dst: Mac, out: &mut [u8; ARP_FRAME_LEN]) {
        out.fill(0);
        out[0..6].copy_from_slice(&dst);
        out[6..12].copy_from_slice(&self.sender_mac);
        out[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        let a = &mut out[14..14 + ARP_LEN];
        a[0..2].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
        a[2..4].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
        a[4] = 6;
        a[5] = 4;
        let op: u16 = if self.op == Op::Request { 1 } else { 2 };
        a[6..8].copy_from_slice(&op.to_be_bytes());
        a[8..14].copy_from_slice(&self.sender_mac);
        a[14..18].copy_from_slice(&self.sender_ip.octets());
        a[18..24].copy_from_slice(&self.target_mac);
        a[24..28].copy_from_slice(&self.target_ip.octets());
    }
}

/// Where a neighbour's resolution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Requests are out; `tries` sent, the next at `next`.
    Incomplete { tries: u32, next: Instant },
    /// The MAC is known.
    Reachable(Mac),
    /// [`TRIES`] requests went unanswered.
    Failed,
}

#[derive(Debug)]
pub(crate) struct Neighbour {
    pub ip: Ipv4Addr,
    pub state: State,
    /// Frames waiting for the MAC (their Ethernet destination is filled in when it comes).
    pub pending: VecDeque<Vec<u8>>,
}

/// The neighbour table (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Table {
    entries: Vec<Neighbour>,
    /// Frames dropped: queue full, or their neighbour failed.
    pub dropped: u64,
    /// Requests sent.
    pub requests: u64,
}

impl Table {
    /// The MAC of `ip`, if resolved.
    #[inline]
    pub(crate) fn mac_of(&self, ip: Ipv4Addr) -> Option<Mac> {
        self.entries.iter().find(|e| e.ip == ip).and_then(|e| match e.state {
            State::Reachable(m) => Some(m),
            _ => None,
        })
    }

    /// The state of `ip`'s entry.
    pub(crate) fn state(&self, ip: Ipv4Addr) -> Option<State> {
        self.entries.iter().find(|e| e.ip == ip).map(|e| e.state)
    }

    /// Starts resolving `ip` if it is not resolved or being resolved (again, if it failed):
    /// returns true if a request must go out now.
    pub(crate) fn start(&mut self, ip: Ipv4Addr, now: Instant) -> bool {
        let first = State::Incomplete { tries: 1, next: now + FIRST_RETRY };
        if let Some(e) = self.entries.iter_mut().find(|e| e.ip == ip) {
            if e.state == State::Failed {
                e.state = first;
                self.requests += 1;
                return true;
            }
            return false;
        }
        if self.entries.len() >= TABLE_MAX {
            let victim = self.entries.iter().position(|e| e.state == State::Failed).unwrap_or(0);
            let gone = self.entries.remove(victim);
            self.dropped += gone.pending.len() as u64;
        }
        self.entries.push(Neighbour { ip, state: first, pending: VecDeque::new() });
        self.requests += 1;
        true
    }

    /// Holds `frame` until `ip` resolves (dropping it if the queue is full); the caller has
    /// called [`start`](Self::start).
    pub(crate) fn hold(&mut self, ip: Ipv4Addr, frame: Vec<u8>) {
        match self.entries.iter_mut().find(|e| e.ip == ip) {
            Some(e) if e.pending.len() < PENDING_MAX => e.pending.push_back(frame),
            _ => self.dropped += 1,
        }
    }

    /// An ARP packet from `ip` at `mac`: records it (creating the entry only if `create`, i.e.
    /// the packet was addressed to us). Returns the frames that waited for it, their destination
    /// MAC filled in.
    pub(crate) fn learn(&mut self, ip: Ipv4Addr, mac: Mac, create: bool) -> VecDeque<Vec<u8>> {
        match self.entries.iter_mut().find(|e| e.ip == ip) {
            Some(e) => {
                e.state = State::Reachable(mac);
                let mut out = std::mem::take(&mut e.pending);
                for f in &mut out {
                    f[0..6].copy_from_slice(&mac);
                }
                out
            }
            None => {
                if create && self.entries.len() < TABLE_MAX {
                    self.entries.push(Neighbour {
                        ip,
                        state: State::Reachable(mac),
                        pending: VecDeque::new(),
                    });
                }
                VecDeque::new()
            }
        }
    }

    /// Whether a resolution is under way (retries to be sent by [`due`](Self::due)).
    pub(crate) fn resolving(&self) -> bool {
        self.entries.iter().any(|e| matches!(e.state, State::Incomplete { .. }))
    }

    /// The addresses whose next request is due at `now` (written to `out`, at most its length),
    /// after moving their retry time on; entries out of tries fail, dropping their frames.
    pub(crate) fn due(&mut self, now: Instant, out: &mut [Ipv4Addr]) -> usize {
        let mut n = 0;
        for e in &mut self.entries {
            let State::Incomplete { tries, next } = e.state else { continue };
            if now < next {
                continue;
            }
            if tries >= TRIES {
                e.state = State::Failed;
                self.dropped += e.pending.len() as u64;
                e.pending.clear();
                continue;
            }
            if n == out.len() {
                break;
            }
            e.state = State::Incomplete { tries: tries + 1, next: now + FIRST_RETRY * (1 << tries) };
            out[n] = e.ip;
            n += 1;
            self.requests += 1;
        }
        n
    }
}

/// How long resolution takes at most before an entry fails: the sum of the waits.
pub(crate) fn give_up_after() -> Duration {
    (0..TRIES).map(|t| FIRST_RETRY * (1 << t)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip() {
        let a = Arp {
            op: Op::Request,
            sender_mac: [2, 0, 0, 0, 0, 1],
            sender_ip: Ipv4Addr::new(10, 99, 0, 1),
            target_mac: [0; 6],
            target_ip: Ipv4Addr::new(10, 99, 0, 2),
        };
        let mut f = [0u8; ARP_FRAME_LEN];
        a.write([0xFF; 6], &mut f);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(Arp::parse(&f), Some(a));
        // Unpadded (42 bytes, as a veth passes it) parses too; a truncated one does not.
        assert_eq!(Arp::parse(&f[..42]), Some(a));
        assert_eq!(Arp::parse(&f[..41]), None);
        let mut other = f;
        other[16] = 0x86; // protocol type IPv6
        assert_eq!(Arp::parse(&other), None);
    }

    #[test]
    fn retries_back_off_then_fail() {
        let mut t = Table::default();
        let ip = Ipv4Addr::new(10, 99, 0, 9);
        let t0 = Instant::now();
        assert!(t.start(ip, t0));
        assert!(!t.start(ip, t0), "one request in flight per neighbour");
        t.hold(ip, vec![0; 60]);
        let mut out = [Ipv4Addr::UNSPECIFIED; 4];
        assert_eq!(t.due(t0 + Duration::from_millis(99), &mut out), 0);
        let mut at = t0;
        let mut sent = vec![];
        for wait in [100u64, 200, 400, 800] {
            at += Duration::from_millis(wait);
            assert_eq!(t.due(at, &mut out), 1, "retry after {wait} ms");
            sent.push(wait);
        }
        assert_eq!(t.requests, u64::from(TRIES));
        at += Duration::from_millis(1600);
        assert_eq!(t.due(at, &mut out), 0);
        assert_eq!(t.state(ip), Some(State::Failed));
        assert_eq!(t.dropped, 1, "the held frame is dropped with the neighbour");
        assert_eq!(give_up_after(), Duration::from_millis(3100));
        // A failed neighbour is tried again when wanted again, and a reply releases held frames.
        assert!(t.start(ip, at));
        t.hold(ip, vec![0; 60]);
        let held = t.learn(ip, [2, 0, 0, 0, 0, 9], false);
        assert_eq!(held.len(), 1);
        assert_eq!(&held[0][0..6], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(t.mac_of(ip), Some([2, 0, 0, 0, 0, 9]));
    }

    #[test]
    fn pending_queue_is_bounded() {
        let mut t = Table::default();
        let ip = Ipv4Addr::new(10, 99, 0, 9);
        t.start(ip, Instant::now());
        for _ in 0..PENDING_MAX + 5 {
            t.hold(ip, vec![0; 60]);
        }
        assert_eq!(t.dropped, 5);
        assert_eq!(t.learn(ip, [2; 6], false).len(), PENDING_MAX);
    }
}
