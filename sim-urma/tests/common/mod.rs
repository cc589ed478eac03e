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
