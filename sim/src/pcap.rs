//! Packet capture: the sim's packets as Ethernet/IPv4/UDP/RoCEv2 frames in a classic libpcap
//! file (LINKTYPE_ETHERNET), which Wireshark and tshark dissect as InfiniBand over UDP port 4791.
//!
//! [`PcapWire`] wraps any [`Wire`] (as the fault wire does) and writes every packet the inner wire
//! takes to a [`PcapWriter`]. Setting `BYPASS_PCAP=<file>` makes every [`Fabric`](crate::Fabric)
//! created afterwards wrap each of its links, right in front of the receiving NIC (behind a fault
//! wire, if any: a capture shows what reached the receiver, so lost packets are missing and
//! duplicated ones appear twice). All fabrics of a process that name the same file share one
//! writer; `{pid}` in the name is replaced by the process id, so test binaries running side by
//! side keep to their own files. Frames are encoded with [`crate::roce`]: NIC `n` is 10.0.0.0 + n,
//! its Ethernet address `02:FF:FF:NN:NN:NN` with the fabric id in the `FF` bytes.
//!
//! **A debugging path**, not a fast one: every packet is copied once more, encoded, and written
//! under one process-wide lock with one `write` per packet. Each record goes to the file whole as
//! soon as it is captured (header and frame in one write, then a flush), so a run that crashes or
//! is killed leaves a file that reads to its last packet.

use crate::packet::PacketHeader;
use crate::roce::{self, Endpoints, Link};
use crate::wire::{Transmit, Wire};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The environment variable that turns capture on: the file to write.
pub const ENV: &str = "BYPASS_PCAP";
/// pcap magic for microsecond timestamps (written in the machine's byte order, little-endian here).
pub const MAGIC: u32 = 0xA1B2_C3D4;
/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// The largest record kept whole (libpcap's default snapshot length).
pub const SNAPLEN: u32 = 262_144;
/// Bytes of the file header.
pub const FILE_HEADER_LEN: usize = 24;
/// Bytes of each record header.
pub const RECORD_HEADER_LEN: usize = 16;

/// The 24-byte pcap file header: magic, version 2.4, zone 0, sigfigs 0, snaplen, link type.
pub fn file_header() -> [u8; FILE_HEADER_LEN] {
    let mut h = [0u8; FILE_HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
    h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    h
}

struct State {
    out: BufWriter<Box<dyn Write + Send>>,
    /// Wall-clock time at `start`, since the Unix epoch.
    start_wall: Duration,
    start: Instant,
    /// Timestamp of the last record, in µs since the epoch (records never go back in time).
    last_us: u64,
    records: u64,
    skipped: u64,
    failed: bool,
    /// The frame being written: the record header, then the frame.
    buf: Vec<u8>,
}

/// A pcap file being written: a file header, then one record per packet, each flushed whole.
/// Timestamps are wall-clock microseconds, never decreasing in file order.
pub struct PcapWriter {
    state: Mutex<State>,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for PcapWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapWriter").field("path", &self.path).field("records", &self.records()).finish()
    }
}

impl PcapWriter {
    /// Creates (or truncates) `path` and writes the file header.
    pub fn create(path: impl AsRef<Path>) -> io::Result<PcapWriter> {
        let path = path.as_ref();
        let mut w = Self::new(std::fs::File::create(path)?)?;
        w.path = Some(path.to_path_buf());
        Ok(w)
    }

    /// A writer over any byte sink; writes the file header now.
    pub fn new(out: impl Write + Send + 'static) -> io::Result<PcapWriter> {
        let out: Box<dyn Write + Send> = Box::new(out);
        let mut out = BufWriter::with_capacity(1 << 16, out);
        out.write_all(&file_header())?;
        out.flush()?;
        let start_wall = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let state = State {
            out,
            start_wall,
            start: Instant::now(),
            last_us: 0,
            records: 0,
            skipped: 0,
            failed: false,
            buf: Vec::with_capacity(RECORD_HEADER_LEN + 4096 + 128),
        };
        Ok(PcapWriter { state: Mutex::new(state), path: None })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file written, if the writer was made by [`create`](Self::create).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.lock().records
    }

