//! # tls: TLS 1.3 with mutual authentication on the control plane
//!
//! The control connection (`control`: the hellos with the queue infos, whose tokens and keys
//! let a peer reach the queues, and the stream whose closure ends the connection) can run over
//! TLS 1.3 ([rustls](https://docs.rs/rustls), `ring` provider). Set
//! [`ChannelConfig::tls`](crate::ChannelConfig::tls) and
//! [`ServerConfig::tls`](crate::ServerConfig::tls) to a [`TlsConfig`]:
//!
//! - **Mutual**: the server always asks for a client certificate and refuses a client without
//!   one; the client always checks the server's. Both chains must lead to a CA of the bundle.
//! - **Required when set**: a server with a `TlsConfig` refuses plaintext clients, and a server
//!   without one refuses TLS clients; both sides get an error saying so ([`TlsError`]). The server
//!   tells the two apart by the first byte: `0x16` opens a TLS handshake record, `B` the
//!   plaintext control frame's magic `BYPC`.
//! - **Named refusals**: a certificate from an unknown CA, expired or not yet valid, revoked by a
//!   CRL, issued for another name, or missing is reported as such ([`CertProblem`]), by the side
//!   that checked it ([`TlsError::PeerCertificate`]) and by the side it was refused to
//!   ([`TlsError::RefusedByPeer`], from the TLS alert).
//! - **No secret leaves**: passphrases and key bytes are wiped when dropped ([`Passphrase`]),
//!   never printed by `Debug` and never part of an error message.
//! - **Whole connection**: the TLS stream replaces the TCP stream for the life of the control
//!   connection ([`ControlStream`](crate::control::ControlStream)); only TLS 1.3, no session
//!   resumption (every connection authenticates afresh).
//!
//! The material (CA bundle, certificate chain, private key, CRLs) is read and checked once, by
//! [`TlsConfigBuilder::build`]: a bad file or a wrong passphrase fails there, naming the file.
//!
//! ```
//! # #[cfg(feature = "tls")]
//! # fn demo() -> Result<(), bypass::tls::TlsError> {
//! use bypass::tls::{Passphrase, PemSource, TlsConfig};
//! # let dir = std::env::temp_dir();
//! # let (ca, cert, key) = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
//! let tls = TlsConfig::builder()
//!     .ca(PemSource::file(ca))
//!     .cert_chain(PemSource::file(cert))
//!     .encrypted_private_key(PemSource::file(key), Passphrase::new(b"secret".to_vec()))
//!     .build();
//! # let _ = tls;
//! # Ok(())
//! # }
//! ```
//!
//! Without the crate feature `tls` the types exist (so configurations compile either way), but
//! [`TlsConfigBuilder::build`] fails with [`TlsError::Config`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use zeroize::Zeroizing;

/// The first byte of a TLS handshake record (a ClientHello starts with it); a plaintext control
/// frame starts with `B` of `BYPC`.
pub const TLS_HANDSHAKE_BYTE: u8 = 0x16;

/// Which end of the control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The side that connects (a [`Channel`](crate::Channel)).
    Client,
    /// The side that listens (a [`Server`](crate::Server)).
    Server,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Client => "client",
            Role::Server => "server",
        })
    }
}

/// What was wrong with a certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CertProblem {
    /// Its chain does not lead to a CA of the bundle (wrong CA, or self-signed).
    UnknownCa,
    /// Past its `notAfter`. (A peer's alert says only "expired" for not-yet-valid ones too.)
    Expired,
    /// Before its `notBefore`.
    NotYetValid,
    /// Listed as revoked in a CRL.
    Revoked,
    /// A CRL was given, but none covers it (see [`TlsConfigBuilder::crl`]).
    RevocationUnknown,
    /// Not issued for the name or address the client connected to
    /// ([`TlsConfigBuilder::server_name`]).
    WrongName,
    /// None was presented (a client without a certificate; the server requires one).
    Missing,
    /// The verify hook ([`TlsConfigBuilder::verify_peer`]) refused it, for this reason.
    RefusedByHook(String),
    /// Something else (bad signature, unsupported algorithm, bad encoding, ...).
    Other(String),
}

