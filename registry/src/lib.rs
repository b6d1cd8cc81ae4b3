//! The keel plugin registry.
//!
//! A registry is a directory (or `keel registry serve` sharing one over HTTP on loopback)
//! holding one append-only, hash-chained, signed index per plugin and content-addressed
//! blobs. Publishing validates a plugin with the kernel's own checks and signs a record that
//! covers the artifact's hash, requirements and requested capabilities; installing resolves
//! versions with PubGrub, checks every blob's hash and signature against the user's trusted
//! keys before anything is loaded, shows the capabilities requested, and writes a lockfile
//! that every later load re-checks. See `registry/README.md` for the formats and trust model.

mod error;
mod fsutil;
mod home;
mod index;
mod install;
mod keys;
mod local;
mod lockfile;
mod name;
mod oci;
mod publish;
mod record;
mod registry;
mod remote;
mod resolve;
mod serve;
mod trust;

pub use error::RegistryError;
pub use fsutil::{UpdateLock, atomic_write, lock_for_update, lock_path_for, sha256_hex};
pub use home::{Home, Session};
pub use index::{Head, Heads, IndexLog, VersionInfo};
pub use install::{
    InstallOptions, InstallPlan, InstalledPlugin, PlannedPlugin, apply_install, load_installed,
    plan_install,
};
pub use keys::{KeyPair, PublicKey};
pub use local::{LocalRegistry, REGISTRY_FORMAT, RegistryConfig, RegistryLock, Step};
pub use lockfile::{LockEntry, Lockfile};
pub use name::{PluginName, is_valid_namespace, parse_spec};
pub use oci::{Credentials, OciOptions, OciRegistry, OciUrl, parse_oci_url};
pub use publish::{
    Package, VERSION_SECTION, component_version, installed_code_name, publish, validate, yank,
};
pub use record::{Action, GENESIS, Record, Release, SIGNING_DOMAIN, ServiceReq, capability_digest};
pub use registry::Registry;
pub use remote::RemoteRegistry;
pub use resolve::{Candidate, Catalog, Request, resolve};
pub use serve::{ServeOptions, ServerHandle, check_bind_address, serve, spawn_server};
pub use trust::{NamespaceTrust, TrustConfig, Verdict};
