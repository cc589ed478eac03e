//! TLS 1.3 on the control plane: mutual authentication with certificates generated here by
//! rcgen; every refusal (plaintext/TLS mismatch both ways, wrong CA, expired, revoked, missing
//! client certificate, wrong name) named on both sides; encrypted keys; no secret in `Debug`.
//!
//! Every wait is bounded ([`WAIT_LIMIT`]) and panics with what it saw; nothing sleeps.

use bypass::control::ControlError;
use bypass::sim::{Engine, Fabric, SimNic};
use bypass::tls::{CertProblem, Passphrase, PemSource, Role, TlsConfig, TlsConfigBuilder, TlsError};
use bypass::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber,
};
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::helpers;
use common::ids::ECHO;
use common::served::Served;
use helpers::{echo_functions, wait_for, WAIT_LIMIT};

const NAME: &str = "tls-test";
/// Longest any single wait may take before the test gives up.
const PASSPHRASE: &[u8] = b"correct horse battery staple";

// ---- certificates ----

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn leaf(&self, name: &str) -> Leaf {
        self.leaf_with(name, |_| {})
    }

    /// A leaf for `localhost` / 127.0.0.1, for client and server use; `edit` changes its params.
    fn leaf_with(&self, name: &str, edit: impl FnOnce(&mut CertificateParams)) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        edit(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf { cert: cert.pem(), key: key.serialize_pem(), key_der: key.serialize_der() }
    }

    /// A CRL that revokes the certificates with these serial numbers.
    fn crl(&self, revoked: &[u64]) -> String {
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2200, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|&n| RevokedCertParams {
                    serial_number: SerialNumber::from(n),
                    revocation_time: rcgen::date_time_ymd(2021, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params.signed_by(&self.issuer).unwrap().pem().unwrap()
    }
}

struct Leaf {
    cert: String,
    key: String,
    key_der: Vec<u8>,
}

impl Leaf {
    /// The key as an encrypted PKCS#8 PEM (PBKDF2-SHA256, AES-256-CBC), as `openssl pkcs8
    /// -topk8 -v2 aes-256-cbc` writes it.
    fn encrypted_key(&self, passphrase: &[u8]) -> String {
        let info = pkcs8::PrivateKeyInfo::try_from(self.key_der.as_slice()).unwrap();
        let params =
            pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(2048, b"saltsalt", &[7u8; 16]).unwrap();
        let doc = info.encrypt_with_params(params, passphrase).unwrap();
        let pem = doc.to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF).unwrap();
        pem.to_string()
    }
}

fn config(ca: &Ca, leaf: &Leaf) -> TlsConfig {
    TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert.clone()))
        .private_key(PemSource::pem(leaf.key.clone()))
        .build()
        .expect("TLS config")
}

// ---- servers and clients ----

/// The served fabric (Inline) with the server's TLS config.
struct Rig(Served);

impl std::ops::Deref for Rig {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl std::ops::DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut Served {
        &mut self.0
    }
}

fn rig(tls: Option<TlsConfig>) -> Rig {
    let config = ServerConfig { tls, ..ServerConfig::new(NAME) };
    Rig(Served::build(Fabric::new(Engine::Inline), config, |_| Ok(()), |_, events| events))
}

impl Rig {
    fn connect(&self, tls: Option<TlsConfig>) -> Result<Channel<SimNic>, RpcError> {
        let config =
            ChannelConfig { tls, connect_timeout: Duration::from_secs(20), ..ChannelConfig::new(NAME) };
        self.0.connect(config)
    }

    /// Waits (bounded) for the server's first TLS refusal.
    fn refusal(&self) -> TlsError {
        let start = Instant::now();
        loop {
            if let Some(r) = self.server.tls_refusals().into_iter().next() {
                assert!(r.peer.is_some_and(|p| p.ip().is_loopback()), "{r:?}");
                return r.error;
            }
            assert!(start.elapsed() < WAIT_LIMIT, "the server recorded no TLS refusal");
            std::thread::yield_now();
        }
    }
}

fn echo(channel: &Channel<SimNic>) {
    let mut rsp = Vec::new();
    channel.call(ECHO, b"over tls", &mut rsp).expect("call");
    assert_eq!(rsp, b"over tls");
}

fn tls_error(result: Result<Channel<SimNic>, RpcError>) -> TlsError {
    match result {
        Err(RpcError::Control(ControlError::Tls(e))) => e,
        Err(other) => panic!("expected a TLS error, got {other:?} ({other})"),
        Ok(_) => panic!("expected a TLS error, the channel connected"),
    }
}

// ---- success ----

