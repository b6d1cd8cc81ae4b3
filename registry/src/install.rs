//! Installing: resolve, download, verify every hash and signature, show what is requested,
//! then write the plugins and the lockfile. And loading: re-hash what is installed against the
//! lockfile before the kernel sees it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keel_kernel::{Manifest, PluginKind};
use semver::{Version, VersionReq};

use crate::RegistryError;
use crate::fsutil::{atomic_write, lock_for_update, remove_stale_temps_under, sha256_hex};
use crate::home::{Home, Session};
use crate::index::IndexLog;
use crate::keys::PublicKey;
use crate::lockfile::{LockEntry, Lockfile};
use crate::name::PluginName;
use crate::publish::installed_code_name;
use crate::record::{Record, Release, capability_digest};
use crate::resolve::{Catalog, Request, resolve};
use crate::trust::Verdict;

/// What the user allowed on the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct InstallOptions {
    /// Accept unsigned releases and unknown keys (`--allow-unverified`); the lockfile says so.
    pub allow_unverified: bool,
    /// Accept native plugins, which run with the user's full rights (`--allow-native`).
    pub allow_native: bool,
    /// Told before each release's code is downloaded: its name, version and size in bytes
    /// (the command line shows a progress line).
    pub on_download: Option<fn(&PluginName, &Version, u64)>,
}

/// One plugin of an install plan.
#[derive(Debug, Clone)]
pub struct PlannedPlugin {
    /// The plugin.
    pub name: PluginName,
    /// The version to be installed.
    pub version: Version,
    /// The version installed now, if any.
    pub previous: Option<Version>,
    /// Whether this version is yanked (chosen only because the lockfile pins it).
    pub yanked: bool,
    /// The signed release record.
    pub release: Release,
    /// Who signed it; `None` when unsigned.
    pub signer: Option<PublicKey>,
    /// Whether the signer is trusted for the namespace (false: `--allow-unverified`).
    pub verified: bool,
    /// The verified code to write; empty when the plugin is already installed at this version.
    pub code: Vec<u8>,
}

impl PlannedPlugin {
    /// Whether this plugin is new or changes version.
    pub fn changes(&self) -> bool {
        self.previous.as_ref() != Some(&self.version)
    }

    /// Lines describing what the plugin asks to be allowed to do, network access first.
    pub fn capability_lines(&self) -> Vec<String> {
        // The installed manifest says everything the consent must name (services, events,
        // replaces, limits); it was checked against the signed record when planned.
        if let Ok(manifest) =
            Manifest::parse(&self.release.manifest, std::path::Path::new("keel.toml"))
        {
            return keel_kernel::consent::capability_lines(&manifest);
        }
        let caps = &self.release.capabilities;
        let mut lines = Vec::new();
        if self.release.kind == PluginKind::Native {
            lines.push(
                "FULL TRUST: native code, runs outside the sandbox with all of your rights"
                    .to_owned(),
            );
        }
        for host in &caps.network {
            lines.push(format!("NETWORK: may send requests to {host}"));
        }
        if caps.exec {
            lines.push("EXEC: may ask to run commands (each judged by the exec policy)".to_owned());
        }
        for d in &caps.dirs {
            let access = match d.access {
                keel_kernel::DirAccess::Read => "read",
                keel_kernel::DirAccess::ReadWrite => "read and write",
            };
            lines.push(format!(
                "FILES: {access} {} (seen as {})",
                d.path.display(),
                d.guest
            ));
        }
        if lines.is_empty() {
            lines.push("nothing beyond its own sandbox".to_owned());
        }
        lines
    }
}

/// What an install will do; nothing is written until [`apply_install`].
#[derive(Debug, Clone)]
pub struct InstallPlan {
    /// The registry.
    pub registry: String,
    /// Every plugin of the resolution, sorted by name.
    pub plugins: Vec<PlannedPlugin>,
    /// The lockfile after the install.
    pub lock: Lockfile,
}

