//! A registry kept in an OCI distribution registry (`oci://HOST[:PORT]/PATH`): distribution,
//! zot, Harbor, GHCR, ECR, Artifactory. The storage is theirs; every check is keel's, exactly
//! as for a directory: the index assembled from the repository is parsed by [`IndexLog`]
//! (chain, order, signatures), heads are compared for rollback by the caller, and every blob
//! is re-hashed (by the client as it streams, and again by the install).
//!
//! Distribution has no conditional write, so the index is not one overwritable object.
//! Each record is claimed by a tag of its own (`keel-record-<seq>-<hash>-<claim>`, `claim`
//! random), so publishers never overwrite each other. A publisher claims the next position,
//! then lists the tags: if any other claim of that position is not withdrawn, it withdraws
//! its own (`keel-withdrawn-<hash>-<claim>`) and tries again on the new head; otherwise its
//! record has landed and it says so (`keel-landed-<hash>-<claim>`). Of two claims of one
//! position, the one listed last sees the other, so at most one lands; every publisher
//! either lands or, after its attempts, is told to retry. A claim that neither landed nor
//! was withdrawn within ten minutes was left by an interrupted publish and is passed over.
//! Readers follow the chain from the genesis hash through landed records only, so nothing is
//! built on a claim that may yet be withdrawn.

pub mod credentials;
mod distribution;
pub(crate) use distribution::display_clean;
pub mod layout;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};

use crate::RegistryError;
use crate::index::IndexLog;
use crate::local::{RegistryConfig, Step};
use crate::name::PluginName;
use crate::record::{GENESIS, Record};
pub use credentials::Credentials;
use distribution::{Distribution, WireError};

/// Attempts at appending while other publishers keep landing first.
const APPEND_ATTEMPTS: u32 = 24;
/// A claim older than this that neither landed nor was withdrawn was left by an interrupted
/// publish, and is passed over; a publisher whose own claim took half as long withdraws it.
const ABANDONED_CLAIM: Duration = Duration::from_secs(600);
/// Writes of one blob or manifest while the registry settles a concurrent one.
const WRITE_ATTEMPTS: u32 = 6;
/// Tags asked for per page, and pages read at most (a repository of keel's holds a few tags
/// per record).
const TAG_PAGE: usize = 1000;
const MAX_TAG_PAGES: usize = 200;
/// The largest tags page read: a thousand tags of the 128 characters a tag has at most, with
/// room to spare. A page is refused as it grows past this, not after it has arrived.
const MAX_TAG_PAGE_BYTES: usize = 1024 * 1024;
/// Manifests fetched at once while reading an index, and indexes read at once.
const FETCH_CONCURRENCY: usize = 16;
const INDEX_CONCURRENCY: usize = 8;
/// The largest record manifest read (a record carries its manifest text: a few KiB),
/// refused as it streams past this.
const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;
/// The most record text one index may hold, and all the indexes one search reads: a record
/// is a few KiB, so an index of thousands of releases stays far below. A registry listing
/// more is refused as the records arrive.
const MAX_INDEX_BYTES: usize = 16 * 1024 * 1024;
const MAX_INDEXES_BYTES: usize = 128 * 1024 * 1024;
/// Every operation against the registry ends within this.
const OPERATION_DEADLINE: Duration = Duration::from_secs(300);

/// How to reach an OCI registry.
#[derive(Debug, Clone, Default)]
pub struct OciOptions {
    /// Speak plain HTTP: allowed only for a loopback host.
    pub plain_http: bool,
    /// Credentials; without them, those `docker login` stored for the host, else anonymous.
    pub credentials: Option<Credentials>,
    /// A folder keeping the records read (each named by its hash and re-checked when used),
    /// so an index is read again with one listing of its tags.
    pub cache: Option<std::path::PathBuf>,
    /// A PEM certificate of a private authority the registry's certificate is signed by,
    /// trusted besides the public roots.
    pub ca_file: Option<std::path::PathBuf>,
}

