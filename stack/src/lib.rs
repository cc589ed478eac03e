//! # bypass: kernel-bypass RPC with URPC semantics
//!
//! A client opens a [`Channel`] to a [`Server`]; calls go over reliable-connected queue pairs of
//! any [`hal::Device`] — an RDMA or UB NIC, or the simulator ([`sim`]) that runs everywhere. The
//! control plane (versions, names, queue addresses) is a TCP handshake; after it, every byte of a
//! call moves through the NIC's rings: URPC's 20-byte request header and arguments in one SEND,
//! the 16-byte response header and data in another.
//!
//! ```
//! use bypass::sim::{Engine, Fabric};
//! use bypass::{Channel, ChannelConfig, FunctionId, Functions, RpcError, Server, ServerConfig};
//!
//! # fn main() -> Result<(), RpcError> {
//! // Two simulated NICs on one fabric (no hardware needed).
//! let fabric = Fabric::new(Engine::Inline);
//! let (server_nic, client_nic) = (fabric.add_nic(), fabric.add_nic());
//!
//! // A server with one function, listening on a free port.
//! let reverse = FunctionId::new(0x100, 1, true, 7).expect("fits in 48 bits");
//! let mut functions = Functions::new();
//! functions.register(reverse, |req| {
//!     let mut bytes = req.args().to_vec();
//!     bytes.reverse();
//!     let _ = req.reply(&bytes); // or move `req` to another thread and reply there
//! });
//! let server = Server::bind(&server_nic, "127.0.0.1:0", ServerConfig::new("demo"), functions)?;
//!
//! // A client: a blocking call polls the channel on the calling thread.
//! let channel = Channel::connect(&client_nic, server.local_addr(), ChannelConfig::new("demo"))?;
//! let mut response = Vec::new();
//! channel.call(reverse, b"bypass", &mut response)?;
//! assert_eq!(response, b"ssapyb");
//!
//! // Unknown functions, timeouts, a closed peer: every call ends exactly once, with a reason.
//! let missing = FunctionId::new(0x100, 1, true, 8).expect("fits");
//! assert!(matches!(channel.call(missing, b"", &mut response), Err(RpcError::FunctionNotFound(_))));
//! # Ok(())
//! # }
//! ```
//!
//! ## What is where
//!
//! - [`Channel`] (client): several queues used round-robin, the four [`CallMode`]s (including
//!   URPC's standalone ACK), blocking calls, callbacks ([`Channel::call_callback`]) and
//!   runtime-agnostic futures ([`Channel::call_future`]), per-call deadlines on the device's
//!   clock, credit-based flow control ([`RpcError::WouldBlock`] or waiting, per call), and
//!   one-sided READ / WRITE of a peer's region ([`Channel::read`], [`Channel::write`]).
//! - [`Server`], [`Functions`], [`Request`]: the function table; handlers reply inline or later
//!   from any thread; [`WorkerGroup`] threads poll, optionally pinned.
//! - Polling and CPU: by default ([`PollMode::Adaptive`]) a server's worker spins for a short
//!   while ([`DEFAULT_SPIN`]) after its last completion, then arms its completion queues and
//!   sleeps on their event fds. Back-to-back calls see busy-polling latency and an idle server
//!   uses no CPU; the first call after an idle spell pays for waking the worker (typically a
//!   few to tens of microseconds). [`PollMode::Busy`] never sleeps (lowest latency, one core per
//!   worker); [`PollMode::Event`] sleeps almost at once (least CPU).
//! - Liveness and recovery: keepalive probes on the data path find a frozen or cut-off peer
//!   ([`Keepalive`]; outstanding calls then fail with [`RpcError::ConnectionBroken`]); a break
//!   callback per channel ([`Channel::set_break_callback`]) and per server connection, a
//!   new-connection callback that may refuse a client ([`ConnectionEvents`],
//!   [`Server::bind_with`]), a `u64` context on both sides ([`Channel::set_context`],
//!   [`Connection::set_context`], [`Request::context`]); a failed queue is reset, re-exchanged
//!   over the control stream and READY again, within a budget ([`Recovery`]).
//! - Building blocks, each tested on its own and model-checked by `loom-tests`:
//!   [`wire`] (URPC headers byte for byte, golden vectors), [`tx_ctx`] (the send-context double
//!   release), [`req_table`] (request ids and stale responses), [`credits`], [`control`] (the
//!   TCP handshake), [`buf_pool`].
//! - [`tls`]: mutual TLS 1.3 on the control connection ([`ChannelConfig::tls`],
//!   [`ServerConfig::tls`]; crate feature `tls`, on by default). The queue infos and their
//!   tokens then travel only inside the TLS session; a TLS server refuses plaintext clients and
//!   the reverse; a refused certificate is named (unknown CA, expired, revoked, missing) on both
//!   sides. See `examples/tls.rs`.
//!
//! ## One-sided I/O
//!
//! [`Channel::write`] and [`Channel::read`] (and their `_callback` / `_future` forms, delivered
//! like calls) move bytes between registered local memory ([`LocalRange`]s of
//! `Arc<D::Region>`, gathered or scattered in order) and a region of the peer, named by the
//! 49-byte [`RemoteRegion`] descriptor the peer hands out, typically in an RPC response. The
//! peer's NIC checks the key and range: a bad one fails with [`RpcError::RemoteAccess`], and on
//! a reliable connection it fails the queue used (the channel carries on over its other queues,
//! and closes when none is left).
//!
//! ```
//! use bypass::hal::Device;
//! use bypass::sim::{Engine, Fabric};
//! use bypass::*;
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), RpcError> {
//! let fabric = Fabric::new(Engine::Inline);
//! let (server_nic, client_nic) = (fabric.add_nic(), fabric.add_nic());
//!
//! // The server exposes a region and returns its descriptor from a function.
//! let exposed = Arc::new(server_nic.register(
//!     4096,
//!     Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
//! )?);
//! let get_region = FunctionId::new(0x100, 1, true, 1).expect("fits");
//! let mut functions = Functions::new();
//! let r = exposed.clone();
//! functions.register(get_region, move |req| {
//!     let _ = req.reply(&r.remote().encode());
//! });
//! let server = Server::bind(&server_nic, "127.0.0.1:0", ServerConfig::new("demo"), functions)?;
//! let channel = Channel::connect(&client_nic, server.local_addr(), ChannelConfig::new("demo"))?;
//!
//! // The client gets the descriptor, then WRITEs and READs the region.
//! let mut rsp = Vec::new();
//! channel.call(get_region, b"", &mut rsp)?;
//! let remote = RemoteRegion::decode(&rsp)?;
//! let mut src = client_nic.register(5, Access::LOCAL_WRITE)?;
//! src.write(0, b"hello")?;
//! let src = Arc::new(src); // the operation keeps a clone until the NIC is done with it
//! channel.write(&[LocalRange::whole(&src)], &remote, 128, &OpOptions::default())?;
//! let dst = Arc::new(client_nic.register(5, Access::LOCAL_WRITE)?);
//! channel.read(&[LocalRange::whole(&dst)], &remote, 128, &OpOptions::default())?;
//! let mut got = [0u8; 5];
//! dst.read(0, &mut got)?;
//! assert_eq!(&got, b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! The protocol, with sequence diagrams for every call mode, is in `docs/protocol.md`; how to
//! test without a NIC (engines, seeds, faults) in the README and `docs/sim.md`.

pub use bypass_hal as hal;
pub use bypass_hal::{Access, MemoryRegion, RemoteKey, RemoteRegion};

/// The simulated NIC, for tests, examples and laptops: what the README and the examples here
/// need. The whole simulator (engines, faults, traces) is the crate `bypass_sim`.
#[cfg(feature = "sim")]
pub mod sim {
    pub use bypass_sim::{
        Engine, Fabric, FabricConfig, FaultPlan, SimCq, SimNic, SimQueue, SimRegion, WireConfig,
    };
}

// The layers, bottom up (each imports only from those above it in this list).
#[cfg(not(loom))]
pub mod backend;
#[cfg(not(loom))]
mod client;
#[cfg(all(feature = "conformance", not(loom)))]
pub mod conformance;
#[cfg(not(loom))]
mod conn;
pub mod control;
mod core;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod limits;
#[cfg(not(loom))]
mod os;
#[cfg(not(loom))]
mod server;
mod sync;
#[cfg(test)]
mod test_rng;
pub mod wire;
#[cfg(not(loom))]
mod worker;

// The building blocks at their historical paths (`bypass::tx_ctx`, ..., `bypass::tls`).
pub use crate::control::tls;
pub use crate::core::{buf_pool, credits, req_table, tx_ctx};

#[cfg(not(loom))]
pub use backend::{Backend, WithDevices};
#[cfg(not(loom))]
pub use client::{
    CallBatch, CallFuture, CallInfo, CallOptions, Callback, Channel, ChannelConfig, ChannelStats, LocalRange,
    OpFuture, OpOptions, MAX_SGES,
};
#[cfg(not(loom))]
pub use conn::liveness::{CloseReason, Keepalive};
#[cfg(not(loom))]
pub use conn::{AllocFns, Recovery, RegionPool, RndvAllocator, RndvBuf};
#[cfg(not(loom))]
#[doc(hidden)]
pub use control::reactor::{control_loop_settled_for_tests, panic_control_loop_for_tests};
#[cfg(not(loom))]
pub use error::{Result, RpcError};
#[cfg(not(loom))]
pub use limits::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_MEMORY, DEFAULT_MEMORY_LIMIT, DEFAULT_RNDV_MEMORY_LIMIT,
    DEFAULT_SHARED_RECV_BUFFERS, QUEUE_RESET_WINDOW,
};
#[cfg(not(loom))]
pub use server::{
    Connection, ConnectionEvents, Functions, Handler, RecvBuffers, Request, RndvStats, Server, ServerConfig,
    ServerStats,
};
#[cfg(not(loom))]
pub use tx_ctx::CallMode;
#[cfg(not(loom))]
pub use wire::{FunctionId, Status};
#[cfg(not(loom))]
pub use worker::{
    pin_current_thread, PollMode, Pollable, WorkerConfig, WorkerGroup, WorkerStats, DEFAULT_SPIN,
};

/// Loom-only mutation switch for the broken twins in `loom-tests`; absent from normal builds.
#[cfg(loom)]
#[doc(hidden)]
pub use sync::mutation;
