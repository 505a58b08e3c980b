// The benchworker's build script: libtorch's links (link_libtorch.rs, shared
// with the other crates), and `src/fbgemm/shim.cpp` compiled against the
// headers of the libtorch it links. Where that libtorch lives is recorded:
// FBGEMM's libraries are loaded from beside it at run time.
include!("link_libtorch.rs");

fn main() {
    let lib = link_libtorch().expect("torch-sys reports where libtorch is");
    shim(&lib);
}

/// Compiles the FBGEMM shim against libtorch's headers in `lib/../include`.
fn shim(lib: &str) {
    println!("cargo:rerun-if-changed=src/fbgemm/shim.cpp");
    println!("cargo:rustc-env=EMBSHARD_TORCH_LIB={lib}");
    let include = Path::new(lib).join("../include");
    cc::Build::new()
        .cpp(true)
        .file("src/fbgemm/shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .std("c++17")
        // The ABI of the torch wheels (torch._C._GLIBCXX_USE_CXX11_ABI).
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // libtorch's headers warn under compilers newer than theirs.
        .warnings(false)
        .flag_if_supported("-w")
        .compile("embshard_fbgemm_shim");
}
