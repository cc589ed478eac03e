//! Mutual TLS 1.3 on the control plane: a CA, a server certificate and a client certificate
//! (its key encrypted with a passphrase) are generated into a temporary directory, loaded from
//! the files as an application (or the C API's TLS callbacks) would hand them over, and used
//! for a server and a channel. Then a plaintext client is shown the door.
//!
//! ```text
//! cargo run -p bypass --example tls
//! ```

use bypass::tls::{Passphrase, PemSource, TlsConfig};
use bypass::{Channel, ChannelConfig, FunctionId, Functions, Server, ServerConfig};
use bypass_sim::{Engine, Fabric};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use std::path::Path;

const ECHO: FunctionId = match FunctionId::new(0x100, 1, true, 1) {
    Some(f) => f,
    None => panic!("bad function id"),
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("bypass-tls-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let passphrase = b"example passphrase".to_vec();
    make_pki(&dir, &passphrase)?;

    // The server: CA bundle, its chain, its (plain) key. It requires a client certificate.
    let server_tls = TlsConfig::builder()
        .ca(PemSource::file(dir.join("ca.pem")))
        .cert_chain(PemSource::file(dir.join("server.pem")))
        .private_key(PemSource::file(dir.join("server.key")))
        .build()?;
    // The client: its key is encrypted; the erase hook runs once the key is decrypted.
    let client_tls = TlsConfig::builder()
        .ca(PemSource::file(dir.join("ca.pem")))
        .cert_chain(PemSource::file(dir.join("client.pem")))
        .encrypted_private_key(
            PemSource::file(dir.join("client.key")),
            Passphrase::new(passphrase).with_erase(|| println!("passphrase used and wiped")),
        )
        .build()?;
    std::fs::remove_dir_all(&dir)?;
    println!("server {server_tls:?}\nclient {client_tls:?}");

    let fabric = Fabric::new(Engine::Inline);
    let (server_nic, client_nic) = (fabric.add_nic(), fabric.add_nic());
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        let bytes = req.args().to_vec();
        let _ = req.reply(&bytes);
    });
    let config = ServerConfig { tls: Some(server_tls), ..ServerConfig::new("demo") };
    let server = Server::bind(&server_nic, "127.0.0.1:0", config, functions)?;

    let config = ChannelConfig { tls: Some(client_tls), ..ChannelConfig::new("demo") };
    let channel = Channel::connect(&client_nic, server.local_addr(), config)?;
    let mut response = Vec::new();
    channel.call(ECHO, b"hello over a TLS-negotiated channel", &mut response)?;
    println!("response: {}", String::from_utf8_lossy(&response));

    // A client without TLS is refused, and both sides say why.
    match Channel::connect(&client_nic, server.local_addr(), ChannelConfig::new("demo")) {
        Err(e) => println!("plaintext client: {e}"),
        Ok(_) => return Err("a plaintext client got in".into()),
    }
    // The server records its side once its answer is out, which may be just after we read it.
    let start = std::time::Instant::now();
    while server.tls_refusals().is_empty() && start.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::yield_now();
    }
    for refusal in server.tls_refusals() {
        println!("server refused {:?}: {}", refusal.peer, refusal.error);
    }
    Ok(())
}

/// A CA, and a server and a client certificate for localhost / 127.0.0.1 signed by it; the
/// client's key encrypted (PKCS#8, PBKDF2-SHA256 + AES-256-CBC) with `passphrase`.
fn make_pki(dir: &Path, passphrase: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "bypass example CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    for name in ["server", "client"] {
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate()?;
        std::fs::write(dir.join(format!("{name}.pem")), params.signed_by(&key, &ca)?.pem())?;
        let key_pem = if name == "client" {
            let info = pkcs8::PrivateKeyInfo::try_from(key.serialized_der())?;
            let salt: [u8; 16] =
                std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ std::process::id() as u8);
            let params = pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(100_000, &salt, &[9u8; 16])
                .map_err(|e| format!("PBES2 parameters: {e}"))?;
            info.encrypt_with_params(params, passphrase)?
                .to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF)?
                .to_string()
        } else {
            key.serialize_pem()
        };
        std::fs::write(dir.join(format!("{name}.key")), key_pem)?;
    }
    Ok(())
}
