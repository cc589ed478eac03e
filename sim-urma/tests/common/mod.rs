//! Finding the built `liburma.so` from a test binary, and running child processes with a bound.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The cdylib cargo built for these tests: `target/<profile>/deps/liburma.so` (next to the test
/// binary), or `target/<profile>/liburma.so`.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the test binary has a directory");
    for cand in [deps.join("liburma.so"), deps.parent().map(|p| p.join("liburma.so")).unwrap_or_default()] {
        if cand.is_file() {
            return cand;
        }
    }
    panic!("liburma.so not found next to {} (cargo builds the cdylib with the tests)", exe.display());
}

/// A directory holding `liburma.so.0` (the soname programs ask for) pointing at [`library`].
pub fn lib_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bypass-sim-urma-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("liburma.so.0");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(library(), &link).unwrap();
    let link2 = dir.join("liburma.so");
    let _ = std::fs::remove_file(&link2);
    std::os::unix::fs::symlink(library(), &link2).unwrap();
    dir
}

/// Waits for `child` at most `limit`, killing it past that; returns its output.
pub fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} did not finish within {limit:?}; stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `cmd` with the library on LD_LIBRARY_PATH and pipes for its output.
pub fn with_lib(mut cmd: Command, dir: &Path) -> Command {
    cmd.env("LD_LIBRARY_PATH", dir).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Compiles the C program `name` from `sources` (files of `sim-urma/c/`) with the system `cc`
/// against `include/urma_api.h` and the library in `dir`; returns the executable.
pub fn build_c(dir: &Path, name: &str, sources: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join(name);
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"]).arg(src.join("include"));
    for s in sources {
        cc.arg(src.join("c").join(s));
    }
    let out = cc
        .arg("-L")
        .arg(dir)
        .arg("-lurma")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc (the system C compiler)");
    assert!(out.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// Runs `exe` as a server (`server <server_args>`, which prints `PORT <n>` first) and a client
/// (`client <n> <client_args>`) on `wire`, each bounded; both must exit 0 saying
/// "<role>: all checks passed". `what` names the run in failure messages.
pub fn server_and_client(
    exe: &Path,
    dir: &Path,
    wire: &str,
    server_args: &[&str],
    client_args: &[&str],
    what: &str,
) {
    use std::io::{BufRead, BufReader, Read};
    let mut server = with_lib(Command::new(exe), dir)
        .arg("server")
        .args(server_args)
        .env("BYPASS_SIM_URMA", wire)
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut so = BufReader::new(server.stdout.take().unwrap());
    so.read_line(&mut line).unwrap();
    let port =
        line.trim().strip_prefix("PORT ").unwrap_or_else(|| panic!("server said {line:?}")).to_string();
    let client = with_lib(Command::new(exe), dir)
        .args(["client", &port])
        .args(client_args)
        .env("BYPASS_SIM_URMA", wire)
        .spawn()
        .unwrap();
    let c = wait_bounded(client, Duration::from_secs(60), "the client");
    let mut rest = String::new();
    server.stdout = None;
    let s = wait_bounded(server, Duration::from_secs(30), "the server");
    so.read_to_string(&mut rest).unwrap();
    let cs = String::from_utf8_lossy(&c.stdout);
    let client_ok = c.status.success() && cs.contains("client: all checks passed");
    let server_ok = s.status.success() && rest.contains("server: all checks passed");
    // Both sides' output on any failure: one side failing often shows as the other's
    // "peer closed", and the cause is in the first one's.
    assert!(
        client_ok && server_ok,
        "{what} on {wire}: client {}, server {}\nclient:\n{cs}\n{}\nserver:\n{rest}\n{}",
        if client_ok { "passed" } else { "FAILED" },
        if server_ok { "passed" } else { "FAILED" },
        String::from_utf8_lossy(&c.stderr),
        String::from_utf8_lossy(&s.stderr)
    );
}
