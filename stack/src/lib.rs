//! # bypass: the RPC stack
//!
//! This crate will hold the RPC layer with URPC semantics (wire format, channels, request table,
//! the four call modes, tx_ctx double release, credits, server dispatch and the TCP control
//! plane), generic over any [`bypass_hal::Device`] and running on `bypass-sim` by default.
//! It is being built under the RPC stack issue. What exists so far are its lock-free and
//! byte-level building blocks, each tested on its own:
//!
//! - [`wire`]: URPC's request, ACK and response headers byte for byte, with the golden vectors;
//! - [`tx_ctx`]: the send-context slab and its double (or triple) release, exactly once;
//! - [`req_table`]: the per-channel request table with wrapping ids and stale-response dropping;
//! - [`credits`]: sender-side flow control, so a sender never outruns the peer's receive buffers;
//! - [`buf_pool`]: fixed-size buffers carved from one registered region, lock-free, returned on drop.
//!
//! Channels, the call modes on top of these, the server and the control plane come next.

pub use bypass_hal as hal;
pub use bypass_sim as sim;

pub mod buf_pool;
pub mod credits;
pub mod req_table;
pub mod tx_ctx;
pub mod wire;

mod free_list;
mod handle;
mod sync;
#[cfg(test)]
mod test_rng;
