//! The function table: function id → [`Handler`].

use super::*;

/// A request handler. It owns the [`Request`]: reply before returning, or move it to another
/// thread and reply there later. Dropping it without replying drops the request cleanly.
///
/// A handler that panics fails only its own request: the worker catches the panic and goes on
/// serving, [`ServerStats::handler_panics`] counts it, and a request the handler still held
/// (dropped by the unwinding) is answered SERVER_DECLINE, which the caller sees as
/// [`RpcError::Status`]`(`[`Status::ServerDecline`]`)`. A reply already made stands; a request
/// already handed to another thread stays valid there.
pub type Handler<D> = Arc<dyn Fn(Request<D>) + Send + Sync + 'static>;

/// The function table: function id → handler.
pub struct Functions<D: Device + Clone> {
    pub(super) map: HashMap<u64, Handler<D>>,
    /// Where rendezvous arguments and staged responses live (`None`: a pool per connection).
    pub(super) rndv_alloc: Option<Arc<dyn crate::conn::rndv::RndvAllocator<D::Region>>>,
}

impl<D: Device + Clone> Default for Functions<D> {
    fn default() -> Self {
        Functions { map: HashMap::new(), rndv_alloc: None }
    }
}

impl<D: Device + Clone> std::fmt::Debug for Functions<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<_> = self.map.keys().map(|&k| FunctionId::from_raw(k)).collect();
        ids.sort_by_key(|id| id.as_ref().map(|i| i.raw()).unwrap_or(0));
        f.debug_struct("Functions").field("ids", &ids).finish()
    }
}

impl<D: Device + Clone> Functions<D> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `id` (replacing an earlier one).
    pub fn register(
        &mut self,
        id: FunctionId,
        handler: impl Fn(Request<D>) + Send + Sync + 'static,
    ) -> &mut Self {
        self.map.insert(id.raw(), Arc::new(handler));
        self
    }

    /// Takes the memory for rendezvous arguments (the READ targets) and for staged large
    /// responses from `alloc` instead of the server's own pool (e.g. the C API's
    /// `OckRpcRndvMemAllocate` / `OckRpcRndvMemFree` hooks). Its regions must be registered on
    /// the server's device with `LOCAL_WRITE`. Every connection still charges what it takes
    /// against [`ServerConfig::rndv_memory_limit`].
    pub fn rndv_allocator(
        &mut self,
        alloc: Arc<dyn crate::conn::rndv::RndvAllocator<D::Region>>,
    ) -> &mut Self {
        self.rndv_alloc = Some(alloc);
        self
    }

    pub(super) fn get(&self, id: FunctionId) -> Option<&Handler<D>> {
        self.map.get(&id.raw())
    }
}
