//! What the `keel` binary carries for plugin authors: the plugin ABI (the WIT package) and the
//! keel-sdk crate of the ABI it hosts, with the dependency versions keel itself was built
//! with. `keel plugin new` vendors them into the new crate (`vendor/keel-sdk/`, `wit/`,
//! `Cargo.lock`), so the crate builds offline from registry dependencies alone, without keel's
//! sources, and builds the same later: nothing in it follows a moving version.

/// The WIT package directories of every ABI this keel hosts, oldest first, with their texts.
/// Each version reuses the earlier ones' interfaces by name, so a world of the newest needs
/// them all.
pub const WIT_PACKAGES: &[(&str, &str)] = &[
    (
        "keel-plugin-0.2.0",
        include_str!("../../../wit/keel-plugin-0.2.0/plugin.wit"),
    ),
    (
        "keel-plugin-0.3.0",
        include_str!("../../../wit/keel-plugin-0.3.0/plugin.wit"),
    ),
    (
        "keel-plugin-0.4.0",
        include_str!("../../../wit/keel-plugin-0.4.0/plugin.wit"),
    ),
    (
        "keel-plugin-0.5.0",
        include_str!("../../../wit/keel-plugin-0.5.0/plugin.wit"),
    ),
    (
        "keel-plugin-0.6.0",
        include_str!("../../../wit/keel-plugin-0.6.0/plugin.wit"),
    ),
    (
        "keel-plugin-0.7.0",
        include_str!("../../../wit/keel-plugin-0.7.0/plugin.wit"),
    ),
    (
        "keel-plugin-0.8.0",
        include_str!("../../../wit/keel-plugin-0.8.0/plugin.wit"),
    ),
];

/// The WIT package of the newest ABI, which new Rust plugins are built against (Python ones
/// use 0.4.0's `tool-plugin` world, see `plugin_python.rs`).
pub const WIT_PACKAGE_LATEST: &str = "keel:plugin@0.8.0";

/// The SDK's sources; they bind the WIT at `../../wit/<package>` from the SDK's directory,
/// which in the vendored layout is the new crate's `wit/`.
const SDK_SOURCES: &[(&str, &str)] = &[
    ("lib.rs", include_str!("../../../plugins/sdk/src/lib.rs")),
    ("mock.rs", include_str!("../../../plugins/sdk/src/mock.rs")),
];

/// The SDK's registry dependencies, with the features it needs of each.
const SDK_DEPENDENCIES: &[(&str, &str)] = &[
    ("wit-bindgen", ""),
    ("serde", ", features = [\"derive\"]"),
    ("serde_json", ""),
    ("schemars", ""),
];

/// The lockfile keel was built with: it pins every registry dependency of the SDK and of the
/// exemplars to the version keel was tested with.
const LOCKFILE: &str = include_str!("../../../Cargo.lock");

/// The SDK's version (keel's own).
const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `(path relative to the new crate, contents)` of the SDK and the lockfile vendored into it
/// (the WIT it binds is [`wit_files`]).
pub fn vendored_files() -> anyhow::Result<Vec<(String, String)>> {
    let mut dependencies = String::new();
    for (dependency, features) in SDK_DEPENDENCIES {
        let version = locked_dependency("keel-sdk", dependency).ok_or_else(|| {
            anyhow::anyhow!(
                "this keel binary carries no pinned {dependency} version for its SDK (its build \
                 lockfile lacks one); pass --sdk PATH to a keel-sdk crate"
            )
        })?;
        dependencies.push_str(&format!(
            "{dependency} = {{ version = \"={version}\"{features} }}\n"
        ));
    }
    let cargo_toml = format!(
        "# The keel SDK for the plugin ABI {WIT_PACKAGE_LATEST}, vendored by `keel plugin new`.\n\
         [package]\nname = \"keel-sdk\"\nversion = \"{SDK_VERSION}\"\nedition = \"2024\"\n\
         publish = false\n\n[dependencies]\n{dependencies}"
    );
    let mut files = vec![("vendor/keel-sdk/Cargo.toml".to_owned(), cargo_toml)];
    for (file, text) in SDK_SOURCES {
        files.push((format!("vendor/keel-sdk/src/{file}"), (*text).to_owned()));
    }
    files.push(("Cargo.lock".to_owned(), LOCKFILE.to_owned()));
    Ok(files)
}

/// The WIT packages of the ABI this keel hosts, as `(path relative to the crate, contents)`.
pub fn wit_files() -> Vec<(String, String)> {
    WIT_PACKAGES
        .iter()
        .map(|(dir, text)| (format!("wit/{dir}/plugin.wit"), (*text).to_owned()))
        .collect()
}

/// The version of `dependency` that `package` resolved to in keel's lockfile: the entry in the
/// package's `dependencies` list (`"name version"` when several versions are locked), or the
/// only locked version of it.
fn locked_dependency(package: &str, dependency: &str) -> Option<String> {
    let lock: toml::Table = LOCKFILE.parse().ok()?;
    let packages = lock.get("package")?.as_array()?;
    let entry = packages
        .iter()
        .find(|p| p.get("name").and_then(toml::Value::as_str) == Some(package))?;
    let named = entry
        .get("dependencies")?
        .as_array()?
        .iter()
        .filter_map(toml::Value::as_str)
        .find(|d| d.split(' ').next() == Some(dependency))?;
    if let Some((_, version)) = named.split_once(' ') {
        return Some(version.to_owned());
    }
    let mut versions = packages
        .iter()
        .filter(|p| p.get("name").and_then(toml::Value::as_str) == Some(dependency))
        .filter_map(|p| p.get("version").and_then(toml::Value::as_str));
    let only = versions.next()?;
    versions.next().is_none().then(|| only.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_is_vendored_with_its_pinned_bindgen_and_the_wit_it_binds() -> anyhow::Result<()> {
        let mut files = vendored_files()?;
        files.extend(wit_files());
        let get = |path: &str| {
            files
                .iter()
                .find(|(p, _)| p == path)
                .map(|(_, text)| text.as_str())
                .unwrap_or_default()
        };
        let cargo = get("vendor/keel-sdk/Cargo.toml");
        assert!(cargo.contains("wit-bindgen = { version = \"=0."), "{cargo}");
        assert!(cargo.contains("schemars = { version = \"=1."), "{cargo}");
        assert!(cargo.contains("serde = { version = \"=1."), "{cargo}");
        assert!(!cargo.contains("workspace"), "standalone: {cargo}");
        assert!(get("vendor/keel-sdk/src/mock.rs").contains("pub struct MockHost"));
        // The SDK binds the WIT where the vendored layout puts it.
        let lib = get("vendor/keel-sdk/src/lib.rs");
        for (dir, text) in WIT_PACKAGES {
            assert!(
                lib.contains(&format!("\"../../wit/{dir}\"")),
                "the SDK's WIT path changed; change the vendored layout with it"
            );
            let version = dir.trim_start_matches("keel-plugin-");
            assert!(
                get(&format!("wit/{dir}/plugin.wit"))
                    .contains(&format!("package keel:plugin@{version}"))
            );
            assert_eq!(get(&format!("wit/{dir}/plugin.wit")), *text);
        }
        assert!(lib.contains(&format!(
            "world: \"keel:plugin/keel-plugin@{}\"",
            WIT_PACKAGE_LATEST.trim_start_matches("keel:plugin@")
        )));
        Ok(())
    }
}
