//! Fuzz target: the simulator's RoCEv2 codec (`bypass_sim::roce`): `decode_udp`,
//! `decode_udp_any_id` and `decode_ethernet`.
//!
//! Besides "never panics": a UDP payload that decodes must encode back to the same bytes, up to
//! what the decoder ignores (the BTH's M bit, FECN/BECN/reserved byte and reserved PSN bits, the reserved bytes of RDETH
//! and DETH, and
//! the pad bytes' contents, all written as 0, with the ICRC recomputed over that); an Ethernet
//! frame that decodes must re-encode to a frame that decodes to the same thing; and a frame this
//! codec encodes must decode as itself, at both levels.
//!
//! Input: byte 0 is the mode, bytes 1..13 the endpoints (source and destination IPv4, UDP source
//! and destination port), the rest the UDP payload (BTH … ICRC). Mode bit 0 set: the last four
//! bytes are replaced by the right ICRC, so the fuzzer's time goes past the checksum into the
//! headers. Mode bit 1 set: the destination port is RoCEv2's 4791, so the frame is also tried at
//! the Ethernet level. The whole input after byte 0 is also tried as an Ethernet frame.
#![no_main]

use bypass_sim::roce::{
    decode_ethernet, decode_udp, decode_udp_any_id, udp_icrc, Endpoints, Frame, Link, BTH_LEN, ICRC_LEN,
    RDETH_LEN, ROCE_PORT,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if let Ok(eth) = decode_ethernet(rest) {
        let mut out = vec![0u8; rest.len() + 64];
        let n = eth
            .frame
            .encode_ethernet(&eth.endpoints, &eth.link, &mut out)
            .expect("re-encode a decoded frame");
        let again = decode_ethernet(&out[..n]).expect("a re-encoded Ethernet frame decodes");
        assert_eq!(again, eth, "Ethernet round trip");
    }
    let Some((ep, payload)) = rest.split_first_chunk::<12>() else { return };
    let mut ep = Endpoints {
        src_ip: [ep[0], ep[1], ep[2], ep[3]],
        dst_ip: [ep[4], ep[5], ep[6], ep[7]],
        src_port: u16::from_be_bytes([ep[8], ep[9]]),
        dst_port: u16::from_be_bytes([ep[10], ep[11]]),
    };
    if mode & 2 == 2 {
        ep.dst_port = ROCE_PORT;
    }
    let mut payload = payload.to_vec();
    if mode & 1 == 1 && payload.len() >= ICRC_LEN {
        let body = payload.len() - ICRC_LEN;
        let icrc = udp_icrc(&ep, &payload[..body]);
        payload[body..].copy_from_slice(&icrc.to_le_bytes());
    }
    let strict = decode_udp(&payload, &ep);
    if let Ok(f) = strict {
        check_udp(&f, &ep, &payload, mode);
    }
    if let Ok(f) = decode_udp_any_id(&payload, &ep) {
        if let Ok(s) = strict {
            assert_eq!(f, s, "the two UDP decoders disagree on a frame both accept");
        }
        let mut out = vec![0u8; payload.len()];
        let n = f.encode_udp(&ep, &mut out).expect("re-encode a frame decode_udp_any_id accepted");
        assert_eq!(decode_udp(&out[..n], &ep), Ok(f), "encode_udp → decode_udp round trip");
    }
});

/// `f` was decoded from `bytes` between `ep`.
fn check_udp(f: &Frame<'_>, ep: &Endpoints, bytes: &[u8], mode: u8) {
    // The canonical form of the input: the ignored bits zeroed, the ICRC over that.
    let mut canon = bytes.to_vec();
    let body = canon.len() - ICRC_LEN;
    canon[1] &= !0x40; // M
    canon[4] = 0; // FECN, BECN, resv6
    canon[8] &= 0x80; // AckReq kept, resv7 zeroed
    let mut at = BTH_LEN;
    if f.rdeth.is_some() {
        canon[at] = 0; // RDETH's reserved byte
        at += RDETH_LEN;
    }
    if f.deth.is_some() {
        canon[at + 4] = 0; // DETH's reserved byte, before SrcQP
    }
    let pad = usize::from((canon[1] >> 4) & 3);
    canon[body - pad..body].fill(0);
    let icrc = udp_icrc(ep, &canon[..body]);
    canon[body..].copy_from_slice(&icrc.to_le_bytes());
    assert!(body >= BTH_LEN);

    let mut out = vec![0u8; bytes.len() + 16];
    let n = f.encode_udp(ep, &mut out).expect("re-encode a decoded frame");
    assert_eq!(out[..n], canon[..], "UDP round trip");
    assert_eq!(decode_udp(&out[..n], ep), Ok(*f));

    // The same frame at the Ethernet level, with link fields from the mode byte.
    let link = Link {
        src_mac: [2, 0, 0, 0, 0, mode],
        dst_mac: [2, 0, 0, 0, 1, mode],
        ip_id: 0,
        ttl: mode,
        tos: mode,
    };
    let mut eth = vec![0u8; n + 64];
    if ep.dst_port == ROCE_PORT {
        let m = f.encode_ethernet(ep, &link, &mut eth).expect("encode the frame as Ethernet");
        let e = decode_ethernet(&eth[..m]).expect("an encoded Ethernet frame decodes");
        assert_eq!(e.frame, *f);
        assert_eq!(e.endpoints, *ep);
        assert_eq!(e.link, link);
    }
}