impl fmt::Display for CertProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertProblem::UnknownCa => f.write_str("it is not signed by a trusted CA (unknown CA)"),
            CertProblem::Expired => f.write_str("it has expired"),
            CertProblem::NotYetValid => f.write_str("it is not valid yet"),
            CertProblem::Revoked => f.write_str("it has been revoked (listed in a CRL)"),
            CertProblem::RevocationUnknown => {
                f.write_str("its revocation status is unknown (no CRL given covers its issuer)")
            }
            CertProblem::WrongName => f.write_str("it is not valid for the server's name or address"),
            CertProblem::Missing => f.write_str("none was presented (a client certificate is required)"),
            CertProblem::RefusedByHook(reason) => write!(f, "the verify hook refused it: {reason}"),
            CertProblem::Other(text) => f.write_str(text),
        }
    }
}

/// Everything TLS can fail with. It never contains key material or a passphrase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The TLS material could not be loaded or does not fit together (a missing or unreadable
    /// file, no certificate in it, a wrong passphrase, a key that does not match the
    /// certificate, ...), or this build has no TLS support. The text names the file or field.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// (Client) The server requires TLS, and this client connected without it.
    #[error("the server requires TLS, but this client connected without it (set ChannelConfig.tls)")]
    ServerRequiresTls,
    /// (Server) A client connected without TLS to this server, which requires it.
    #[error(
        "a client connected without TLS, but this server requires TLS (the client needs ChannelConfig.tls)"
    )]
    PlaintextClient,
    /// (Client) This client connected with TLS to a server that does not use TLS (it answered
    /// with a plaintext control frame).
    #[error("this client connected with TLS, but the server does not use TLS (it answered in plaintext; set ServerConfig.tls or connect without ChannelConfig.tls)")]
    ServerWithoutTls,
    /// (Server) A client opened a TLS handshake, but this server does not use TLS.
    #[error("a client connected with TLS, but this server does not use TLS (set ServerConfig.tls, or the client connects without ChannelConfig.tls)")]
    TlsClient,
    /// This side refused the peer's certificate.
    #[error("the {peer}'s certificate was refused: {problem}")]
    PeerCertificate {
        /// Whose certificate it was.
        peer: Role,
        /// Why it was refused.
        problem: CertProblem,
    },
    /// The peer refused this side's certificate (it said so with a TLS alert).
    #[error("the {peer} refused this side's certificate: {problem}")]
    RefusedByPeer {
        /// Who refused it.
        peer: Role,
        /// The reason its alert gave.
        problem: CertProblem,
    },
    /// The TLS handshake (or a later TLS record) failed for another reason.
    #[error("TLS with the {peer} failed: {detail}")]
    Handshake {
        /// The other side.
        peer: Role,
        /// What went wrong.
        detail: String,
    },
}

/// Where PEM text comes from: a file (read by [`TlsConfigBuilder::build`]), or bytes in memory
/// (wiped when dropped, as they may hold a private key).
#[derive(Clone)]
pub enum PemSource {
    /// A PEM file.
    File(PathBuf),
    /// PEM text.
    Pem(Zeroizing<Vec<u8>>),
}

impl PemSource {
    /// A PEM file.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        PemSource::File(path.into())
    }

    /// PEM text in memory.
    pub fn pem(bytes: impl Into<Vec<u8>>) -> Self {
        PemSource::Pem(Zeroizing::new(bytes.into()))
    }

    /// How errors name it: the path, or "PEM given in memory".
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    fn describe(&self, what: &str) -> String {
        match self {
            PemSource::File(path) => format!("{what} file {}", path.display()),
            PemSource::Pem(_) => format!("{what} (PEM given in memory)"),
        }
    }
}

