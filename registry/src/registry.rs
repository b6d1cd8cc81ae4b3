//! A registry wherever it is: a directory, `keel registry serve`, or an OCI registry.

use std::path::Path;

use crate::RegistryError;
use crate::index::IndexLog;
use crate::local::{LocalRegistry, Step};
use crate::name::PluginName;
use crate::oci::{OciOptions, OciRegistry};
use crate::record::Record;
use crate::remote::RemoteRegistry;

/// A registry, local or remote; both are read and written the same way.
#[derive(Debug, Clone)]
pub enum Registry {
    /// A directory.
    Local(LocalRegistry),
    /// `keel registry serve` over HTTP.
    Remote(RemoteRegistry),
    /// An OCI distribution registry.
    Oci(OciRegistry),
}

impl Registry {
    /// Open `spec`: an `oci://` URL (over TLS, with the credentials `docker login` stored),
    /// an `http://` URL or a directory (created when `create` is set).
    pub fn open(spec: &str, create: bool) -> Result<Registry, RegistryError> {
        if spec.starts_with("oci://") {
            Registry::open_oci(spec, OciOptions::default())
        } else if spec.starts_with("http://") || spec.starts_with("https://") {
            Ok(Registry::Remote(RemoteRegistry::new(spec)?))
        } else {
            Ok(Registry::Local(LocalRegistry::open(
                Path::new(spec),
                create,
            )?))
        }
    }

    /// Open the OCI registry at `url` (`oci://HOST[:PORT]/PATH`) with `options`.
    pub fn open_oci(url: &str, options: OciOptions) -> Result<Registry, RegistryError> {
        Ok(Registry::Oci(OciRegistry::new(url, options)?))
    }

    /// Its identity in trust bindings and remembered heads: the canonical directory or the
    /// normalized URL.
    pub fn location(&self) -> &str {
        match self {
            Registry::Local(r) => r.location(),
            Registry::Remote(r) => r.location(),
            Registry::Oci(r) => r.location(),
        }
    }

    /// Every plugin with an index.
    pub fn names(&self) -> Result<Vec<PluginName>, RegistryError> {
        match self {
            Registry::Local(r) => r.names(),
            Registry::Remote(r) => r.names(),
            Registry::Oci(r) => r.names(),
        }
    }

    /// The raw index of `name` (empty when none).
    pub fn read_index(&self, name: &PluginName) -> Result<Vec<u8>, RegistryError> {
        match self {
            Registry::Local(r) => r.read_index(name),
            Registry::Remote(r) => r.read_index(name),
            Registry::Oci(r) => r.read_index(name),
        }
    }

    /// The raw indexes of `names`, in order (an OCI registry reads them at once).
    pub fn read_indexes(&self, names: &[PluginName]) -> Vec<Result<Vec<u8>, RegistryError>> {
        match self {
            Registry::Oci(r) => r.read_indexes(names),
            _ => names.iter().map(|name| self.read_index(name)).collect(),
        }
    }

    /// A blob of `name`'s releases (the caller re-hashes it).
    pub fn read_blob(&self, name: &PluginName, sha256: &str) -> Result<Vec<u8>, RegistryError> {
        match self {
            Registry::Local(r) => r.read_blob(sha256),
            Registry::Remote(r) => r.read_blob(sha256),
            Registry::Oci(r) => r.read_blob(name, sha256),
        }
    }

    /// Append a record (and its blob) to `name`'s index; see [`LocalRegistry::append`].
    pub fn append(
        &self,
        name: &PluginName,
        blob: Option<&[u8]>,
        build: &mut dyn FnMut(&IndexLog) -> Result<Record, RegistryError>,
        hook: &mut dyn FnMut(Step),
    ) -> Result<Record, RegistryError> {
        match self {
            Registry::Local(r) => r.append(name, blob, build, hook),
            Registry::Remote(r) => r.append(name, blob, build, hook),
            Registry::Oci(r) => r.append(name, blob, build, hook),
        }
    }
}
