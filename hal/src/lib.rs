//! # bypass-hal: the contract every NIC meets
//!
//! The hardware abstraction layer under the bypass RPC stack. It names the objects of a
//! kernel-bypass NIC — [`Device`], [`MemoryRegion`], [`CompletionQueue`], [`Queue`] — and the
//! work requests and completions that flow through them, in terms that map directly onto RDMA
//! verbs, URMA (UB) and the bypass simulator (`bypass-sim`).
//!
//! The data path is statically dispatched: the stack is generic over `D: Device`, so a post or a
//! poll is a direct call into the backend. Posting takes a batch and rings one doorbell per batch;
//! polling fills a caller-provided slice. Work-request errors come back as completions with a
//! [`Status`]; call errors (full queue, wrong state, bad argument) come back as [`Error`].
//!
//! | hal | verbs | URMA | sim |
//! |---|---|---|---|
//! | [`Device`] | `ibv_context` + PD | `urma_context` on an EID | one simulated NIC |
//! | [`MemoryRegion`] | `ibv_mr` | target segment + token | entry in the NIC's key table |
//! | [`CompletionQueue`] | `ibv_cq` + channel | jfc + jfce | CQE ring with owner bit |
//! | [`Queue`] | RC `ibv_qp` | RC jetty on its own JFR, bound | QP context + SQ/RQ rings |
//! | [`SharedRecv`] | `ibv_srq` | a JFR shared by several jettys | receive ring shared by QPs |
//! | [`QueueInfo`] | qpn, gid, lid, psn | jetty id, eid, uasid, token | NIC address, qpn |
//!
//! Backends behind features: `verbs` ([`verbs`], libibverbs), `urma` (`urma`, liburma
//! loaded at run time) and `vfio` (`vfio`, a userspace virtio-net driver implementing
//! [`l2::L2Port`]). What the two do alike over their different libraries lives once, in a
//! crate-private module per concept: `queue_book` (a queue's rings, epoch, heads, tracked state
//! and checks), `side_ring`, `cq_feeders` (the queues feeding a CQ), `cq_events` (a CQ's event
//! channel), `shared_slots` (a shared receive queue's slots), `wr_chain` (chained work
//! requests) and `region_memory` (the memory under a region).
//!
//! [`trace`] records what drivers, devices and the stack do, as a Chrome trace (off unless
//! started; an `if trace::is_enabled()` per emit site otherwise).
//!
//! With the `conformance` feature, [`conformance`] holds the test scenarios every backend must
//! pass; `bypass-sim` runs them in CI and `bypass-hw-tests` on real NICs.

#![warn(missing_docs)]

mod completion;
mod device;
pub mod doorbell;
mod error;
mod event;
pub mod l2;
mod mr;
mod queue;
mod shared_recv;
mod sync;
mod timer;
pub mod trace;
mod wr;

#[cfg(feature = "conformance")]
pub mod conformance;

#[cfg(any(feature = "verbs", feature = "urma"))]
mod cq_events;
#[cfg(any(feature = "verbs", feature = "urma"))]
mod cq_feeders;
#[cfg(any(feature = "verbs", feature = "urma"))]
mod queue_book;
#[cfg(any(feature = "verbs", feature = "urma"))]
mod region_memory;
#[cfg(any(feature = "verbs", feature = "urma"))]
mod shared_slots;
#[cfg(any(feature = "verbs", feature = "urma"))]
mod side_ring;
#[cfg(feature = "verbs")]
pub mod verbs;
#[cfg(any(feature = "verbs", feature = "urma"))]
mod wr_chain;

#[cfg(feature = "urma")]
pub mod urma;

#[cfg(any(feature = "vfio", loom))]
pub mod vfio;

/// loom only: the doorbell mutation switch for the broken-twin models in `loom-tests/`.
#[cfg(loom)]
#[doc(hidden)]
pub use sync::mutation;

pub use completion::{ArmMode, Completion, CompletionQueue, CqOpcode, Status};
pub use device::{Device, DeviceCaps, DeviceConfig};
pub use error::{Error, Result};
pub use event::{AsyncEvent, EventChannel};
pub use mr::{Access, MemoryRegion, RemoteAddr, RemoteKey, RemoteRegion, Sge};
pub use queue::{Queue, QueueConfig, QueueInfo, QueueInfoError, QueueState};
pub use shared_recv::SharedRecv;
pub use timer::{AckTimeout, RnrTimer};
pub use wr::{check_send_wr, RecvWr, SendOp, SendWr, WrFlags, ATOMIC_SIZE};