impl InstallPlan {
    /// The plugins that are new or change version: these need the user's approval.
    pub fn changes(&self) -> impl Iterator<Item = &PlannedPlugin> {
        self.plugins.iter().filter(|p| p.changes())
    }
}

/// The release record of `name@version` in `log` and whether it is yanked.
fn release_of<'a>(log: &'a IndexLog, version: &Version) -> Option<(&'a Record, bool)> {
    log.version(version)
        .map(|v| (v.record, v.yanked_by.is_some()))
}

/// Check that a release's manifest says what its record says (both are signed; a mismatch
/// means the publisher's tool is broken or the record was crafted).
pub(crate) fn manifest_of(name: &PluginName, record: &Record) -> Result<Manifest, RegistryError> {
    let bad = |reason: String| RegistryError::Corrupt {
        what: format!("the release record of {name}@{}", record.version),
        reason,
    };
    let release = record
        .release
        .as_ref()
        .ok_or_else(|| bad("it is not a release".into()))?;
    let manifest = Manifest::parse(&release.manifest, Path::new("keel.toml"))
        .map_err(|e| bad(format!("its manifest is invalid: {e}")))?;
    let requires: BTreeMap<String, (String, bool)> = manifest
        .requires
        .iter()
        .map(|(s, r)| (s.clone(), (r.range.to_string(), r.optional)))
        .collect();
    let recorded: BTreeMap<String, (String, bool)> = release
        .requires
        .iter()
        .map(|(s, r)| (s.clone(), (r.range.clone(), r.optional)))
        .collect();
    if manifest.name != name.name()
        || manifest.version != record.version
        || manifest.kind != release.kind
        || manifest.capabilities != release.capabilities
        || manifest.provides != release.provides
        || requires != recorded
        || manifest.component.as_deref() != Some(Path::new(&installed_code_name(release.kind)))
    {
        return Err(bad(
            "its manifest disagrees with the record (name, version, kind, requirements, provides, capabilities or component)"
                .into(),
        ));
    }
    Ok(manifest)
}

