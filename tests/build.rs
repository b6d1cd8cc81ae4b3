//! Compiles the hostile plugin fixtures under `fixtures/plugins/` to components and generates
//! the table behind `keel_tests::fixtures`. The agent plugins come from the bundled set
//! (`keel-bundled-plugins`), so they are compiled once.

use std::fmt::Write as _;
use std::path::PathBuf;

use keel_guest_build::{build_components, discover};

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let fixtures_dir = manifest_dir.join("fixtures").join("plugins");
    // A new fixture directory must re-run this script even before it is built.
    println!("cargo:rerun-if-changed={}", fixtures_dir.display());
    let fixtures = discover(&fixtures_dir);
    let built = build_components(&fixtures);

    let mut code = String::new();
    for component in &built {
        let _ = writeln!(
            code,
            "/// The name of the fixture `{name}`.\npub const {constant}: &str = {name:?};",
            name = component.name,
            constant = component.name.to_uppercase().replace('-', "_"),
        );
    }
    code.push_str("\n/// The name of every fixture, sorted.\npub const NAMES: &[&str] = &[\n");
    for component in &built {
        let _ = writeln!(code, "    {:?},", component.name);
    }
    code.push_str("];\n\n/// Every fixture: name, manifest text, component bytes.\n");
    code.push_str("static FIXTURES: &[(&str, &str, &[u8])] = &[\n");
    for component in &built {
        let _ = writeln!(
            code,
            "    ({:?}, {}, {}),",
            component.name,
            component.include_manifest_expr(),
            component.include_component_expr(),
        );
    }
    code.push_str("];\n");

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out_dir.join("fixtures.rs"), code).expect("cannot write fixtures.rs to OUT_DIR");
}