#[test]
fn mutual_tls_calls_work_and_closure_is_seen_both_ways() {
    let ca = Ca::new("test CA");
    let rig = rig(Some(config(&ca, &ca.leaf("server"))));
    let client_tls = config(&ca, &ca.leaf("client"));

    let channel = rig.connect(Some(client_tls.clone())).expect("connect over TLS");
    echo(&channel);
    assert_eq!(rig.server.connections(), 1);
    // The client closes: the server sees its TLS stream end and closes the connection.
    drop(channel);
    wait_for("the server to see the client's close", || rig.server.connections() == 0);

    // The server goes away: the client's monitor sees the TLS stream end.
    let channel = rig.connect(Some(client_tls)).expect("connect again");
    echo(&channel);
    let mut rig = rig;
    rig.server.shutdown();
    wait_for("the channel to see the server's close", || channel.is_closed());
    assert!(rig.server.tls_refusals().is_empty());
}

#[test]
fn many_tls_clients_at_once() {
    let ca = Ca::new("test CA");
    let rig = rig(Some(config(&ca, &ca.leaf("server"))));
    let client_tls = config(&ca, &ca.leaf("client"));
    let rig = Arc::new(rig);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (rig, tls) = (rig.clone(), client_tls.clone());
            std::thread::spawn(move || {
                let channel = rig.connect(Some(tls)).expect("connect");
                echo(&channel);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn stalled_handshakes_do_not_block_a_tls_client() {
    let ca = Ca::new("test CA");
    let rig = rig(Some(config(&ca, &ca.leaf("server"))));
    // One connection that sends nothing, one that starts a TLS record and stalls, one that
    // starts a plaintext frame and stalls.
    let silent = TcpStream::connect(rig.server.local_addr()).unwrap();
    let mut tls_stall = TcpStream::connect(rig.server.local_addr()).unwrap();
    tls_stall.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let mut plain_stall = TcpStream::connect(rig.server.local_addr()).unwrap();
    plain_stall.write_all(b"BYPC").unwrap();
    let config = ChannelConfig {
        tls: Some(config(&ca, &ca.leaf("client"))),
        connect_timeout: Duration::from_secs(3),
        ..ChannelConfig::new(NAME)
    };
    let channel = Channel::connect(&rig.cnic, rig.server.local_addr(), config).expect("connect");
    echo(&channel);
    drop((silent, tls_stall, plain_stall));
}

#[test]
fn a_stalled_tls_handshake_ends_at_the_handshake_timeout() {
    use std::io::Read;
    let ca = Ca::new("test CA");
    let fabric = Fabric::new(Engine::Inline);
    let nic = fabric.add_nic();
    let config = ServerConfig {
        tls: Some(config(&ca, &ca.leaf("server"))),
        handshake_timeout: Duration::from_millis(200),
        ..ServerConfig::new(NAME)
    };
    let server = Server::bind(&nic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let mut stall = TcpStream::connect(server.local_addr()).unwrap();
    stall.write_all(&[0x16, 0x03, 0x01]).unwrap();
    wait_for("the stalled handshake to time out", || server.stats().handshake_timeouts == 1);
    // The server dropped it: the stream ends (no answer was sent).
    stall.set_read_timeout(Some(WAIT_LIMIT)).unwrap();
    let mut buf = [0u8; 16];
    match stall.read(&mut buf) {
        Ok(0) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        Ok(n) => panic!("the server sent {n} bytes to a stalled handshake"),
    }
}

#[test]
fn encrypted_key_with_the_right_passphrase() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf("server");
    let erased = Arc::new(AtomicUsize::new(0));
    let e = erased.clone();
    let server_tls = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert.clone()))
        .encrypted_private_key(
            PemSource::pem(leaf.encrypted_key(PASSPHRASE)),
            Passphrase::new(PASSPHRASE.to_vec()).with_erase(move || {
                e.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .build()
        .expect("the key decrypts");
    assert_eq!(erased.load(Ordering::SeqCst), 1, "the erase hook runs once, when build is done");

    // From files too, as the C API hands them over.
    let dir = std::env::temp_dir().join(format!("bypass-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = ca.leaf("client");
    let (ca_path, cert_path, key_path) = (dir.join("ca.pem"), dir.join("client.pem"), dir.join("client.key"));
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&cert_path, &client.cert).unwrap();
    std::fs::write(&key_path, client.encrypted_key(b"another")).unwrap();
    let client_tls = TlsConfig::builder()
        .ca(PemSource::file(&ca_path))
        .cert_chain(PemSource::file(&cert_path))
        .encrypted_private_key(PemSource::file(&key_path), Passphrase::new(b"another".to_vec()))
        .build()
        .expect("the key file decrypts");
    let _ = std::fs::remove_dir_all(&dir);

    let rig = rig(Some(server_tls));
    echo(&rig.connect(Some(client_tls)).expect("connect"));
}

#[test]
fn encrypted_key_with_a_wrong_or_missing_passphrase_is_refused_without_showing_it() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf("server");
    let erased = Arc::new(AtomicUsize::new(0));
    let e = erased.clone();
    let err = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert.clone()))
        .encrypted_private_key(
            PemSource::pem(leaf.encrypted_key(PASSPHRASE)),
            Passphrase::new(b"wrong horse".to_vec()).with_erase(move || {
                e.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .build()
        .unwrap_err();
    assert_eq!(erased.load(Ordering::SeqCst), 1, "the erase hook runs on failure too");
    let text = format!("{err} {err:?}");
    assert!(matches!(err, TlsError::Config(_)), "{text}");
    assert!(text.contains("wrong passphrase"), "{text}");
    assert!(!text.contains("wrong horse") && !text.contains("correct horse"), "{text}");

    let err = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert.clone()))
        .private_key(PemSource::pem(leaf.encrypted_key(PASSPHRASE)))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("encrypted: give its passphrase"), "{err}");
}

#[test]
fn no_secret_in_debug_output() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf("server");
    let tls = config(&ca, &leaf);
    let key_body: String = leaf.key.lines().nth(1).unwrap().to_string();
    let texts = [
        format!("{tls:?}"),
        format!("{:?}", ChannelConfig { tls: Some(tls.clone()), ..ChannelConfig::new(NAME) }),
        format!("{:?}", ServerConfig { tls: Some(tls), ..ServerConfig::new(NAME) }),
        format!("{:?}", TlsConfig::builder().private_key(PemSource::pem(leaf.key.clone()))),
        format!("{:?}", Passphrase::new(PASSPHRASE.to_vec())),
    ];
    for text in texts {
        assert!(!text.contains(&key_body), "{text}");
        assert!(!text.contains("correct horse"), "{text}");
    }
}

#[test]
fn a_key_of_another_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let (a, b) = (ca.leaf("a"), ca.leaf("b"));
    let err = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(a.cert))
        .private_key(PemSource::pem(b.key))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("does not belong"), "{err}");
}