    /// Packets that could not be recorded (too long for one UDP datagram, or a NIC address
    /// above 2^24).
    pub fn skipped(&self) -> u64 {
        self.lock().skipped
    }

    /// Writes sim packet `hdr` of fabric `fabric` with its payload as an Ethernet frame, time
    /// stamped now (see [`roce::encode_ethernet`], [`Endpoints::of_packet`], [`Link::of_packet`]).
    pub fn write_packet(&self, fabric: u32, hdr: &PacketHeader, payload: &[u8]) {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(ep) = Endpoints::of_packet(hdr) else {
            st.skipped += 1;
            return;
        };
        let link = Link::of_packet(fabric, hdr);
        let n = roce::ethernet_len(hdr);
        st.buf.resize(RECORD_HEADER_LEN + n, 0);
        match roce::encode_ethernet(hdr, payload, &ep, &link, &mut st.buf[RECORD_HEADER_LEN..]) {
            Ok(n) => {
                st.buf.truncate(RECORD_HEADER_LEN + n);
                Self::emit(st);
            }
            Err(_) => st.skipped += 1,
        }
    }

    /// Writes one Ethernet frame as a record, time stamped now.
    pub fn write_frame(&self, frame: &[u8]) {
        let mut st = self.lock();
        let st = &mut *st;
        st.buf.clear();
        st.buf.resize(RECORD_HEADER_LEN, 0);
        st.buf.extend_from_slice(frame);
        Self::emit(st);
    }

    /// Fills in the record header of `st.buf` and writes the record.
    fn emit(st: &mut State) {
        if st.failed {
            return;
        }
        let now = st.start_wall + st.start.elapsed();
        let us = (now.as_micros() as u64).max(st.last_us);
        st.last_us = us;
        let len = (st.buf.len() - RECORD_HEADER_LEN) as u32;
        let incl = len.min(SNAPLEN);
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0..4].copy_from_slice(&((us / 1_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((us % 1_000_000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&incl.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        st.buf[..RECORD_HEADER_LEN].copy_from_slice(&h);
        let record = &st.buf[..RECORD_HEADER_LEN + incl as usize];
        let result = st.out.write_all(record).and_then(|()| st.out.flush());
        match result {
            Ok(()) => st.records += 1,
            Err(e) => {
                st.failed = true;
                eprintln!("bypass-sim: packet capture stopped, writing failed: {e}");
            }
        }
    }

    /// Pushes buffered bytes to the file (records are flushed as they are written; this is for
    /// completeness).
    pub fn flush(&self) {
        let _ = self.lock().out.flush();
    }
}

impl Drop for PcapWriter {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The capture file named by `BYPASS_PCAP`, if set (read when a fabric is created): one writer
/// per file per process, created on first use. `None` if the variable is unset or empty, or the
/// file cannot be created (said once on stderr).
pub(crate) fn from_env() -> Option<Arc<PcapWriter>> {
    let name = std::env::var_os(ENV)?;
    let name = name.to_string_lossy().replace("{pid}", &std::process::id().to_string());
    if name.is_empty() {
        return None;
    }
    static OPEN: Mutex<Vec<(String, Option<Arc<PcapWriter>>)>> = Mutex::new(Vec::new());
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, w)) = open.iter().find(|(n, _)| *n == name) {
        return w.clone();
    }
    let w = match PcapWriter::create(&name) {
        Ok(w) => Some(Arc::new(w)),
        Err(e) => {
            eprintln!("bypass-sim: {ENV}={name}: cannot create the capture file: {e}");
            None
        }
    };
    open.push((name, w.clone()));
    w
}

/// A wire that records every packet its inner wire takes (see the module docs).
pub struct PcapWire {
    inner: Arc<dyn Wire>,
    writer: Arc<PcapWriter>,
    fabric: u32,
    /// Where the packet's payload is copied on its way to the inner wire.
    payload: Mutex<Vec<u8>>,
}

impl std::fmt::Debug for PcapWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapWire").field("fabric", &self.fabric).field("writer", &self.writer).finish()
    }
}

impl PcapWire {
    /// Wraps `inner`, recording to `writer`; `fabric` goes into the Ethernet addresses.
    pub fn new(inner: Arc<dyn Wire>, writer: Arc<PcapWriter>, fabric: u32) -> PcapWire {
        PcapWire { inner, writer, fabric, payload: Mutex::new(Vec::new()) }
    }
}

impl Wire for PcapWire {
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        let mut copy = self.payload.lock().unwrap_or_else(|e| e.into_inner());
        copy.clear();
        let result = self.inner.transmit(hdr, &mut |buf: &mut [u8]| {
            fill(buf);
            copy.extend_from_slice(buf);
        });
        if result == Transmit::Sent {
            copy.resize(hdr.payload_len as usize, 0); // in case the inner wire never called `fill`
            self.writer.write_packet(self.fabric, hdr, &copy);
        }
        result
    }

