//! Compiles and runs the C test programs of `tests/c/` for the memory API's test drivers.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>`: where the compiled C programs go (the test binary is in its `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// The directory holding `libhcom4db.so`: `target/<profile>/deps/` when cargo built the cdylib
/// as a dependency of these tests (a plain `cargo test` leaves it there), else `target/<profile>/`
/// (after a `cargo build`).
pub fn lib_dir() -> PathBuf {
    let profile = profile_dir();
    let deps = profile.join("deps");
    let dir = if deps.join("libhcom4db.so").exists() { deps } else { profile };
    assert!(
        dir.join("libhcom4db.so").exists(),
        "libhcom4db.so is in neither {0}/deps nor {0} (run through cargo test -p bypass-capi)",
        dir.display()
    );
    dir
}

fn c_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c")
}

/// Compiles `tests/c/<source>` into `target/<profile>/capi-c/<name>` and returns its path.
pub fn compile(source: &str) -> PathBuf {
    compile_from(&c_dir(), source)
}

/// Compiles `<dir>/<source>` (see [`compile`]).
pub fn compile_from(dir: &Path, source: &str) -> PathBuf {
    let lib = lib_dir();
    let out_dir = profile_dir().join("capi-c");
    std::fs::create_dir_all(&out_dir).expect("create capi-c output directory");
    let out = out_dir.join(source.trim_end_matches(".c"));
    // Built under a name of this process and renamed into place: two test processes compiling
    // the same program never run (or overwrite) a half-written file.
    // (A counter too: two tests of one process may compile the same program at once.)
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = out.with_extension(format!("partial-{}-{seq}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let status = Command::new(&cc)
        .args(["-std=c11", "-D_GNU_SOURCE", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(c_dir())
        .arg(dir.join(source))
        .arg("-o")
        .arg(&partial)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lhcom4db", "-lpthread"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e} (install gcc or set CC)"));
    assert!(status.success(), "compiling {source} failed ({status})");
    std::fs::rename(&partial, &out)
        .unwrap_or_else(|e| panic!("cannot move {} into place: {e}", partial.display()));
    out
}

/// How to run a program.
#[derive(Debug, Clone)]
pub struct Run {
    /// Longest wait before the program is killed and the test fails.
    pub timeout: Duration,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

impl Default for Run {
    fn default() -> Self {
        // Generous: the same programs run under valgrind in CI.
        Run { timeout: Duration::from_secs(120), env: Vec::new() }
    }
}

/// The outcome of one program.
#[derive(Debug)]
pub struct Outcome {
    /// Exit code (`None`: killed by a signal or by the timeout).
    pub code: Option<i32>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// stdout and stderr.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

impl Outcome {
    /// Panics with the program's output unless it exited 0.
    pub fn expect_ok(&self, name: &str) -> &Self {
        assert!(
            self.code == Some(0) && !self.timed_out,
            "{name} failed (exit {:?}, timed out: {})\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            self.timed_out,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// The runner prefix from `CAPI_C_RUNNER` (split on whitespace), if set.
pub fn runner() -> Vec<String> {
    std::env::var("CAPI_C_RUNNER")
        .map(|r| r.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// A command running `exe` under `CAPI_C_RUNNER` (if set). The library directory the program
/// was linked against comes first in its `LD_LIBRARY_PATH`: cargo runs tests with its output
/// directories there (`target/<profile>` too), where an older `libhcom4db.so` left by a
/// `cargo build` would otherwise win over the program's RUNPATH.
pub fn command(exe: &Path) -> Command {
    let prefix = runner();
    let mut c = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let mut path = std::ffi::OsString::from(lib_dir());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    c.env("LD_LIBRARY_PATH", path);
    c
}

/// Starts `exe args…` (under `CAPI_C_RUNNER`) with piped output.
pub fn spawn(exe: &Path, args: &[&str], how: &Run) -> Child {
    let mut cmd = command(exe);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in &how.env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()))
}

/// Waits for `child` at most `timeout`, killing it then; collects its output.
/// (Its stdout is collected only if the caller has not taken it.)
pub fn finish(mut child: Child, timeout: Duration) -> Outcome {
    let out = child.stdout.take();
    let mut err = child.stderr.take().expect("piped stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut out) = out {
            let _ = out.read_to_string(&mut s);
        }
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the C program") {
            break s;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait for the killed C program");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Outcome {
        code: status.code(),
        timed_out,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    }
}

/// Runs `exe args…` to completion (bounded by `how.timeout`).
pub fn run(exe: &Path, args: &[&str], how: Run) -> Outcome {
    let child = spawn(exe, args, &how);
    finish(child, how.timeout)
}

/// A server process started by a test, whose stdout a thread reads.
pub struct Served {
    pub child: Child,
    /// What follows `prefix` on the first line that starts with it (e.g. the port).
    pub value: String,
    /// The rest of the child's stdout (every line, the matched one included) once it closes.
    pub stdout: std::thread::JoinHandle<String>,
}

/// Takes `child`'s piped stdout and waits at most 60 s for a line starting with `prefix`; a
/// child that prints none is killed and the test fails with what it printed.
pub fn serve(mut child: Child, prefix: &'static str) -> Served {
    use std::io::{BufRead, BufReader};
    let stdout = child.stdout.take().expect("the server's stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(v) = line.strip_prefix(prefix) {
                let _ = tx.send(v.trim().to_string());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(value) => Served { child, value, stdout: reader },
        Err(_) => {
            let out = finish(child, Duration::from_secs(1));
            panic!(
                "the server printed no {prefix:?} line within 60 s:\n{}\n{}",
                reader.join().unwrap_or_default(),
                out.stderr
            );
        }
    }
}

/// proc.c's two processes with `env`: the server prints its port and serves until its stdin
/// closes; the client calls, sends 100 one-way messages, calls with an iovec. Checks both ends.
pub fn proc_pair(exe: &Path, env: &[(String, String)]) {
    let base = 31000 + (std::process::id() % 9000);
    let range = format!("{base}-{}", base + 200);
    let server = command(exe)
        .args(["server", &range])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
    let mut served = serve(server, "PORT ");
    let client =
        run(exe, &["client", &served.value], Run { env: env.to_vec(), timeout: Duration::from_secs(90) });
    drop(served.child.stdin.take()); // the server exits when its stdin closes
    let out = finish(served.child, Duration::from_secs(30));
    let server_stdout = served.stdout.join().unwrap_or_default();
    client.expect_ok("proc client");
    assert!(client.stdout.contains("client ok"), "{}", client.stdout);
    assert!(out.code == Some(0), "the server process failed (exit {:?}):\n{}", out.code, out.stderr);
    assert!(server_stdout.contains("COUNT 100"), "the server got every one-way message: {server_stdout}");
}

/// sim-urma's `liburma.so`, built by cargo with these tests (a dev-dependency): next to the
/// library, in `target/<profile>/deps/`, or in `target/<profile>/`.
#[cfg(feature = "urma")]
pub fn sim_liburma() -> PathBuf {
    let profile = profile_dir();
    [profile.join("deps/liburma.so"), profile.join("liburma.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("sim-urma's liburma.so is in neither {0}/deps nor {0}", profile.display()))
}

/// The environment of a program on sim-urma: `wire` is `BYPASS_SIM_URMA` (None: in-process).
#[cfg(feature = "urma")]
pub fn urma_env(wire: Option<&str>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("BYPASS_URMA_LIB".to_string(), sim_liburma().display().to_string()),
        ("BYPASS_CAPI_LOG_LEVEL".to_string(), "2".to_string()),
    ];
    if let Some(w) = wire {
        env.push(("BYPASS_SIM_URMA".into(), w.into()));
    }
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}
