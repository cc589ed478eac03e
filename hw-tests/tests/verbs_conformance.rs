//! The hal conformance suite on a verbs device (`BYPASS_HW=verbs:rxe0`); every test skips, with a
//! message, when `BYPASS_HW` is unset or the machine has no RDMA device. Run with
//! `--test-threads=1` on Soft-RoCE (it loses completions when many queue pairs run at once).
#![cfg(feature = "verbs")]

use bypass_hw_tests::verbs::VerbsEnv;

bypass_hal::conformance_suite!(verbs, skip_unless VerbsEnv::from_env);
