// Binaries and tests find libtorch without LD_LIBRARY_PATH: torch-sys reports
// where it linked libtorch from, and that folder becomes the rpath.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
