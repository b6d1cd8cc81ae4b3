//! A registry shared by `keel registry serve`, reached over HTTP.
//!
//! The server is storage only: every index the client receives is checked (chain,
//! signatures, rollback) and every blob re-hashed, exactly as for a local directory.

use std::time::Duration;

use crate::RegistryError;
use crate::index::IndexLog;
use crate::local::{RegistryConfig, Step};
use crate::name::PluginName;
use crate::record::Record;

/// Attempts at appending when other publishers keep appending first.
const APPEND_ATTEMPTS: usize = 50;

/// What keel reads of each answer at most, whatever the server says (it may be hostile): the
/// configuration is a few fields; an index or the list of plugins is a few KiB a record
/// (as for OCI registries); a blob is bounded by keel's own limit, never the server's; an
/// error or a publish's answer is a message.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
const MAX_INDEX_BYTES: u64 = 16 * 1024 * 1024;
const MAX_ERROR_BYTES: u64 = 64 * 1024;
/// The most of a server's message keel shows.
const MAX_MESSAGE_CHARS: usize = 300;

/// A server's `text` as keel shows it: control characters (escape sequences) gone, cut short.
fn clean(text: &str) -> String {
    crate::oci::display_clean(text, MAX_MESSAGE_CHARS)
}

/// An HTTP registry client.
#[derive(Debug, Clone)]
pub struct RemoteRegistry {
    base: String,
    client: reqwest::blocking::Client,
}

