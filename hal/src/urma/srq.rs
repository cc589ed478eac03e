//! Shared receive queues on URMA: not implemented yet.
//!
//! The design (a JFR shared by several jettys) is in `docs/urma.md`; until it lands, the device
//! reports `DeviceCaps::max_shared_recv` 0 and `create_shared_recv` is `Error::Unsupported`, so no
//! value of [`UrmaSharedRecv`] ever exists.

use crate::{Error, RecvWr, Result, SharedRecv};

/// A shared receive queue on a URMA device: never created (see the module docs).
#[derive(Debug)]
pub struct UrmaSharedRecv {
    pub(crate) never: std::convert::Infallible,
}

impl UrmaSharedRecv {
    pub(crate) fn unsupported(name: &str) -> Error {
        Error::Unsupported(format!(
            "shared receive queues (a JFR shared by several jettys) are not implemented by the urma backend \
             yet ({name}): create queues with create_queue, each on a JFR of its own"
        ))
    }
}

impl SharedRecv for UrmaSharedRecv {
    fn depth(&self) -> u32 {
        match self.never {}
    }

    fn max_sge(&self) -> u32 {
        match self.never {}
    }

    fn post_recv(&mut self, _: &[RecvWr<'_>]) -> Result<()> {
        match self.never {}
    }

    fn destroy(self) -> Result<(), (Self, Error)> {
        match self.never {}
    }
}