/// An OCI registry client for keel's indexes and releases.
#[derive(Clone)]
pub struct OciRegistry {
    location: String,
    path: String,
    client: Arc<Distribution>,
    runtime: Arc<OwnRuntime>,
    max_blob_bytes: u64,
    cache: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for OciRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciRegistry")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// The client's own runtime (the registry API is blocking, like the directory's), shut
/// down without waiting when the last clone goes, whatever thread that is on.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The chain read from a repository.
struct Chain {
    /// The index as JSONL, from the genesis record to the last one settled.
    text: Vec<u8>,
    /// A position two landed records hold, where the chain stops.
    contested: Option<u64>,
}

/// Is `host` (without a port) this machine?
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A path component as OCI repository names allow: lowercase letters and digits, separated
/// by one `.` or `_`, `__`, or dashes.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: &u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(&b[0]) || !alnum(&b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(&b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(&b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// An `oci://HOST[:PORT][/PATH]` URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciUrl {
    /// The normalized URL: the registry's identity.
    pub location: String,
    /// `host[:port]`, as the distribution API names a registry.
    pub authority: String,
    /// The host, without its port (IPv6 in brackets).
    pub host: String,
    /// The port (443 when none is written).
    pub port: u16,
    /// The repository path under which keel's repositories live (may be empty).
    pub path: String,
}

/// Parse and normalize an `oci://HOST[:PORT][/PATH]` URL.
pub fn parse_oci_url(url: &str) -> Result<OciUrl, RegistryError> {
    let bad = |reason: String| RegistryError::InvalidName {
        name: url.to_owned(),
        reason,
    };
    let rest = url
        .strip_prefix("oci://")
        .ok_or_else(|| bad("an OCI registry is written `oci://HOST[:PORT]/PATH`".into()))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let parsed = url::Url::parse(&format!("https://{authority}/"))
        .map_err(|e| bad(format!("`{authority}` is not a host[:port] ({e})")))?;
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("the URL names no host".into()))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad(
            "credentials do not belong in the URL: name a password secret in `[registries]`, or `docker login`".into(),
        ));
    }
    let port = parsed.port().unwrap_or(443);
    let authority = match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    let path = path.trim_end_matches('/');
    if let Some(c) = path
        .split('/')
        .find(|c| !path.is_empty() && !valid_component(c))
    {
        return Err(bad(format!(
            "`{c}` is not a repository path component (lowercase letters and digits, separated by `.`, `_` or `-`)"
        )));
    }
    let location = if path.is_empty() {
        format!("oci://{authority}")
    } else {
        format!("oci://{authority}/{path}")
    };
    Ok(OciUrl {
        location,
        authority,
        host: host.to_owned(),
        port,
        path: path.to_owned(),
    })
}

/// Is `e` a registry still settling a concurrent write of the same content? Distribution's
/// filesystem storage rewrites a repository's link to a blob in place, so a manifest pushed
/// while another publisher uploads the same blob (the empty one, say) may find it missing
/// for a moment.
fn settling(e: &WireError) -> bool {
    ["BLOB_UNKNOWN", "MANIFEST_BLOB_UNKNOWN", "DIGEST_INVALID"]
        .iter()
        .any(|code| e.has_code(code))
}

/// Is `e` what distribution answers for a tag whose folder exists before its link does?
fn being_written(e: &WireError) -> bool {
    e.status().is_some_and(|status| status >= 500) || e.has_code("MANIFEST_UNKNOWN")
}

