//! Unit tests of the control plane: frames, the blocking and non-blocking handshakes.

use super::*;
use crate::test_rng::Rng;
use std::net::TcpListener;
use std::thread::{self, JoinHandle};

/// Generous: the tests never wait for it except in the timeout tests.
const T: Duration = Duration::from_secs(20);

fn queue(n: u8) -> QueueInfo {
    let mut q = QueueInfo::new([n; 16], 0x100 + u32::from(n), 0x00AB_0000 | u32::from(n));
    q.lid = u16::from(n);
    q.uasid = 0x5A00 | u32::from(n);
    q.token = 0xC0DE_0000 | u32::from(n);
    q
}

fn client_hello(name: &str, queues: u8) -> ClientHello {
    ClientHello {
        version: CONTROL_VERSION,
        server_name: name.to_owned(),
        client_info: "pid=42 host=tester ünïcode".to_owned(),
        window: 16,
        max_msg: 8192,
        keepalive: Some((1000, 5)),
        queues: (0..queues).map(queue).collect(),
    }
}

fn server_hello(name: &str, queues: u8) -> ServerHello {
    ServerHello {
        version: CONTROL_VERSION,
        server_name: name.to_owned(),
        channel_id: 0x12_3456,
        credits: 64,
        max_msg: 4096,
        queues: (0..queues).map(|n| queue(n.wrapping_add(100))).collect(),
    }
}

