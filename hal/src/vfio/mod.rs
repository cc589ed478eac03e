//! The vfio backend: a userspace driver for a modern virtio-net NIC owned through VFIO, as an
//! [`L2Port`](crate::l2::L2Port) (feature `vfio`; `docs/vfio.md` says how to bind a device).
//!
//! Layers, bottom up:
//!
//! - `dma` and `mmio`: the only `unsafe` of the driver. DMA memory is a few large anonymous
//!   mappings reached through raw pointers (never a Rust reference: the device writes them behind
//!   our back); a BAR is mapped from the device fd and every register access is one volatile
//!   access of the register's exact width.
//! - [`virtqueue`]: the driver's side of a split virtqueue over any [`virtqueue::QueueMemory`],
//!   with its publication discipline (descriptors, release fence, available index; used index,
//!   acquire fence, used elements; one notification per batch). [`soft_device`] is the device's
//!   side in software, for tests without a VM and for the loom models of `loom-tests/`.
//! - [`dma_queue`]: a virtqueue laid out in a DMA region; [`net`]: virtio-net's frames over a
//!   receive and a transmit queue (the 12-byte header, receive buffers kept posted).
//! - `pci`, `virtio_pci` and [`VirtioNet`]: the VFIO container, group and device, the virtio-pci
//!   capabilities in config space, feature negotiation, queue setup, and every refusal with a
//!   message that says what to do.

#[cfg(feature = "vfio")]
mod device;
#[cfg(feature = "vfio")]
mod dma;
#[cfg(feature = "vfio")]
pub mod dma_queue;
#[cfg(feature = "vfio")]
mod mmio;
#[cfg(feature = "vfio")]
pub mod net;
#[cfg(feature = "vfio")]
pub mod pci;
pub mod soft_device;
#[cfg(feature = "vfio")]
pub mod virtio_pci;
pub mod virtqueue;

#[cfg(feature = "vfio")]
pub use device::{VirtioNet, VirtioNetOptions};
#[cfg(feature = "vfio")]
pub use dma::DmaRegion;
#[cfg(feature = "vfio")]
pub use mmio::Bar;

#[cfg(all(test, feature = "vfio"))]
mod tests;
