//! Compiles the hostile plugin fixtures under `fixtures/plugins/` and the agent plugins under
//! test (`TOOL_PLUGINS`, not bundled yet) to components, in one nested build, and generates
//! the tables behind `keel_tests::fixtures` and `keel_tests::plugins`.

use std::fmt::Write as _;
use std::path::PathBuf;

use keel_guest_build::{GuestCrate, build_components, discover, workspace_root};

/// The plugin crates (directories under `plugins/`) the tool-plugin tests load.
const TOOL_PLUGINS: &[&str] = &[
    "fs-tools",
    "shell",
    "tool-registry",
    "session-log",
    "verifier",
];

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let fixtures_dir = manifest_dir.join("fixtures").join("plugins");
    // A new fixture directory must re-run this script even before it is built.
    println!("cargo:rerun-if-changed={}", fixtures_dir.display());
    let fixtures = discover(&fixtures_dir);
    let root = workspace_root();
    let plugins_dir = root.join("plugins");
    // Path dependencies of the plugins under test: a change there changes the components.
    for dependency in [plugins_dir.join("agent-kit"), root.join("protocol")] {
        println!("cargo:rerun-if-changed={}", dependency.display());
    }
    let mut crates = fixtures.clone();
    crates.extend(
        TOOL_PLUGINS
            .iter()
            .map(|dir| GuestCrate::from_dir(plugins_dir.join(dir))),
    );
    let mut built = build_components(&crates);
    let plugins = built.split_off(fixtures.len());

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

    let mut code =
        String::from("/// Every plugin under test: name, manifest text, component bytes.\n");
    code.push_str("static PLUGINS: &[(&str, &str, &[u8])] = &[\n");
    for component in &plugins {
        let _ = writeln!(
            code,
            "    ({:?}, {}, {}),",
            component.name,
            component.include_manifest_expr(),
            component.include_component_expr(),
        );
    }
    code.push_str("];\n");
    std::fs::write(out_dir.join("plugins.rs"), code).expect("cannot write plugins.rs to OUT_DIR");
}