fn malformed_text(r: Result<impl fmt::Debug, ControlError>) -> String {
    match r {
        Err(ControlError::Malformed(text)) => text,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

/// Rewrites the body-length field of `frame` to match what follows the header.
fn fix_len(frame: &mut [u8]) {
    let len = u32::try_from(frame.len() - HEADER_LEN).unwrap();
    frame[8..12].copy_from_slice(&len.to_le_bytes());
}

// ---- encoding and decoding ----

#[test]
fn client_hello_round_trip() {
    for hello in [
        client_hello("alpha", 3),
        client_hello("", 0),
        ClientHello {
            version: 7,
            server_name: "é".repeat(MAX_NAME_LEN / 2) + "x",
            client_info: "i".repeat(MAX_INFO_LEN),
            window: u32::MAX,
            max_msg: 0,
            keepalive: None,
            queues: (0..=255).map(queue).collect(),
        },
        ClientHello { keepalive: Some((u32::MAX, 1)), ..client_hello("k", 1) },
    ] {
        let frame = hello.encode().unwrap();
        assert_eq!(ClientHello::decode(&frame).unwrap(), hello);
    }
}

/// A keepalive with one of its two numbers 0 is neither "none" nor a limit: refused by name.
#[test]
fn half_a_keepalive_is_malformed() {
    for bad in [(0, 5), (1000, 0)] {
        let mut frame = client_hello("k", 1).encode().unwrap();
        // The keepalive follows the header, window and max_msg.
        frame[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&u32::to_le_bytes(bad.0));
        frame[HEADER_LEN + 12..HEADER_LEN + 16].copy_from_slice(&u32::to_le_bytes(bad.1));
        let text = malformed_text(ClientHello::decode(&frame));
        assert!(text.contains("keepalive"), "{text}");
    }
}

#[test]
fn largest_client_hello_fits_the_body_cap() {
    let hello = ClientHello {
        version: CONTROL_VERSION,
        server_name: "n".repeat(MAX_NAME_LEN),
        client_info: "i".repeat(MAX_INFO_LEN),
        window: 1,
        max_msg: 1,
        keepalive: Some((1000, 5)),
        queues: vec![queue(1); MAX_QUEUES],
    };
    let frame = hello.encode().unwrap();
    assert!(frame.len() - HEADER_LEN <= MAX_BODY_LEN);
    assert_eq!(ClientHello::decode(&frame).unwrap(), hello);
}

#[test]
fn server_hello_round_trip() {
    for hello in [
        server_hello("alpha", 3),
        server_hello("", 0),
        ServerHello { channel_id: MAX_CHANNEL_ID, credits: u32::MAX, ..server_hello("b", 255) },
    ] {
        let frame = hello.encode().unwrap();
        assert_eq!(ServerHello::decode(&frame).unwrap(), hello);
    }
}

#[test]
fn reject_round_trip() {
    for code in [
        RejectCode::Version,
        RejectCode::WrongName,
        RejectCode::Refused,
        RejectCode::Malformed,
        RejectCode::Tls,
        RejectCode::Other(0),
        RejectCode::Other(200),
    ] {
        let reject = Reject { version: 3, code, server_name: "srv".into(), reason: "because".into() };
        assert_eq!(Reject::decode(&reject.encode().unwrap()).unwrap(), reject);
        assert_eq!(RejectCode::from_u8(code.to_u8()), code);
    }
}

#[test]
fn golden_client_hello() {
    let hello = ClientHello {
        version: 1,
        server_name: "srv".into(),
        client_info: "hi".into(),
        window: 8,
        max_msg: 4096,
        keepalive: Some((1000, 5)),
        queues: vec![{
            let gid = [
                0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e,
                0x1f,
            ];
            let mut q = QueueInfo::new(gid, 0x0203, 0x00AB_CDEF);
            q.lid = 0x0405;
            q.uasid = 0x0607;
            q.token = 0xDEAD_BEEF;
            q.responder_resources = Some(2);
            q.requester_depth = Some(0);
            q
        }],
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // header: magic, type 1, reserved, version 1, body length 66
        0x42, 0x59, 0x50, 0x43, 0x01, 0x00, 0x01, 0x00, 0x42, 0x00, 0x00, 0x00,
        // window 8, max_msg 4096
        0x08, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
        // keepalive 1000 ms x 5
        0xe8, 0x03, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00,
        // server name "srv"
        0x03, 0x00, 0x73, 0x72, 0x76,
        // client info "hi"
        0x02, 0x00, 0x68, 0x69,
        // one queue: info version 1, 37 bytes: gid, qpn, psn, lid, uasid, token,
        // responder_resources, requester_depth, both known
        0x01, 0x00,
        0x01, 0x25,
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
        0x03, 0x02, 0x00, 0x00, 0xef, 0xcd, 0xab, 0x00, 0x05, 0x04, 0x07, 0x06, 0x00, 0x00,
        0xef, 0xbe, 0xad, 0xde, 0x02, 0x00, 0x03,
    ];
    assert_eq!(hello.encode().unwrap(), expected);
    assert_eq!(ClientHello::decode(expected).unwrap(), hello);
}

#[test]
fn golden_server_hello_and_reject() {
    let hello = ServerHello {
        version: 1,
        server_name: "s".into(),
        channel_id: 0x00AB_CDEF,
        credits: 32,
        max_msg: 0x0001_0000,
        queues: vec![],
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x42, 0x59, 0x50, 0x43, 0x02, 0x00, 0x01, 0x00, 0x11, 0x00, 0x00, 0x00,
        0xef, 0xcd, 0xab, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
        0x01, 0x00, 0x73,
        0x00, 0x00,
    ];
    assert_eq!(hello.encode().unwrap(), expected);
    assert_eq!(ServerHello::decode(expected).unwrap(), hello);

    let reject =
        Reject { version: 1, code: RejectCode::Refused, server_name: "s".into(), reason: "no".into() };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x42, 0x59, 0x50, 0x43, 0x03, 0x00, 0x01, 0x00, 0x08, 0x00, 0x00, 0x00,
        0x03, 0x01, 0x00, 0x73, 0x02, 0x00, 0x6e, 0x6f,
    ];
    assert_eq!(reject.encode().unwrap(), expected);
    assert_eq!(Reject::decode(expected).unwrap(), reject);
}

#[test]
fn bad_magic() {
    let mut frame = client_hello("a", 1).encode().unwrap();
    frame[0] = b'X';
    assert!(malformed_text(ClientHello::decode(&frame)).contains("magic"));
    // Entirely foreign bytes, e.g. an HTTP request.
    let http = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert!(malformed_text(ClientHello::decode(http)).contains("magic"));
}

#[test]
fn unknown_type_and_reserved_byte() {
    let frame = client_hello("a", 1).encode().unwrap();
    for kind in [0u8, 6, 0x7f, 0xff] {
        let mut bad = frame.clone();
        bad[4] = kind;
        let text = malformed_text(ClientHello::decode(&bad));
        assert!(text.contains(&format!("unknown message type {kind}")), "{text}");
        malformed_text(ServerHello::decode(&bad));
        malformed_text(Reject::decode(&bad));
    }
    let mut bad = frame.clone();
    bad[5] = 1;
    assert!(malformed_text(ClientHello::decode(&bad)).contains("reserved"));
}

#[test]
fn wrong_frame_type_for_the_decoder() {
    let client = client_hello("a", 1).encode().unwrap();
    let server = server_hello("a", 1).encode().unwrap();
    assert!(malformed_text(ServerHello::decode(&client)).contains("got a client hello"));
    assert!(malformed_text(ClientHello::decode(&server)).contains("got a server hello"));
    malformed_text(Reject::decode(&client));
}

#[test]
fn every_truncation_is_malformed() {
    let frames = [
        client_hello("alpha", 2).encode().unwrap(),
        server_hello("alpha", 2).encode().unwrap(),
        Reject { version: 1, code: RejectCode::Refused, server_name: "a".into(), reason: "r".into() }
            .encode()
            .unwrap(),
    ];
    for frame in &frames {
        for cut in 0..frame.len() {
            let prefix = &frame[..cut];
            // As received: the header's length no longer matches.
            assert!(matches!(ClientHello::decode(prefix), Err(ControlError::Malformed(_))));
            assert!(matches!(ServerHello::decode(prefix), Err(ControlError::Malformed(_))));
            assert!(matches!(Reject::decode(prefix), Err(ControlError::Malformed(_))));
            // With the length field rewritten to match: the body parser must notice.
            if cut >= HEADER_LEN {
                let mut consistent = prefix.to_vec();
                fix_len(&mut consistent);
                assert!(matches!(ClientHello::decode(&consistent), Err(ControlError::Malformed(_))));
                assert!(matches!(ServerHello::decode(&consistent), Err(ControlError::Malformed(_))));
                assert!(matches!(Reject::decode(&consistent), Err(ControlError::Malformed(_))));
            }
        }
    }
}

#[test]
fn oversize_length_is_malformed() {
    let mut frame = client_hello("a", 1).encode().unwrap();
    for declared in [MAX_BODY_LEN as u32 + 1, u32::MAX] {
        frame[8..12].copy_from_slice(&declared.to_le_bytes());
        let text = malformed_text(ClientHello::decode(&frame));
        assert!(text.contains("over the 65536-byte limit"), "{text}");
    }
    // Exactly at the cap is a length the header accepts (the body is then checked).
    let mut head = frame[..HEADER_LEN].to_vec();
    head[8..12].copy_from_slice(&(MAX_BODY_LEN as u32).to_le_bytes());
    assert!(parse_header(&head.try_into().unwrap()).is_ok());
}

#[test]
fn bad_utf8_is_malformed() {
    // Server name "srv" sits at body offset 18..21 of the client hello, client info after it.
    let base = ClientHello { client_info: "hi".into(), ..client_hello("srv", 1) };
    let frame = base.encode().unwrap();
    let mut bad = frame.clone();
    bad[HEADER_LEN + 18] = 0xff;
    assert!(malformed_text(ClientHello::decode(&bad)).contains("server name is not valid UTF-8"));
    let mut bad = frame.clone();
    bad[HEADER_LEN + 23] = 0xc3; // a lone lead byte followed by 'i'
    assert!(malformed_text(ClientHello::decode(&bad)).contains("client info is not valid UTF-8"));

    let reject =
        Reject { version: 1, code: RejectCode::Refused, server_name: "s".into(), reason: "ok".into() };
    let mut bad = reject.encode().unwrap();
    let last = bad.len() - 1;
    bad[last] = 0x80;
    assert!(malformed_text(Reject::decode(&bad)).contains("reason is not valid UTF-8"));
}

#[test]
fn trailing_bytes_are_malformed() {
    let frame = client_hello("a", 1).encode().unwrap();
    // Past the declared length.
    let mut longer = frame.clone();
    longer.push(0);
    assert!(malformed_text(ClientHello::decode(&longer)).contains("trailing"));
    // Inside the declared length, after the last field.
    fix_len(&mut longer);
    assert!(malformed_text(ClientHello::decode(&longer)).contains("trailing"));

    let mut server = server_hello("a", 1).encode().unwrap();
    server.extend_from_slice(&[1, 2, 3]);
    fix_len(&mut server);
    assert!(malformed_text(ServerHello::decode(&server)).contains("3 trailing bytes"));
}

#[test]
fn too_many_queues() {
    let mut hello = client_hello("a", 0);
    hello.queues = vec![queue(1); MAX_QUEUES + 1];
    assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
    let mut server = server_hello("a", 0);
    server.queues = vec![queue(1); MAX_QUEUES + 1];
    assert!(matches!(server.encode(), Err(ControlError::Unencodable(_))));

    // A hand-made frame declaring 257 queues (with all their bytes present).
    hello.queues.truncate(MAX_QUEUES);
    let mut frame = hello.encode().unwrap();
    let count_at = HEADER_LEN + 4 + 4 + 8 + 2 + 1 + 2 + hello.client_info.len();
    assert_eq!(frame[count_at..count_at + 2], [0x00, 0x01]);
    frame[count_at..count_at + 2].copy_from_slice(&257u16.to_le_bytes());
    frame.extend_from_slice(&queue(1).encode());
    fix_len(&mut frame);
    assert!(malformed_text(ClientHello::decode(&frame)).contains("257 queues"));
    // A count of u16::MAX with no queue bytes behind it fails without reserving that much.
    frame.truncate(count_at + 2);
    frame[count_at..count_at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
    fix_len(&mut frame);
    malformed_text(ClientHello::decode(&frame));
}

#[test]
fn overlong_strings_are_refused_not_truncated() {
    let mut hello = client_hello(&"n".repeat(MAX_NAME_LEN + 1), 1);
    let err = hello.encode().unwrap_err();
    assert!(err.to_string().contains("server name is 256 bytes"), "{err}");
    // 128 two-byte characters: 256 bytes although only 128 characters.
    hello.server_name = "é".repeat(128);
    assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
    hello.server_name = "ok".into();
    hello.client_info = "i".repeat(MAX_INFO_LEN + 1);
    assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
    let server = server_hello(&"n".repeat(MAX_NAME_LEN + 1), 0);
    assert!(matches!(server.encode(), Err(ControlError::Unencodable(_))));
    let reject = Reject {
        version: 1,
        code: RejectCode::Refused,
        server_name: "s".into(),
        reason: "r".repeat(MAX_REASON_LEN + 1),
    };
    assert!(matches!(reject.encode(), Err(ControlError::Unencodable(_))));

    // A frame declaring a 256-byte name (with the bytes present) does not decode.
    let mut frame = client_hello("x", 0).encode().unwrap();
    let name_at = HEADER_LEN + 16;
    frame.splice(name_at..name_at + 3, [0x00, 0x01].into_iter().chain([b'n'; 256]));
    fix_len(&mut frame);
    assert!(malformed_text(ClientHello::decode(&frame)).contains("256 bytes long"));
}

#[test]
fn channel_id_is_24_bits() {
    let hello = ServerHello { channel_id: MAX_CHANNEL_ID + 1, ..server_hello("a", 0) };
    assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
    let mut frame = server_hello("a", 0).encode().unwrap();
    frame[HEADER_LEN + 3] = 0x01;
    assert!(malformed_text(ServerHello::decode(&frame)).contains("24 bits"));
}

#[test]
fn clip_keeps_char_boundaries() {
    assert_eq!(clip("abc", 5), "abc");
    assert_eq!(clip("abc", 2), "ab");
    assert_eq!(clip("éé", 3), "é");
    assert_eq!(clip("é", 1), "");
}

#[test]
fn fuzzed_frames_never_panic() {
    let seeds = [
        client_hello("alpha", 2).encode().unwrap(),
        server_hello("alpha", 2).encode().unwrap(),
        Reject { version: 1, code: RejectCode::Version, server_name: "a".into(), reason: "r".into() }
            .encode()
            .unwrap(),
    ];
    let mut rng = Rng(0x00C0_FFEE);
    for round in 0..30_000 {
        let mut frame = seeds[round % seeds.len()].clone();
        match rng.below(4) {
            0 => {
                for _ in 0..=rng.below(4) {
                    let at = rng.below(frame.len());
                    frame[at] = rng.next() as u8;
                }
            }
            1 => frame.truncate(rng.below(frame.len() + 1)),
            2 => {
                let mut tail = vec![0u8; rng.below(40)];
                rng.fill(&mut tail);
                frame.extend_from_slice(&tail);
                if rng.percent(50) {
                    fix_len(&mut frame);
                }
            }
            _ => {
                // Keep a valid-looking header, randomize the body and its length.
                let mut body = vec![0u8; rng.below(200)];
                rng.fill(&mut body);
                frame.truncate(HEADER_LEN);
                frame.extend_from_slice(&body);
                fix_len(&mut frame);
            }
        }
        let _ = ClientHello::decode(&frame);
        let _ = ServerHello::decode(&frame);
        let _ = Reject::decode(&frame);
    }
}

#[test]
fn error_messages_name_what_is_wrong() {
    let e = ControlError::VersionMismatch { ours: 1, theirs: 2 };
    assert!(e.to_string().contains("version 1") && e.to_string().contains("version 2"));
    let e = ControlError::WrongServerName { expected: "a".into(), actual: "b".into() };
    assert_eq!(e.to_string(), "wrong server name: the client expected \"a\", but the server is \"b\"");
    assert!(ControlError::Rejected("full".into()).to_string().ends_with("full"));
    assert!(ControlError::Closed.to_string().contains("closed"));
    let e = ControlError::Connect {
        addr: "10.0.0.1:9".into(),
        source: io::Error::new(io::ErrorKind::TimedOut, "timed out"),
    };
    assert!(e.to_string().contains("no answer from 10.0.0.1:9"), "{e}");
}

// ---- over real sockets ----

type ServerResult = (Result<ClientHello, ControlError>, TcpStream);

/// Accepts one connection on 127.0.0.1 and runs [`accept`] on it in a thread.
fn spawn_server<F>(name: &'static str, decide: F) -> (SocketAddr, JoinHandle<ServerResult>)
where
    F: FnOnce(&ClientHello) -> Result<ServerHello, String> + Send + 'static,
{
    spawn_raw(move |mut stream| {
        let result = accept(&mut stream, name, T, decide);
        (result, stream)
    })
}

/// Accepts one connection on 127.0.0.1 and hands it to `f` in a thread.
fn spawn_raw<R: Send + 'static>(
    f: impl FnOnce(TcpStream) -> R + Send + 'static,
) -> (SocketAddr, JoinHandle<R>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        f(stream)
    });
    (addr, handle)
}

