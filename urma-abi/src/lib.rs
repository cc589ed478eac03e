//! # bypass-urma-abi: liburma's C ABI, declared by hand
//!
//! The structs, constants, status codes and function signatures of liburma (openEuler UMDK URMA,
//! `liburma.so.0`), written from the facts in `shared/reference/urma-abi.md` (x86_64 Linux, the
//! headers of UMDK master 26.06.0, `URMA_API_VERSION` 9). Nothing here links liburma: the
//! `urma` backend of `bypass-hal` loads it at run time and casts symbols to the [`fns`] types,
//! and `sim-urma` implements the same functions on the simulated NIC and checks its exports
//! against the same types.
//!
//! Every struct's size and every field offset the reference lists is asserted in
//! `tests/layout.rs`. Layouts of older UMDK releases differ (see [`legacy`]); this crate
//! declares only the current one.
//!
//! Conventions:
//! - A C `enum` is a 4-byte integer; it is declared as a `u32` alias (or `i32` where a value is
//!   negative) with the values as constants.
//! - A C bitfield union (`*_flag_t`, `*_attr_t`, `cap`) is a `u32` plus the masks and shifts in
//!   [`consts`]; gcc fills bitfields from the least-significant bit.
//! - Library-internal parts of a struct (mutexes, condition variables, driver-private tails) are
//!   opaque byte arrays of the right size and alignment; only the library writes them.
//! - `urma_status_t` is an `int`: 0 is success, errors are positive errno numbers ([`status`]).

#![warn(missing_docs)]

pub mod consts;
pub mod device;
pub mod fns;
pub mod jetty;
pub mod legacy;
pub mod seg;
pub mod status;
pub mod timers;
pub mod wr;

pub use device::*;
pub use jetty::*;
pub use seg::*;
pub use status::UrmaStatus;
pub use wr::*;