impl fmt::Debug for PemSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PemSource::File(path) => f.debug_tuple("File").field(path).finish(),
            PemSource::Pem(bytes) => write!(f, "Pem(<{} bytes>)", bytes.len()),
        }
    }
}

/// The passphrase of an encrypted private key. Its bytes are wiped when it is dropped, and it
/// never appears in `Debug` output or errors.
///
/// An *erase hook* ([`Passphrase::with_erase`]) runs exactly once, when the passphrase is
/// dropped: [`TlsConfigBuilder::build`] drops it as soon as it has decrypted the key (or failed
/// to), so the hook is the moment to wipe the application's own copy — the C API's erase
/// function.
pub struct Passphrase {
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    bytes: Zeroizing<Vec<u8>>,
    erase: Option<Box<dyn FnOnce() + Send>>,
}

impl Passphrase {
    /// A passphrase (its bytes are moved in, not copied).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Passphrase { bytes: Zeroizing::new(bytes.into()), erase: None }
    }

    /// Runs `erase` when the passphrase is dropped (once).
    pub fn with_erase(mut self, erase: impl FnOnce() + Send + 'static) -> Self {
        self.erase = Some(Box::new(erase));
        self
    }

    #[cfg(feature = "tls")]
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Passphrase {
    fn drop(&mut self) {
        if let Some(erase) = self.erase.take() {
            // A panicking hook must not turn a drop into an abort.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(erase));
        }
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passphrase(<redacted>)")
    }
}

/// The peer's certificates as the verify hook ([`TlsConfigBuilder::verify_peer`]) sees them,
/// after rustls has verified them.
#[derive(Debug, Clone, Copy)]
pub struct PeerChain<'a> {
    /// Whose certificates these are: [`Role::Server`] on a client, [`Role::Client`] on a server.
    pub peer: Role,
    /// The end-entity certificate (DER).
    pub end_entity: &'a [u8],
    /// The intermediate certificates the peer sent (DER), in its order.
    pub intermediates: &'a [&'a [u8]],
}

/// A verify hook: `Ok` accepts the peer, `Err(reason)` refuses it.
pub type VerifyHook = std::sync::Arc<dyn Fn(&PeerChain<'_>) -> Result<(), String> + Send + Sync>;

/// Collects the TLS material; [`build`](TlsConfigBuilder::build) loads and checks it.
#[derive(Default)]
pub struct TlsConfigBuilder {
    ca: Vec<PemSource>,
    chain: Option<PemSource>,
    key: Option<PemSource>,
    passphrase: Option<Passphrase>,
    crls: Vec<PemSource>,
    server_name: Option<String>,
    verify: Option<VerifyHook>,
}

impl fmt::Debug for TlsConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfigBuilder")
            .field("ca", &self.ca)
            .field("chain", &self.chain)
            .field("key", &self.key)
            .field("passphrase", &self.passphrase)
            .field("crls", &self.crls)
            .field("server_name", &self.server_name)
            .field("verify", &self.verify.as_ref().map(|_| "<hook>"))
            .finish()
    }
}

impl TlsConfigBuilder {
    /// A CA bundle (one or more certificates) the peer's chain must lead to. May be given
    /// several times; at least once.
    pub fn ca(mut self, source: PemSource) -> Self {
        self.ca.push(source);
        self
    }

    /// This side's certificate chain, leaf first. Required for a server; a client without one
    /// is refused by every server (it has no certificate to present).
    pub fn cert_chain(mut self, source: PemSource) -> Self {
        self.chain = Some(source);
        self
    }

    /// The private key of the certificate, unencrypted (PKCS#8, PKCS#1 RSA or SEC1 EC PEM).
    pub fn private_key(mut self, source: PemSource) -> Self {
        self.key = Some(source);
        self.passphrase = None;
        self
    }

    /// The private key of the certificate as an encrypted PKCS#8 PEM
    /// (`-----BEGIN ENCRYPTED PRIVATE KEY-----`, PBES2: PBKDF2-HMAC-SHA256 or scrypt with
    /// AES-CBC, as `openssl pkcs8 -topk8 -v2 aes-256-cbc` writes), and its passphrase.
    pub fn encrypted_private_key(mut self, source: PemSource, passphrase: Passphrase) -> Self {
        self.key = Some(source);
        self.passphrase = Some(passphrase);
        self
    }

