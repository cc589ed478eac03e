//! One side of a connection, shared by the client's channel and the server's connections: the
//! [`endpoint`] (queues, completion queues, send contexts, message buffers and the views of
//! them), the [`bufs`] tokens that own those buffers, its [`sizes`], [`liveness`] (keepalive, silence, why a connection closed), the
//! server's [`shared_pool`] of receive buffers, queue [`recovery`] and the [`rndv`]
//! (rendezvous) memory of large arguments and responses.

pub(crate) mod bufs;
pub(crate) mod endpoint;
pub(crate) mod liveness;
pub(crate) mod polled;
pub(crate) mod recovery;
pub(crate) mod rndv;
pub(crate) mod shared_pool;
pub(crate) mod sizes;

pub use recovery::Recovery;
pub use rndv::{AllocFns, RegionPool, RndvAllocator, RndvBuf};