impl RemoteRegistry {
    /// A client for the registry at `url` (`http://127.0.0.1:PORT`).
    pub fn new(url: &str) -> Result<RemoteRegistry, RegistryError> {
        let parsed = url::Url::parse(url).map_err(|e| RegistryError::InvalidName {
            name: url.to_owned(),
            reason: format!("not a URL ({e}); write e.g. `http://127.0.0.1:7878`"),
        })?;
        if parsed.scheme() != "http" && parsed.scheme() != "https" {
            return Err(RegistryError::InvalidName {
                name: url.to_owned(),
                reason: "a registry is a directory or an http:// URL".into(),
            });
        }
        let base = parsed.as_str().trim_end_matches('/').to_owned();
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| RegistryError::Io {
                what: format!("HTTP client for {base}"),
                reason: e.to_string(),
            })?;
        Ok(RemoteRegistry { base, client })
    }

    /// The normalized URL, which is also the registry's identity in trust bindings.
    pub fn location(&self) -> &str {
        &self.base
    }

    /// The body at `path`, read within `limit` bytes (`what` names it in the error); `None`
    /// for a 404. A larger answer is refused as it streams, a declared one before it does.
    fn get(&self, path: &str, limit: u64, what: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let url = format!("{}{path}", self.base);
        let response = self
            .client
            .get(&url)
            .send()
            .map_err(|e| self.net_error(&url, e))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(self.failure(status.as_u16(), response));
        }
        self.read_bounded(response, limit, what).map(Some)
    }

    /// `response`'s body, at most `limit` bytes.
    fn read_bounded(
        &self,
        response: reqwest::blocking::Response,
        limit: u64,
        what: &str,
    ) -> Result<Vec<u8>, RegistryError> {
        use std::io::Read as _;
        let too_large = || RegistryError::Corrupt {
            what: format!("{what} from {}", self.base),
            reason: format!(
                "larger than the {limit} bytes keel reads of one; the registry is misbehaving or \
                 hostile, and nothing of the answer was used"
            ),
        };
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        response
            .take(limit + 1)
            .read_to_end(&mut body)
            .map_err(|e| RegistryError::Io {
                what: format!("{what} from {}", self.base),
                reason: e.to_string(),
            })?;
        if body.len() as u64 > limit {
            return Err(too_large());
        }
        Ok(body)
    }

    /// The error a failing answer stands for, with at most [`MAX_ERROR_BYTES`] of its body
    /// read (and what is shown of it cleaned for the terminal).
    fn failure(&self, status: u16, response: reqwest::blocking::Response) -> RegistryError {
        use std::io::Read as _;
        let mut body = Vec::new();
        let _ = response.take(MAX_ERROR_BYTES).read_to_end(&mut body);
        RegistryError::Remote {
            url: self.base.clone(),
            status,
            message: clean(&String::from_utf8_lossy(&body)),
        }
    }

    /// Send `body`; the answer's status and (bounded, cleaned) text.
    fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(u16, String), RegistryError> {
        use std::io::Read as _;
        let url = format!("{}{path}", self.base);
        let response = self
            .client
            .request(method, &url)
            .body(body)
            .send()
            .map_err(|e| self.net_error(&url, e))?;
        let status = response.status().as_u16();
        let mut text = Vec::new();
        response
            .take(MAX_ERROR_BYTES)
            .read_to_end(&mut text)
            .map_err(|e| RegistryError::Io {
                what: url.clone(),
                reason: format!("{e}; is `keel registry serve` running there?"),
            })?;
        Ok((status, clean(&String::from_utf8_lossy(&text))))
    }

    fn net_error(&self, url: &str, e: reqwest::Error) -> RegistryError {
        RegistryError::Io {
            what: url.to_owned(),
            reason: format!(
                "{e}; is `keel registry serve` running there? check the --registry URL"
            ),
        }
    }

    /// The registry's configuration.
    pub fn config(&self) -> Result<RegistryConfig, RegistryError> {
        let bytes = self
            .get("/config", MAX_CONFIG_BYTES, "the registry's configuration")?
            .ok_or_else(|| RegistryError::NoRegistry {
                location: self.base.clone(),
            })?;
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::Corrupt {
            what: format!("{}/config", self.base),
            reason: e.to_string(),
        })
    }

    /// Every plugin with an index.
    pub fn names(&self) -> Result<Vec<PluginName>, RegistryError> {
        let bytes = self
            .get("/index", MAX_INDEX_BYTES, "the list of plugins")?
            .unwrap_or_else(|| b"[]".to_vec());
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::Corrupt {
            what: format!("{}/index", self.base),
            reason: e.to_string(),
        })
    }

    /// The raw index of `name`; empty when it has none.
    pub fn read_index(&self, name: &PluginName) -> Result<Vec<u8>, RegistryError> {
        Ok(self
            .get(&format!("/index/{name}"), MAX_INDEX_BYTES, "an index")?
            .unwrap_or_default())
    }

    /// A blob's bytes (unchecked: the caller re-hashes them).
    pub fn read_blob(&self, sha256: &str) -> Result<Vec<u8>, RegistryError> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RegistryError::Corrupt {
                what: format!("blob name `{sha256}`"),
                reason: "a blob is named by 64 hex digits".into(),
            });
        }
        self.get(
            &format!("/blobs/sha256/{sha256}"),
            RegistryConfig::default().max_blob_bytes,
            "a blob",
        )?
        .ok_or_else(|| RegistryError::MissingBlob {
            sha256: sha256.to_owned(),
            registry: self.base.clone(),
        })
    }

    /// Upload the blob (when given), then append the record `build` makes from the current
    /// log; retried when another publisher appended in between.
    pub fn append(
        &self,
        name: &PluginName,
        blob: Option<&[u8]>,
        build: &mut dyn FnMut(&IndexLog) -> Result<Record, RegistryError>,
        hook: &mut dyn FnMut(Step),
    ) -> Result<Record, RegistryError> {
        let mut uploaded = false;
        for _ in 0..APPEND_ATTEMPTS {
            let text = self.read_index(name)?;
            let log = IndexLog::parse(name, &text)?;
            let record = build(&log)?;
            if let (Some(bytes), false) = (blob, uploaded) {
                let sha = crate::fsutil::sha256_hex(bytes);
                let (status, message) = self.send(
                    reqwest::Method::PUT,
                    &format!("/blobs/sha256/{sha}"),
                    bytes.to_vec(),
                )?;
                if !(200..300).contains(&status) {
                    return Err(RegistryError::Remote {
                        url: self.base.clone(),
                        status,
                        message,
                    });
                }
                uploaded = true;
                hook(Step::BlobWritten);
            }
            let (status, message) = self.send(
                reqwest::Method::POST,
                &format!("/index/{name}"),
                record.line()?.into_bytes(),
            )?;
            match status {
                200..=299 => {
                    hook(Step::RecordAppended);
                    return Ok(record);
                }
                409 => continue,
                _ => {
                    return Err(RegistryError::Remote {
                        url: self.base.clone(),
                        status,
                        message,
                    });
                }
            }
        }
        Err(RegistryError::Conflict {
            name: name.to_string(),
        })
    }
}
