//! Two processes, each with its own `Fabric`: the in-process wire cannot carry calls between
//! them, and connecting must say so at once — not "connect" and fail the first call later with
//! `Queue(Flushed)`. The test re-executes its own binary as the server process.

use bypass::sim::{Engine, Fabric};
use bypass::{Channel, ChannelConfig, Functions, Server, ServerConfig};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::ids::ECHO;

const CHILD: &str = "BYPASS_TEST_CHILD_SERVER";

/// In the child: serve until stdin closes (the parent holds it open), after printing the address.
#[test]
fn child_server() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful when the parent test starts this binary as its server
    }
    let fabric = Fabric::new(Engine::Inline);
    let nic = fabric.add_nic();
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        let args = req.args().to_vec();
        let _ = req.reply(&args);
    });
    let server = Server::bind(&nic, "127.0.0.1:0", ServerConfig::new("two"), functions).expect("bind");
    println!("ADDR {}", server.local_addr());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

#[test]
fn connecting_to_a_sim_nic_in_another_process_fails_at_connect_with_the_reason() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_server", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the server process");
    // Read the address on a thread, so a child that never prints it cannot hang this test.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The harness may print "test child_server ... " before it on the same line.
            if let Some(i) = line.find("ADDR ") {
                let _ = tx.send(line[i + 5..].trim().to_string());
            }
        }
    });
    let addr = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(addr) => addr,
        Err(e) => {
            let _ = child.kill();
            panic!("the server process printed no address within 60 s: {e}");
        }
    };
    let fabric = Fabric::new(Engine::Inline);
    let nic = fabric.add_nic();
    let start = Instant::now();
    let mut config = ChannelConfig::new("two");
    config.connect_timeout = Duration::from_secs(20);
    let result = Channel::connect(&nic, addr.as_str(), config);
    drop(child.stdin.take()); // lets the child exit; kill it if it does not
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match result {
        Ok(_) => panic!("a channel to a sim NIC in another process connected"),
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("another process"), "the error says why: {text}");
            assert!(start.elapsed() < Duration::from_secs(20), "refused at connect, not by a timeout");
        }
    }
}
