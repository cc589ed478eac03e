//! Loading liburma at run time: `dlopen` of the library a configuration, `BYPASS_URMA_LIB` or the
//! default `liburma.so.0` names, every function resolved once into a table of `extern "C"` fn
//! pointers of the types `bypass-urma-abi` declares, and `urma_init` called once per library.
//!
//! A library is loaded once per path and never unloaded (providers start threads and register
//! themselves from ELF constructors; unloading under them is not safe).

use super::tables::status_error;
use crate::{Error, Result};
use bypass_urma_abi::fns::*;
use bypass_urma_abi::{legacy, status, UrmaInitAttr};
use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

/// The environment variable naming the liburma to load (a path or a soname).
pub const LIB_ENV: &str = "BYPASS_URMA_LIB";
/// The environment variable the conformance environments read the device spec from
/// (`udma0,lib=...,eid=0`; empty: the first device).
pub const SPEC_ENV: &str = "BYPASS_URMA_SPEC";
/// The library loaded when neither the configuration nor [`LIB_ENV`] names one.
pub const DEFAULT_LIB: &str = "liburma.so.0";

macro_rules! lib_table {
    ($($field:ident : $ty:ty = $sym:literal),* $(,)?) => {
        /// liburma's functions, resolved from one loaded library.
        pub(crate) struct Lib {
            /// What was loaded (path or soname), for messages.
            pub(crate) name: String,
            $(pub(crate) $field: $ty,)*
        }

        impl Lib {
            /// Resolves every function from `handle`; `Err(symbol)` names the first one missing.
            ///
            /// # Safety
            /// `handle` is a live `dlopen` handle of a library exporting liburma's ABI.
            unsafe fn resolve(handle: *mut c_void, name: String) -> std::result::Result<Lib, &'static str> {
                Ok(Lib {
                    name,
                    $($field: {
                        // SAFETY: the handle is live; the symbol name is NUL-terminated.
                        let p = unsafe { libc::dlsym(handle, concat!($sym, "\0").as_ptr().cast()) };
                        if p.is_null() {
                            return Err($sym);
                        }
                        // SAFETY: a non-null symbol of this name in a liburma-compatible library
                        // is the function urma-abi.md declares, whose signature `$ty` spells.
                        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
                    },)*
                })
            }
        }
    };
}

