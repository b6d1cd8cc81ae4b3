//! Compiles the bundled plugins to components and generates the table behind
//! `keel_bundled_plugins::all()`.

use std::fmt::Write as _;
use std::path::PathBuf;

use keel_guest_build::{GuestCrate, build_components, workspace_root};

mod precompile;

/// The plugin crates (directories under `plugins/`) bundled into the binary.
const BUNDLED: &[&str] = &[
    "greeter",
    "greeter-client",
    "echo-tool",
    "agent-loop",
    "model-openai",
    "model-anthropic",
    "model-scripted",
    "fs-tools",
    "shell",
    "tool-registry",
    "session-log",
    "verifier",
    "mcp",
    "memory",
    "compaction",
    "skills",
    "review",
    "subagents",
    "hooks",
];

/// Bundled plugins no default session loads (the examples; `review`, loaded by `keel review`;
/// `mcp`, loaded only when MCP servers are configured; `hooks`, only when hooks are):
/// they ship as components only and are compiled into the component cache on first use,
/// which keeps their machine code (about 0.7 MB) out of the binary.
const COMPILED_ON_FIRST_USE: &[&str] = &[
    "greeter",
    "greeter-client",
    "echo-tool",
    "review",
    "mcp",
    "hooks",
];

fn main() {
    let plugins = workspace_root().join("plugins");
    let crates: Vec<GuestCrate> = BUNDLED
        .iter()
        .map(|dir| GuestCrate::from_dir(plugins.join(dir)))
        .collect();
    // Libraries the plugins share are not guests themselves; a change there changes the
    // components too.
    for shared in ["agent-kit", "model-wire", "model-http"] {
        println!("cargo:rerun-if-changed={}", plugins.join(shared).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        workspace_root().join("protocol").display()
    );
    let built = build_components(&crates);
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bundle = precompile::all(&built, &out_dir, |name| {
        !COMPILED_ON_FIRST_USE.contains(&name)
    });

    let mut code = String::from(
        "/// Every bundled plugin, in a fixed order.\nstatic BUNDLED: &[Bundled] = &[\n",
    );
    for (component, packed) in built.iter().zip(&bundle.plugins) {
        let precompiled = match &packed.code {
            Some(path) => format!("Some(include_bytes!({:?}))", path.display().to_string()),
            None => "None".to_owned(),
        };
        let _ = writeln!(
            code,
            "    Bundled {{\n        name: {:?},\n        manifest: {},\n        packed: include_bytes!({:?}),\n        precompiled: {precompiled},\n    }},",
            component.name,
            component.include_manifest_expr(),
            packed.component.display().to_string(),
        );
    }
    code.push_str("];\n");
    let _ = writeln!(
        code,
        "/// The zstd dictionary every artifact above is compressed with, itself compressed.\nstatic DICTIONARY: &[u8] = include_bytes!({:?});",
        bundle.dictionary.display().to_string()
    );
    let _ = writeln!(
        code,
        "/// The fingerprint of the engine that compiled `precompiled` (see `keel_engine`).\nstatic ENGINE: Option<[u8; 32]> = {:?};",
        bundle.engine
    );
    std::fs::write(out_dir.join("bundled.rs"), code).expect("cannot write bundled.rs to OUT_DIR");
}
