//! Compiles the hostile plugin fixtures under `fixtures/plugins/` and the model adapter plugins
//! (`plugins/model-*`) to components and generates the tables behind `keel_tests::fixtures`
//! and `keel_tests::models`.

use std::fmt::Write as _;
use std::path::PathBuf;

use keel_guest_build::{BuiltComponent, GuestCrate, build_components, discover, workspace_root};

/// The model adapter plugins the end-to-end tests load (until they are bundled).
const MODEL_PLUGINS: &[&str] = &["model-openai", "model-anthropic", "model-scripted"];

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let fixtures_dir = manifest_dir.join("fixtures").join("plugins");
    // A new fixture directory must re-run this script even before it is built.
    println!("cargo:rerun-if-changed={}", fixtures_dir.display());
    let fixtures = discover(&fixtures_dir);
    let plugins = workspace_root().join("plugins");
    let models: Vec<GuestCrate> = MODEL_PLUGINS
        .iter()
        .map(|dir| GuestCrate::from_dir(plugins.join(dir)))
        .collect();
    // The shared crates of the model plugins are not guests themselves; a change there must
    // rebuild the components too.
    for shared in ["model-http", "model-wire"] {
        println!("cargo:rerun-if-changed={}", plugins.join(shared).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        workspace_root().join("protocol").display()
    );
    // One nested build for all guests.
    let mut built = build_components(&[fixtures.clone(), models].concat());
    let built_models = built.split_off(fixtures.len());
    write_models(&built_models);

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

/// The table behind `keel_tests::models`.
fn write_models(built: &[BuiltComponent]) {
    let mut code = String::from("/// Every model plugin: name, manifest text, component bytes.\n");
    code.push_str("static MODELS: &[(&str, &str, &[u8])] = &[\n");
    for component in built {
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
    std::fs::write(out_dir.join("models.rs"), code).expect("cannot write models.rs to OUT_DIR");
}
