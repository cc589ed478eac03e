//! Server contexts (`OckRpcServerContext`, `OckRpcServerRndvContext`): a request being handled.
//!
//! The handler's context handle lives while the handler runs (a rendezvous context until
//! `OckRpcServerCleanupRndvCtx`). `OckRpcCloneCtx` makes a second handle on the same request
//! that lives until `OckRpcDeCloneCtx`, so another thread can reply. The request is answered at
//! most once, by whichever handle replies first; a request no handle answered is dropped when
//! its last handle ends (the client sees a timeout).

use crate::handle::{Handle, HandleTable};
use crate::net::AnyRequest;
use crate::server::Dispatch;
use std::sync::{Arc, Mutex};

/// A request being handled. Reused: a context whose handles have all ended goes back to its
/// server's pool, so serving a request allocates nothing in steady state.
#[derive(Debug)]
pub struct Ctx {
    /// The request, until it is answered.
    pub req: Mutex<Option<AnyRequest>>,
    /// Its message id.
    pub msg_id: u16,
    /// The connection's channel id (for `OckRpcGetClient`).
    pub channel: u32,
    /// The server's dispatch state.
    pub dispatch: Arc<Dispatch>,
    /// Whether it came by `OckRpcClientCallRndv*`.
    pub rndv: bool,
}

/// Every live context handle.
pub static CTXS: HandleTable<Ctx> = HandleTable::new(0xC7);

/// The context behind `h`.
pub fn lookup(h: Handle) -> Option<Arc<Ctx>> {
    CTXS.get(h)
}
