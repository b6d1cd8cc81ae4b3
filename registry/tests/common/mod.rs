//! Shared fixtures: a registry in a temp directory, keys, homes that trust them, and
//! components of any 5-character version made from the bundled echo-tool.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use keel_kernel::{WasmHost, WasmHostConfig};
use keel_registry::{
    Home, InstallOptions, InstallPlan, KeyPair, OciOptions, Package, PluginName, Record, Registry,
    RegistryError, Session, Step, TrustConfig, parse_spec, plan_install, publish, validate,
};

pub type R = Result<(), Box<dyn std::error::Error>>;

/// The bundled echo-tool component, built as version 0.1.0.
pub fn echo_component() -> Vec<u8> {
    keel_bundled_plugins::get("echo-tool")
        .map(|b| b.component())
        .expect("echo-tool is bundled")
}

/// The echo-tool component re-labelled as `version` (5 characters, e.g. `0.2.7`): the
/// version section's payload is replaced in place, so the bytes (and the hash) differ.
pub fn component(version: &str) -> Vec<u8> {
    assert_eq!(version.len(), 5, "fixture versions have 5 characters");
    let mut bytes = echo_component();
    let needle = b"\x13keel-plugin-version0.1.0";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the bundled component declares version 0.1.0");
    let start = at + needle.len() - 5;
    bytes[start..start + 5].copy_from_slice(version.as_bytes());
    bytes
}

/// A manifest for plugin `name` at `version` with extra TOML appended.
pub fn manifest(name: &str, version: &str, extra: &str) -> String {
    format!(
        "name = \"{name}\"\nversion = \"{version}\"\nkind = \"wasm\"\ndescription = \"{name} for tests\"\ncomponent = \"x.wasm\"\n{extra}"
    )
}

/// A registry (a directory, or an OCI registry) with a publisher key for `acme`.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub host: WasmHost,
    pub key: KeyPair,
    pub publisher: Home,
    /// The OCI registry's URL and how to reach it, instead of the directory.
    pub oci: Option<(String, OciOptions)>,
}

impl Fixture {
    pub fn new() -> Result<Fixture, Box<dyn std::error::Error>> {
        let fx = Fixture::with_registry(None)?;
        Registry::open(&fx.registry_path().display().to_string(), true)?;
        Ok(fx)
    }

    /// A fixture whose registry is the OCI registry at `url`.
    pub fn oci(url: &str, options: OciOptions) -> Result<Fixture, Box<dyn std::error::Error>> {
        Fixture::with_registry(Some((url.to_owned(), options)))
    }

    fn with_registry(
        oci: Option<(String, OciOptions)>,
    ) -> Result<Fixture, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let host = WasmHost::new(WasmHostConfig {
            cache_dir: Some(dir.path().join("cache")),
            ..WasmHostConfig::default()
        })?;
        let publisher = Home::new(dir.path().join("publisher"));
        Ok(Fixture {
            key: KeyPair::from_seed("acme", Some("acme"), [42; 32]),
            dir,
            host,
            publisher,
            oci,
        })
    }

    pub fn registry_path(&self) -> PathBuf {
        self.dir.path().join("registry")
    }

    pub fn registry(&self) -> Result<Registry, RegistryError> {
        match &self.oci {
            Some((url, options)) => Registry::open_oci(url, options.clone()),
            None => Registry::open(&self.registry_path().display().to_string(), false),
        }
    }

    /// A fresh home that trusts `key` for `acme` on this registry.
    pub fn home_trusting(&self, key: &KeyPair, label: &str) -> Result<Home, RegistryError> {
        let home = Home::new(self.dir.path().join(label));
        let mut trust = TrustConfig::default();
        trust.trust("acme", key.public(), self.registry()?.location())?;
        trust.save(&home.trust_path())?;
        Ok(home)
    }

    pub fn session(&self, home: &Home) -> Result<Session, RegistryError> {
        Session::new(home.clone(), self.registry()?)
    }

    pub fn package(&self, manifest_text: &str, code: Vec<u8>) -> Result<Package, RegistryError> {
        validate(&self.host, Path::new("keel.toml"), manifest_text, code)
    }

    /// Publish `acme:NAME@VERSION` (component relabelled to VERSION) with extra manifest TOML.
    pub fn publish(&self, name: &str, version: &str, extra: &str) -> Result<Record, RegistryError> {
        self.publish_with(name, version, extra, Some(&self.key))
    }

    pub fn publish_with(
        &self,
        name: &str,
        version: &str,
        extra: &str,
        key: Option<&KeyPair>,
    ) -> Result<Record, RegistryError> {
        let package = self.package(&manifest(name, version, extra), component(version))?;
        let mut session = self.session(&self.publisher)?;
        let plugin: PluginName = format!("acme:{name}").parse()?;
        publish(&mut session, &plugin, &package, key, &mut |_: Step| {})
    }

    pub fn plan(
        &self,
        home: &Home,
        specs: &[&str],
        options: InstallOptions,
    ) -> Result<InstallPlan, RegistryError> {
        let wanted = specs
            .iter()
            .map(|s| parse_spec(s))
            .collect::<Result<Vec<_>, _>>()?;
        let mut session = self.session(home)?;
        let plan = plan_install(&mut session, &wanted, options)?;
        session.finish()?;
        Ok(plan)
    }
}

/// The error's message, or a note that there was none.
pub fn message<T: std::fmt::Debug>(result: Result<T, RegistryError>) -> String {
    match result {
        Ok(v) => format!("unexpected success: {v:?}"),
        Err(e) => e.to_string(),
    }
}
