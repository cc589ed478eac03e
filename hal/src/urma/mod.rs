//! # The urma backend: UB NICs through liburma (openEuler UMDK URMA)
//!
//! Behind the `urma` feature (off by default). Nothing URMA is needed to build it: liburma is
//! loaded at run time with `dlopen` — the library named by the backend option `lib=<path>`, else
//! by `$BYPASS_URMA_LIB`, else `liburma.so.0` — and a machine without it gets an error naming
//! what is missing and how to point at it. The C declarations are `bypass-urma-abi`'s, written
//! by hand from urma-abi.md and checked field by field in its tests; a library older than UMDK
//! 26.x (no `urma_get_rjetty` / `urma_get_seg_ctx`, different layouts) is refused at load time.
//!
//! | hal | here |
//! |---|---|
//! | [`crate::Device`] | [`UrmaDevice`]: a `urma_context` on one EID of a device (`urma_get_eid_list`) |
//! | [`crate::MemoryRegion`] | [`UrmaRegion`]: a registered segment with a token of its own |
//! | [`crate::RemoteKey`] | 32 bits (the token id, under the device token; named as a `user_tseg`), or for write-only regions 32 bytes (token, token id, va, len, granted access) imported with `urma_import_seg` on first use, cached per queue (see `mr`) |
//! | [`crate::CompletionQueue`] | [`UrmaCq`]: a JFC on its own or a shared JFCE |
//! | [`crate::EventChannel`] | [`UrmaChannel`]: a JFCE (its fd; `urma_wait_jfc` with timeout 0, then `urma_ack_jfc`) |
//! | [`crate::Queue`] | [`UrmaQueue`]: an RC jetty on a JFR of its own (`share_jfr`), bound to the peer with `urma_import_jetty` + `urma_bind_jetty` |
//! | [`crate::QueueInfo`] | gid = EID, qpn = jetty id, uasid, token = the JFR's token value |
//! | [`crate::Status`] | `urma_cr_status_t`, one table (`tables::cr_status`) |
//! | [`crate::Error`] | `urma_status_t` / errno, one table (`tables::status_error`) |
//!
//! One `urma_post_jetty_send_wr` (or `_recv_wr`) per batch, built in per-queue buffers;
//! [`crate::WrFlags::SIGNALED`] is `complete_enable`. Order types are left at 0 in both
//! `create_jetty` and `import_jetty`, which the library rewrites to OL for RC on both sides, so
//! `bind_jetty` compares equal values; a bind refused with `URMA_ENOPERM` reports both order
//! types, and `URMA_EEXIST` (already bound) counts as bound, as UMDK's perftest does.
//!
//! ## Where the hal contract had to choose (what real hardware does)
//!
//! - **Keys and tokens.** Segments the owner's device protects by itself (remote rights none,
//!   READ or READ|WRITE) share the device's token and get 32-bit keys (their token ids), so they
//!   fit URPC's 32-bit descriptor token and rendezvous works. Any peer connected to the device
//!   knows that token, as any queue of a verbs PD may use any of its rkeys: a key is a
//!   capability among connected peers, not a secret against them.
//! - **Write-only regions.** URMA cannot register WRITE without READ (`urma_check_seg_cfg`), so a
//!   region with REMOTE_WRITE but not REMOTE_READ is registered READ|WRITE with a token of its
//!   own, and its (wide) key carries only WRITE: the requester imports the segment with the rights
//!   the key grants, and its device refuses a READ through that import. The owner's device does
//!   not enforce the difference, so a peer that forges the key's access bits can READ it.
//! - **Retries.** URMA's JFS has `rnr_retry` and `err_timeout` (from [`crate::QueueConfig`]'s
//!   `rnr_retry` and `timeout` exponent) but no transport retry count: `retry_count` is not
//!   applied; the device's own budget decides when `ACK_TIMEOUT_ERR` is reported.
//! - **Reset.** A jetty has no path back to a connectable RESET, so [`crate::Queue::reset`]
//!   deletes the jetty and its JFR and creates new ones: the queue keeps its CQs but gets a new
//!   jetty id (connect with the new `info()`, as every reconnect does). Records of the old jetty
//!   carry the old epoch and are dropped.
//! - **Stale local keys.** A local SGE names a library segment object, not a number the NIC
//!   checks; an lkey that names no live region is given a LOCAL_ONLY page the context keeps
//!   registered, so the device fails the request with a local access error completion
//!   ([`crate::Status::LocalProtection`]) instead of touching a freed segment.
//! - **Keys the library will not import.** A remote key is a completion-time error on every
//!   backend, never a post-time one: a key `urma_import_seg` refuses (a forged or corrupted one)
//!   is sent as a `user_tseg` (token id, token value, attributes) instead, and the owner's device
//!   refuses it like any wrong token (`REM_ACCESS_ABORT` → [`crate::Status::RemoteAccess`]).
//! - **Async events.** `URMA_EVENT_JETTY_ERR` / `JFS_ERR` → [`crate::AsyncEvent::QueueFatal`],
//!   `JFC_ERR` → `CqError` (and the CQ reports [`crate::Error::CqOverflow`]), `PORT_*`, `DEV_FATAL`;
//!   the rest → `Other(code)`.
//! - **Caps.** URMA reports no segment-size limit (`max_region_size` is `isize::MAX`) nor READ
//!   depths (the hal defaults apply); the queue depth is the smaller of the JFS and JFR depths.
//!
//! Posting holds the context's registration table read-locked across the library call (a
//! segment cannot be unregistered while the library may read it): one uncontended read lock per
//! batch. A remote key's first use on a queue imports the segment (a system call on UB and an
//! allocation in the cache); later uses are a hash lookup.
//!
//! Never run here: a real liburma, a UB NIC, ubcore/uburma. See docs/urma.md.

mod cq;
mod device;
#[cfg(feature = "conformance")]
mod env;
mod loader;
mod mr;
mod queue;
mod srq;
mod tables;

pub use cq::{UrmaChannel, UrmaCq};
pub use device::{device_names, parse_spec, UrmaConfig, UrmaDevice};
#[cfg(feature = "conformance")]
pub use env::UrmaEnv;
pub use loader::{DEFAULT_LIB, LIB_ENV, SPEC_ENV};
pub use mr::UrmaRegion;
pub use queue::UrmaQueue;
pub use srq::UrmaSharedRecv;