/// Resolve `wanted` (plus what is installed from this registry), download what changes, and
/// verify all of it: every blob's SHA-256 against its signed record, every signer against the
/// user's trusted keys for the namespace (or `--allow-unverified`), native plugins against
/// `--allow-native`. Nothing is written.
pub fn plan_install(
    session: &mut Session,
    wanted: &[(PluginName, VersionReq)],
    options: InstallOptions,
) -> Result<InstallPlan, RegistryError> {
    let location = session.location().to_owned();
    let lock = Lockfile::load(&session.home.lock_path())?;
    for (name, _) in wanted {
        session.trust.check_registry(name, &location)?;
    }
    let locked: BTreeMap<PluginName, Version> = lock
        .plugins
        .iter()
        .filter(|e| e.registry == location)
        .map(|e| (e.name.clone(), e.version.clone()))
        .collect();

    let mut catalog = Catalog::new();
    let mut logs: BTreeMap<PluginName, IndexLog> = BTreeMap::new();
    // A namespace that comes from another registry is never taken from this one.
    let names: Vec<PluginName> = session
        .registry
        .names()?
        .into_iter()
        .filter(|name| session.trust.check_registry(name, &location).is_ok())
        .collect();
    let logs_read = session.logs_for_resolution(&names);
    for (name, read) in names.into_iter().zip(logs_read) {
        match read {
            Ok(log) => {
                catalog.add_log(&log);
                logs.insert(name, log);
            }
            Err(e) if wanted.iter().any(|(w, _)| *w == name) || locked.contains_key(&name) => {
                return Err(e);
            }
            Err(e) => tracing::warn!("skipping {name}: {e}"),
        }
    }
    catalog.finish();
    for (name, _) in wanted {
        if !catalog.contains(name) {
            return Err(RegistryError::NoSuchPlugin {
                name: name.to_string(),
                registry: location.clone(),
            });
        }
    }
    let solution = resolve(
        &catalog,
        &Request {
            wanted: wanted.to_vec(),
            locked: locked.clone(),
        },
    )?;

    let mut plugins = Vec::new();
    for (name, version) in solution {
        let log = logs.get(&name).ok_or_else(|| RegistryError::NoSuchPlugin {
            name: name.to_string(),
            registry: location.clone(),
        })?;
        let (record, yanked) =
            release_of(log, &version).ok_or_else(|| RegistryError::NoSuchVersion {
                name: name.to_string(),
                version: version.to_string(),
            })?;
        // The catalog was read without signature checks; this release's signature is checked
        // here, before its signer is judged.
        let signer = record.signer()?;
        let verdict = session.trust.judge(
            &name,
            &version,
            &location,
            signer.as_ref(),
            options.allow_unverified,
        )?;
        let release = record
            .release
            .clone()
            .ok_or_else(|| RegistryError::Internal("release without body".into()))?;
        manifest_of(&name, record)?;
        if release.kind == PluginKind::Native && !options.allow_native {
            return Err(RegistryError::NativeNeedsConsent {
                name: name.to_string(),
                version: version.to_string(),
            });
        }
        let previous = locked.get(&name).cloned();
        let installed_same = previous.as_ref() == Some(&version)
            && lock.get(&name).is_some_and(|e| e.sha256 == release.sha256);
        let code = if installed_same {
            Vec::new()
        } else {
            if let Some(tell) = options.on_download {
                tell(&name, &version, release.size);
            }
            let bytes = session.registry.read_blob(&name, &release.sha256)?;
            let actual = sha256_hex(&bytes);
            if actual != release.sha256 || bytes.len() as u64 != release.size {
                return Err(RegistryError::BlobMismatch {
                    name: name.to_string(),
                    version: version.to_string(),
                    expected: release.sha256.clone(),
                    actual,
                });
            }
            bytes
        };
        plugins.push(PlannedPlugin {
            verified: matches!(verdict, Verdict::Trusted(_)),
            name,
            version,
            previous,
            yanked,
            release,
            signer,
            code,
        });
    }

    let mut new_lock = Lockfile {
        plugins: lock
            .plugins
            .iter()
            .filter(|e| e.registry != location)
            .cloned()
            .collect(),
        ..Lockfile::default()
    };
    for p in &plugins {
        new_lock.plugins.push(LockEntry {
            name: p.name.clone(),
            version: p.version.clone(),
            registry: location.clone(),
            kind: p.release.kind,
            sha256: p.release.sha256.clone(),
            manifest_sha256: sha256_hex(p.release.manifest.as_bytes()),
            capabilities: capability_digest(p.release.kind, &p.release.capabilities),
            key: p.signer.map(|k| k.to_string()).filter(|_| p.verified),
            unverified: !p.verified,
            native_consent: p.release.kind == PluginKind::Native,
        });
    }
    new_lock.plugins.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(InstallPlan {
        registry: location,
        plugins,
        lock: new_lock,
    })
}

/// The directory of an installed plugin.
pub fn installed_dir(home: &Home, name: &PluginName, version: &Version) -> PathBuf {
    home.plugins_dir()
        .join(name.namespace())
        .join(name.name())
        .join(version.to_string())
}

