//! What the `keel` binary carries for plugin authors: the plugin ABI (the WIT package) and the
//! keel-sdk crate of the ABI it hosts, with the dependency versions keel itself was built
//! with. `keel plugin new` vendors them into the new crate (`vendor/keel-sdk/`, `wit/`,
//! `Cargo.lock`), so the crate builds offline from registry dependencies alone, without keel's
//! sources, and builds the same later: nothing in it follows a moving version.

/// The WIT package directory of the base ABI (its `tool-plugin` world is what Python plugins
/// build against).
pub const WIT_PACKAGE: &str = "keel-plugin-0.2.0";

/// The WIT package directory of the newest ABI, which adds to the base one.
const WIT_PACKAGE_LATEST: &str = "keel-plugin-0.3.0";

/// The WIT packages' texts.
const WIT: &str = include_str!("../../../wit/keel-plugin-0.2.0/plugin.wit");
const WIT_LATEST: &str = include_str!("../../../wit/keel-plugin-0.3.0/plugin.wit");

/// The SDK's source; it binds the WIT at `../../wit/<package>` from its own directory, which
/// in the vendored layout is the new crate's `wit/`.
const SDK_LIB: &str = include_str!("../../../plugins/sdk/src/lib.rs");

/// The lockfile keel was built with: it pins every registry dependency of the SDK and of the
/// exemplars to the version keel was tested with.
const LOCKFILE: &str = include_str!("../../../Cargo.lock");

/// The SDK's version (keel's own).
const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `(path relative to the new crate, contents)` of the SDK and the lockfile vendored into it
/// (the WIT it binds is [`wit_files`]).
pub fn vendored_files() -> anyhow::Result<Vec<(String, String)>> {
    let bindgen = locked_dependency("keel-sdk", "wit-bindgen").ok_or_else(|| {
        anyhow::anyhow!(
            "this keel binary carries no pinned wit-bindgen version for its SDK (its build \
             lockfile lacks one); pass --sdk PATH to a keel-sdk crate"
        )
    })?;
    let cargo_toml = format!(
        "# The keel SDK for the plugin ABI {WIT_PACKAGE}, vendored by `keel plugin new`.\n\
         [package]\nname = \"keel-sdk\"\nversion = \"{SDK_VERSION}\"\nedition = \"2024\"\n\
         publish = false\n\n[dependencies]\nwit-bindgen = \"={bindgen}\"\n"
    );
    Ok(vec![
        ("vendor/keel-sdk/Cargo.toml".to_owned(), cargo_toml),
        ("vendor/keel-sdk/src/lib.rs".to_owned(), SDK_LIB.to_owned()),
        ("Cargo.lock".to_owned(), LOCKFILE.to_owned()),
    ])
}

/// The WIT packages of the ABI this keel hosts, as `(path relative to the crate, contents)`.
pub fn wit_files() -> Vec<(String, String)> {
    vec![
        (format!("wit/{WIT_PACKAGE}/plugin.wit"), WIT.to_owned()),
        (
            format!("wit/{WIT_PACKAGE_LATEST}/plugin.wit"),
            WIT_LATEST.to_owned(),
        ),
    ]
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
        assert!(cargo.contains("wit-bindgen = \"=0."), "{cargo}");
        assert!(!cargo.contains("workspace"), "standalone: {cargo}");
        // The SDK binds the WIT where the vendored layout puts it.
        let lib = get("vendor/keel-sdk/src/lib.rs");
        assert!(
            lib.contains(&format!(
                "path: [\"../../wit/{WIT_PACKAGE}\", \"../../wit/{WIT_PACKAGE_LATEST}\"]"
            )),
            "the SDK's WIT path changed; change the vendored layout with it"
        );
        assert!(
            get(&format!("wit/{WIT_PACKAGE}/plugin.wit")).contains("package keel:plugin@0.2.0")
        );
        assert!(
            get(&format!("wit/{WIT_PACKAGE_LATEST}/plugin.wit"))
                .contains("package keel:plugin@0.3.0")
        );
        Ok(())
    }
}
