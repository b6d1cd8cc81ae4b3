//! Every refusal of the registry: what was refused, why, and the command that fixes it.

use std::path::{Path, PathBuf};

use crate::keys::PublicKey;

/// Why a registry operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A plugin, namespace or key name is malformed.
    #[error("`{name}` is not a valid name: {reason}")]
    InvalidName {
        /// What was given.
        name: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// A public key is malformed.
    #[error("`{key}` is not an ed25519 public key: {reason}; `keel key list` prints yours")]
    InvalidKey {
        /// What was given.
        key: String,
        /// Why.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{what}: {reason}")]
    Io {
        /// The file or resource.
        what: String,
        /// The OS error.
        reason: String,
    },
    /// A bug or an impossible state.
    #[error("internal error: {0}")]
    Internal(String),
    /// `keel key new` would overwrite a key.
    #[error(
        "a key named `{name}` already exists ({path}); keel never overwrites a key: choose another name with `keel key new --name NAME`"
    )]
    KeyExists {
        /// Key name.
        name: String,
        /// Its file.
        path: PathBuf,
    },
    /// The signing key does not exist.
    #[error(
        "there is no signing key `{name}` ({path}); create one with `keel key new --name {name}`"
    )]
    NoSuchKey {
        /// Key name.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A key file others can read.
    #[error("{path}: the key file is readable by other users; run `chmod 600 {path}` first")]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
    },
    /// A file of the registry or of keel's home is damaged.
    #[error("{what} is damaged: {reason}")]
    Corrupt {
        /// Which file or record.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// `keel key trust` for a namespace bound to another registry.
    #[error(
        "namespace `{namespace}` is bound to registry {bound}, not {requested}: a namespace comes from exactly one registry; run the command with `--registry {bound}`, or `keel key untrust PUBKEY --namespace {namespace}` for each of its keys first to move it"
    )]
    NamespaceBound {
        /// The namespace.
        namespace: String,
        /// Its registry.
        bound: String,
        /// The registry the command used.
        requested: String,
    },
    /// A plugin was asked of a registry its namespace is not bound to.
    #[error(
        "refused {name} from registry {registry}: its namespace is bound to registry {bound}, and keel never falls back to another registry; run the command with `--registry {bound}`"
    )]
    WrongRegistry {
        /// The plugin.
        name: String,
        /// The namespace's registry.
        bound: String,
        /// The registry asked.
        registry: String,
    },
    /// Signed by a key the user does not trust for the namespace.
    #[error(
        "refused {name}@{version}: it is signed by key {short}, which is not trusted for namespace `{namespace}`; run `keel key trust {key} --namespace {namespace}` if you trust it, or pass --allow-unverified to install it unverified (the lockfile records that)",
        short = key.short()
    )]
    UntrustedKey {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
        /// The signer.
        key: PublicKey,
        /// Its namespace.
        namespace: String,
    },
    /// An unsigned release.
    #[error(
        "refused {name}@{version}: it is not signed, so nothing shows who published it; ask the publisher to sign it (`keel publish` with a key), or pass --allow-unverified to install it unverified (the lockfile records that)"
    )]
    Unsigned {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
    },
    /// A record whose signature does not verify.
    #[error(
        "refused the index of {name}: record {seq} ({version}) has a bad signature ({reason}); the registry's index was altered after signing, and nothing from it is used; tell the registry's operator"
    )]
    BadSignature {
        /// The plugin.
        name: String,
        /// The record's version.
        version: String,
        /// The record's position.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// A log that does not extend the head seen last: rolled back or rewritten.
    #[error(
        "refused the index of {name} from {registry}: it does not extend what this machine saw before ({seen_records} records ending in {seen_head}; it now has {now_records} records with a different history), so it was rolled back or rewritten; if the registry was deliberately restored and you trust it, run `keel registry forget-head {name}`"
    )]
    Rollback {
        /// The plugin.
        name: String,
        /// The registry.
        registry: String,
        /// Records seen before.
        seen_records: u64,
        /// Hash of the last record seen before.
        seen_head: String,
        /// Records now.
        now_records: u64,
    },
    /// No registry at the location.
    #[error(
        "there is no registry at {location}; create one by publishing to it (`keel publish --registry {location}`) or with `keel registry init --registry {location}`"
    )]
    NoRegistry {
        /// The location.
        location: String,
    },
    /// A blob a record names is not stored.
    #[error("blob {sha256} is missing from registry {registry}; the publisher must publish again")]
    MissingBlob {
        /// Its hash.
        sha256: String,
        /// The registry.
        registry: String,
    },
    /// A blob over the registry's size limit.
    #[error("refused a blob of {size} bytes: the registry accepts at most {limit} bytes")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A blob whose bytes do not hash to what its record says.
    #[error(
        "refused {name}@{version}: the downloaded artifact does not match its signed record (expected sha256 {expected}, got {actual}); the registry's copy was altered or damaged, and nothing was installed; tell the registry's operator, or install from another registry you trust"
    )]
    BlobMismatch {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
        /// Hash in the signed record.
        expected: String,
        /// Hash of the bytes received.
        actual: String,
    },
    /// An installed file no longer matches the lockfile.
    #[error(
        "refused to load {name}: {file} does not match the lockfile (expected sha256 {expected}, found {actual}); it was changed after installation; run `keel install {name}@={version}` to restore it"
    )]
    InstalledMismatch {
        /// The plugin.
        name: String,
        /// Its version.
        version: String,
        /// The file.
        file: String,
        /// Hash in the lockfile.
        expected: String,
        /// Hash of the file.
        actual: String,
    },
    /// The registry refused a write for a reason given in the message.
    #[error("refused: {0}")]
    Refused(String),
    /// Someone else appended first; retry.
    #[error(
        "the index of {name} changed while publishing (another publisher appended first); run the command again"
    )]
    Conflict {
        /// The plugin.
        name: String,
    },
    /// Publishing a version that exists.
    #[error(
        "refused to publish {name}@{version}: that version is already published and versions are never replaced; raise `version` in keel.toml (and Cargo.toml), rebuild with `keel plugin build`, and publish again"
    )]
    VersionExists {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
    },
    /// A version that was never published.
    #[error("{name}@{version} was never published; `keel info {name}` lists its versions")]
    NoSuchVersion {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
    },
    /// Yanking twice.
    #[error("{name}@{version} is already yanked; nothing to do")]
    AlreadyYanked {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
    },
    /// The manifest or component failed validation.
    #[error("refused to publish {name}:\n{}\nfix these, rebuild with `keel plugin build`, and publish again", problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    InvalidPackage {
        /// The plugin.
        name: String,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// A plugin the registry does not have.
    #[error(
        "registry {registry} has no plugin {name}; `keel search TEXT --registry {registry}` lists what it has"
    )]
    NoSuchPlugin {
        /// The plugin.
        name: String,
        /// The registry.
        registry: String,
    },
    /// Resolution failed; the explanation names who needs what.
    #[error("cannot resolve the plugins to install:\n{explanation}")]
    Unresolvable {
        /// Cargo-style explanation.
        explanation: String,
    },
    /// A native plugin without explicit consent.
    #[error(
        "refused {name}@{version}: it is a native plugin, which runs outside the sandbox with your full rights; pass --allow-native if you trust its publisher with your account (it also has to be listed under [trust] native in config.toml to load)"
    )]
    NativeNeedsConsent {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
    },
    /// An HTTP registry answered with an error.
    #[error("registry {url} refused the request ({status}): {message}")]
    Remote {
        /// The URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// Its message.
        message: String,
    },
}

impl RegistryError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, e: std::io::Error) -> RegistryError {
        RegistryError::Io {
            what: path.display().to_string(),
            reason: e.to_string(),
        }
    }

    /// An unexpected serialization or similar failure.
    pub fn internal(e: impl std::fmt::Display) -> RegistryError {
        RegistryError::Internal(e.to_string())
    }
}
