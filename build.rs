//! The release module's code section with compact offsets: wasm-ld otherwise keeps every
//! relocated offset padded to five bytes, about 8% of the module (bench/README.md, Module size).
//! It needs the output free of debug information (`--strip-debug`, which keeps function names
//! for `./build.sh size`; the release profile strips those too).
//!
//! The native module (`--features native`) is linked for lazy binding (see `main`).
//!
//! Also lists the golden fixtures' files for the unit tests (`src/providers/fixtures.rs`), which
//! run inside wasm too, where there is no filesystem to read the directory from.
use std::fmt::Write;
use std::path::Path;

fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-cdylib-link-arg=--compress-relocations");
        println!("cargo:rustc-cdylib-link-arg=--strip-debug");
    } else if std::env::var("CARGO_FEATURE_NATIVE").is_ok() {
        // The native module binds Envoy's callbacks lazily, so that an Envoy lacking one (another
        // ABI) still loads it far enough for its init to say which, instead of the loader's
        // bare "undefined symbol" (src/native/mod.rs, on_program_init).
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,lazy");
    }
    list_fixtures();
}

/// `$OUT_DIR/fixtures.rs`: `REQUESTS` (case name, text) of `fixtures/requests/*.json` and
/// `SNAPSHOTS` ("case/provider", text) of `fixtures/snapshots/*/*.json`, sorted by name.
fn list_fixtures() {
    // Read when the script runs (`env!` would keep the directory it was compiled in).
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let root = Path::new(&manifest_dir).join("src/providers/fixtures");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", root.display());
    let requests = json_files(&root.join("requests"));
    let mut snapshots = Vec::new();
    for (case, dir) in directories(&root.join("snapshots")) {
        for (provider, path) in json_files(&dir) {
            snapshots.push((format!("{case}/{provider}"), path));
        }
    }
    let mut out = String::new();
    for (name, files) in [("REQUESTS", requests), ("SNAPSHOTS", snapshots)] {
        let _ = writeln!(out, "const {name}: &[(&str, &str)] = &[");
        for (key, path) in files {
            let _ = writeln!(out, "    ({key:?}, include_str!({:?})),", path.display().to_string());
        }
        let _ = writeln!(out, "];");
    }
    let out_dir = std::env::var("OUT_DIR").unwrap_or_default();
    if let Err(e) = std::fs::write(Path::new(&out_dir).join("fixtures.rs"), out) {
        println!("cargo:warning=could not write the fixture list: {e}");
    }
}

/// The `*.json` files of `dir` by name without the extension, sorted (none when it is absent).
fn json_files(dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let mut files: Vec<_> = entries(dir)
        .filter(|path| path.is_file())
        .filter_map(|path| {
            let stem = path.file_name()?.to_str()?.strip_suffix(".json")?.to_string();
            Some((stem, path))
        })
        .collect();
    files.sort();
    files
}

fn directories(dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let mut dirs: Vec<_> = entries(dir)
        .filter(|path| path.is_dir())
        .filter_map(|path| Some((path.file_name()?.to_str()?.to_string(), path)))
        .collect();
    dirs.sort();
    dirs
}

fn entries(dir: &Path) -> impl Iterator<Item = std::path::PathBuf> {
    std::fs::read_dir(dir).into_iter().flatten().flatten().map(|entry| entry.path())
}