    /// A certificate revocation list (PEM, `-----BEGIN X509 CRL-----`); may be given several
    /// times. With CRLs, the peer's end-entity certificate is refused when a CRL of its issuer
    /// lists it ([`CertProblem::Revoked`]), and also when no CRL of its issuer was given
    /// ([`CertProblem::RevocationUnknown`]) — as OpenSSL's `X509_V_FLAG_CRL_CHECK` does.
    /// Intermediate certificates are not checked against CRLs.
    pub fn crl(mut self, source: PemSource) -> Self {
        self.crls.push(source);
        self
    }

    /// (Client) The DNS name or IP address the server's certificate must be issued for. Without
    /// it, the certificate must name the IP address the client connected to.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// An extra check of the peer, after rustls has verified its chain (CA, validity period,
    /// CRLs, and on a client the server's name): `hook` gets the peer's certificates in DER and
    /// may refuse them with a reason, which both sides then see
    /// ([`CertProblem::RefusedByHook`] here; the peer hears "bad certificate"). It runs on the
    /// connecting thread (client) or the server's control loop (server): keep it short. This is
    /// what the C API's verify callback will be given, instead of OpenSSL's `X509_STORE_CTX`.
    pub fn verify_peer(
        mut self,
        hook: impl Fn(&PeerChain<'_>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.verify = Some(std::sync::Arc::new(hook));
        self
    }

    /// Reads and checks everything: the CA bundle parses and holds at least one certificate, the
    /// chain and key go together (both or neither; the key decrypts with the passphrase, and
    /// belongs to the leaf certificate), the CRLs parse, the server name is valid. The
    /// passphrase is dropped (and its erase hook run) before this returns, success or not.
    pub fn build(self) -> Result<TlsConfig, TlsError> {
        #[cfg(feature = "tls")]
        {
            imp::build(self)
        }
        #[cfg(not(feature = "tls"))]
        {
            drop(self);
            Err(TlsError::Config(
                "this build of bypass has no TLS support (enable the crate feature `tls`)".into(),
            ))
        }
    }
}

/// Loaded, checked TLS material for a [`Channel`](crate::Channel) or a
/// [`Server`](crate::Server) (cheap to clone; the key is held by rustls, and never shown by
/// `Debug`).
#[derive(Clone)]
pub struct TlsConfig {
    #[cfg(feature = "tls")]
    inner: std::sync::Arc<imp::Material>,
    #[cfg(not(feature = "tls"))]
    never: std::convert::Infallible,
}

impl TlsConfig {
    /// An empty builder.
    pub fn builder() -> TlsConfigBuilder {
        TlsConfigBuilder::default()
    }

    /// Whether this side has a certificate and key to present (a server must).
    pub fn has_identity(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.inner.identity
        }
        #[cfg(not(feature = "tls"))]
        {
            match self.never {}
        }
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "tls")]
        {
            f.debug_struct("TlsConfig")
                .field("ca_certs", &self.inner.ca_count)
                .field("identity", &self.inner.identity)
                .field("crls", &self.inner.crl_count)
                .field("server_name", &self.inner.server_name)
                .field("private_key", &"<redacted>")
                .finish()
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = f;
            match self.never {}
        }
    }
}

/// One TLS refusal a server saw (see [`Server::tls_refusals`](crate::Server::tls_refusals)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsRefusal {
    /// The client's address, if known.
    pub peer: Option<SocketAddr>,
    /// Why.
    pub error: TlsError,
}

/// How many refusals a server keeps.
#[cfg(not(loom))]
const KEPT_REFUSALS: usize = 64;

/// A server's recent TLS refusals, and their count; each is also reported on stderr (the
/// first 16, then every power of two).
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    recent: std::sync::Mutex<(u64, std::collections::VecDeque<TlsRefusal>)>,
}