#[test]
fn a_server_needs_a_certificate() {
    let ca = Ca::new("test CA");
    let tls = TlsConfig::builder().ca(PemSource::pem(ca.pem())).build().unwrap();
    let fabric = Fabric::new(Engine::Inline);
    let nic = fabric.add_nic();
    let config = ServerConfig { tls: Some(tls), ..ServerConfig::new(NAME) };
    match Server::bind(&nic, "127.0.0.1:0", config, echo_functions(ECHO)) {
        Err(RpcError::InvalidArgument(text)) => assert!(text.contains("ServerConfig.tls"), "{text}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

// ---- plaintext / TLS mismatch ----

#[test]
fn a_tls_server_refuses_a_plaintext_client() {
    let ca = Ca::new("test CA");
    let rig = rig(Some(config(&ca, &ca.leaf("server"))));
    let err = tls_error(rig.connect(None));
    assert_eq!(err, TlsError::ServerRequiresTls, "{err}");
    assert!(err.to_string().contains("requires TLS"), "{err}");
    assert_eq!(rig.refusal(), TlsError::PlaintextClient);
}

#[test]
fn a_plaintext_server_refuses_a_tls_client() {
    let ca = Ca::new("test CA");
    let rig = rig(None);
    let err = tls_error(rig.connect(Some(config(&ca, &ca.leaf("client")))));
    assert_eq!(err, TlsError::ServerWithoutTls, "{err}");
    assert!(err.to_string().contains("does not use TLS"), "{err}");
    assert_eq!(rig.refusal(), TlsError::TlsClient);
    // Plaintext clients still work.
    echo(&rig.connect(None).expect("plaintext connect"));
}

// ---- certificates refused, named on both sides ----

/// The client's certificate is refused by the server (`problem`), and the client hears it.
fn client_cert_refused(server_tls: TlsConfig, client_tls: TlsConfig, problem: CertProblem) {
    let rig = rig(Some(server_tls));
    let err = tls_error(rig.connect(Some(client_tls)));
    assert_eq!(err, TlsError::RefusedByPeer { peer: Role::Server, problem: problem.clone() }, "{err}");
    assert_eq!(rig.refusal(), TlsError::PeerCertificate { peer: Role::Client, problem });
    assert_eq!(rig.server.connections(), 0);
}

/// The server's certificate is refused by the client (`problem`), and the server hears it.
fn server_cert_refused(
    server_tls: TlsConfig,
    client_tls: TlsConfig,
    problem: CertProblem,
    alert: CertProblem,
) {
    let rig = rig(Some(server_tls));
    let err = tls_error(rig.connect(Some(client_tls)));
    assert_eq!(err, TlsError::PeerCertificate { peer: Role::Server, problem }, "{err}");
    assert_eq!(rig.refusal(), TlsError::RefusedByPeer { peer: Role::Client, problem: alert });
}

#[test]
fn a_client_certificate_of_another_ca_is_refused() {
    let (ca, other) = (Ca::new("test CA"), Ca::new("other CA"));
    let client = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(other.leaf("client").cert))
        .private_key(PemSource::pem(other.leaf_with("client", |_| {}).key))
        .build();
    // (a key of another certificate is refused by build; use a matching pair)
    assert!(client.is_err());
    let leaf = other.leaf("client");
    let client = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert.clone()))
        .private_key(PemSource::pem(leaf.key.clone()))
        .build()
        .unwrap();
    let err_text =
        format!("{}", TlsError::PeerCertificate { peer: Role::Client, problem: CertProblem::UnknownCa });
    assert!(err_text.contains("unknown CA"), "{err_text}");
    client_cert_refused(config(&ca, &ca.leaf("server")), client, CertProblem::UnknownCa);
}