/// Reads one whole frame with plain blocking reads.
fn read_raw_frame(stream: &mut TcpStream) -> Vec<u8> {
    let mut frame = vec![0u8; HEADER_LEN];
    stream.read_exact(&mut frame).unwrap();
    let len = u32::from_le_bytes(frame[8..12].try_into().unwrap()) as usize;
    frame.resize(HEADER_LEN + len, 0);
    stream.read_exact(&mut frame[HEADER_LEN..]).unwrap();
    frame
}

/// A raw client: connects, writes `bytes`, reads the server's whole answer.
fn raw_client(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(bytes).unwrap();
    read_raw_frame(&mut stream)
}

fn answer_for(hello: &ClientHello, name: &str) -> ServerHello {
    ServerHello {
        version: CONTROL_VERSION,
        server_name: name.into(),
        channel_id: 0x00_0042,
        credits: hello.window * 2,
        max_msg: hello.max_msg.min(4096),
        queues: (0..hello.queues.len() as u8).map(|n| queue(n.wrapping_add(200))).collect(),
    }
}

#[test]
fn handshake_succeeds_and_both_sides_see_the_other() {
    let (addr, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "alpha")));
    let hello = client_hello("alpha", 3);
    let (client_stream, answer) = connect(addr, &hello, T).unwrap();
    let (got, mut server_stream) = server.join().unwrap();
    let got = got.unwrap();

    assert_eq!(got, hello);
    assert_eq!(got.client_info, "pid=42 host=tester ünïcode");
    assert_eq!(answer, answer_for(&hello, "alpha"));
    assert_eq!(answer.queues, vec![queue(200), queue(201), queue(202)]);
    assert_eq!(answer.credits, 32);
    for stream in [&client_stream, &server_stream] {
        assert_eq!(stream.read_timeout().unwrap(), None);
        assert_eq!(stream.write_timeout().unwrap(), None);
        assert!(stream.nodelay().unwrap());
    }

    // The stream stays open: the monitor returns only once the client drops its end.
    let monitor = thread::spawn(move || {
        wait_closed(&mut server_stream);
        server_stream
    });
    assert!(!monitor.is_finished());
    drop(client_stream);
    monitor.join().unwrap();
}

