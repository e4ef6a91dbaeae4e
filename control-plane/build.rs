// `sqlx::migrate!` embeds the migrations at compile time: a new or changed one rebuilds the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
