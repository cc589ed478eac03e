//! # bypass-capi: `libhcom4db.so`
//!
//! This crate will export every function of `hcom4db.h` (the OckRpc* API that openGauss CBB,
//! libcomm and the NDP plugin load) with identical names, types, layouts and status codes, on top
//! of the `bypass` stack. No function is exported yet: it is built by a later issue.

// Used by the C entry points of the memory API (phase 2 of issue 12).
#[allow(dead_code)]
mod allocator;
#[allow(dead_code)]
mod memory;
#[allow(dead_code)]
mod one_sided;
