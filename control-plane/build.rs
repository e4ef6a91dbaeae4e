// `sqlx::migrate!` embeds the migrations at compile time: a new or changed one rebuilds the crate.
// The console's chart library is built into the binary from `console/node_modules`, which
// `./build.sh` installs from `console/package-lock.json`: without it, say so.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let chart = std::path::Path::new("../console/node_modules/uplot/dist/uPlot.iife.min.js");
    println!("cargo:rerun-if-changed={}", chart.display());
    if !chart.exists() {
        eprintln!("the console's packages are missing: run ./build.sh (it runs `npm ci --prefix console`)");
        std::process::exit(1);
    }
}
