//! Tracing end to end: the recorder (`bypass_hal::trace`) sees one RPC go client → NIC → wire →
//! NIC → server and back, in causal order, on the Inline and the Stepped engine; the Chrome JSON
//! it writes parses and names every row; and with recording off nothing is recorded.
//!
//! The recorder is process-wide, so every test here holds `SERIAL`.

use bypass::hal::trace::{self, Kind, TraceEvent, Track, Value};
use bypass::sim::Engine;
use bypass::CallOptions;
use std::sync::{Arc, Mutex, MutexGuard};

mod common;
use common::ids::ECHO;
use common::rig::Rig;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shared rig with the server named `trace` (its worker thread's row is `bypass-trace...`).
fn rig(engine: Engine) -> Rig {
    Rig::build(engine, |s| {
        s.server.name = "trace".into();
        s.channel.server_name = "trace".into();
    })
}

/// The one event after `from_ns` that `pred` accepts (panics unless there is exactly one).
fn the<'a>(
    events: &'a [TraceEvent],
    what: &str,
    from_ns: u64,
    pred: impl Fn(&TraceEvent) -> bool,
) -> &'a TraceEvent {
    let found: Vec<&TraceEvent> = events.iter().filter(|e| e.ts_ns >= from_ns && pred(e)).collect();
    assert_eq!(found.len(), 1, "expected exactly one {what}, found {found:#?}");
    found[0]
}

/// Checks the events of the one WAIT_RSP call in `events`, made from NIC `c` to NIC `s`.
fn check_causal_order(events: &[TraceEvent], c: u32, s: u32) {
    let client = Track::Thread("client");
    let server = Track::Thread("server");
    let named = |track: Track, name: &'static str| move |e: &TraceEvent| e.track == track && e.name == name;
    let start = the(events, "call start", 0, named(client, "call start"));
    let req_id = start.arg("req_id").and_then(Value::as_u64).expect("call start has a req_id");
    assert_eq!(start.arg("mode"), Some(Value::Str("WAIT_RSP")));
    let t0 = start.ts_ns;
    let steps: Vec<(&str, &TraceEvent)> = vec![
        ("client: call start", start),
        ("client NIC: doorbell sq", the(events, "client doorbell", t0, named(Track::Nic(c), "doorbell sq"))),
        ("client NIC: wqe fetch", the(events, "client wqe fetch", t0, named(Track::Nic(c), "wqe fetch"))),
        ("wire c→s: SEND", the(events, "request packet", t0, named(Track::Wire { from: c, to: s }, "SEND"))),
        ("server NIC: cqe recv", the(events, "server recv cqe", t0, named(Track::Nic(s), "cqe recv"))),
        (
            "server: request",
            the(events, "request", t0, |e| {
                e.track == server && e.name == "request" && e.arg("req_id") == Some(Value::U64(req_id))
            }),
        ),
        ("server NIC: doorbell sq", the(events, "server doorbell", t0, named(Track::Nic(s), "doorbell sq"))),
        ("wire s→c: SEND", the(events, "response packet", t0, named(Track::Wire { from: s, to: c }, "SEND"))),
        ("client NIC: cqe recv", the(events, "client recv cqe", t0, named(Track::Nic(c), "cqe recv"))),
        ("client: call complete", the(events, "call complete", t0, named(client, "call complete"))),
    ];
    for pair in steps.windows(2) {
        let ((a, ea), (b, eb)) = (pair[0], pair[1]);
        assert!(ea.ts_ns <= eb.ts_ns, "{a} at {} ns comes after {b} at {} ns", ea.ts_ns, eb.ts_ns);
    }
    let by = |name: &str| steps.iter().find(|(n, _)| *n == name).unwrap().1;
    // Packets are slices of their wire: each lands before the receiving NIC completes it.
    let (request, response) = (by("wire c→s: SEND"), by("wire s→c: SEND"));
    assert!(matches!(request.kind, Kind::Async { .. }) && matches!(response.kind, Kind::Async { .. }));
    assert!(request.end_ns() <= by("server NIC: cqe recv").ts_ns);
    assert!(response.end_ns() <= by("client NIC: cqe recv").ts_ns);
    assert_eq!(by("server NIC: cqe recv").arg("status"), Some(Value::Str("Success")));
    assert_eq!(by("client NIC: wqe fetch").arg("op"), Some(Value::Str("SEND")));
    // The handler replied inside the request slice.
    let request_span = by("server: request");
    let reply = the(events, "reply", t0, named(server, "reply"));
    assert!(request_span.ts_ns <= reply.ts_ns && reply.ts_ns <= request_span.end_ns());
    // The call as a whole is a slice of the client's row.
    let call = the(events, "call slice", t0, named(client, "call"));
    assert!(matches!(call.kind, Kind::Async { .. }));
    assert_eq!(call.arg("ok"), Some(Value::Bool(true)));
    assert!(call.ts_ns >= t0 && call.end_ns() <= by("client: call complete").ts_ns);
}