/// Run `op` until it succeeds or fails with an error `transient` does not call passing, at
/// most [`WRITE_ATTEMPTS`] times, pausing between.
async fn retrying<T, F>(
    transient: impl Fn(&WireError) -> bool,
    op: impl Fn() -> F,
) -> Result<T, WireError>
where
    F: std::future::Future<Output = Result<T, WireError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if attempt + 1 < WRITE_ATTEMPTS && transient(&e) => {
                back_off(attempt).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// A random pause before trying again, growing with the attempt.
async fn back_off(attempt: u32) {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    let ceiling = (10u64 << attempt.min(7)).min(1000);
    let ms = 5 + u64::from_le_bytes(bytes) % ceiling;
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

impl OciRegistry {
    /// A client for `url` (`oci://HOST[:PORT]/PATH`).
    pub fn new(url: &str, options: OciOptions) -> Result<OciRegistry, RegistryError> {
        let OciUrl {
            location,
            authority,
            host: bare_host,
            path,
            ..
        } = parse_oci_url(url)?;
        if options.plain_http && !is_loopback(&bare_host) {
            return Err(RegistryError::Refused(format!(
                "plain HTTP is allowed only to a registry on this machine (127.0.0.1, ::1, localhost); {location} is reached over TLS: remove `plain-http` from its [registries] entry"
            )));
        }
        let credentials = match options.credentials {
            Some(c) => Some(c),
            None => match credentials::docker_config_path() {
                Some(config) => credentials::from_docker_config(&config, &authority)?,
                None => None,
            },
        };
        let mut roots = Vec::new();
        if let Some(path) = &options.ca_file {
            let pem = std::fs::read(path).map_err(|e| RegistryError::io(path, e))?;
            let parsed = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| e.to_string());
            match parsed {
                Ok(certs) if !certs.is_empty() => roots = certs,
                other => {
                    return Err(RegistryError::Corrupt {
                        what: path.display().to_string(),
                        reason: format!(
                            "not a PEM certificate ({}); `ca-file` names the certificate of the authority that signed the registry's",
                            other.err().unwrap_or_else(|| "no certificate in it".into())
                        ),
                    });
                }
            }
        }
        let client = Distribution::new(
            &authority,
            options.plain_http,
            credentials,
            roots,
            concat!("keel/", env!("CARGO_PKG_VERSION")),
        )
        .map_err(|reason| RegistryError::Io {
            what: format!("the client of {location}"),
            reason,
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("keel-oci")
            .enable_all()
            .build()
            .map_err(|e| RegistryError::Io {
                what: format!("the client of {location}"),
                reason: e.to_string(),
            })?;
        Ok(OciRegistry {
            location,
            path,
            client: Arc::new(client),
            runtime: Arc::new(OwnRuntime(Some(runtime))),
            max_blob_bytes: RegistryConfig::default().max_blob_bytes,
            cache: options.cache,
        })
    }

    /// The normalized URL, which is also the registry's identity in trust bindings.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Run `work` to completion, bounded by [`OPERATION_DEADLINE`]; from inside another
    /// runtime, on a thread of its own.
    fn run<T>(
        &self,
        what: &str,
        work: impl std::future::Future<Output = Result<T, RegistryError>>,
    ) -> Result<T, RegistryError> {
        let Some(runtime) = self.runtime.0.as_ref() else {
            return Err(RegistryError::Internal(
                "the OCI client has shut down".into(),
            ));
        };
        let bounded = async {
            match tokio::time::timeout(OPERATION_DEADLINE, work).await {
                Ok(result) => result,
                Err(_) => Err(RegistryError::Io {
                    what: format!("{what} at {}", self.location),
                    reason: format!(
                        "no answer within {} s; is the registry overloaded or unreachable?",
                        OPERATION_DEADLINE.as_secs()
                    ),
                }),
            }
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Called from a runtime's worker (as the CLI's commands are): leave it first.
            tokio::task::block_in_place(|| runtime.block_on(bounded))
        } else {
            runtime.block_on(bounded)
        }
    }

    fn repository(&self, tail: &str) -> String {
        if self.path.is_empty() {
            tail.to_owned()
        } else {
            format!("{}/{tail}", self.path)
        }
    }

    fn plugin_repository(&self, name: &PluginName) -> String {
        self.repository(&format!("{}/{}", name.namespace(), name.name()))
    }

    fn error(&self, what: &str, e: WireError) -> RegistryError {
        let what = format!("{what} at {}", self.location);
        let denied = e
            .status()
            .is_some_and(|status| status == 401 || status == 403)
            || e.has_code("UNAUTHORIZED")
            || e.has_code("DENIED");
        match &e {
            WireError::Digest { .. } => {
                return RegistryError::Corrupt {
                    what,
                    reason: format!(
                        "the registry served bytes that do not hash to their digest ({e}): they were altered in the registry, and nothing from them is used"
                    ),
                };
            }
            WireError::TooLarge { .. } => {
                return RegistryError::Corrupt {
                    what,
                    reason: e.to_string(),
                };
            }
            _ => {}
        }
        let unreachable = matches!(&e, WireError::Transport(r) if r.is_connect() || r.is_timeout());
        let hint = if denied {
            "; the registry wants credentials keel does not have or refused them: give them in config.toml (`[registries.NAME]` with `username` and `password-secret`) or `docker login` to it"
        } else if unreachable {
            "; is the registry running and reachable? A registry on this machine without TLS needs `plain-http = true` in its [registries] entry, and one whose certificate a private authority signed needs `ca-file = \"PATH\"` (that authority's PEM certificate)"
        } else {
            ""
        };
        RegistryError::Io {
            what,
            reason: format!("{e}{hint}"),
        }
    }

    async fn push_blob(&self, repository: &str, bytes: &[u8]) -> Result<(), RegistryError> {
        let digest = format!("sha256:{}", crate::fsutil::sha256_hex(bytes));
        retrying(settling, || self.client.push_blob(repository, bytes))
            .await
            .map_err(|e| self.error(&format!("uploading {digest} to {repository}"), e))?;
        Ok(())
    }

    async fn push_manifest(
        &self,
        repository: &str,
        tag: &str,
        manifest: &[u8],
    ) -> Result<(), RegistryError> {
        retrying(settling, || {
            self.client
                .push_manifest(repository, tag, manifest, layout::MANIFEST_MEDIA_TYPE)
        })
        .await
        .map_err(|e| self.error(&format!("tagging {repository}:{tag}"), e))?;
        Ok(())
    }

    /// Every tag of `repository`; `None` when the registry does not know it.
    async fn tags(&self, repository: &str) -> Result<Option<Vec<String>>, RegistryError> {
        let mut all: Vec<String> = Vec::new();
        for _ in 0..MAX_TAG_PAGES {
            let last = all.last().cloned();
            let page = match self
                .client
                .tags_page(repository, TAG_PAGE, last.as_deref(), MAX_TAG_PAGE_BYTES)
                .await
            {
                Ok(page) => page,
                Err(e) if all.is_empty() && e.has_code("NAME_UNKNOWN") => return Ok(None),
                Err(e) => return Err(self.error(&format!("listing the tags of {repository}"), e)),
            };
            let full = page.len() >= TAG_PAGE;
            all.extend(page);
            if all.len() > TAG_PAGE * MAX_TAG_PAGES {
                // Pages longer than asked for: counted in tags, not only in pages.
                break;
            }
            if !full {
                return Ok(Some(all));
            }
        }
        Err(RegistryError::Refused(format!(
            "{repository} at {} has more than {} tags; keel reads no further",
            self.location,
            TAG_PAGE * MAX_TAG_PAGES
        )))
    }

    /// The record a claim's tag names, checked against its tag.
    async fn record(
        &self,
        repository: &str,
        seq: u64,
        hash: &str,
        tag: &str,
    ) -> Result<(u64, String, Record), RegistryError> {
        let what = format!("{}/{repository}:{tag}", self.location);
        let cached = self.cached_record(hash);
        if let Some(line) = cached {
            let record = Record::parse_line(&line, &what)?;
            if record.seq == seq {
                return Ok((seq, line, record));
            }
        }
        // A tag listed while its publisher is still writing it reads as unknown or as a
        // server error for a moment.
        let manifest = retrying(
            |e| settling(e) || being_written(e),
            || {
                self.client.manifest(
                    repository,
                    tag,
                    layout::MANIFEST_MEDIA_TYPE,
                    MAX_MANIFEST_BYTES,
                )
            },
        )
        .await
        .map_err(|e| self.error(&format!("reading {repository}:{tag}"), e))?;
        let corrupt = |reason: &str| RegistryError::Corrupt {
            what: what.clone(),
            reason: reason.to_owned(),
        };
        let line = layout::record_line(&manifest)
            .ok_or_else(|| corrupt("the manifest carries no keel record"))?;
        if Record::hash_line(&line) != hash {
            return Err(corrupt(
                "the record does not hash to its tag: it was altered in the registry; nothing from this index is used",
            ));
        }
        let record = Record::parse_line(&line, &what)?;
        if record.seq != seq {
            return Err(corrupt("the record's position differs from its tag's"));
        }
        self.cache_record(hash, &line);
        Ok((seq, line, record))
    }

    /// A record line kept from an earlier read, if it still hashes to `hash` (so a cache
    /// someone edited is simply not used).
    fn cached_record(&self, hash: &str) -> Option<String> {
        let path = self.cache.as_ref()?.join(&hash[..2]).join(hash);
        let line = std::fs::read_to_string(path).ok()?;
        (Record::hash_line(&line) == hash).then_some(line)
    }

    /// Keep a checked record line: a record never changes, as its tag names its hash.
    fn cache_record(&self, hash: &str, line: &str) {
        if let Some(cache) = &self.cache {
            let dir = cache.join(&hash[..2]);
            let kept = std::fs::create_dir_all(&dir).and_then(|()| {
                crate::fsutil::atomic_write(&dir.join(hash), line.as_bytes(), false)
            });
            if let Err(e) = kept {
                tracing::debug!("not caching record {hash}: {e}");
            }
        }
    }

    /// The index of `name` as stored: its landed records, chained from genesis.
    async fn chain(&self, name: &PluginName) -> Result<Chain, RegistryError> {
        let repository = self.plugin_repository(name);
        let tags = self.tags(&repository).await?.unwrap_or_default();
        let landed: HashSet<&str> = tags
            .iter()
            .filter_map(|t| layout::parse_landed_tag(t))
            .collect();
        let claims: Vec<(layout::Claim<'_>, &str)> = tags
            .iter()
            .filter_map(|t| Some((layout::parse_record_tag(t)?, t.as_str())))
            .filter(|(c, _)| landed.contains(c.id))
            .collect();
        let mut fetched = futures::stream::iter(claims)
            .map(|(c, tag)| self.record(&repository, c.seq, c.hash, tag))
            .buffer_unordered(FETCH_CONCURRENCY);
        let mut records: Vec<(u64, String, Record)> = Vec::new();
        let mut total = 0;
        while let Some(record) = fetched.try_next().await? {
            total += record.1.len();
            if total > MAX_INDEX_BYTES {
                return Err(RegistryError::Corrupt {
                    what: format!("the index of {name} at {}", self.location),
                    reason: format!(
                        "its records add up to more than {} MiB, more than keel reads of one index; the registry is misbehaving or hostile, and nothing from this index is used",
                        MAX_INDEX_BYTES >> 20
                    ),
                });
            }
            records.push(record);
        }
        let mut by_seq: BTreeMap<u64, Vec<(String, Record)>> = BTreeMap::new();
        for (seq, line, record) in records {
            by_seq.entry(seq).or_default().push((line, record));
        }
        let mut text = Vec::new();
        let mut prev = GENESIS.to_owned();
        let mut contested = None;
        for seq in 0u64.. {
            let candidates: Vec<&(String, Record)> = by_seq
                .get(&seq)
                .map(|c| c.iter().filter(|(_, r)| r.prev == prev).collect())
                .unwrap_or_default();
            match candidates.as_slice() {
                [] => break,
                [(line, _)] => {
                    text.extend_from_slice(line.as_bytes());
                    text.push(b'\n');
                    prev = Record::hash_line(line);
                }
                _ => {
                    contested = Some(seq);
                    break;
                }
            }
        }
        Ok(Chain { text, contested })
    }

    /// The index of `name` as JSONL, up to a position two landed records hold.
    async fn index(&self, name: &PluginName) -> Result<Vec<u8>, RegistryError> {
        let chain = self.chain(name).await?;
        if let Some(seq) = chain.contested {
            tracing::warn!(%name, seq, registry = %self.location, "two records are marked landed at one position; reading the index up to it");
        }
        Ok(chain.text)
    }

    /// Every plugin the registry's catalog names.
    pub fn names(&self) -> Result<Vec<PluginName>, RegistryError> {
        self.run("listing plugins", async {
            let tags = self
                .tags(&self.repository(layout::CATALOG_REPOSITORY))
                .await?
                .unwrap_or_default();
            let mut names: Vec<PluginName> = tags
                .iter()
                .filter_map(|t| layout::parse_catalog_tag(t))
                .collect();
            names.sort();
            names.dedup();
            Ok(names)
        })
    }

    /// The index of `name` as JSONL (empty when it has none), up to a position where two
    /// records are marked landed (which keel never does: the registry's storage was altered,
    /// and a client that saw further refuses it as a rollback).
    pub fn read_index(&self, name: &PluginName) -> Result<Vec<u8>, RegistryError> {
        self.run(&format!("reading the index of {name}"), self.index(name))
    }

    /// The indexes of `names`, in order, several read at once.
    pub fn read_indexes(&self, names: &[PluginName]) -> Vec<Result<Vec<u8>, RegistryError>> {
        let read = self.run("reading the indexes", async {
            let mut read = futures::stream::iter(names)
                .map(|name| self.index(name))
                .buffered(INDEX_CONCURRENCY);
            let mut indexes = Vec::new();
            let mut total = 0;
            while let Some(index) = read.next().await {
                if let Ok(text) = &index {
                    total += text.len();
                }
                if total > MAX_INDEXES_BYTES {
                    break;
                }
                indexes.push(index);
            }
            drop(read);
            // What is left unread past the budget is an error of its own, per index.
            for name in &names[indexes.len()..] {
                indexes.push(Err(RegistryError::Refused(format!(
                    "the index of {name} at {} was not read: the indexes read before it add up to more than {} MiB, more than keel reads in one go",
                    self.location,
                    MAX_INDEXES_BYTES >> 20
                ))));
            }
            Ok(indexes)
        });
        match read {
            Ok(indexes) => indexes,
            // Only the deadline fails the whole read; every index shares its error.
            Err(e) => {
                let reason = e.to_string();
                names
                    .iter()
                    .map(|name| {
                        Err(RegistryError::Io {
                            what: format!("the index of {name}"),
                            reason: reason.clone(),
                        })
                    })
                    .collect()
            }
        }
    }

    /// A blob of `name`'s repository, verified against its digest as it streams (a registry
    /// serving other bytes is refused) and bounded in size.
    pub fn read_blob(&self, name: &PluginName, sha256: &str) -> Result<Vec<u8>, RegistryError> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RegistryError::Corrupt {
                what: format!("blob name `{sha256}`"),
                reason: "a blob is named by 64 hex digits".into(),
            });
        }
        let repository = self.plugin_repository(name);
        self.run(&format!("downloading {name}"), async {
            let digest = format!("sha256:{sha256}");
            match self
                .client
                .blob(&repository, sha256, self.max_blob_bytes)
                .await
            {
                Ok(blob) => Ok(blob),
                Err(e) if e.has_code("BLOB_UNKNOWN") || e.has_code("NAME_UNKNOWN") => {
                    Err(RegistryError::MissingBlob {
                        sha256: sha256.to_owned(),
                        registry: self.location.clone(),
                    })
                }
                Err(e) => Err(self.error(&format!("downloading {digest} of {name}"), e)),
            }
        })
    }

    /// Was `claim` left by a publish that was interrupted before it landed or withdrew it?
    /// Its record was signed more than [`ABANDONED_CLAIM`] ago (by its publisher's clock);
    /// a claim that cannot be read counts as live.
    async fn abandoned(&self, repository: &str, claim: layout::Claim<'_>, tag: &str) -> bool {
        match self.record(repository, claim.seq, claim.hash, tag).await {
            Ok((_, _, record)) => {
                crate::record::now().saturating_sub(record.time) >= ABANDONED_CLAIM.as_secs()
            }
            Err(_) => false,
        }
    }

    /// Put `name` in the catalog (idempotent: the tag names the plugin).
    async fn catalog(&self, name: &PluginName) -> Result<(), RegistryError> {
        let repository = self.repository(layout::CATALOG_REPOSITORY);
        self.push_blob(&repository, layout::EMPTY_BLOB).await?;
        self.push_manifest(
            &repository,
            &layout::catalog_tag(name),
            &layout::catalog_manifest(name),
        )
        .await
    }

    /// Upload the blob (when given), then add the record `build` makes from the current
    /// index: see the module's comment for how racing publishers are settled.
    pub fn append(
        &self,
        name: &PluginName,
        blob: Option<&[u8]>,
        build: &mut dyn FnMut(&IndexLog) -> Result<Record, RegistryError>,
        hook: &mut dyn FnMut(Step),
    ) -> Result<Record, RegistryError> {
        let repository = self.plugin_repository(name);
        self.run(&format!("publishing to {name}"), async {
            self.catalog(name).await?;
            self.push_blob(&repository, layout::EMPTY_BLOB).await?;
            if let Some(code) = blob {
                self.push_blob(&repository, code).await?;
                hook(Step::BlobWritten);
            }
            for attempt in 0..APPEND_ATTEMPTS {
                let chain = self.chain(name).await?;
                if let Some(seq) = chain.contested {
                    return Err(RegistryError::Corrupt {
                        what: format!("the index of {name} at {}", self.location),
                        reason: format!(
                            "two records are marked landed at position {seq}, which keel never writes: the registry's storage was altered. Restore it from a backup; nothing was published"
                        ),
                    });
                }
                let log = IndexLog::parse(name, &chain.text)?;
                let record = build(&log)?;
                let built = std::time::Instant::now();
                let line = record.line()?;
                let hash = Record::hash_line(&line);
                let release = match blob {
                    Some(code) => {
                        let blobs = layout::release_blobs(&record, code);
                        self.push_blob(&repository, &blobs.config.1).await?;
                        Some((blobs, code))
                    }
                    None => None,
                };
                let manifest = layout::record_manifest(
                    &record,
                    &line,
                    release.as_ref().map(|(b, code)| (b, *code)),
                );
                let claim = {
                    let mut bytes = [0u8; 8];
                    getrandom::fill(&mut bytes).map_err(RegistryError::internal)?;
                    hex::encode(bytes)
                };
                self.push_manifest(
                    &repository,
                    &layout::record_tag(record.seq, &hash, &claim),
                    &manifest,
                )
                .await?;
                hook(Step::Claimed);
                let tags = self.tags(&repository).await?.unwrap_or_default();
                let withdrawn: HashSet<&str> = tags
                    .iter()
                    .filter_map(|t| layout::parse_withdrawn_tag(t))
                    .collect();
                let mine = format!("{hash}-{claim}");
                let mut live_rival = false;
                for (rival, tag) in tags.iter().filter_map(|t| {
                    let c = layout::parse_record_tag(t)?;
                    (c.seq == record.seq && c.id != mine && !withdrawn.contains(c.id))
                        .then_some((c, t.as_str()))
                }) {
                    if self.abandoned(&repository, rival, tag).await {
                        tracing::warn!(%name, tag, "passing over a claim an interrupted publish left");
                    } else {
                        live_rival = true;
                        break;
                    }
                }
                // A claim this slow could be taken for abandoned by another publisher.
                let in_time = built.elapsed() < ABANDONED_CLAIM / 2;
                if !live_rival && in_time {
                    self.push_manifest(&repository, &layout::landed_tag(&hash, &claim), &manifest)
                        .await?;
                    if release.is_some() {
                        self.push_manifest(
                            &repository,
                            &layout::version_tag(&record.version),
                            &manifest,
                        )
                        .await?;
                    }
                    hook(Step::RecordAppended);
                    return Ok(record);
                }
                self.push_manifest(&repository, &layout::withdrawn_tag(&hash, &claim), &manifest)
                    .await?;
                back_off(attempt).await;
            }
            Err(RegistryError::Conflict {
                name: name.to_string(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalized_and_bad_ones_explained() -> Result<(), RegistryError> {
        let url = parse_oci_url("oci://Registry.Example.com:5000/team/keel/")?;
        assert_eq!(url.location, "oci://registry.example.com:5000/team/keel");
        assert_eq!(url.authority, "registry.example.com:5000");
        assert_eq!(url.path, "team/keel");
        assert_eq!(parse_oci_url("oci://127.0.0.1:5000")?.path, "");
        let parsed = parse_oci_url("oci://[::1]:5000/k")?;
        assert_eq!(parsed.authority, "[::1]:5000");
        assert_eq!((parsed.host.as_str(), parsed.port), ("[::1]", 5000));
        assert_eq!(parse_oci_url("oci://r.example/k")?.port, 443);
        for bad in [
            "http://r.example/x",
            "oci:///x",
            "oci://u:p@r.example/x",
            "oci://r.example/Team",
            "oci://r.example/a//b",
            "oci://r.example/-a",
        ] {
            assert!(parse_oci_url(bad).is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn plain_http_is_refused_off_this_machine() {
        let plain = OciOptions {
            plain_http: true,
            credentials: Some(Credentials {
                username: "u".into(),
                password: "p".into(),
            }),
            ..OciOptions::default()
        };
        let err = OciRegistry::new("oci://registry.example.com/k", plain.clone())
            .expect_err("a remote host over plain HTTP");
        assert!(err.to_string().contains("plain HTTP"), "{err}");
        for local in [
            "oci://127.0.0.1:5000/k",
            "oci://localhost:5000",
            "oci://[::1]:1/k",
        ] {
            assert!(OciRegistry::new(local, plain.clone()).is_ok(), "{local}");
        }
    }
}