    fn flush(&self, eager: bool) {
        self.inner.flush(eager);
    }

    /// As the wire under it: a capture records what leaves, and must not change when it leaves.
    fn holds_acks(&self) -> bool {
        self.inner.holds_acks()
    }
}

impl Drop for PcapWire {
    fn drop(&mut self) {
        self.writer.flush();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::packet::PacketKind;

    /// A `Write` into a shared buffer, to look at what the writer wrote.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A wire that takes everything (and copies the payload out, as a real one does).
    struct Taker;

    impl Wire for Taker {
        fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
            let mut buf = vec![0u8; hdr.payload_len as usize];
            fill(&mut buf);
            Transmit::Sent
        }
        fn flush(&self, _: bool) {}
    }

    /// A wire that is always full.
    struct Full;

    impl Wire for Full {
        fn transmit(&self, _: &PacketHeader, _: &mut dyn FnMut(&mut [u8])) -> Transmit {
            Transmit::Busy
        }
        fn flush(&self, _: bool) {}
    }

    #[test]
    fn records_taken_packets_only_each_flushed_whole() {
        let sink = Sink::default();
        let writer = Arc::new(PcapWriter::new(sink.clone()).unwrap());
        assert_eq!(&sink.0.lock().unwrap()[..], &file_header(), "the header is on disk at once");
        let wire = PcapWire::new(Arc::new(Taker), writer.clone(), 3);
        let hdr = PacketHeader {
            src_nic: 1,
            dst_nic: 2,
            src_qpn: 4,
            dst_qpn: 5,
            kind: PacketKind::Send,
            first: true,
            last: true,
            psn: 0x0123_4567,
            payload_len: 5,
            ..Default::default()
        };
        assert_eq!(wire.transmit(&hdr, &mut |b: &mut [u8]| b.copy_from_slice(b"hello")), Transmit::Sent);
        let full = PcapWire::new(Arc::new(Full), writer.clone(), 3);
        assert_eq!(full.transmit(&hdr, &mut |_: &mut [u8]| unreachable!()), Transmit::Busy);
        assert_eq!(writer.records(), 1);

        let bytes = sink.0.lock().unwrap().clone();
        let rec = &bytes[FILE_HEADER_LEN..];
        let incl = u32::from_le_bytes(rec[8..12].try_into().unwrap()) as usize;
        assert_eq!(incl, roce::ethernet_len(&hdr));
        assert_eq!(rec.len(), RECORD_HEADER_LEN + incl);
        let f = roce::decode_ethernet(&rec[RECORD_HEADER_LEN..]).unwrap();
        assert_eq!(f.link.src_mac, roce::mac_of_nic(3, 1));
        assert_eq!((f.src_nic(), f.dst_nic()), (Some(1), Some(2)));
        assert_eq!(
            (f.frame.opcode, f.frame.psn, f.frame.payload),
            (roce::Opcode::SendOnly, 0x23_4567, &b"hello"[..])
        );
    }
}
