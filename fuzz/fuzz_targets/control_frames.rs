//! Fuzz target: the control plane's frames (`bypass::control`): the handshake's client hello,
//! server hello and reject, and the session frames (queue reset and its answer).
//!
//! Besides "never panics", a frame must be accepted by at most the one decoder of its type, and
//! what a decoder accepts must survive encode → decode unchanged, with the encoding a fixed point
//! (encoding what it decodes to gives the same bytes again). Bytes the format lets a reader skip
//! or ignore — a queue info's extra body bytes, a refused answer's queue info, a session frame's
//! version — are why the first encoding may differ from the input.
//!
//! Input: byte 0 chooses the mode. Below 0x80: the rest is the frame as is. From 0x80: a frame
//! header is written in front of the rest — magic, the type from byte 0 (1..=5), reserved 0, the
//! current version, and the body's true length — so the fuzzer's time goes to the bodies.
#![no_main]

use bypass::control::{
    ClientHello, QueueReset, QueueResetDone, Reject, ServerHello, CONTROL_VERSION, HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let frame = if mode < 0x80 {
        rest.to_vec()
    } else {
        let mut f = Vec::with_capacity(HEADER_LEN + rest.len());
        f.extend_from_slice(b"BYPC");
        f.push(1 + (mode & 0x7F) % 5);
        f.push(0);
        f.extend_from_slice(&CONTROL_VERSION.to_le_bytes());
        f.extend_from_slice(&(rest.len() as u32).to_le_bytes());
        f.extend_from_slice(rest);
        f
    };
    check(&frame);
});

/// Decodes `frame` as `T`; if accepted, checks the round trip and returns 1.
fn round_trip<T: PartialEq + std::fmt::Debug, E: std::fmt::Display>(
    frame: &[u8],
    decode: fn(&[u8]) -> Result<T, E>,
    encode: fn(&T) -> Result<Vec<u8>, E>,
    what: &str,
) -> usize {
    match decode(frame) {
        Ok(v) => {
            let once = encode(&v).unwrap_or_else(|e| panic!("{what}: a decoded frame does not encode: {e}"));
            let back =
                decode(&once).unwrap_or_else(|e| panic!("{what}: its own encoding does not decode: {e}"));
            assert_eq!(back, v, "{what}: encode → decode changed the value");
            let twice = encode(&back).unwrap_or_else(|e| panic!("{what}: re-encoding failed: {e}"));
            assert_eq!(twice, once, "{what}: the encoding is not a fixed point");
            assert!(once.len() <= frame.len() + 256, "{what}: the encoding grew beyond a byte per queue");
            1
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "{what}: an error without a message");
            0
        }
    }
}

fn check(frame: &[u8]) {
    let accepted = round_trip(frame, ClientHello::decode, ClientHello::encode, "client hello")
        + round_trip(frame, ServerHello::decode, ServerHello::encode, "server hello")
        + round_trip(frame, Reject::decode, Reject::encode, "reject")
        + round_trip(frame, QueueReset::decode, QueueReset::encode, "queue reset")
        + round_trip(frame, QueueResetDone::decode, QueueResetDone::encode, "queue reset answer");
    assert!(accepted <= 1, "{accepted} decoders accepted one frame");
}
