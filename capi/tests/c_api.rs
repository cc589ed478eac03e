//! Builds the C programs of `tests/c/` with the system compiler against `libhcom4db.so` and
//! runs them (bounded in time). The library is found next to this test binary:
//! `target/<profile>/deps/c_api-*` → `target/<profile>/libhcom4db.so`, which cargo builds
//! before the tests (the crate's cdylib).

mod c_harness;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>`: where the compiled C programs go (the test binary is in its `deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// The directory holding `libhcom4db.so`: `target/<profile>/deps/` when cargo built the cdylib
/// as a dependency of these tests (a plain `cargo test` leaves it there), else `target/<profile>/`
/// (after a `cargo build`).
fn lib_dir() -> PathBuf {
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

fn src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(name)
}

fn include() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

fn out_dir() -> PathBuf {
    let d = profile_dir().join("capi-c-tests");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `name` (C11, warnings are errors) and links it with the library.
fn build(name: &str, extra: &[&str]) -> PathBuf {
    let out = out_dir().join(name.trim_end_matches(".c"));
    let lib = lib_dir();
    let status = Command::new("cc")
        .args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1"])
        .arg("-I")
        .arg(include())
        .arg(src(name))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .args(extra)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lhcom4db", "-lpthread", "-ldl"])
        .status()
        .expect("run cc");
    assert!(status.success(), "compiling {name} failed");
    out
}

/// Runs `exe` with `env`, at most `limit`; returns its stdout, panics on failure.
/// (Under `CAPI_C_RUNNER`, e.g. valgrind, if set: capi/tests/memcheck.sh.)
fn run(exe: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> String {
    let mut cmd = c_harness::command(exe);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start the test program");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                status.success(),
                "{} failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
                exe.display()
            );
            return stdout;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{} did not finish within {limit:?}:\n{}\n{}",
                exe.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn header_compiles_standalone_in_c11_and_cxx17() {
    let dir = out_dir();
    let c = dir.join("header_only.c");
    std::fs::write(
        &c,
        "#include \"hcom4db.h\"\nint main(void) { OckRpcMessage m = {0, 0}; (void)m; return 0; }\n",
    )
    .unwrap();
    let cpp = dir.join("header_only.cpp");
    std::fs::write(
        &cpp,
        "#include \"hcom4db.h\"\nint main() { OckRpcMessage m = {nullptr, 0}; (void)m; return 0; }\n",
    )
    .unwrap();
    for (compiler, std, file) in [("cc", "-std=c11", &c), ("c++", "-std=c++17", &cpp)] {
        let st = Command::new(compiler)
            .args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-I"])
            .arg(include())
            .arg(file)
            .status()
            .expect("run the compiler");
        assert!(st.success(), "{compiler} {std} refused the header");
    }
}

#[test]
fn layouts_match_from_c() {
    let exe = build("layout.c", &[]);
    assert!(run(&exe, &[], &[], Duration::from_secs(30)).contains("layout ok"));
}

/// The functions the header declares, read from it.
fn header_functions() -> Vec<String> {
    let h = std::fs::read_to_string(include().join("hcom4db.h")).unwrap();
    let mut names: Vec<String> = Vec::new();
    for (i, _) in h.match_indices('(') {
        let before = &h[..i];
        let start = before.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |j| j + 1);
        let name = &before[start..];
        if name.starts_with("OckRpc") {
            names.push(name.to_string());
        }
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn exports_are_the_header_functions_plus_the_log_alias() {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib_dir().join("libhcom4db.so"))
        .output()
        .expect("run nm");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut exported: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind != "A").then(|| name.to_string())
        })
        .collect();
    exported.sort();
    let mut want = header_functions();
    want.push("Hcom4dbSetLogFunc".into());
    want.sort();
    let missing: Vec<&String> = want.iter().filter(|w| !exported.contains(w)).collect();
    let extra: Vec<&String> = exported.iter().filter(|e| !want.contains(e)).collect();
    assert!(missing.is_empty(), "declared but not exported: {missing:?}");
    assert!(extra.is_empty(), "exported but not in the header: {extra:?}");
}

#[test]
fn dlopen_by_ock_rpc_lib_path_resolves_what_cbb_requires() {
    let out = out_dir().join("dlopen_cbb");
    let st = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg(src("dlopen_cbb.c"))
        .arg("-o")
        .arg(&out)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success());
    let dir = lib_dir();
    let text = run(&out, &[], &[("OCK_RPC_LIB_PATH", dir.to_str().unwrap())], Duration::from_secs(30));
    assert!(text.contains("dlopen ok: 15 symbols"), "{text}");
}

#[test]
fn every_server_and_client_function_in_one_process() {
    let exe = build("basic.c", &[]);
    let text = run(&exe, &[], &[("BYPASS_CAPI_LOG_LEVEL", "2")], Duration::from_secs(120));
    assert!(text.contains("basic ok"), "{text}");
}

#[test]
fn two_processes_talk_over_the_tcp_type() {
    c_harness::proc_pair(&build("proc.c", &[]), &[]);
}

#[test]
fn bad_inputs_return_errors_and_never_crash() {
    let exe = build("badinput.c", &[]);
    let verbs = if cfg!(feature = "verbs") { "verbs" } else { "none" };
    let text = run(&exe, &[verbs], &[("BYPASS_CAPI_LOG_LEVEL", "4")], Duration::from_secs(120));
    assert!(text.contains("badinput ok"), "{text}");
}

#[test]
fn bypass_backend_puts_the_caller_on_the_in_process_simulator() {
    // The same program; its servers ask for TCP, the variable moves them to one in-process
    // fabric (threaded engine).
    let exe = build("basic.c", &[]);
    let env = [("BYPASS_CAPI_LOG_LEVEL", "2"), ("BYPASS_BACKEND", "sim:threaded")];
    let text = run(&exe, &[], &env, Duration::from_secs(120));
    assert!(text.contains("basic ok"), "{text}");
}
