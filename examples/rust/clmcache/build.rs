//! Puts libclmcache's directory (found by clmcache-sys, which passes it on as
//! DEP_CLMCACHE_LIBDIR) into the rpath of this package's tests and examples,
//! so they run without LD_LIBRARY_PATH. rustc-link-arg only applies to the
//! package whose build script prints it, hence this second build script.
use std::env;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CLMCACHE_LIBDIR");
    println!("cargo:rerun-if-changed=build.rs");
    let windows = env::var("CARGO_CFG_TARGET_OS").map(|os| os == "windows").unwrap_or(false);
    if let Some(dir) = env::var_os("DEP_CLMCACHE_LIBDIR") {
        if !windows {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
        }
    }
}
