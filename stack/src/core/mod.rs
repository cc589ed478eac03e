//! The loom-checked building blocks of a connection, each tested on its own and model-checked
//! by `loom-tests` against the real code: send contexts ([`tx_ctx`]), request ids
//! ([`req_table`]), flow control ([`credits`]), the lock-free [`free_list`] under both, the
//! registered buffer pool ([`buf_pool`]) and the generational handles they hand out.

pub mod buf_pool;
pub mod credits;
pub(crate) mod free_list;
pub(crate) mod handle;
pub mod req_table;
pub mod tx_ctx;