#[test]
fn a_server_certificate_of_another_ca_is_refused() {
    let (ca, other) = (Ca::new("test CA"), Ca::new("other CA"));
    let server = other.leaf("server");
    let server_tls = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(server.cert))
        .private_key(PemSource::pem(server.key))
        .build()
        .unwrap();
    server_cert_refused(
        server_tls,
        config(&ca, &ca.leaf("client")),
        CertProblem::UnknownCa,
        CertProblem::UnknownCa,
    );
}

fn expired(params: &mut CertificateParams) {
    params.not_before = rcgen::date_time_ymd(2001, 1, 1);
    params.not_after = rcgen::date_time_ymd(2002, 1, 1);
}

#[test]
fn an_expired_client_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let client = config(&ca, &ca.leaf_with("client", expired));
    client_cert_refused(config(&ca, &ca.leaf("server")), client, CertProblem::Expired);
}

#[test]
fn an_expired_server_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let server = config(&ca, &ca.leaf_with("server", expired));
    server_cert_refused(server, config(&ca, &ca.leaf("client")), CertProblem::Expired, CertProblem::Expired);
}

#[test]
fn a_revoked_client_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let server = ca.leaf("server");
    let server_tls = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(server.cert))
        .private_key(PemSource::pem(server.key))
        .crl(PemSource::pem(ca.crl(&[0x5eed])))
        .build()
        .unwrap();
    let revoked = ca.leaf_with("client", |p| p.serial_number = Some(SerialNumber::from(0x5eedu64)));
    client_cert_refused(server_tls.clone(), config(&ca, &revoked), CertProblem::Revoked);

    // A certificate the CRL does not list still gets in.
    let fine = ca.leaf_with("client", |p| p.serial_number = Some(SerialNumber::from(0x600du64)));
    let rig = rig(Some(server_tls));
    echo(&rig.connect(Some(config(&ca, &fine))).expect("an unrevoked certificate"));
}

#[test]
fn a_revoked_server_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let server = ca.leaf_with("server", |p| p.serial_number = Some(SerialNumber::from(77u64)));
    let client = ca.leaf("client");
    let client_tls = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(client.cert))
        .private_key(PemSource::pem(client.key))
        .crl(PemSource::pem(ca.crl(&[77])))
        .build()
        .unwrap();
    server_cert_refused(config(&ca, &server), client_tls, CertProblem::Revoked, CertProblem::Revoked);
}

#[test]
fn a_client_without_a_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let anonymous = TlsConfig::builder().ca(PemSource::pem(ca.pem())).build().unwrap();
    assert!(!anonymous.has_identity());
    client_cert_refused(config(&ca, &ca.leaf("server")), anonymous, CertProblem::Missing);
}

#[test]
fn a_server_certificate_for_another_name_is_refused() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf("client");
    let client_tls = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert))
        .private_key(PemSource::pem(leaf.key))
        .server_name("db.example.com")
        .build()
        .unwrap();
    let rig = rig(Some(config(&ca, &ca.leaf("server"))));
    let err = tls_error(rig.connect(Some(client_tls)));
    assert_eq!(
        err,
        TlsError::PeerCertificate { peer: Role::Server, problem: CertProblem::WrongName },
        "{err}"
    );

    // The name it was issued for works.
    let leaf = ca.leaf("client");
    let client_tls = TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert))
        .private_key(PemSource::pem(leaf.key))
        .server_name("localhost")
        .build()
        .unwrap();
    echo(&rig.connect(Some(client_tls)).expect("connect by name"));
    drop(rig.snic.clone());
}

