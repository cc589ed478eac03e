//! # bypass: the RPC stack
//!
//! This crate will hold the RPC layer with URPC semantics (wire format, channels, request table,
//! the four call modes, tx_ctx double release, credits, server dispatch and the TCP control
//! plane), generic over any [`bypass_hal::Device`] and running on `bypass-sim` by default.
//! It is being built under the RPC stack issue; today it only re-exports the layers below.

pub use bypass_hal as hal;
pub use bypass_sim as sim;
