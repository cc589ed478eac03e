//! The hal conformance suite's environment on the urma backend (feature `conformance`): one
//! URMA device opened twice — two contexts, like two hosts — through the liburma a spec or
//! `$BYPASS_URMA_LIB` names. `progress` does nothing (liburma devices, hardware or the simulated
//! library, move by themselves) and `advance` sleeps.
//!
//! ```text
//! BYPASS_URMA_LIB=/path/to/liburma.so.0 cargo test -p bypass-hal --features urma,conformance --lib urma::env::suite
//! ```
//!
//! `BYPASS_URMA_SPEC` picks the device and options (`udma0,eid=0`; empty: the first device).
//! Without a loadable liburma every scenario is skipped with a message saying what to set.

use super::device::UrmaDevice;
use super::loader::{self, LIB_ENV, SPEC_ENV};
use std::time::Duration;

/// Two contexts on one URMA device, for the hal conformance suite.
#[derive(Debug)]
pub struct UrmaEnv {
    a: UrmaDevice,
    b: UrmaDevice,
}

impl UrmaEnv {
    /// Opens the device `spec` names (`"udma0,lib=/path/liburma.so.0"`, or `""` for the first
    /// device of the default library) twice.
    pub fn open(spec: &str) -> crate::Result<Self> {
        Ok(UrmaEnv { a: UrmaDevice::open_spec(spec)?, b: UrmaDevice::open_spec(spec)? })
    }

    /// The environment `$BYPASS_URMA_SPEC` (and `$BYPASS_URMA_LIB`) ask for, or `None` (after
    /// printing why `test` is skipped) when no liburma can be loaded. A library that loads but
    /// whose device cannot be opened is a failure (panic), not a skip.
    pub fn from_env(test: &str) -> Option<Self> {
        let spec = std::env::var(SPEC_ENV).unwrap_or_default();
        let (_, config) = super::parse_spec(&spec).unwrap_or_else(|e| panic!("{SPEC_ENV}={spec:?}: {e}"));
        let lib = loader::library_name(config.lib.as_deref());
        if let Err(e) = loader::load(&lib) {
            eprintln!("SKIP {test}: {e} (set {LIB_ENV}=<path of a liburma.so.0>, e.g. the simulated one)");
            return None;
        }
        match Self::open(&spec) {
            Ok(env) => Some(env),
            Err(e) => panic!("{SPEC_ENV}={spec:?} through {lib}: cannot open the device twice: {e}"),
        }
    }
}

impl crate::conformance::Env for UrmaEnv {
    type Dev = UrmaDevice;
    fn a(&self) -> &UrmaDevice {
        &self.a
    }
    fn b(&self) -> &UrmaDevice {
        &self.b
    }
    fn progress(&self) {}
    fn advance(&self, d: Duration) {
        std::thread::sleep(d);
    }
    /// UDMA's arm doorbell carries the JFC's consumer index (as mlx5's does), and sim-urma
    /// raises the event for a record already in the JFC; unverified on UB hardware.
    fn arm_signals_queued_completions(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod suite {
    use super::UrmaEnv;
    crate::conformance_suite!(urma, skip_unless UrmaEnv::from_env);
}
