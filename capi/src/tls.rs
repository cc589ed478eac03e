//! TLS from the three callbacks, on the stack's rustls TLS 1.3 (mutual).
//!
//! - `getCaAndVerify(&caPath, &crlPath, &verify)`: the CA bundle (PEM) and, if non-empty, a CRL
//!   (PEM) rustls checks the peer against; `verify`, if set, is then called with `x509` pointing
//!   to an `OckRpcTlsPeerCert` (the peer's end-entity certificate in DER, already verified) and
//!   the CRL path: 1 (any positive value) accepts, anything else refuses. There is no OpenSSL
//!   `X509_STORE_CTX` in rustls, so a callback written for one must not use it as such.
//! - `getCert(&certPath)`: this side's certificate chain (PEM).
//! - `getPriKey(&keyPath, &keypass, &erase)`: the private key (PEM, PKCS#8; encrypted when
//!   `keypass` is non-empty); `erase(keypass)` is called once the key is loaded.

use crate::config::{bounded_str, TlsCallbacks};
use crate::types::*;
use bypass::tls::{Passphrase, PemSource, TlsConfig};
use std::ffi::{c_char, c_void, CString};

const MAX_PATH: usize = 4096;

struct SendPtr(*mut c_char);
// SAFETY: the keypass pointer is only handed back to the caller's erase function, once.
unsafe impl Send for SendPtr {}

/// Builds the TLS config (server or client side) from the callbacks.
pub fn build(cb: &TlsCallbacks) -> Result<TlsConfig, OckRpcStatus> {
    let (mut ca, mut crl, mut verify): (*const c_char, *const c_char, OckRpcTlsCertVerify) =
        (std::ptr::null(), std::ptr::null(), None);
    // SAFETY: the caller's callbacks, given valid out-pointers.
    unsafe { (cb.get_ca_and_verify)(&mut ca, &mut crl, &mut verify) };
    let mut cert: *const c_char = std::ptr::null();
    // SAFETY: as above.
    unsafe { (cb.get_cert)(&mut cert) };
    let (mut key, mut pass, mut erase): (*const c_char, *mut c_char, OckRpcTlsKeypassErase) =
        (std::ptr::null(), std::ptr::null_mut(), None);
    // SAFETY: as above.
    unsafe { (cb.get_pri_key)(&mut key, &mut pass, &mut erase) };
    let path = |p: *const c_char, what: &str| {
        // SAFETY: the callbacks return C strings (read bounded).
        unsafe { bounded_str(p, MAX_PATH) }.ok_or_else(|| {
            crate::log!(crate::log::ERROR, "TLS: the {what} path is NULL or unterminated");
            OCK_RPC_ERR_INVALID_PARAM
        })
    };
    let erase_now = |pass: *mut c_char| {
        if let (Some(e), false) = (erase, pass.is_null()) {
            // SAFETY: the caller's erase function with the keypass it gave.
            unsafe { e(pass) };
        }
    };
    let (ca, cert, key) = match (path(ca, "CA"), path(cert, "certificate"), path(key, "private key")) {
        (Ok(a), Ok(c), Ok(k)) => (a, c, k),
        (a, c, k) => {
            erase_now(pass);
            return Err(a.err().or(c.err()).or(k.err()).unwrap_or(OCK_RPC_ERR_INVALID_PARAM));
        }
    };
    // SAFETY: a C string or NULL (read bounded).
    let crl = unsafe { bounded_str(crl, MAX_PATH) }.filter(|c| !c.is_empty());
    let mut b = TlsConfig::builder().ca(PemSource::file(&ca)).cert_chain(PemSource::file(&cert));
    // SAFETY: a C string or NULL (read bounded).
    let passphrase = unsafe { bounded_str(pass, 1024) }.filter(|p| !p.is_empty());
    b = match passphrase {
        Some(p) => {
            let raw = SendPtr(pass);
            let mut phrase = Passphrase::new(p.into_bytes());
            if let Some(e) = erase {
                phrase = phrase.with_erase(move || {
                    let raw = raw;
                    // SAFETY: the caller's erase function with its keypass, once.
                    unsafe { e(raw.0) }
                });
            }
            b.encrypted_private_key(PemSource::file(&key), phrase)
        }
        None => {
            erase_now(pass);
            b.private_key(PemSource::file(&key))
        }
    };
    if let Some(c) = &crl {
        b = b.crl(PemSource::file(c));
    }
    if let Some(v) = verify {
        let crl_c = CString::new(crl.clone().unwrap_or_default()).unwrap_or_default();
        b = b.verify_peer(move |chain| {
            let mut peer = OckRpcTlsPeerCert {
                der: chain.end_entity.as_ptr(),
                len: chain.end_entity.len(),
                peer_is_server: matches!(chain.peer, bypass::tls::Role::Server) as i32,
            };
            // SAFETY: the caller's verify callback with a live OckRpcTlsPeerCert and CRL path.
            let rc = unsafe { v(&mut peer as *mut OckRpcTlsPeerCert as *mut c_void, crl_c.as_ptr()) };
            if rc > 0 {
                Ok(())
            } else {
                Err(format!("the verify callback refused the certificate ({rc})"))
            }
        });
    }
    b.build().map_err(|e| {
        crate::log!(crate::log::ERROR, "TLS: {e}");
        OCK_RPC_ERR_INVALID_PARAM
    })
}
