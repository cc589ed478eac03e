//! Fuzz target: the URPC wire format (`bypass::wire`): `parse` of a whole message, each header's
//! `decode`, and the DMA descriptor.
//!
//! Besides "never panics", every accepted message must encode back to the bytes it came from
//! (with an ACK's two reserved bytes, which are ignored on read, written as 0), and a parsed
//! request's descriptor view must agree with its header.
//!
//! Input: byte 0 chooses the mode. Even: the rest is the message as is (every header check is
//! reachable). Odd: the rest is made well-formed enough to pass the first checks — version 1,
//! the type from byte 0, the total size field set to the message's length — so the fuzzer's time
//! goes to the fields behind them.
#![no_main]

use bypass::wire::{
    encode_request, encode_response, parse, peek_type, AckHeader, DmaDescriptor, Parsed, RequestHeader,
    ResponseHeader,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut msg = rest.to_vec();
    if mode & 1 == 1 && !msg.is_empty() {
        let kind = (mode >> 1) & 3;
        msg[0] = 0x10 | kind;
        let total = (msg.len() as u32).to_le_bytes();
        match kind {
            0 if msg.len() >= RequestHeader::LEN => msg[8..12].copy_from_slice(&total),
            2 | 3 if msg.len() >= ResponseHeader::LEN => msg[12..16].copy_from_slice(&total),
            _ => {}
        }
    }
    check(&msg);
});

fn check(msg: &[u8]) {
    let _ = peek_type(msg);
    let mut out = vec![0u8; msg.len() + 64];

    // Each header decoder on its own: what it accepts encodes back to the same header bytes.
    if let Ok(h) = RequestHeader::decode(msg) {
        assert_eq!(h.encode(&mut out), Ok(RequestHeader::LEN));
        assert_eq!(out[..RequestHeader::LEN], msg[..RequestHeader::LEN], "request header round trip");
        assert!(h.total_size as usize >= h.min_total_size());
    }
    if let Ok(h) = AckHeader::decode(msg) {
        assert_eq!(h.encode(&mut out), Ok(AckHeader::LEN));
        let mut canon = [0u8; AckHeader::LEN];
        canon.copy_from_slice(&msg[..AckHeader::LEN]);
        canon[1] = 0; // reserved
        canon[11] = 0; // reserved
        assert_eq!(out[..AckHeader::LEN], canon, "ack header round trip");
    }
    if let Ok(h) = ResponseHeader::decode(msg) {
        assert_eq!(h.encode(&mut out), Ok(ResponseHeader::LEN));
        assert_eq!(out[..ResponseHeader::LEN], msg[..ResponseHeader::LEN], "response header round trip");
    }
    if let Ok(d) = DmaDescriptor::decode(msg) {
        assert_eq!(d.encode(&mut out), Ok(DmaDescriptor::LEN));
        assert_eq!(out[..DmaDescriptor::LEN], msg[..DmaDescriptor::LEN], "descriptor round trip");
    }

    // A whole message.
    match parse(msg) {
        Ok(Parsed::Request(v)) => {
            let n = usize::from(v.header.arg_dma_count);
            assert_eq!(v.descriptors.len(), n, "descriptor count");
            assert_eq!(v.descriptors.is_empty(), n == 0);
            assert_eq!(v.descriptors.iter().len(), n);
            let descs: Vec<DmaDescriptor> = v.descriptors.iter().collect();
            for (i, d) in descs.iter().enumerate() {
                assert_eq!(v.descriptors.get(i), Some(*d));
            }
            assert_eq!(v.descriptors.get(n), None);
            assert_eq!(v.header.total_size as usize, msg.len());
            let len =
                encode_request(&mut out, &v.header, &descs, v.args).expect("re-encode a parsed request");
            assert_eq!(out[..len], *msg, "request round trip");
        }
        Ok(Parsed::Ack(h)) => {
            assert_eq!(msg.len(), AckHeader::LEN);
            let _ = h.is_credit_grant();
        }
        Ok(Parsed::Response(v)) => {
            assert_eq!(v.header.total_size as usize, msg.len());
            let len = encode_response(&mut out, &v.header, v.data).expect("re-encode a parsed response");
            assert_eq!(out[..len], *msg, "response round trip");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
