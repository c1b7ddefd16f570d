//! Generates libfabric bindings against the installed headers (found with
//! pkg-config), and compiles C wrappers for the header's `static inline` calls
//! (`fi_tsend`, `fi_cq_read`, ...), which have no symbol to link against.
//! Without feature `fabric` (e.g. the no_std core) nothing here runs, and
//! bindgen, cc and pkg-config are not built.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "fabric")]
    fabric();
}

#[cfg(feature = "fabric")]
fn fabric() {
    use std::{env, path::PathBuf};
    println!("cargo:rerun-if-changed=src/dataplane/fabric/wrapper.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let lib = match pkg_config::Config::new().atleast_version("1.14").probe("libfabric") {
        Ok(lib) => lib,
        Err(e) => panic!(
            "libfabric >= 1.14 development files not found ({e}).\n\
             Debian/Ubuntu: `make deps` (apt-get install libfabric-dev).\n\
             AWS EFA installer: PKG_CONFIG_PATH=/opt/amazon/efa/lib64/pkgconfig"
        ),
    };
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let header = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("src/dataplane/fabric/wrapper.h");
    // bindgen reads the host's headers, as in every build: libfabric's types
    // do not depend on the glibc version. cargo-zigbuild (the release build,
    // scripts/build/release.sh) hands bindgen zig's own glibc headers, which
    // cannot be mixed with /usr/include where libfabric's headers are.
    let target = env::var("TARGET").unwrap_or_default();
    for var in [format!("BINDGEN_EXTRA_CLANG_ARGS_{target}"), format!("BINDGEN_EXTRA_CLANG_ARGS_{}", target.replace('-', "_"))] {
        println!("cargo:rerun-if-env-changed={var}");
        if env::var(&var).is_ok_and(|v| v.contains("ziglang") || v.contains("/zig/")) {
            env::remove_var(&var);
        }
    }
    let includes: Vec<String> = lib.include_paths.iter().map(|p| format!("-I{}", p.display())).collect();
    let bindings = bindgen::Builder::default()
        .header(header.to_str().unwrap())
        .clang_args(&includes)
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*")
        .allowlist_var("FI_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(out.join("fabric_static"))
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on the libfabric headers");
    bindings.write_to_file(out.join("fabric_sys.rs")).unwrap();
    let mut cc = cc::Build::new();
    cc.file(out.join("fabric_static.c")).include(header.parent().unwrap()).warnings(false);
    for p in &lib.include_paths {
        cc.include(p);
    }
    cc.compile("tally_fabric_static");
}
