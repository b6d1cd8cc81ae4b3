//! The default keel plugins, compiled to WebAssembly components when this crate is built and
//! embedded in it.
//!
//! The build script compiles the plugin crates listed in `build.rs` with `keel-guest-build`,
//! then on to machine code for the building machine (`precompile.rs`), so that no run compiles
//! them; [`all`] returns them with their manifests.

/// A plugin bundled into the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bundled {
    /// The plugin's name (the manifest's `name`), e.g. `greeter`.
    pub name: &'static str,
    /// The plugin's manifest, the text of its `keel.toml`.
    pub manifest: &'static str,
    /// The component, compressed with zstd ([`Bundled::component`] unpacks it).
    packed: &'static [u8],
    /// Its machine code for the machine keel was built on, compressed, or `None` (a cross
    /// build; see `precompile.rs`).
    precompiled: Option<&'static [u8]>,
}

include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

/// The dictionary every bundled artifact is compressed with, unpacked and prepared once.
fn dictionary() -> &'static zstd::dict::DecoderDictionary<'static> {
    static PREPARED: std::sync::OnceLock<zstd::dict::DecoderDictionary<'static>> =
        std::sync::OnceLock::new();
    PREPARED.get_or_init(|| {
        let raw = zstd::stream::decode_all(DICTIONARY)
            .expect("the build script packed the dictionary with zstd");
        zstd::dict::DecoderDictionary::copy(&raw)
    })
}

impl Bundled {
    /// The compiled component (a `wasm32-wasip2` WebAssembly component), unpacked.
    pub fn component(&self) -> Vec<u8> {
        self.shipped()
            .unpack(self.name)
            .expect("the build script packed it with zstd and the bundle's dictionary")
    }

    /// The plugin as keel ships it, for `PluginLoader::from_shipped`: the packed component
    /// and its machine code from keel's build (used when the running engine made it).
    pub fn shipped(&self) -> keel_kernel::Shipped<'static> {
        let code = ENGINE.zip(self.precompiled).map(|(engine, packed)| {
            // SAFETY: `packed` is what this crate's build script wrote: wasmtime's
            // `precompile_component` output for this component, by an engine built from
            // `keel_engine::config()` whose fingerprint is `ENGINE`, compressed with zstd and
            // embedded in this binary by `include_bytes!`; nothing read at run time.
            #[allow(unsafe_code)]
            unsafe {
                keel_kernel::Precompiled::new(engine, packed)
            }
        });
        keel_kernel::Shipped {
            packed: self.packed,
            code,
            dictionary: Some(dictionary()),
        }
    }
}

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
                "mcp",
                "memory",
                "compaction",
                "skills",
                "review",
                "subagents",
                "hooks",
            ]
        );
        for bundled in all() {
            // A component, not a core module: magic, then version 0x0d and layer 1.
            assert_eq!(
                bundled.component().get(..8),
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

    /// The build's engine and the kernel's agree, so no plugin of a session is compiled at run
    /// time on the machine keel was built on (a wasmtime feature or setting that differed between
    /// the build script's engine and the kernel's would fail here, not silently recompile).
    #[test]
    fn every_bundled_plugin_loads_from_its_shipped_machine_code() {
        let cache = tempfile::tempdir().expect("tempdir");
        let host = keel_kernel::WasmHost::new(keel_kernel::WasmHostConfig {
            cache_dir: Some(cache.path().to_path_buf()),
            ..Default::default()
        })
        .expect("engine");
        for bundled in all() {
            let shipped = bundled.shipped();
            // What no default session loads is compiled on first use instead.
            if [
                "greeter",
                "greeter-client",
                "echo-tool",
                "review",
                "mcp",
                "hooks",
            ]
            .contains(&bundled.name)
            {
                assert!(shipped.code.is_none(), "{}", bundled.name);
                continue;
            }
            let code = shipped.code.expect("machine code is bundled");
            assert!(host.runs(&code), "{}: another engine made it", bundled.name);
            let loaded = host
                .compile_shipped(bundled.name, shipped)
                .unwrap_or_else(|e| panic!("{}: {e}", bundled.name));
            assert_eq!(
                loaded.cache_status(),
                keel_kernel::CacheStatus::Shipped,
                "{}",
                bundled.name
            );
        }
        let cached = std::fs::read_dir(cache.path())
            .expect("cache dir")
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .count();
        assert_eq!(cached, 0, "nothing was compiled");
    }
}
