// The build script of the crates that link libtorch but compile no C++:
// see link_libtorch.rs.
include!("link_libtorch.rs");

fn main() {
    link_libtorch();
}
