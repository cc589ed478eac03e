//! Links the cdylib as `liburma.so` with soname `liburma.so.0`, exporting only `urma_*`.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=liburma.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liburma.so.0");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/liburma.map");
}