#[test]
fn handshake_with_no_queues() {
    let (addr, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "alpha")));
    let (_stream, answer) = connect(addr, &client_hello("alpha", 0), T).unwrap();
    assert!(answer.queues.is_empty());
    assert!(server.join().unwrap().0.unwrap().queues.is_empty());
}

#[test]
fn wrong_server_name_on_both_sides() {
    let (addr, server) = spawn_server("beta", |_| panic!("accept callback must not run"));
    let client = connect(addr, &client_hello("alpha", 1), T);
    let (server_result, _stream) = server.join().unwrap();
    for result in [client.map(|_| ()), server_result.map(|_| ())] {
        match result {
            Err(ControlError::WrongServerName { expected, actual }) => {
                assert_eq!((expected.as_str(), actual.as_str()), ("alpha", "beta"));
            }
            other => panic!("expected WrongServerName, got {other:?}"),
        }
    }
}

#[test]
fn version_mismatch_on_both_sides() {
    let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
    // A version-1 client (before queue infos were versioned) meets a version-6 server.
    let hello = ClientHello { version: 1, ..client_hello("alpha", 1) };
    match connect(addr, &hello, T) {
        Err(ControlError::VersionMismatch { ours: 1, theirs: 6 }) => {}
        other => panic!("client: expected VersionMismatch {{ 1, 6 }}, got {other:?}"),
    }
    match server.join().unwrap().0 {
        Err(ControlError::VersionMismatch { ours: 6, theirs: 1 }) => {}
        other => panic!("server: expected VersionMismatch {{ 6, 1 }}, got {other:?}"),
    }
}

