//! The model adapter plugins (`model-openai`, `model-anthropic`, `model-scripted`) from the
//! bundled set, with their configuration overridden for a test.

use anyhow::Context as _;
use keel_kernel::{PluginLoader, PluginPackage};

/// The bundled model plugin `name`, if there is one.
pub fn model_plugin(name: &str) -> Option<&'static keel_bundled_plugins::Bundled> {
    keel_bundled_plugins::get(name).filter(|b| b.name.starts_with("model-"))
}

/// The package of the model plugin `name` with its configuration overridden by `config` (a
/// JSON object merged over the manifest's `[config]`, as the user's `[config.<name>]` is).
pub fn package(
    loader: &PluginLoader,
    name: &str,
    config: serde_json::Value,
) -> anyhow::Result<PluginPackage> {
    let bundled = model_plugin(name).with_context(|| format!("no model plugin `{name}`"))?;
    let mut package = loader.from_shipped(
        &format!("model plugin {name}"),
        bundled.manifest,
        bundled.shipped(),
    )?;
    if let (Some(defaults), serde_json::Value::Object(overrides)) =
        (package.manifest.config.as_object_mut(), config)
    {
        defaults.extend(overrides);
    }
    Ok(package)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_plugin_is_a_component_providing_model() {
        for name in ["model-openai", "model-anthropic", "model-scripted"] {
            let bundled = model_plugin(name).expect("built");
            assert_eq!(
                bundled.component().get(..8),
                Some(&b"\0asm\x0d\x00\x01\x00"[..]),
                "{name}"
            );
            let manifest =
                keel_kernel::Manifest::parse(bundled.manifest, std::path::Path::new(name))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(manifest.name, name);
            assert!(manifest.provides.contains_key("model"), "{name}");
        }
    }
}
