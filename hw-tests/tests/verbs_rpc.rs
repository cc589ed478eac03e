//! The RPC conformance suite (`bypass::conformance`) on a verbs device (`BYPASS_HW=verbs:rxe0`):
//! a server and a client on one open of the device, their queue pairs connected through its
//! loopback. Every test skips, with a message, when `BYPASS_HW` is unset or the machine has no
//! RDMA device. Run with `--test-threads=1` on Soft-RoCE.
#![cfg(feature = "verbs")]

use bypass_hw_tests::verbs::VerbsRpcEnv;

bypass::rpc_suite!(verbs, skip_unless VerbsRpcEnv::from_env);
