//! The default keel plugins, compiled to WebAssembly components when this crate is built and
//! embedded in it.
//!
//! The build script compiles the plugin crates `plugins/greeter`, `plugins/greeter-client` and
//! `plugins/echo-tool` with `keel-guest-build`; [`all`] returns them with their manifests.

/// A plugin bundled into the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bundled {
    /// The plugin's name (the manifest's `name`), e.g. `greeter`.
    pub name: &'static str,
    /// The plugin's manifest, the text of its `keel.toml`.
    pub manifest: &'static str,
    /// The compiled component (a `wasm32-wasip2` WebAssembly component).
    pub component: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

/// Every bundled plugin, in a fixed order.
pub fn all() -> &'static [Bundled] {
    BUNDLED
}

/// The bundled plugin named `name`, if there is one.
pub fn get(name: &str) -> Option<&'static Bundled> {
    BUNDLED.iter().find(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_the_example_plugins() {
        let names: Vec<&str> = all().iter().map(|b| b.name).collect();
        assert_eq!(
            names,
            [
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
            ]
        );
        for bundled in all() {
            // A component, not a core module: magic, then version 0x0d and layer 1.
            assert_eq!(
                bundled.component.get(..8),
                Some(&b"\0asm\x0d\x00\x01\x00"[..])
            );
            assert!(
                bundled
                    .manifest
                    .contains(&format!("name = \"{}\"", bundled.name))
            );
        }
        assert!(get("greeter").is_some_and(|g| g.manifest.contains("example.greeting")));
        assert!(get("missing").is_none());
    }
}
