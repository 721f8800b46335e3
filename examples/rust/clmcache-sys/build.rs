//! Finds libclmcache and links it dynamically.
//!
//! 1. `CLMCACHE_PREFIX` set: the library in `$CLMCACHE_PREFIX/lib` (else
//!    `lib64` or `lib/<multiarch>`), the header in `$CLMCACHE_PREFIX/include`.
//! 2. Otherwise `pkg-config --libs-only-L clmcache` (and `--cflags-only-I`);
//!    when no -L dir has the library, the dir above the .pc file (pcfiledir).
//!
//! The library directory also goes into the rpath of this package's test
//! binaries, so they run without LD_LIBRARY_PATH, and to dependents as
//! DEP_CLMCACHE_LIBDIR (the `clmcache` crate puts it in its own rpath).
//!
//! It then compiles probe/layout.c against the header with the C compiler
//! ($CC, else cc) and runs it, writing the C layout of every struct and the
//! value of every macro to $OUT_DIR/c_layout.rs for tests/layout.rs. A probe
//! that cannot run is not a build error: the test reports why instead.
use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for var in ["CLMCACHE_PREFIX", "PKG_CONFIG", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR", "CC"]
    {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=probe/layout.c");

    let found = match env::var_os("CLMCACHE_PREFIX").filter(|p| !p.is_empty()) {
        Some(prefix) => from_prefix(Path::new(&prefix)),
        None => from_pkg_config(),
    };

    if let Some(dir) = &found.lib_dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:libdir={}", dir.display());
        if env::var("CARGO_CFG_TARGET_OS").map(|os| os != "windows").unwrap_or(true) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
    println!("cargo:rustc-link-lib=dylib=clmcache");

    if let Some(dir) = &found.include_dir {
        println!("cargo:include={}", dir.display());
        let header = dir.join("clm.h");
        if header.exists() {
            println!("cargo:rerun-if-changed={}", header.display());
        }
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let layout = match probe_layout(found.include_dir.as_deref(), &out_dir) {
        Ok(tables) => format!("pub const C_PROBE: Result<(), &str> = Ok(());\n{}", tables),
        Err(why) => {
            println!("cargo:warning=clmcache-sys: C layout probe skipped: {}", why);
            format!(
                "pub const C_PROBE: Result<(), &str> = Err({:?});\n\
                 pub const C_TYPES: &[(&str, usize, usize)] = &[];\n\
                 pub const C_FIELDS: &[(&str, usize, usize)] = &[];\n\
                 pub const C_CONSTANTS: &[(&str, i64)] = &[];\n",
                why
            )
        }
    };
    fs::write(out_dir.join("c_layout.rs"), layout).expect("write c_layout.rs");
}

struct Found {
    lib_dir: Option<PathBuf>,
    include_dir: Option<PathBuf>,
}

fn has_shared_library(dir: &Path) -> bool {
    ["libclmcache.so", "libclmcache.dylib", "clmcache.lib"].iter().any(|name| dir.join(name).exists())
}

fn from_prefix(prefix: &Path) -> Found {
    // lib, lib64, or a multiarch lib/<triple> (GNUInstallDirs with prefix /usr).
    let mut candidates = vec![prefix.join("lib"), prefix.join("lib64")];
    if let Ok(entries) = fs::read_dir(prefix.join("lib")) {
        let mut subdirs: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        subdirs.sort();
        candidates.extend(subdirs);
    }
    let lib_dir = match candidates.iter().find(|dir| has_shared_library(dir)) {
        Some(dir) => dir.clone(),
        None => panic!(
            "CLMCACHE_PREFIX={}: no libclmcache.so in {}/lib, lib64 or lib/*; install clmcache there \
             (cmake --install <build> --prefix <prefix>) or unset CLMCACHE_PREFIX to use pkg-config",
            prefix.display(),
            prefix.display()
        ),
    };
    let include = prefix.join("include");
    Found { lib_dir: Some(lib_dir), include_dir: if include.join("clm.h").exists() { Some(include) } else { None } }
}

fn pkg_config(flag: &str) -> Result<Vec<PathBuf>, String> {
    let program = env::var_os("PKG_CONFIG").unwrap_or_else(|| OsString::from("pkg-config"));
    let output = Command::new(&program)
        .args([flag, "clmcache"])
        .output()
        .map_err(|e| format!("cannot run {}: {}", program.to_string_lossy(), e))?;
    if !output.status.success() {
        return Err(format!(
            "{} {} clmcache failed: {}",
            program.to_string_lossy(),
            flag,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let prefix = match flag {
        "--libs-only-L" => "-L",
        "--cflags-only-I" => "-I",
        _ => return Ok(vec![PathBuf::from(stdout.trim())]), // a --variable
    };
    Ok(stdout.split_whitespace().filter_map(|word| word.strip_prefix(prefix)).map(PathBuf::from).collect())
}

fn from_pkg_config() -> Found {
    let lib_dirs = match pkg_config("--libs-only-L") {
        Ok(dirs) => dirs,
        Err(why) => panic!(
            "clmcache-sys: set CLMCACHE_PREFIX to clmcache's install prefix (the folder with lib/libclmcache.so), \
             or make `pkg-config clmcache` work (PKG_CONFIG_PATH); {}",
            why
        ),
    };
    // A .pc file whose prefix is stale (an install moved, or made with
    // `cmake --install --prefix` elsewhere than configured) names dirs without
    // the library; the .pc file's own place, <libdir>/pkgconfig, still knows.
    let pc_dir = pkg_config("--variable=pcfiledir").ok().and_then(|dirs| dirs.into_iter().next());
    let pc_lib_dir = pc_dir.as_ref().and_then(|dir| dir.parent()).map(Path::to_path_buf);
    let lib_dir = lib_dirs
        .iter()
        .find(|dir| has_shared_library(dir))
        .or_else(|| pc_lib_dir.as_ref().filter(|dir| has_shared_library(dir)))
        // No -L at all: the library is in the linker's default path.
        .or_else(|| lib_dirs.first())
        .cloned();
    let mut include_dirs = pkg_config("--cflags-only-I").unwrap_or_default();
    include_dirs.extend(pc_lib_dir.as_ref().and_then(|dir| dir.parent()).map(|prefix| prefix.join("include")));
    include_dirs.push(PathBuf::from("/usr/include"));
    let include_dir = include_dirs.into_iter().find(|dir| dir.join("clm.h").exists());
    Found { lib_dir, include_dir }
}

fn probe_layout(include_dir: Option<&Path>, out_dir: &Path) -> Result<String, String> {
    if env::var("TARGET").ok() != env::var("HOST").ok() {
        return Err("cross-compiling: the probe cannot run on the build machine".to_string());
    }
    let include_dir = include_dir.ok_or_else(|| "clm.h not found next to the library".to_string())?;
    let source = Path::new(&env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("probe/layout.c");
    let exe = out_dir.join("clm_layout_probe");
    let cc = env::var_os("CC").filter(|c| !c.is_empty()).unwrap_or_else(|| OsString::from("cc"));
    let compiled = Command::new(&cc)
        .arg("-std=c11")
        .arg("-I")
        .arg(include_dir)
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run C compiler {}: {}", cc.to_string_lossy(), e))?;
    if !compiled.status.success() {
        return Err(format!(
            "{} failed on {}: {}",
            cc.to_string_lossy(),
            source.display(),
            String::from_utf8_lossy(&compiled.stderr).trim()
        ));
    }
    let ran = Command::new(&exe).output().map_err(|e| format!("cannot run {}: {}", exe.display(), e))?;
    if !ran.status.success() {
        return Err(format!("{} exited with {}", exe.display(), ran.status));
    }
    String::from_utf8(ran.stdout).map_err(|_| "the probe printed non-UTF-8".to_string())
}