#[test]
fn one_rpc_inline_in_causal_order_and_valid_json() {
    let _g = serial();
    let rig = rig(Engine::Inline);
    let (cnic, snic, channel) = (&rig.cnic, &rig.snic, &rig.channel);
    trace::start();
    let mut response = Vec::new();
    channel.call(ECHO, b"ping", &mut response).unwrap();
    assert_eq!(response, b"ping");
    let events = trace::snapshot();
    let path = std::env::temp_dir().join(format!("bypass-trace-test-{}.json", std::process::id()));
    let written = trace::finish(&path).unwrap();
    assert!(!trace::is_enabled());
    assert!(written >= events.len(), "finish writes what was recorded ({written} < {})", events.len());
    let (c, s) = (cnic.addr(), snic.addr());
    check_causal_order(&events, c, s);

    // Client and server ran on different threads (the server's worker).
    let thread_of =
        |track: Track, name: &str| events.iter().find(|e| e.track == track && e.name == name).unwrap().thread;
    assert_ne!(
        thread_of(Track::Thread("client"), "call start"),
        thread_of(Track::Thread("server"), "request")
    );
    // Device work shows as "device run" slices of the NIC rows.
    assert!(events.iter().any(|e| e.track == Track::Nic(s) && e.name == "device run"));

    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let json = json::parse(&text).unwrap_or_else(|e| panic!("the trace is not JSON: {e}"));
    let list = json.get("traceEvents").and_then(json::J::as_array).expect("a traceEvents array");
    let mut processes = Vec::new();
    let mut threads = Vec::new();
    let mut counted = 0;
    for ev in list {
        let ph = ev.get("ph").and_then(json::J::as_str).expect("every event has a phase");
        let pid = ev.get("pid").and_then(json::J::as_f64).expect("every event has a pid");
        assert!(ev.get("tid").and_then(json::J::as_f64).is_some(), "every event has a tid");
        let name = ev.get("name").and_then(json::J::as_str).expect("every event has a name");
        match ph {
            "M" => {
                let arg = ev.get("args").and_then(|a| a.get("name")).and_then(json::J::as_str);
                match name {
                    "process_name" => processes.push((arg.unwrap().to_string(), pid)),
                    "thread_name" => threads.push(arg.unwrap().to_string()),
                    _ => {}
                }
            }
            "e" => {}
            "i" | "X" | "b" => {
                assert!(ev.get("ts").and_then(json::J::as_f64).is_some(), "{name} has a timestamp");
                if ph == "X" {
                    assert!(ev.get("dur").and_then(json::J::as_f64).is_some(), "{name} has a duration");
                }
                counted += 1;
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    assert_eq!(counted, written, "one JSON event (an async pair counting once) per recorded event");
    let pid = |name: &str| {
        processes
            .iter()
            .find(|(n, _)| n.strip_suffix(&format!(" [pid {}]", std::process::id())) == Some(name))
            .unwrap_or_else(|| panic!("no process {name} in {processes:?}"))
            .1
    };
    // Rows in sequence-diagram order: client, its NIC, the wires, the server's NIC, server.
    let order = [
        pid("client"),
        pid(&format!("NIC {c}")),
        pid(&format!("wire {c}\u{2192}{s}")),
        pid(&format!("wire {s}\u{2192}{c}")),
        pid(&format!("NIC {s}")),
        pid("server"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "process order {order:?} in {processes:?}");
    assert!(threads.iter().any(|t| t.starts_with("bypass-trace")), "the server worker's row: {threads:?}");
    drop(rig);
}

#[test]
fn one_rpc_stepped_in_causal_order() {
    let _g = serial();
    let rig = rig(Engine::Stepped { seed: 11 });
    let (fabric, cnic, snic, server, channel) =
        (&rig.fabric, &rig.cnic, &rig.snic, &rig.server, &rig.channel);
    trace::start();
    let got = Arc::new(Mutex::new(None));
    let sink = got.clone();
    channel
        .call_callback(&CallOptions::default(), ECHO, b"ping", move |r| {
            *sink.lock().unwrap() = Some(r.map(<[u8]>::to_vec).map_err(|e| e.to_string()));
        })
        .unwrap();
    fabric.run_until_idle();
    assert!(server.poll() > 0, "the request reached the server");
    fabric.run_until_idle();
    assert!(channel.poll() > 0, "the response reached the client");
    assert_eq!(*got.lock().unwrap(), Some(Ok(b"ping".to_vec())));
    fabric.advance(std::time::Duration::from_micros(5));
    let events = trace::take();
    check_causal_order(&events, cnic.addr(), snic.addr());
    // Stepped: one unit per device run, and the virtual clock's moves are recorded.
    let run = events.iter().find(|e| e.name == "device run").expect("device runs");
    assert!(matches!(run.arg("units"), Some(Value::Str("Rx" | "Tx" | "Send" | "Timer"))));
    let advance = events.iter().find(|e| e.name == "advance clock").expect("the clock's move");
    assert_eq!(advance.arg("by_ns"), Some(Value::U64(5_000)));
}

#[test]
fn recording_off_records_nothing() {
    let _g = serial();
    let _ = trace::take();
    assert!(!trace::is_enabled());
    let rig = rig(Engine::Inline);
    let channel = &rig.channel;
    let mut response = Vec::new();
    for _ in 0..10 {
        channel.call(ECHO, b"ping", &mut response).unwrap();
    }
    assert!(trace::take().is_empty(), "nothing is recorded while recording is off");
    assert_eq!(trace::dropped(), 0);
}

/// A small JSON parser, enough to check that the trace is well-formed.
mod json {
    #[derive(Debug)]
    pub enum J {
        Null,
        Bool(#[allow(dead_code)] bool),
        Num(f64),
        Str(String),
        Arr(Vec<J>),
        Obj(Vec<(String, J)>),
    }

    impl J {
        pub fn get(&self, key: &str) -> Option<&J> {
            match self {
                J::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
        pub fn as_array(&self) -> Option<&[J]> {
            match self {
                J::Arr(v) => Some(v),
                _ => None,
            }
        }
        pub fn as_str(&self) -> Option<&str> {
            match self {
                J::Str(s) => Some(s),
                _ => None,
            }
        }
        pub fn as_f64(&self) -> Option<f64> {
            match self {
                J::Num(n) => Some(*n),
                _ => None,
            }
        }
    }

    pub fn parse(text: &str) -> Result<J, String> {
        let mut p = Parser { s: text.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing bytes at {}", p.i));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\n' | b'\r' | b'\t') {
                self.i += 1;
            }
        }

        fn err<T>(&self, what: &str) -> Result<T, String> {
            Err(format!("{what} at byte {}", self.i))
        }

        fn eat(&mut self, c: u8) -> Result<(), String> {
            self.ws();
            if self.s.get(self.i) == Some(&c) {
                self.i += 1;
                Ok(())
            } else {
                self.err(&format!("expected '{}'", c as char))
            }
        }

        fn value(&mut self) -> Result<J, String> {
            self.ws();
            match self.s.get(self.i) {
                Some(b'{') => {
                    self.i += 1;
                    let mut fields = Vec::new();
                    self.ws();
                    if self.s.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        return Ok(J::Obj(fields));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.eat(b':')?;
                        fields.push((k, self.value()?));
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b'}') => {
                                self.i += 1;
                                return Ok(J::Obj(fields));
                            }
                            _ => return self.err("expected ',' or '}'"),
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut items = Vec::new();
                    self.ws();
                    if self.s.get(self.i) == Some(&b']') {
                        self.i += 1;
                        return Ok(J::Arr(items));
                    }
                    loop {
                        items.push(self.value()?);
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                return Ok(J::Arr(items));
                            }
                            _ => return self.err("expected ',' or ']'"),
                        }
                    }
                }
                Some(b'"') => self.string().map(J::Str),
                Some(b't') => self.word("true", J::Bool(true)),
                Some(b'f') => self.word("false", J::Bool(false)),
                Some(b'n') => self.word("null", J::Null),
                Some(b'-' | b'0'..=b'9') => {
                    let start = self.i;
                    while self.i < self.s.len()
                        && matches!(self.s[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                    {
                        self.i += 1;
                    }
                    let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                    let digits = t.trim_start_matches('-');
                    let leading_zero =
                        digits.len() > 1 && digits.starts_with('0') && !digits.starts_with("0.");
                    match t.parse::<f64>() {
                        Ok(n) if !leading_zero && !t.ends_with('.') => Ok(J::Num(n)),
                        _ => self.err(&format!("bad number {t}")),
                    }
                }
                _ => self.err("expected a value"),
            }
        }

        fn word(&mut self, w: &str, v: J) -> Result<J, String> {
            if self.s[self.i..].starts_with(w.as_bytes()) {
                self.i += w.len();
                Ok(v)
            } else {
                self.err("bad literal")
            }
        }

        fn string(&mut self) -> Result<String, String> {
            if self.s.get(self.i) != Some(&b'"') {
                return self.err("expected a string");
            }
            self.i += 1;
            let mut out = Vec::new();
            loop {
                let Some(&c) = self.s.get(self.i) else { return self.err("unterminated string") };
                self.i += 1;
                match c {
                    b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                    b'\\' => {
                        let Some(&e) = self.s.get(self.i) else { return self.err("bad escape") };
                        self.i += 1;
                        match e {
                            b'"' | b'\\' | b'/' => out.push(e),
                            b'n' => out.push(b'\n'),
                            b't' => out.push(b'\t'),
                            b'r' => out.push(b'\r'),
                            b'b' => out.push(8),
                            b'f' => out.push(12),
                            b'u' => {
                                let hex = self.s.get(self.i..self.i + 4).ok_or("short \\u escape")?;
                                let code = u32::from_str_radix(std::str::from_utf8(hex).unwrap(), 16)
                                    .map_err(|e| e.to_string())?;
                                self.i += 4;
                                let ch = char::from_u32(code).unwrap_or('\u{fffd}');
                                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                            }
                            _ => return self.err("bad escape"),
                        }
                    }
                    c if c < 0x20 => return self.err("control character in a string"),
                    c => out.push(c),
                }
            }
        }
    }

    #[test]
    fn the_parser_refuses_broken_json() {
        assert!(parse("{\"a\":[1,2.5,-3e2,\"x\\u00e9\\n\",true,null,{}]}").is_ok());
        for bad in ["{", "{\"a\":}", "[1,]", "\"a\nb\"", "{\"a\":1}x", "01", "[1 2]"] {
            assert!(parse(bad).is_err(), "{bad} should not parse");
        }
    }
}
