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

#[cfg(not(loom))]
mod call;
#[cfg(not(loom))]
mod client;
#[cfg(not(loom))]
mod endpoint;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod server;
#[cfg(not(loom))]
mod worker;

#[cfg(not(loom))]
pub use call::{CallFuture, Callback};
#[cfg(not(loom))]
pub use client::{CallInfo, CallOptions, Channel, ChannelConfig, ChannelStats};
#[cfg(not(loom))]
pub use error::{Result, RpcError};
#[cfg(not(loom))]
pub use server::{Functions, Handler, Request, Server, ServerConfig, ServerStats};
#[cfg(not(loom))]
pub use tx_ctx::CallMode;
#[cfg(not(loom))]
pub use wire::{FunctionId, Status};
#[cfg(not(loom))]
pub use worker::{pin_current_thread, PollMode, Pollable, WorkerConfig, WorkerGroup};

pub mod buf_pool;
pub mod control;
pub mod credits;
pub mod req_table;
pub mod tx_ctx;
pub mod wire;

mod free_list;
mod handle;
mod sync;
#[cfg(test)]
mod test_rng;
