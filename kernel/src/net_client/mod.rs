//! The kernel's HTTP client: the only way a plugin reaches the network. Every request passes
//! the network gate ([`crate::gates::net_policy`]): the plugin's declared hosts, the user's
//! policy (allow / prompt / deny), every resolved address checked and the connection pinned to
//! it, redirects followed here and re-checked hop by hop, secrets placed into headers from
//! kernel-held values, and one audit line per request.

use std::path::PathBuf;
use std::time::Duration;

use crate::gates::net_policy::NetPolicy;
use crate::types::KernelError;

/// A header whose value is a kernel-held secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretHeader {
    /// The secret's name, e.g. `OPENAI_API_KEY`.
    pub secret: String,
    /// The header it goes into.
    pub header: String,
    /// Text before the value, e.g. `Bearer `.
    pub prefix: String,
}

/// An outbound request as a plugin asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// An `http` or `https` URL.
    pub url: String,
    /// Headers, as (name, value).
    pub headers: Vec<(String, String)>,
    /// Headers filled from kernel-held secrets.
    pub secret_headers: Vec<SecretHeader>,
    /// The body.
    pub body: Vec<u8>,
    /// How long to wait for the response head.
    pub timeout: Duration,
}

/// The status line and headers of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpHead {
    /// Status code; error statuses are ordinary responses.
    pub status: u16,
    /// Headers, as (name, value).
    pub headers: Vec<(String, String)>,
    /// The URL that answered, after redirects.
    pub url: String,
}

/// Kernel-held secrets by name. The values never reach a plugin, a log line or an error.
#[derive(Clone, Default)]
pub struct Secrets(std::collections::BTreeMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Secrets {
    /// No secrets.
    pub fn new() -> Self {
        Secrets::default()
    }

    /// Hold `value` under `name`. Empty values are ignored.
    pub fn insert(&mut self, name: &str, value: &str) {
        if !value.is_empty() {
            self.0.insert(name.to_owned(), value.to_owned());
        }
    }

    /// Whether a secret named `name` is held.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Every name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// Every value, for redaction.
    pub(crate) fn values(&self) -> Vec<&str> {
        self.0.values().map(String::as_str).collect()
    }
}

/// How the network gate is set up for a session.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// The user's network policy.
    pub policy: NetPolicy,
    /// Secrets requests may use.
    pub secrets: Secrets,
    /// Where audit lines are appended; `None` keeps no audit log (tests only).
    pub audit_log: Option<PathBuf>,
}

/// The kernel's HTTP client.
pub(crate) struct NetClient {
    config: NetConfig,
}

impl NetClient {
    pub(crate) fn new(config: NetConfig) -> Self {
        NetClient { config }
    }

    /// Values to redact from anything a plugin or a log could see.
    pub(crate) fn secret_values(&self) -> Vec<&str> {
        self.config.secrets.values()
    }

    /// Send `req` for `plugin`, whose manifest declares `hosts` and `secrets`.
    pub(crate) async fn send(
        &self,
        plugin: &str,
        hosts: &[String],
        secrets: &[String],
        req: HttpRequest,
        approver: &dyn crate::gates::approvals::Approver,
    ) -> Result<(u32, HttpHead), KernelError> {
        let _ = (hosts, secrets, req, approver, &self.config.policy);
        Err(KernelError::Unavailable(format!(
            "plugin `{plugin}`: the kernel's HTTP client is not available in this build"
        )))
    }

    /// The next chunk of body `id`, waiting at most `idle`.
    pub(crate) async fn next_chunk(
        &self,
        plugin: &str,
        id: u32,
        idle: Duration,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let _ = idle;
        Err(KernelError::Invalid(format!(
            "plugin `{plugin}`: no open response body {id}"
        )))
    }

    /// Release body `id`.
    pub(crate) fn close(&self, plugin: &str, id: u32) {
        let _ = (plugin, id);
    }

    /// Release every body `plugin` still holds (it was unloaded or replaced).
    pub(crate) fn close_all(&self, plugin: &str) {
        let _ = plugin;
    }
}
