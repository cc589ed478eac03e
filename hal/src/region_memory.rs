//! The memory under a registered region, common to the verbs and URMA backends: page-aligned
//! zeroed memory the region allocates and owns (`Device::register`), or the caller's
//! (`Device::register_external`), and freeing it only once the device can no longer reach it.

use crate::{Error, Result};
use std::alloc::Layout;

/// Alignment of memory the backend allocates for a region (a page: what DMA mappings pin).
const REGION_ALIGN: usize = 4096;

/// The layout of the memory a region of `len` bytes allocates (at least one byte).
pub(crate) fn layout(len: usize) -> Result<Layout> {
    Layout::from_size_align(len.max(1), REGION_ALIGN).map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// Allocates zeroed memory of `layout` (for a region of `len` bytes) and registers it with
/// `register` (given the memory and the registered length, the layout's size); frees the
/// memory again if the registration fails.
pub(crate) fn allocate<R>(
    len: usize,
    layout: Layout,
    register: impl FnOnce(*mut u8, usize) -> Result<R>,
) -> Result<R> {
    // SAFETY: `layout` has a non-zero size (see `layout`).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(Error::OutOfResources(format!("cannot allocate {len} bytes to register")));
    }
    register(ptr, layout.size()).inspect_err(|_| {
        // SAFETY: allocated above with this layout; the registration failed, nothing refers to
        // it.
        unsafe { std::alloc::dealloc(ptr, layout) };
    })
}

/// Checks the caller's memory given to `register_external`; `backend` names the library in the
/// message (it registers at least one byte).
pub(crate) fn check_external(ptr: *mut u8, len: usize, backend: &str) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::InvalidArgument("register_external of a null pointer".into()));
    }
    if len == 0 {
        return Err(Error::InvalidArgument(format!(
            "register_external of zero bytes ({backend} registers at least one)"
        )));
    }
    Ok(())
}

/// After the backend deregistered a region (`deregistered`: the library said so), frees its
/// memory if the region allocated it (`owned`). Memory the device may still reach (the
/// deregistration failed) is leaked rather than freed.
///
/// # Safety
/// `owned` is the layout [`allocate`] allocated `ptr` with, and nothing uses the memory any more.
pub(crate) unsafe fn free(ptr: *mut u8, owned: Option<Layout>, deregistered: bool) {
    if !deregistered {
        return;
    }
    if let Some(layout) = owned {
        // SAFETY: per the contract.
        unsafe { std::alloc::dealloc(ptr, layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_get_aligned_memory_and_failures_pass_through() {
        let l = layout(0).unwrap();
        assert_eq!((l.size(), l.align()), (1, REGION_ALIGN));
        let e = allocate(10, layout(10).unwrap(), |_, _| Err::<(), _>(Error::Device("no".into())));
        assert!(matches!(e, Err(Error::Device(_))));
        let (ptr, reg_len) = allocate(10, layout(10).unwrap(), |p, n| Ok((p, n))).unwrap();
        assert_eq!(reg_len, 10);
        assert_eq!(ptr as usize % REGION_ALIGN, 0);
        // SAFETY: allocated just above with this layout, used by nothing.
        unsafe { free(ptr, Some(layout(10).unwrap()), true) };
        assert!(layout(usize::MAX).is_err());
        assert!(check_external(std::ptr::null_mut(), 1, "x").is_err());
        let e = check_external(ptr, 0, "verbs").unwrap_err().to_string();
        assert!(e.contains("verbs registers at least one"), "{e}");
    }
}
