// Included by every crate's build script (build.rs, build_links.rs).
// Binaries and tests find libtorch without LD_LIBRARY_PATH: torch-sys reports
// where it linked libtorch from, and that folder becomes the rpath.
//
// With the `cuda` feature:
// - libtorch_cuda is linked for real: nothing in the binary names one of its
//   symbols, so the linker's --as-needed would drop it and libtorch would
//   see no GPU (`tch::Cuda::is_available()` false);
// - NCCL: cudarc loads `libnccl.so` by that name at run time, and the torch
//   wheel ships `nvidia/nccl/lib/libnccl.so.2` only; a link named
//   `libnccl.so` to it in this build's output folder, on the rpath, lets the
//   binary find the very library libtorch_cuda already loaded. NCCL_LIB_DIR
//   names another folder holding libnccl.so.2.
use std::path::{Path, PathBuf};

/// Sets the rpath (and, with `cuda`, the CUDA links); returns libtorch's
/// folder.
fn link_libtorch() -> Option<String> {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=NCCL_LIB_DIR");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").ok();
    if let Some(lib) = &lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return lib;
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    let nccl_dir = std::env::var("NCCL_LIB_DIR")
        .map(PathBuf::from)
        .ok()
        .or_else(|| lib.as_ref().map(|l| Path::new(l).join("../../nvidia/nccl/lib")));
    let Some(so2) = nccl_dir
        .map(|d| d.join("libnccl.so.2"))
        .filter(|p| p.exists())
    else {
        println!(
            "cargo:warning=libnccl.so.2 not found next to libtorch (or in NCCL_LIB_DIR): \
             the cuda backend will look for libnccl.so on LD_LIBRARY_PATH"
        );
        return lib;
    };
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("nccl");
    std::fs::create_dir_all(&out).expect("create the NCCL link folder");
    let link = out.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    let target = so2.canonicalize().unwrap_or(so2);
    std::os::unix::fs::symlink(&target, &link).expect("link libnccl.so");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", out.display());
    lib
}
