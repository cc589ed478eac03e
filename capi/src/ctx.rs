//! Server contexts (`OckRpcServerContext`, `OckRpcServerRndvContext`): a request being handled.
//!
//! The handler's context handle lives while the handler runs (a rendezvous context until
//! `OckRpcServerCleanupRndvCtx`). `OckRpcCloneCtx` makes a second handle on the same request
//! that lives until `OckRpcDeCloneCtx`, so another thread can reply. The request is answered at
//! most once, by whichever handle replies first; a request no handle answered is dropped when
//! its last handle ends (the client sees a timeout) — except a one-way message too large for
//! the eager segment, which travels as a call ([`Ctx::auto_reply`]) and is answered empty
//! then, so the sender learns the server is done with its memory.

use crate::handle::{Handle, HandleTable};
use crate::server::Dispatch;
use bypass::backend::AnyRequest;
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
    /// A one-way message sent as a call (larger than the eager segment): answered with an
    /// empty reply when its last handle ends unanswered.
    pub auto_reply: bool,
}

impl Ctx {
    /// Ends the request if no handle answered it: dropped, or (a large one-way message)
    /// answered empty.
    pub fn end(&mut self) {
        let req = self.req.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(req), true) = (req, self.auto_reply) {
            if let Err(e) = bypass::match_any!(req, r => r.reply(&[])) {
                crate::log!(crate::log::DEBUG, "the empty answer of a large one-way message failed: {e}");
            }
        }
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        self.end();
    }
}

/// Every live context handle.
pub static CTXS: HandleTable<Ctx> = HandleTable::new(0xC7);

/// The context behind `h`.
pub fn lookup(h: Handle) -> Option<Arc<Ctx>> {
    CTXS.get(h)
}
