//! Fuzz target: the descriptors peers hand each other — `RemoteRegion::decode` (a region for
//! one-sided I/O, carried in an application's RPC) and `QueueInfo::decode` (a queue, in the
//! control plane's hellos and queue resets).
//!
//! Besides "never panics": a remote region decodes exactly when it is 49 bytes of version 1 and
//! then encodes back to the same bytes; a queue info reports the bytes it took (its announced
//! length), its known fields encode back to the same bytes, and what it decodes to survives
//! encode → decode.
#![no_main]

use bypass::hal::QueueInfo;
use bypass::RemoteRegion;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match RemoteRegion::decode(data) {
        Ok(r) => {
            assert!(data.len() == RemoteRegion::ENCODED_LEN && data[0] == 1);
            assert_eq!(r.encode()[..], *data, "remote region round trip");
        }
        Err(e) => {
            assert!(data.len() != RemoteRegion::ENCODED_LEN || data[0] != 1, "refused a valid region: {e}");
            assert!(!e.to_string().is_empty());
        }
    }

    match QueueInfo::decode(data) {
        Ok((info, used)) => {
            let body = usize::from(data[1]);
            assert_eq!(used, 2 + body, "a queue info takes its announced length");
            assert!(used <= data.len());
            let enc = info.encode();
            assert_eq!(enc[0], data[0]);
            // gid .. token: the 34 bytes every version has.
            assert_eq!(enc[2..36], data[2..36], "queue info fields round trip");
            // responder_resources, requester_depth, known bits: a 37-byte (or longer) body says
            // which values are known (other bits skipped, an unknown value written 0); a 35- or
            // 36-byte one has the responder resources alone (0: unknown); a 34-byte one neither.
            let want = match body {
                34 => [0, 0, 0],
                35 | 36 => [data[36], 0, u8::from(data[36] != 0)],
                _ => {
                    let known = data[38] & 3;
                    let r = if known & 1 != 0 { data[36] } else { 0 };
                    let d = if known & 2 != 0 { data[37] } else { 0 };
                    [r, d, known]
                }
            };
            assert_eq!(enc[36..39], want, "queue info READ limits");
            let (back, n) = QueueInfo::decode(&enc).expect("an encoded queue info decodes");
            assert_eq!((back, n), (info, QueueInfo::ENCODED_LEN));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