lib_table! {
    init: UrmaInit = "urma_init",
    get_device_list: UrmaGetDeviceList = "urma_get_device_list",
    free_device_list: UrmaFreeDeviceList = "urma_free_device_list",
    get_device_by_name: UrmaGetDeviceByName = "urma_get_device_by_name",
    get_eid_list: UrmaGetEidList = "urma_get_eid_list",
    free_eid_list: UrmaFreeEidList = "urma_free_eid_list",
    query_device: UrmaQueryDevice = "urma_query_device",
    create_context: UrmaCreateContext = "urma_create_context",
    delete_context: UrmaDeleteContext = "urma_delete_context",
    create_jfce: UrmaCreateJfce = "urma_create_jfce",
    delete_jfce: UrmaDeleteJfce = "urma_delete_jfce",
    create_jfc: UrmaCreateJfc = "urma_create_jfc",
    delete_jfc: UrmaDeleteJfc = "urma_delete_jfc",
    rearm_jfc: UrmaRearmJfc = "urma_rearm_jfc",
    wait_jfc: UrmaWaitJfc = "urma_wait_jfc",
    ack_jfc: UrmaAckJfc = "urma_ack_jfc",
    poll_jfc: UrmaPollJfc = "urma_poll_jfc",
    create_jfr: UrmaCreateJfr = "urma_create_jfr",
    delete_jfr: UrmaDeleteJfr = "urma_delete_jfr",
    create_jetty: UrmaCreateJetty = "urma_create_jetty",
    delete_jetty: UrmaDeleteJetty = "urma_delete_jetty",
    modify_jetty: UrmaModifyJetty = "urma_modify_jetty",
    query_jetty: UrmaQueryJetty = "urma_query_jetty",
    import_jetty: UrmaImportJetty = "urma_import_jetty",
    unimport_jetty: UrmaUnimportJetty = "urma_unimport_jetty",
    bind_jetty: UrmaBindJetty = "urma_bind_jetty",
    unbind_jetty: UrmaUnbindJetty = "urma_unbind_jetty",
    register_seg: UrmaRegisterSeg = "urma_register_seg",
    unregister_seg: UrmaUnregisterSeg = "urma_unregister_seg",
    import_seg: UrmaImportSeg = "urma_import_seg",
    unimport_seg: UrmaUnimportSeg = "urma_unimport_seg",
    post_jetty_send_wr: UrmaPostJettySendWr = "urma_post_jetty_send_wr",
    post_jetty_recv_wr: UrmaPostJettyRecvWr = "urma_post_jetty_recv_wr",
    post_jfr_wr: UrmaPostJfrWr = "urma_post_jfr_wr",
    get_async_event: UrmaGetAsyncEvent = "urma_get_async_event",
    ack_async_event: UrmaAckAsyncEvent = "urma_ack_async_event",
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lib").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Which library to load: `configured` (from the backend spec), else `$BYPASS_URMA_LIB`, else
/// `liburma.so.0`.
pub(crate) fn library_name(configured: Option<&str>) -> String {
    if let Some(c) = configured.filter(|c| !c.is_empty()) {
        return c.to_owned();
    }
    match std::env::var(LIB_ENV) {
        Ok(v) if !v.trim().is_empty() => v.trim().to_owned(),
        _ => DEFAULT_LIB.to_owned(),
    }
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The liburma `name` names, loaded, checked and initialised (once per name per process).
pub(crate) fn load(name: &str) -> Result<&'static Lib> {
    static LIBS: OnceLock<Mutex<HashMap<String, &'static Lib>>> = OnceLock::new();
    let mut libs = LIBS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(lib) = libs.get(name) {
        return Ok(lib);
    }
    let lib: &'static Lib = Box::leak(Box::new(open(name)?));
    libs.insert(name.to_owned(), lib);
    Ok(lib)
}

fn open(name: &str) -> Result<Lib> {
    let c = CString::new(name)
        .map_err(|_| Error::InvalidArgument(format!("liburma path {name:?} contains a NUL byte")))?;
    // SAFETY: `c` is NUL-terminated; RTLD_NOW resolves everything now, so a broken library fails
    // here and not at a later call.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(Error::Device(format!(
            "liburma not found: dlopen({name:?}) failed: {}. The urma backend loads liburma at run time: \
             install UMDK's URMA library (liburma.so.0, with its provider in <libdir>/urma/), or name a \
             liburma-compatible library (such as the simulated one from sim-urma) with {LIB_ENV}=<path> or \
             the backend option `urma:<device>,lib=<path>`",
            dlerror_text()
        )));
    }
    for sym in legacy::SYMBOLS_SINCE_26 {
        let s = CString::new(*sym).expect("no NUL in a symbol name");
        // SAFETY: `handle` is live; `s` is NUL-terminated.
        if unsafe { libc::dlsym(handle, s.as_ptr()) }.is_null() {
            return Err(Error::Unsupported(format!(
                "{name} has no {sym}: it is an older liburma (UMDK v25.12 or 24.12 LTS) whose object and \
                 device-attribute layouts differ from the 26.x layout this backend is built for \
                 (urma-abi.md §3.7); use UMDK 26.x"
            )));
        }
    }
    // SAFETY: `handle` was just opened and is never closed.
    let lib = unsafe { Lib::resolve(handle, name.to_owned()) }.map_err(|sym| {
        Error::Unsupported(format!("{name} does not export {sym}: it is not a complete liburma"))
    })?;
    let mut attr = UrmaInitAttr { token: 0, uasid: 0 };
    // SAFETY: `attr` is a valid init attribute; urma_init may be called once per process (a second
    // call says EEXIST, which is fine: someone else in this process initialised it).
    let rc = unsafe { (lib.init)(&mut attr) };
    match rc {
        status::URMA_SUCCESS | status::URMA_EEXIST => Ok(lib),
        status::URMA_FAIL => Err(Error::Device(format!(
            "urma_init of {name} failed (URMA_FAIL): no URMA provider loaded. A UB host needs the provider \
             (liburma-udma.so in <libdir>/urma/) and the ubcore/uburma kernel modules; check `ls \
             /sys/class/ubcore`"
        ))),
        rc => Err(status_error("urma_init", rc, &format!("initialise {name}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_name_prefers_configuration() {
        assert_eq!(library_name(Some("/opt/x/liburma.so.0")), "/opt/x/liburma.so.0");
        // The env var is process-wide; only assert the fallback when nobody set it.
        if std::env::var(LIB_ENV).is_err() {
            assert_eq!(library_name(None), DEFAULT_LIB);
            assert_eq!(library_name(Some("")), DEFAULT_LIB);
        }
    }

    #[test]
    fn a_missing_library_says_what_to_install_and_set() {
        let e = load("/nonexistent/liburma.so.0").unwrap_err().to_string();
        assert!(e.contains("liburma not found"), "{e}");
        assert!(e.contains("/nonexistent/liburma.so.0"), "{e}");
        assert!(e.contains(LIB_ENV) && e.contains("lib=<path>"), "{e}");
    }

    #[test]
    fn a_library_that_is_not_liburma_is_refused_by_name() {
        // libc is loaded in every process and exports none of liburma's functions.
        let e = load("libc.so.6").unwrap_err().to_string();
        assert!(e.contains("urma_get_rjetty") && e.contains("older liburma"), "{e}");
    }
}
