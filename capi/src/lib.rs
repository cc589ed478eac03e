//! # bypass-capi: `libhcom4db.so`
//!
//! The OckRpc* C API of `include/hcom4db.h` (what openGauss CBB, libcomm and the NDP plugin
//! load through `OCK_RPC_LIB_PATH`) on the bypass stack: same names, types, layouts and status
//! codes. See `docs/capi.md`.
//!
//! Layout of the crate:
//! - [`types`]: the C structs and status codes; [`handle`]: generational handle tables;
//!   [`guard`]: the panic barrier of every export; [`log`](mod@log): the logger; [`config`]: config keys.
//! - [`backend`]: the device of a server (held as a `bypass::backend::AnyDevice`: the stack's
//!   erasure over backends, which every object of the crate uses).
//! - [`server`], [`ctx`], [`client`], [`call`], [`regions`], [`tls`]: the objects.
//! - `api_*`: the exported functions (each body in [`guard::guard`]).

#![allow(non_snake_case)]

pub mod backend;
pub mod call;
pub mod client;
pub mod config;
pub mod ctx;
pub mod guard;
pub mod handle;
#[macro_use]
pub mod log;
pub mod regions;
pub mod server;
pub mod tls;
pub mod types;

/// The exported client functions (public for the crate's Rust tests).
pub mod api_client;
/// The exported server functions.
pub mod api_server;

// The memory side: regions, one-sided I/O, the allocator.
mod allocator;
mod memory;
mod one_sided;
