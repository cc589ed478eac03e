//! TLS from C: certificates generated here (rcgen), handed to `tests/c/tls.c` as files; the
//! key is encrypted, so the passphrase callback and its erase function are exercised.

mod c_harness;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `target/<profile>`: where the compiled C programs go (the test binary is in its `deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// The directory holding `libhcom4db.so`: `target/<profile>/deps/` when cargo built the cdylib
/// as a dependency of these tests (a plain `cargo test` leaves it there), else `target/<profile>/`
/// (after a `cargo build`).
fn lib_dir() -> PathBuf {
    let profile = profile_dir();
    let deps = profile.join("deps");
    let dir = if deps.join("libhcom4db.so").exists() { deps } else { profile };
    assert!(
        dir.join("libhcom4db.so").exists(),
        "libhcom4db.so is in neither {0}/deps nor {0} (run through cargo test -p bypass-capi)",
        dir.display()
    );
    dir
}

#[test]
fn tls_through_the_three_callbacks() {
    let dir = profile_dir().join("capi-c-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, "capi test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "capi peer");
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let pass = b"capi passphrase";
    let der = key.serialize_der();
    let info = pkcs8::PrivateKeyInfo::try_from(der.as_slice()).unwrap();
    let p = pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(2048, b"saltsalt", &[7u8; 16]).unwrap();
    let enc = info.encrypt_with_params(p, pass).unwrap();
    let enc = enc.to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF).unwrap();
    let tag = std::process::id();
    let (ca_path, cert_path, key_path) = (
        dir.join(format!("ca-{tag}.pem")),
        dir.join(format!("cert-{tag}.pem")),
        dir.join(format!("key-{tag}.pem")),
    );
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, enc.as_bytes()).unwrap();

    let exe = dir.join("tls");
    let lib = lib_dir();
    let st = Command::new("cc")
        .args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g"])
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/tls.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lhcom4db", "-lpthread"])
        .status()
        .unwrap();
    assert!(st.success(), "compiling tls.c failed");
    // Under `CAPI_C_RUNNER` (valgrind in capi/tests/memcheck.sh) if set.
    let mut child = c_harness::command(&exe)
        .arg(&ca_path)
        .arg(&cert_path)
        .arg(&key_path)
        .arg(std::str::from_utf8(pass).unwrap())
        .env("BYPASS_CAPI_LOG_LEVEL", "4")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("tls.c did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    for p in [&ca_path, &cert_path, &key_path] {
        let _ = std::fs::remove_file(p);
    }
    assert!(out.status.success(), "tls.c failed: {}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("tls ok"));
}
