//! # The verbs backend: RDMA NICs through libibverbs (crate `rdma-sys`)
//!
//! Behind the `verbs` feature (off by default: it needs libibverbs-dev, librdmacm-dev,
//! libclang-dev and pkg-config to build). Works with any verbs provider — mlx5, hns, irdma, and
//! Linux's Soft-RoCE (`rdma_rxe`), which is what CI runs the conformance suite on.
//!
//! | hal | here |
//! |---|---|
//! | [`crate::Device`] | [`VerbsDevice`]: an `ibv_context` + one PD, a port and a GID |
//! | [`crate::MemoryRegion`] | [`VerbsRegion`]: an `ibv_mr` over memory it owns (or the caller's) |
//! | [`crate::CompletionQueue`] | [`VerbsCq`]: an `ibv_cq` on its own or a shared `ibv_comp_channel` |
//! | [`crate::EventChannel`] | [`VerbsChannel`]: an `ibv_comp_channel` (fd non-blocking) |
//! | [`crate::Queue`] | [`VerbsQueue`]: an RC `ibv_qp` and the backend's slot bookkeeping |
//! | [`crate::SharedRecv`] | [`VerbsSharedRecv`]: an `ibv_srq` and its slot table |
//!
//! Resources keep their parents alive (a queue its CQs, a CQ its channel, all of them the
//! context), so drop order never matters. What libibverbs leaves to its caller the backend does
//! itself, so that every hal promise holds on every provider:
//!
//! - **All-or-nothing batches.** `ibv_post_send` posts everything before a bad request; the
//!   backend counts free slots per queue (posted minus retired; a signaled send completion retires
//!   the unsignaled requests before it) and validates SGE counts, INLINE sizes and INLINE memory
//!   before calling it, so a refused batch leaves nothing behind. One `ibv_post_send` per batch,
//!   built in per-queue buffers (no allocation when posting).
//! - **Opcodes of failed completions.** On error only `wr_id`, status and `qp_num` are valid; the
//!   backend keeps the operation next to the user's `wr_id` in a side ring.
//! - **Reset purges.** mlx5-class providers purge a QP's CQEs on RESET, rxe drops unflushed WQEs
//!   and may still deliver old CQEs: an epoch in the `wr_id` libibverbs sees makes completions of
//!   a queue's earlier incarnation invisible everywhere.
//! - **State.** Tracked by the backend; an error completion, an async QP error event or (on
//!   `state()`) `ibv_query_qp` reveal a queue the device moved to ERROR.
//!
//! Open a device with [`VerbsDevice::open`] or [`VerbsDevice::open_spec`] (`"rxe0,gid=1"`).

mod cq;
mod device;
mod mr;
mod qp;
mod srq;
mod tables;

pub use cq::{VerbsChannel, VerbsCq};
pub use device::{device_names, parse_spec, VerbsDevice};
pub use mr::VerbsRegion;
pub use qp::VerbsQueue;
pub use srq::VerbsSharedRecv;