#[test]
fn a_version_5_client_is_refused_by_a_version_6_server() {
    // Version 5 queue infos could not say that a queue serves or issues no READ (0 read as
    // "unknown"): a version-5 peer would try READs that fail the queue. (Version 3's had no
    // responder resources at all.)
    for old in [5, 3] {
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let hello = ClientHello { version: old, ..client_hello("alpha", 1) };
        match connect(addr, &hello, T) {
            Err(e @ ControlError::VersionMismatch { ours, theirs: CONTROL_VERSION }) if ours == old => {
                assert!(e.to_string().contains("version 6"), "the error names both versions: {e}");
            }
            other => panic!("client {old}: expected VersionMismatch, got {other:?}"),
        }
        assert!(
            matches!(server.join().unwrap().0, Err(ControlError::VersionMismatch { ours: 6, theirs }) if theirs == old)
        );
    }
}

#[test]
fn a_version_2_client_is_refused_by_a_version_3_server() {
    // Version 2 allowed no frame after the handshake; version 3 has queue resets.
    let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
    let hello = ClientHello { version: 2, ..client_hello("alpha", 1) };
    match connect(addr, &hello, T) {
        Err(ControlError::VersionMismatch { ours: 2, theirs: CONTROL_VERSION }) => {}
        other => panic!("client: expected VersionMismatch, got {other:?}"),
    }
    assert!(matches!(server.join().unwrap().0, Err(ControlError::VersionMismatch { .. })));
}