#[cfg(not(loom))]
impl RefusalLog {
    pub(crate) fn record(&self, peer: Option<SocketAddr>, error: TlsError) {
        let mut guard = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let (count, recent) = &mut *guard;
        *count += 1;
        if *count <= 16 || count.is_power_of_two() {
            let from = peer.map(|p| format!(" from {p}")).unwrap_or_default();
            eprintln!("bypass: refused a control connection{from}: {error} ({count} TLS refusals so far)");
        }
        if recent.len() == KEPT_REFUSALS {
            recent.pop_front();
        }
        recent.push_back(TlsRefusal { peer, error });
    }

    pub(crate) fn recent(&self) -> Vec<TlsRefusal> {
        let guard = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        guard.1.iter().cloned().collect()
    }
}

/// Maps a failed I/O on a TLS stream to an error carrying a [`TlsError`] (the control plane
/// turns that into [`ControlError::Tls`](crate::control::ControlError::Tls)); other errors
/// pass through.
#[cfg(feature = "tls")]
pub(crate) fn wrap_io(err: std::io::Error, peer: Role) -> std::io::Error {
    let tls = err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(|e| imp::from_rustls(e, peer));
    match tls {
        Some(tls) => std::io::Error::new(std::io::ErrorKind::InvalidData, tls),
        None => err,
    }
}

#[cfg(feature = "tls")]
pub(crate) use imp::{client_connection, server_connection};

#[cfg(feature = "tls")]
mod imp {
    use super::*;
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{
        CertificateDer, CertificateRevocationListDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName,
    };
    use rustls::server::WebPkiClientVerifier;
    use rustls::{AlertDescription, CertificateError, RootCertStore};
    use std::sync::Arc;

    pub(crate) struct Material {
        pub(super) ca_count: usize,
        pub(super) crl_count: usize,
        pub(super) identity: bool,
        pub(super) server_name: Option<String>,
        client: Arc<rustls::ClientConfig>,
        server: Option<Arc<rustls::ServerConfig>>,
    }

    fn config_err(text: impl Into<String>) -> TlsError {
        TlsError::Config(text.into())
    }

    fn read(source: &PemSource, what: &str) -> Result<Zeroizing<Vec<u8>>, TlsError> {
        match source {
            PemSource::Pem(bytes) => Ok(bytes.clone()),
            PemSource::File(path) => std::fs::read(path)
                .map(Zeroizing::new)
                .map_err(|e| config_err(format!("cannot read the {}: {e}", source.describe(what)))),
        }
    }