/// Write the plan's new and changed plugins (code, then manifest, each by temp file and
/// rename), then the lockfile; the lockfile is the commit point.
///
/// All of it runs under the lock on `keel.lock`, which every writer of the lockfile and of
/// `plugins/` holds: the lockfile is read again under it and only this plan's plugins are
/// changed in it, so installs running at once all keep their entries; temp files a killed
/// install left under `plugins/` are removed first.
pub fn apply_install(home: &Home, plan: &InstallPlan) -> Result<(), RegistryError> {
    let lock_path = home.lock_path();
    let _lock = lock_for_update(&lock_path).map_err(|e| RegistryError::io(&lock_path, e))?;
    remove_stale_temps_under(&home.plugins_dir());
    let mut lock = Lockfile::load(&lock_path)?;
    for p in plan.changes() {
        let dir = installed_dir(home, &p.name, &p.version);
        let code = dir.join(installed_code_name(p.release.kind));
        atomic_write(&code, &p.code, false).map_err(|e| RegistryError::io(&code, e))?;
        let manifest = dir.join("keel.toml");
        atomic_write(&manifest, p.release.manifest.as_bytes(), false)
            .map_err(|e| RegistryError::io(&manifest, e))?;
    }
    // The plan's entries for what it changed win; an unchanged plugin keeps the entry on disk
    // (another install may have moved it on since this plan was made), or the plan's when
    // the lockfile lost it.
    for entry in &plan.lock.plugins {
        let changed = plan.changes().any(|p| p.name == entry.name);
        match lock.plugins.iter_mut().find(|e| e.name == entry.name) {
            Some(kept) if changed => *kept = entry.clone(),
            Some(_) => {}
            None => lock.plugins.push(entry.clone()),
        }
    }
    lock.save(&lock_path)?;
    for p in plan.changes() {
        if let Some(old) = &p.previous {
            let still_locked = lock
                .plugins
                .iter()
                .any(|e| e.name == p.name && &e.version == old);
            if !still_locked {
                let _ = std::fs::remove_dir_all(installed_dir(home, &p.name, old));
            }
        }
    }
    Ok(())
}

/// An installed plugin whose files matched the lockfile.
#[derive(Debug, Clone)]
pub struct InstalledPlugin {
    /// Its lockfile entry.
    pub entry: LockEntry,
    /// Its directory.
    pub dir: PathBuf,
    /// Its parsed manifest.
    pub manifest: Manifest,
    /// The verified component bytes (WebAssembly plugins); native plugins load from `dir`.
    pub component: Option<Vec<u8>>,
}

/// Every plugin the lockfile lists, re-hashed against it: the manifest, the code and the
/// capability digest must all match, or loading is refused with both hashes.
pub fn load_installed(home: &Home) -> Result<Vec<InstalledPlugin>, RegistryError> {
    let lock = Lockfile::load(&home.lock_path())?;
    let mut out = Vec::new();
    for entry in lock.plugins {
        let dir = installed_dir(home, &entry.name, &entry.version);
        let mismatch =
            |file: &Path, expected: &str, actual: String| RegistryError::InstalledMismatch {
                name: entry.name.to_string(),
                version: entry.version.to_string(),
                file: file.display().to_string(),
                expected: expected.to_owned(),
                actual,
            };
        let manifest_path = dir.join("keel.toml");
        let missing = |path: &Path, e: std::io::Error| RegistryError::Io {
            what: path.display().to_string(),
            reason: format!(
                "{e}; the lockfile lists {}@{} as installed; run `keel install {}@={}` to restore it",
                entry.name, entry.version, entry.name, entry.version
            ),
        };
        let manifest_text =
            std::fs::read(&manifest_path).map_err(|e| missing(&manifest_path, e))?;
        let actual = sha256_hex(&manifest_text);
        if actual != entry.manifest_sha256 {
            return Err(mismatch(&manifest_path, &entry.manifest_sha256, actual));
        }
        let manifest = Manifest::parse(&String::from_utf8_lossy(&manifest_text), &manifest_path)
            .map_err(|e| RegistryError::Corrupt {
                what: manifest_path.display().to_string(),
                reason: e.to_string(),
            })?;
        let digest = capability_digest(manifest.kind, &manifest.capabilities);
        if digest != entry.capabilities {
            return Err(mismatch(&manifest_path, &entry.capabilities, digest));
        }
        let code_path = dir.join(installed_code_name(manifest.kind));
        let code = std::fs::read(&code_path).map_err(|e| missing(&code_path, e))?;
        let actual = sha256_hex(&code);
        if actual != entry.sha256 {
            return Err(mismatch(&code_path, &entry.sha256, actual));
        }
        let component = (manifest.kind == PluginKind::Wasm).then_some(code);
        out.push(InstalledPlugin {
            entry,
            dir,
            manifest,
            component,
        });
    }
    Ok(out)
}
