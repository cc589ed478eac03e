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
//! - [`req_table`]: the per-channel request table with wrapping ids and stale-response dropping.
//!
//! Channels, call modes, the server, credits and the control plane come next.

pub use bypass_hal as hal;
pub use bypass_sim as sim;

pub mod req_table;
pub mod tx_ctx;
pub mod wire;

mod sync;
#[cfg(test)]
mod test_rng;