    fn certs(source: &PemSource, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let bytes = read(source, what)?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| config_err(format!("the {} does not parse as PEM: {e}", source.describe(what))))?;
        if certs.is_empty() {
            return Err(config_err(format!(
                "the {} holds no certificate (-----BEGIN CERTIFICATE-----)",
                source.describe(what)
            )));
        }
        Ok(certs)
    }

    const ENC_BEGIN: &str = "-----BEGIN ENCRYPTED PRIVATE KEY-----";
    const ENC_END: &str = "-----END ENCRYPTED PRIVATE KEY-----";

    fn key(source: &PemSource, passphrase: Option<&Passphrase>) -> Result<PrivateKeyDer<'static>, TlsError> {
        let what = "private key";
        let bytes = read(source, what)?;
        let text = std::str::from_utf8(&bytes).ok();
        let encrypted = text.and_then(|t| {
            let start = t.find(ENC_BEGIN)?;
            let end = t[start..].find(ENC_END)? + start + ENC_END.len();
            Some(&t[start..end])
        });
        if let Some(block) = encrypted {
            let Some(passphrase) = passphrase else {
                return Err(config_err(format!(
                    "the {} is encrypted: give its passphrase (TlsConfigBuilder::encrypted_private_key)",
                    source.describe(what)
                )));
            };
            let (_, doc) = pkcs8::der::Document::from_pem(block).map_err(|e| {
                config_err(format!(
                    "the {} does not parse as an encrypted PKCS#8 key: {e}",
                    source.describe(what)
                ))
            })?;
            let info = pkcs8::EncryptedPrivateKeyInfo::try_from(doc.as_bytes()).map_err(|e| {
                config_err(format!(
                    "the {} does not parse as an encrypted PKCS#8 key: {e}",
                    source.describe(what)
                ))
            })?;
            let wrong = || {
                config_err(format!(
                    "cannot decrypt the {}: wrong passphrase (or a corrupt key, or an unsupported cipher)",
                    source.describe(what)
                ))
            };
            let plain = info.decrypt(passphrase.bytes()).map_err(|_| wrong())?;
            // A wrong passphrase may still yield valid padding: the result must parse as a key.
            pkcs8::PrivateKeyInfo::try_from(plain.as_bytes()).map_err(|_| wrong())?;
            return Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(plain.as_bytes().to_vec())));
        }
        PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
            config_err(format!(
                "the {} holds no usable private key (PKCS#8, PKCS#1 RSA or SEC1 EC PEM): {e}",
                source.describe(what)
            ))
        })
    }

    fn crls(sources: &[PemSource]) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
        let mut out = Vec::new();
        for source in sources {
            let bytes = read(source, "CRL")?;
            let before = out.len();
            for crl in CertificateRevocationListDer::pem_slice_iter(&bytes) {
                out.push(crl.map_err(|e| {
                    config_err(format!("the {} does not parse as PEM: {e}", source.describe("CRL")))
                })?);
            }
            if out.len() == before {
                return Err(config_err(format!(
                    "the {} holds no CRL (-----BEGIN X509 CRL-----)",
                    source.describe("CRL")
                )));
            }
        }
        Ok(out)
    }

    pub(super) fn build(b: TlsConfigBuilder) -> Result<TlsConfig, TlsError> {
        let TlsConfigBuilder {
            ca,
            chain,
            key: key_source,
            passphrase,
            crls: crl_sources,
            server_name,
            verify,
        } = b;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        if ca.is_empty() {
            return Err(config_err("no CA bundle given (TlsConfigBuilder::ca): the peer cannot be verified"));
        }
        let mut roots = RootCertStore::empty();
        for source in &ca {
            for cert in certs(source, "CA bundle")? {
                roots.add(cert).map_err(|e| {
                    config_err(format!(
                        "the {} holds an unusable CA certificate: {e}",
                        source.describe("CA bundle")
                    ))
                })?;
            }
        }
        let ca_count = roots.len();
        let roots = Arc::new(roots);
        let identity = match (&chain, &key_source) {
            (Some(chain), Some(key_source)) => {
                let chain = certs(chain, "certificate chain")?;
                let key = key(key_source, passphrase.as_ref())?;
                Some((chain, key))
            }
            (None, None) => None,
            (Some(_), None) => {
                return Err(config_err(
                    "a certificate chain without its private key (TlsConfigBuilder::private_key)",
                ))
            }
            (None, Some(_)) => {
                return Err(config_err(
                    "a private key without its certificate chain (TlsConfigBuilder::cert_chain)",
                ))
            }
        };
        // The passphrase is done with: wipe it and run its erase hook now.
        drop(passphrase);
        let crls = crls(&crl_sources)?;
        if let Some(name) = &server_name {
            ServerName::try_from(name.clone()).map_err(|e| {
                config_err(format!("server name {name:?} is not a DNS name or IP address: {e}"))
            })?;
        }
        let verifier_err =
            |e: rustls::client::VerifierBuilderError| config_err(format!("CA bundle or CRL: {e}"));
        let identity_err = |e: rustls::Error| match e {
            rustls::Error::InconsistentKeys(_) => {
                config_err("the private key does not belong to the certificate chain's leaf certificate")
            }
            e => config_err(format!("the certificate chain or private key is unusable: {e}")),
        };

        let mut server_verifier =
            WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone());
        if !crls.is_empty() {
            server_verifier = server_verifier.with_crls(crls.clone()).only_check_end_entity_revocation();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| config_err(format!("TLS 1.3: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Hooked {
                inner: server_verifier.build().map_err(verifier_err)?,
                hook: verify.clone(),
            }));
        let mut client = match &identity {
            Some((chain, key)) => {
                builder.with_client_auth_cert(chain.clone(), key.clone_key()).map_err(identity_err)?
            }
            None => builder.with_no_client_auth(),
        };
        client.resumption = rustls::client::Resumption::disabled();

        let server = match identity {
            Some((chain, key)) => {
                let mut client_verifier =
                    WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
                if !crls.is_empty() {
                    client_verifier =
                        client_verifier.with_crls(crls.clone()).only_check_end_entity_revocation();
                }
                let mut server = rustls::ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map_err(|e| config_err(format!("TLS 1.3: {e}")))?
                    .with_client_cert_verifier(Arc::new(Hooked {
                        inner: client_verifier.build().map_err(verifier_err)?,
                        hook: verify,
                    }))
                    .with_single_cert(chain, key)
                    .map_err(identity_err)?;
                server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
                server.send_tls13_tickets = 0;
                Some(Arc::new(server))
            }
            None => None,
        };
        Ok(TlsConfig {
            inner: Arc::new(Material {
                ca_count,
                crl_count: crls.len(),
                identity: server.is_some(),
                server_name,
                client: Arc::new(client),
                server,
            }),
        })
    }

    /// A client connection to a server at `peer`, verified against the configured server name or
    /// else `peer`'s IP address.
    pub(crate) fn client_connection(
        tls: &TlsConfig,
        peer: SocketAddr,
    ) -> Result<rustls::ClientConnection, TlsError> {
        let name = match &tls.inner.server_name {
            // Checked by `build`.
            Some(name) => ServerName::try_from(name.clone()).map_err(|e| config_err(e.to_string()))?,
            None => ServerName::IpAddress(peer.ip().into()),
        };
        rustls::ClientConnection::new(tls.inner.client.clone(), name)
            .map_err(|e| TlsError::Handshake { peer: Role::Server, detail: e.to_string() })
    }

    /// A server connection (`None` if the config has no identity: a server needs one).
    pub(crate) fn server_connection(tls: &TlsConfig) -> Result<rustls::ServerConnection, TlsError> {
        let config = tls.inner.server.clone().ok_or_else(|| {
            config_err(
                "a TLS server needs a certificate chain and private key (TlsConfigBuilder::cert_chain)",
            )
        })?;
        rustls::ServerConnection::new(config)
            .map_err(|e| TlsError::Handshake { peer: Role::Client, detail: e.to_string() })
    }

    /// rustls's verifier, then the application's hook.
    struct Hooked<V: ?Sized> {
        inner: Arc<V>,
        hook: Option<VerifyHook>,
    }

    impl<V: ?Sized> fmt::Debug for Hooked<V> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Hooked").field("hook", &self.hook.is_some()).finish()
        }
    }

    /// A refusal by the hook, carried through rustls as a certificate error.
    #[derive(Debug)]
    struct HookRefusal(String);

    impl fmt::Display for HookRefusal {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for HookRefusal {}

    impl<V: ?Sized> Hooked<V> {
        fn check(
            &self,
            peer: Role,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
        ) -> Result<(), rustls::Error> {
            let Some(hook) = &self.hook else { return Ok(()) };
            let intermediates: Vec<&[u8]> = intermediates.iter().map(|c| c.as_ref()).collect();
            let chain = PeerChain { peer, end_entity: end_entity.as_ref(), intermediates: &intermediates };
            let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&chain)))
                .unwrap_or_else(|_| Err("the verify hook panicked".into()));
            verdict.map_err(|reason| {
                rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
                    HookRefusal(reason),
                ))))
            })
        }
    }

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::UnixTime;
    use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
    use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

    impl ServerCertVerifier for Hooked<WebPkiServerVerifier> {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            let verified =
                self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
            self.check(Role::Server, end_entity, intermediates)?;
            Ok(verified)
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    }

    impl ClientCertVerifier for Hooked<dyn ClientCertVerifier> {
        fn offer_client_auth(&self) -> bool {
            true
        }

        fn client_auth_mandatory(&self) -> bool {
            true
        }

        fn root_hint_subjects(&self) -> &[DistinguishedName] {
            self.inner.root_hint_subjects()
        }

        fn verify_client_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            now: UnixTime,
        ) -> Result<ClientCertVerified, rustls::Error> {
            let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
            self.check(Role::Client, end_entity, intermediates)?;
            Ok(verified)
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    }

    fn problem_of(e: &CertificateError) -> CertProblem {
        match e {
            CertificateError::Other(other) if other.0.downcast_ref::<HookRefusal>().is_some() => {
                CertProblem::RefusedByHook(other.0.to_string())
            }
            CertificateError::UnknownIssuer => CertProblem::UnknownCa,
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => CertProblem::Expired,
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                CertProblem::NotYetValid
            }
            CertificateError::Revoked => CertProblem::Revoked,
            CertificateError::UnknownRevocationStatus => CertProblem::RevocationUnknown,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                CertProblem::WrongName
            }
            other => CertProblem::Other(other.to_string()),
        }
    }

    /// What `peer`'s alert or our own check means.
    pub(crate) fn from_rustls(e: &rustls::Error, peer: Role) -> TlsError {
        match e {
            rustls::Error::InvalidCertificate(c) => {
                TlsError::PeerCertificate { peer, problem: problem_of(c) }
            }
            rustls::Error::NoCertificatesPresented => {
                TlsError::PeerCertificate { peer, problem: CertProblem::Missing }
            }
            rustls::Error::AlertReceived(alert) => {
                let problem = match alert {
                    AlertDescription::UnknownCA => CertProblem::UnknownCa,
                    AlertDescription::CertificateExpired => CertProblem::Expired,
                    AlertDescription::CertificateRevoked => CertProblem::Revoked,
                    AlertDescription::CertificateRequired => CertProblem::Missing,
                    AlertDescription::BadCertificate
                    | AlertDescription::UnsupportedCertificate
                    | AlertDescription::CertificateUnknown
                    | AlertDescription::BadCertificateStatusResponse => {
                        CertProblem::Other(format!("the {peer} sent the TLS alert {alert:?}"))
                    }
                    other => {
                        return TlsError::Handshake {
                            peer,
                            detail: format!("the {peer} sent the TLS alert {other:?}"),
                        }
                    }
                };
                TlsError::RefusedByPeer { peer, problem }
            }
            other => TlsError::Handshake { peer, detail: other.to_string() },
        }
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_out_of_debug() {
        let p = Passphrase::new(b"hunter2".to_vec());
        assert_eq!(format!("{p:?}"), "Passphrase(<redacted>)");
        let s = PemSource::pem(b"-----BEGIN PRIVATE KEY-----\nsecret".to_vec());
        assert!(!format!("{s:?}").contains("secret"));
        let b = TlsConfig::builder().encrypted_private_key(s, p);
        let text = format!("{b:?}");
        assert!(!text.contains("hunter2") && !text.contains("secret"), "{text}");
    }

    #[test]
    fn erase_hook_runs_once_on_drop() {
        let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = n.clone();
        let p = Passphrase::new(b"x".to_vec()).with_erase(move || {
            m.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        // build fails (no CA), but the passphrase is dropped and erased all the same.
        let err = TlsConfig::builder().encrypted_private_key(PemSource::pem(b"".to_vec()), p).build();
        assert!(matches!(err, Err(TlsError::Config(_))));
        assert_eq!(n.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn missing_files_are_named() {
        let err = TlsConfig::builder().ca(PemSource::file("/no/such/ca.pem")).build().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/no/such/ca.pem") && text.contains("CA bundle"), "{text}");
    }
}