#[test]
fn callback_refusal_reaches_the_client() {
    let (addr, server) = spawn_server("alpha", |hello| {
        assert_eq!(hello.window, 16);
        Err("full".to_owned())
    });
    match connect(addr, &client_hello("alpha", 1), T) {
        Err(ControlError::Rejected(reason)) => assert_eq!(reason, "full"),
        other => panic!("expected Rejected(\"full\"), got {other:?}"),
    }
    match server.join().unwrap().0 {
        Err(ControlError::Rejected(reason)) => assert_eq!(reason, "full"),
        other => panic!("expected Rejected(\"full\"), got {other:?}"),
    }
}

#[test]
fn overlong_refusal_reason_is_clipped_for_the_wire_only() {
    let long = "é".repeat(MAX_REASON_LEN);
    let sent = long.clone();
    let (addr, server) = spawn_server("alpha", move |_| Err(sent));
    match connect(addr, &client_hello("alpha", 1), T) {
        Err(ControlError::Rejected(reason)) => {
            assert_eq!(reason.len(), MAX_REASON_LEN);
            assert!(long.starts_with(&reason));
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    match server.join().unwrap().0 {
        Err(ControlError::Rejected(reason)) => assert_eq!(reason, long),
        other => panic!("expected Rejected, got {other:?}"),
    }
}

#[test]
fn callback_answer_with_wrong_queue_count_is_refused() {
    let (addr, server) = spawn_server("alpha", |_| Ok(server_hello("alpha", 1)));
    match connect(addr, &client_hello("alpha", 2), T) {
        Err(ControlError::Rejected(reason)) => assert!(reason.contains("queue count"), "{reason}"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    match server.join().unwrap().0 {
        Err(ControlError::QueueCountMismatch { client: 2, server: 1 }) => {}
        other => panic!("expected QueueCountMismatch, got {other:?}"),
    }
}

#[test]
fn callback_answer_with_another_name_is_refused() {
    let (addr, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "gamma")));
    assert!(matches!(connect(addr, &client_hello("alpha", 1), T), Err(ControlError::Rejected(_))));
    assert!(matches!(server.join().unwrap().0, Err(ControlError::Unencodable(_))));
}

#[test]
fn connect_where_nothing_listens() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    match connect(addr, &client_hello("alpha", 1), T) {
        Err(e @ ControlError::Connect { .. }) => {
            let text = e.to_string();
            assert_eq!(text, format!("nothing listens at {addr} (connection refused)"));
            let ControlError::Connect { addr: named, source } = e else { unreachable!() };
            assert_eq!(named, addr.to_string());
            assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused);
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

#[test]
fn connect_to_an_unresolvable_name() {
    match connect("no-such-host.invalid:1", &client_hello("alpha", 1), T) {
        Err(e @ ControlError::Connect { .. }) => {
            assert!(e.to_string().contains("does not resolve"), "{e}")
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    match connect(("no-such-host.invalid", 1), &client_hello("alpha", 1), T) {
        Err(e @ ControlError::Connect { .. }) => {
            assert!(e.to_string().contains("does not resolve"), "{e}")
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

/// Several socket addresses, and no `Display`: `connect` takes any `ToSocketAddrs`.
struct Addrs(Vec<SocketAddr>);

impl ToSocketAddrs for Addrs {
    type Iter = std::vec::IntoIter<SocketAddr>;
    fn to_socket_addrs(&self) -> io::Result<Self::Iter> {
        Ok(self.0.clone().into_iter())
    }
}

#[test]
fn connect_error_describes_the_resolved_addresses() {
    let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let b: SocketAddr = "127.0.0.2:2".parse().unwrap();
    let c: SocketAddr = "[::1]:3".parse().unwrap();
    assert_eq!(describe_addrs(&[a]), "127.0.0.1:1");
    assert_eq!(describe_addrs(&[a, b]), "127.0.0.1:1 or 127.0.0.2:2");
    assert_eq!(describe_addrs(&[a, b, c]), "127.0.0.1:1, 127.0.0.2:2 or [::1]:3");
}

#[test]
fn connect_tries_each_address() {
    let dead = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (live, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "alpha")));
    let (_stream, answer) = connect(Addrs(vec![dead, live]), &client_hello("alpha", 1), T).unwrap();
    assert_eq!(answer.server_name, "alpha");
    server.join().unwrap().0.unwrap();

    match connect(Addrs(vec![dead, dead]), &client_hello("alpha", 1), T) {
        Err(e @ ControlError::Connect { .. }) => {
            assert!(e.to_string().contains(&format!("{dead} or {dead}")), "{e}")
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    match connect(Addrs(vec![]), &client_hello("alpha", 1), T) {
        Err(ControlError::Connect { source, .. }) => {
            assert_eq!(source.kind(), io::ErrorKind::InvalidInput)
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

#[test]
fn unencodable_hello_fails_before_connecting() {
    // Nothing listens there; the encode error must come first.
    let hello = client_hello(&"n".repeat(MAX_NAME_LEN + 1), 1);
    assert!(matches!(connect("127.0.0.1:1", &hello, T), Err(ControlError::Unencodable(_))));
}

#[test]
fn zero_timeout_is_invalid() {
    match connect("127.0.0.1:1", &client_hello("a", 0), Duration::ZERO) {
        Err(ControlError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput),
        other => panic!("expected Io(InvalidInput), got {other:?}"),
    }
}

#[test]
fn server_closes_after_reading_the_hello() {
    let (addr, server) = spawn_raw(|mut stream| {
        read_raw_frame(&mut stream);
    });
    let result = connect(addr, &client_hello("alpha", 1), T);
    assert!(matches!(result, Err(ControlError::Closed)), "{result:?}");
    server.join().unwrap();
}

#[test]
fn server_closes_without_reading() {
    // Unread data makes the close a reset, or the client's write may fail: both are Closed.
    let (addr, server) = spawn_raw(drop);
    let result = connect(addr, &client_hello("alpha", 1), T);
    assert!(matches!(result, Err(ControlError::Closed)), "{result:?}");
    server.join().unwrap();
}

#[test]
fn server_closes_in_the_middle_of_its_answer() {
    for cut in [1, HEADER_LEN - 1, HEADER_LEN, HEADER_LEN + 7] {
        let (addr, server) = spawn_raw(move |mut stream| {
            read_raw_frame(&mut stream);
            let answer = server_hello("alpha", 1).encode().unwrap();
            stream.write_all(&answer[..cut]).unwrap();
        });
        let result = connect(addr, &client_hello("alpha", 1), T);
        assert!(matches!(result, Err(ControlError::Closed)), "cut {cut}: {result:?}");
        server.join().unwrap();
    }
}

#[test]
fn client_closes_before_sending_everything() {
    let hello = client_hello("alpha", 1).encode().unwrap();
    for cut in [0, 3, HEADER_LEN, hello.len() - 1] {
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(&hello[..cut]).unwrap();
        drop(stream);
        let result = server.join().unwrap().0;
        assert!(matches!(result, Err(ControlError::Closed)), "cut {cut}: {result:?}");
    }
}

fn assert_rejected_as_malformed(answer: &[u8], server: JoinHandle<ServerResult>, needle: &str) {
    let reject = Reject::decode(answer).unwrap();
    assert_eq!(reject.code, RejectCode::Malformed);
    assert_eq!(reject.server_name, "alpha");
    assert!(reject.reason.contains(needle), "{}", reject.reason);
    let text = malformed_text(server.join().unwrap().0);
    assert!(text.contains(needle), "{text}");
}

#[test]
fn server_rejects_garbage() {
    let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
    let answer = raw_client(addr, b"GET / HTTP/1.1\r\n");
    assert_rejected_as_malformed(&answer, server, "magic");
}

#[test]
fn server_refuses_an_oversize_length_without_reading_it() {
    let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
    let mut head = client_hello("alpha", 0).encode().unwrap();
    head.truncate(HEADER_LEN);
    head[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let answer = raw_client(addr, &head);
    assert_rejected_as_malformed(&answer, server, "limit");
}

#[test]
fn server_rejects_a_bad_body_and_a_wrong_frame_type() {
    let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
    let mut frame = client_hello("alpha", 1).encode().unwrap();
    frame.push(0);
    fix_len(&mut frame);
    let answer = raw_client(addr, &frame);
    assert_rejected_as_malformed(&answer, server, "trailing");

    let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
    let answer = raw_client(addr, &server_hello("alpha", 1).encode().unwrap());
    assert_rejected_as_malformed(&answer, server, "got a server hello");
}

#[test]
fn client_checks_the_servers_answer() {
    type Case = (ServerHello, fn(&ControlError) -> bool);
    let cases: [Case; 3] = [
        (server_hello("beta", 2), |e| {
            let ControlError::WrongServerName { expected, actual } = e else { return false };
            expected == "alpha" && actual == "beta"
        }),
        (server_hello("alpha", 1), |e| {
            matches!(e, ControlError::QueueCountMismatch { client: 2, server: 1 })
        }),
        (ServerHello { version: 7, ..server_hello("alpha", 2) }, |e| {
            matches!(e, ControlError::VersionMismatch { ours: CONTROL_VERSION, theirs: 7 })
        }),
    ];
    for (answer, expected) in cases {
        let frame = answer.encode().unwrap();
        let (addr, server) = spawn_raw(move |mut stream| {
            read_raw_frame(&mut stream);
            stream.write_all(&frame).unwrap();
            wait_closed(&mut stream);
        });
        let err = connect(addr, &client_hello("alpha", 2), T).unwrap_err();
        assert!(expected(&err), "unexpected {err:?}");
        server.join().unwrap();
    }
}

#[test]
fn client_maps_unusual_answers() {
    type Case = (Vec<u8>, fn(&ControlError) -> bool);
    let answers: [Case; 3] = [
        (
            client_hello("alpha", 1).encode().unwrap(),
            |e| matches!(e, ControlError::Malformed(t) if t.contains("got a client hello")),
        ),
        (
            Reject {
                version: 1,
                code: RejectCode::Other(99),
                server_name: "alpha".into(),
                reason: "newer".into(),
            }
            .encode()
            .unwrap(),
            |e| matches!(e, ControlError::Rejected(r) if r == "newer"),
        ),
        (
            Reject {
                version: 1,
                code: RejectCode::Malformed,
                server_name: "alpha".into(),
                reason: "bad".into(),
            }
            .encode()
            .unwrap(),
            |e| {
                let ControlError::Malformed(text) = e else { return false };
                text.contains("could not parse our client hello: bad")
            },
        ),
    ];
    for (frame, expected) in answers {
        let (addr, server) = spawn_raw(move |mut stream| {
            read_raw_frame(&mut stream);
            stream.write_all(&frame).unwrap();
            wait_closed(&mut stream);
        });
        let err = connect(addr, &client_hello("alpha", 1), T).unwrap_err();
        assert!(expected(&err), "unexpected {err:?}");
        server.join().unwrap();
    }
}

#[test]
fn server_times_out_on_a_silent_client() {
    let (addr, server) = spawn_raw(|mut stream| {
        accept(&mut stream, "alpha", Duration::from_millis(100), |_| panic!("must not run"))
    });
    // Connected but silent until the server gives up; kept open so only the timeout can end it.
    let client = TcpStream::connect(addr).unwrap();
    match server.join().unwrap() {
        Err(ControlError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut),
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(client);
}

#[test]
fn client_times_out_on_a_silent_server() {
    let (addr, server) = spawn_raw(|mut stream| {
        read_raw_frame(&mut stream);
        wait_closed(&mut stream); // never answers; returns once the client gives up
    });
    match connect(addr, &client_hello("alpha", 1), Duration::from_millis(100)) {
        Err(ControlError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut),
        other => panic!("expected a timeout, got {other:?}"),
    }
    server.join().unwrap();
}

#[test]
fn wait_closed_returns_when_the_peer_drops_its_stream() {
    let (addr, monitor) = spawn_raw(|mut stream| {
        wait_closed(&mut stream);
    });
    let client = TcpStream::connect(addr).unwrap();
    drop(client);
    monitor.join().unwrap();
}

#[test]
fn wait_closed_treats_stray_bytes_as_closure_and_shuts_down() {
    let (addr, monitor) = spawn_raw(|mut stream| {
        wait_closed(&mut stream);
    });
    let mut client = TcpStream::connect(addr).unwrap();
    client.write_all(b"x").unwrap();
    monitor.join().unwrap();
    // The monitor shut the stream down: the client sees end of stream (or a reset).
    let mut buf = [0u8; 1];
    match client.read(&mut buf) {
        Ok(0) => {}
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
        Ok(n) => panic!("read {n} bytes from a shut-down stream"),
    }
}
