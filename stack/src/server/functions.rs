//! The function table: function id → [`Handler`].

#![forbid(unsafe_code)]

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

/// Hashes a function id for the table: one multiply instead of SipHash (which cost about 140
/// instructions per request, a tenth of the RPC layer's own work on the one-thread round trip).
/// Keys are the ids the server registered, so a peer cannot fill the table with colliding ones;
/// looking up an unregistered id probes no longer than a registered one does.
#[derive(Default, Clone, Copy)]
pub(super) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u64` keys; kept correct for any other.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: the product's high bits (hashbrown's tag) and, after the fold, its
        // low bits (the bucket) both depend on every bit of the id.
        let h = (self.0 ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

/// The function table: function id → handler.
pub struct Functions<D: Device + Clone> {
    pub(super) map: HashMap<u64, Handler<D>, std::hash::BuildHasherDefault<IdHasher>>,
    /// Where rendezvous arguments and staged responses live (`None`: a pool per connection).
    pub(super) rndv_alloc: Option<Arc<dyn crate::conn::rndv::RndvAllocator<D::Region>>>,
}

impl<D: Device + Clone> Default for Functions<D> {
    fn default() -> Self {
        Functions { map: HashMap::default(), rndv_alloc: None }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimNic as SimDevice;

    /// Ids that differ only in their high bits (device classes) or only in their low bits
    /// (methods) each find their own handler, and an unregistered neighbour finds none.
    #[test]
    fn every_registered_id_finds_its_handler_and_no_other() {
        let mut f = Functions::<SimDevice>::new();
        let mut ids = Vec::new();
        for class in [0u16, 1, 0x800, 0xFFF] {
            for method in [0u32, 1, 2, 0x7FFF, FunctionId::MAX_METHOD] {
                let id = FunctionId::new(class, 7, false, method).expect("valid id");
                let raw = id.raw();
                f.register(id, move |r: Request<SimDevice>| assert_eq!(r.function().raw(), raw));
                ids.push(id);
            }
        }
        for id in &ids {
            assert!(f.get(*id).is_some(), "{id} lost");
        }
        let absent = FunctionId::new(0x123, 7, false, 3).expect("valid id");
        assert!(f.get(absent).is_none());
        assert_eq!(f.map.len(), ids.len());
    }
}
