//! The release module's code section with compact offsets: wasm-ld otherwise keeps every
//! relocated offset padded to five bytes, about 8% of the module (bench/README.md, Module size).
//! It needs the output free of debug information (`--strip-debug`, which keeps function names
//! for `./build.sh size`; the release profile strips those too).
fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-cdylib-link-arg=--compress-relocations");
        println!("cargo:rustc-cdylib-link-arg=--strip-debug");
    }
}