// ---- the verify hook (what the C API's verify callback will get) ----

fn builder(ca: &Ca, leaf: &Leaf) -> TlsConfigBuilder {
    TlsConfig::builder()
        .ca(PemSource::pem(ca.pem()))
        .cert_chain(PemSource::pem(leaf.cert.clone()))
        .private_key(PemSource::pem(leaf.key.clone()))
}

/// The DER of a one-certificate PEM.
fn der_of(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64_decode(&body)
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn the_verify_hook_sees_the_verified_peer_chain_and_may_refuse() {
    let ca = Ca::new("test CA");
    let (server_leaf, client_leaf) = (ca.leaf("server"), ca.leaf("client"));
    let client_der = der_of(&client_leaf.cert);
    let server_der = der_of(&server_leaf.cert);
    let seen = Arc::new(AtomicUsize::new(0));

    // Both hooks accept, after checking what they got.
    let s = seen.clone();
    let server_tls = builder(&ca, &server_leaf)
        .verify_peer(move |chain| {
            assert_eq!(chain.peer, Role::Client);
            assert_eq!(chain.end_entity, client_der.as_slice());
            s.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .build()
        .unwrap();
    let s = seen.clone();
    let client_tls = builder(&ca, &client_leaf)
        .verify_peer(move |chain| {
            assert_eq!(chain.peer, Role::Server);
            assert_eq!(chain.end_entity, server_der.as_slice());
            assert!(chain.intermediates.is_empty());
            s.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .build()
        .unwrap();
    let rig = rig(Some(server_tls));
    echo(&rig.connect(Some(client_tls.clone())).expect("both hooks accept"));
    assert_eq!(seen.load(Ordering::SeqCst), 2);

    // The server's hook refuses: named with its reason there, a bad certificate here.
    let refusing =
        builder(&ca, &server_leaf).verify_peer(|_| Err("not on the allow list".into())).build().unwrap();
    let rig = rig_with(refusing);
    let err = tls_error(rig.connect(Some(client_tls)));
    assert!(
        matches!(err, TlsError::RefusedByPeer { peer: Role::Server, problem: CertProblem::Other(_) }),
        "{err}"
    );
    assert_eq!(
        rig.refusal(),
        TlsError::PeerCertificate {
            peer: Role::Client,
            problem: CertProblem::RefusedByHook("not on the allow list".into())
        }
    );

    // The client's hook refuses the server (a panicking hook refuses too).
    let panicking = builder(&ca, &client_leaf).verify_peer(|_| panic!("hook bug")).build().unwrap();
    let rig = rig_with(config(&ca, &server_leaf));
    let err = tls_error(rig.connect(Some(panicking)));
    assert_eq!(
        err,
        TlsError::PeerCertificate {
            peer: Role::Server,
            problem: CertProblem::RefusedByHook("the verify hook panicked".into())
        }
    );
}

fn rig_with(tls: TlsConfig) -> Rig {
    rig(Some(tls))
}

// ---- the control stream after the handshake ----

/// Queue recovery exchanges QueueInfos on the control stream after the handshake: over TLS it
/// goes through the same session, and keepalive probes (on the data path) keep the channel up.
#[test]
fn queue_recovery_runs_over_the_tls_stream() {
    let ca = Ca::new("test CA");
    let rig = rig(Some(config(&ca, &ca.leaf("server"))));
    let mut cfg = ChannelConfig {
        tls: Some(config(&ca, &ca.leaf("client"))),
        connect_timeout: Duration::from_secs(20),
        ..ChannelConfig::new(NAME)
    };
    cfg.keepalive = Some(bypass::Keepalive { interval: Duration::from_millis(50), misses: 40 });
    let channel = Channel::connect(&rig.cnic, rig.server.local_addr(), cfg).expect("connect over TLS");
    echo(&channel);
    for round in 1..=2u64 {
        channel.fail_queue(0).expect("fail queue 0");
        wait_for("the queue to be recovered over TLS", || {
            let s = channel.stats();
            s.recoveries >= round && s.ready_queues == channel.queues()
        });
        echo(&channel);
    }
    assert!(!channel.is_closed());
    assert_eq!(rig.server.connections(), 1);
}
