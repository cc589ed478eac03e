//! # bypass-hw-tests
//!
//! Runs the hal conformance suite (`bypass_hal::conformance`, `tests/verbs_conformance.rs`) and
//! the stack's RPC suite (`bypass::conformance`, `tests/verbs_rpc.rs`) on real NICs when the
//! machine has one, and, on Soft-RoCE as root (the QEMU guest), a simulated NIC against rxe on
//! a veth pair (`tests/rxe_interop.rs`). Which device is chosen by the `BYPASS_HW`
//! environment variable, in the stack's backend-string form:
//!
//! | `BYPASS_HW` | runs on |
//! |---|---|
//! | unset | nothing: every test prints why it skipped and passes |
//! | `verbs` | the first RDMA device libibverbs lists (feature `verbs`) |
//! | `verbs:rxe0` | device `rxe0` |
//! | `verbs:rxe0,gid=1,mtu=1024` | with device options (`gid`, `port`, `mtu`, `tc`) |
//!
//! The hal suite's verbs environment opens the device twice — two contexts, like two hosts — and
//! connects the pair through the device's own loopback (Soft-RoCE over `lo` in the CI guest); the
//! RPC suite's opens it once and runs both the server and the client on it. When
//! `BYPASS_HW` asks for verbs but the machine has no RDMA device at all, tests skip with a
//! message; a device that is present but cannot be opened as asked is a failure.
//!
//! Soft-RoCE is slow and loses completions when many QPs run at once: run with
//! `--test-threads=1`. In the project's QEMU guest:
//!
//! ```text
//! cargo test -p bypass-hw-tests --features verbs --release --no-run   # prints the test binary
//! hw-tests/vm/run env BYPASS_HW=verbs:rxe0 target/release/deps/verbs_conformance-… --test-threads=1
//! hw-tests/vm/run env BYPASS_HW=verbs:rxe0 target/release/deps/verbs_rpc-… --test-threads=1
//! ```

pub mod either;
#[cfg(feature = "verbs")]
pub mod rxe_link;
pub mod shell;
pub mod vfio_topology;

/// The environment variable naming the device under test.
pub const ENV_VAR: &str = "BYPASS_HW";

/// What `BYPASS_HW` asks for: `(backend, options)`, e.g. `("verbs", "rxe0,gid=1")`; `None` when
/// it is unset or empty.
pub fn requested() -> Option<(String, String)> {
    let v = std::env::var(ENV_VAR).ok()?;
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    let (backend, rest) = v.split_once(':').unwrap_or((v, ""));
    Some((backend.to_owned(), rest.to_owned()))
}

/// Prints why a hardware test did not run (visible with `--nocapture`, and in the summary of
/// `cargo test` as a pass).
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIP {test}: {why}");
}

/// The test environments on a verbs device: [`VerbsEnv`](verbs::VerbsEnv) for the hal
/// conformance suite (two opens of the device, like two hosts) and
/// [`VerbsRpcEnv`](verbs::VerbsRpcEnv) for the RPC suite (`bypass::conformance`: one open, used
/// by both the server and the client). In both, `progress` does nothing (hardware moves by
/// itself) and `advance` sleeps.
#[cfg(feature = "verbs")]
pub mod verbs {
    use super::*;
    use bypass_hal::verbs::{device_names, VerbsDevice};
    use std::time::Duration;

    /// The verbs device spec `BYPASS_HW` asks for (`"rxe0,gid=1"`, or `""` for the first
    /// device), or `None` (after printing why `test` is skipped) when it asks for none, for
    /// another backend, or for verbs on a machine without RDMA devices. Every verbs environment
    /// goes through here, so the suites skip for the same reasons with the same messages.
    pub fn requested_spec(test: &str) -> Option<String> {
        let Some((backend, spec)) = requested() else {
            skip(test, &format!("{ENV_VAR} is not set (e.g. {ENV_VAR}=verbs:rxe0)"));
            return None;
        };
        if backend != "verbs" {
            skip(test, &format!("{ENV_VAR}={backend}:… is not a verbs device"));
            return None;
        }
        if device_names().is_empty() {
            skip(
                test,
                &format!(
                    "{ENV_VAR}=verbs:{spec} but there is no RDMA device here (for Soft-RoCE: modprobe \
                     rdma_rxe; rdma link add rxe0 type rxe netdev lo; or use hw-tests/vm/run)"
                ),
            );
            return None;
        }
        Some(spec)
    }

    /// Opens the device `spec` names, or panics saying which devices are present: a device that
    /// `BYPASS_HW` names and that is there but cannot be opened as asked is a failure, not a
    /// skip.
    #[track_caller]
    pub fn open_or_panic(spec: &str) -> VerbsDevice {
        VerbsDevice::open_spec(spec).unwrap_or_else(|e| {
            panic!("{ENV_VAR}=verbs:{spec}: cannot open the device: {e} (present: {:?})", device_names())
        })
    }

    /// Two opens of one verbs device, for the hal conformance suite.
    #[derive(Debug)]
    pub struct VerbsEnv {
        a: VerbsDevice,
        b: VerbsDevice,
    }

    impl VerbsEnv {
        /// Opens the device `spec` names (`"rxe0,gid=1"`, or `""` for the first) twice.
        pub fn open(spec: &str) -> bypass_hal::Result<Self> {
            Ok(VerbsEnv { a: VerbsDevice::open_spec(spec)?, b: VerbsDevice::open_spec(spec)? })
        }

        /// The environment `BYPASS_HW` asks for, or `None` (after printing why) when it asks for
        /// none, for another backend, or for verbs on a machine without RDMA devices. Panics if a
        /// present device cannot be opened as asked.
        pub fn from_env(test: &str) -> Option<Self> {
            let spec = requested_spec(test)?;
            Some(VerbsEnv { a: open_or_panic(&spec), b: open_or_panic(&spec) })
        }
    }

    impl bypass_hal::conformance::Env for VerbsEnv {
        type Dev = VerbsDevice;
        fn a(&self) -> &VerbsDevice {
            &self.a
        }
        fn b(&self) -> &VerbsDevice {
            &self.b
        }
        fn progress(&self) {}
        fn advance(&self, d: Duration) {
            std::thread::sleep(d);
        }
    }

    /// One open of a verbs device, for the RPC suite: the server and the client share it, and
    /// their queue pairs connect through the device's loopback (as `bypass::Backend` runs a
    /// verbs device for bypass-perf).
    #[derive(Debug)]
    pub struct VerbsRpcEnv {
        dev: VerbsDevice,
    }

    impl VerbsRpcEnv {
        /// Opens the device `spec` names (`"rxe0,gid=1"`, or `""` for the first).
        pub fn open(spec: &str) -> bypass_hal::Result<Self> {
            Ok(VerbsRpcEnv { dev: VerbsDevice::open_spec(spec)? })
        }

        /// The environment `BYPASS_HW` asks for, or `None` (after printing why), as
        /// [`VerbsEnv::from_env`].
        pub fn from_env(test: &str) -> Option<Self> {
            let spec = requested_spec(test)?;
            Some(VerbsRpcEnv { dev: open_or_panic(&spec) })
        }
    }

    impl bypass::conformance::Env for VerbsRpcEnv {
        type Dev = VerbsDevice;
        fn server(&self) -> &VerbsDevice {
            &self.dev
        }
        fn client(&self) -> &VerbsDevice {
            &self.dev
        }
        fn progress(&self) {}
        fn advance(&self, d: Duration) {
            std::thread::sleep(d);
        }
    }
}
