//! # bypass-loom-tests
//!
//! loom models of the production concurrency code — the sim rings and doorbells, the tx_ctx double
//! release, the request table, slabs and credits — compiled with `RUSTFLAGS="--cfg loom"` through
//! each crate's `sync` shim so loom checks the real code, not a copy. The models are written under
//! the loom issue; this crate exists so the workspace layout is final.
