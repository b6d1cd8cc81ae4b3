//! The kernel's HTTP client: the only way a plugin reaches the network. Every request passes
//! the network gate ([`crate::gates::net_policy`]): the plugin's declared hosts, the user's
//! policy (allow / prompt / deny), every resolved address checked and the connection pinned to
//! it, redirects followed here and re-checked hop by hop, secrets placed into headers from
//! kernel-held values, and one audit line per request.
//!
//! One hop of a request, in order (every refusal is a `denied` error naming what to change,
//! and an audit line):
//!
//! 1. [`NetPolicy::decide_url`]: scheme, userinfo, local names and addresses, the rules.
//! 2. The plugin's manifest must declare the host (see `declared`: exact host, `host:port`,
//!    `.suffix` for subdomains, `*` for "whatever the user's policy allows").
//! 3. A `prompt` decision asks the session's approver (tool `network`, summary
//!    `METHOD host:port (plugin ...)`) on a blocking thread; "session" (or "always") is
//!    remembered for that plugin and host until the session ends, "once" is not, "deny"
//!    refuses.
//! 4. The host is resolved here, every address goes through
//!    [`NetPolicy::check_resolved`], and the connection is pinned to the checked address:
//!    the per-request reqwest client gets `resolve_to_addrs(host, checked)` *and* a resolver
//!    that answers every name with the checked addresses, so no second lookup can happen. The
//!    address `check_resolved` returns is tried first, the answer's other (equally checked)
//!    addresses after it.
//! 5. The audit line is written (an allowed request whose line cannot be written is not sent).
//!
//! Redirects are not followed by reqwest: a 3xx with `Location` goes through
//! [`NetPolicy::check_redirect`] (at most [`crate::gates::net_policy::MAX_REDIRECTS`] hops) and
//! then the whole hop above again. Secret headers (and `authorization`, `cookie`, `x-api-key`)
//! are dropped once a redirect leaves the origin the plugin asked for.
//!
//! Secrets: a secret header needs the secret listed in the manifest's `secrets` and held in
//! [`Secrets`]; the header is marked sensitive, and every error, log line, audit line,
//! returned header and URL is passed through [`redact::redact`] with the secret values.
//!
//! Responses: any status is a response (an API's error body is the plugin's diagnostic). The
//! head must arrive within the request's timeout; the body is kept under an id per plugin (at
//! most `MAX_OPEN_BODIES` open at once) and read with [`NetClient::next_chunk`] in pieces of at
//! most 64 KiB: `timed-out` when nothing arrives within the idle time, `unavailable`
//! ("connection dropped ...") on a transport error mid-body, `None` at the end. A timeout of
//! 0 ms means the default of 120 s.

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::gates::approvals::{Answer, ApprovalRequest, Approver};
use crate::gates::net_policy::{
    AuditRecord, NetCheck, NetDecision, NetPolicy, audit_line, resolve_location, rfc3339_utc,
};
use crate::gates::redact;
use crate::types::KernelError;

mod bodies;
mod declared;
mod request_buffers;
pub use declared::declares as host_declared;
#[cfg(test)]
mod tests;

use bodies::{Bodies, MAX_OPEN_BODIES};
use request_buffers::RequestBuffers;

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
    /// The body ([`NetClient::request_body`] copies a plugin's into a reused buffer).
    pub body: bytes::Bytes,
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

/// Kernel-held secrets by name, each bound to the hosts it is for. The values never reach a
/// plugin, a log line or an error; a secret goes only into a request to one of its hosts.
#[derive(Clone, Default)]
pub struct Secrets(std::collections::BTreeMap<String, HeldSecret>);

#[derive(Clone)]
struct HeldSecret {
    value: String,
    /// Host patterns, read like a manifest's `network` entries (`api.example.com`,
    /// `127.0.0.1:11434`, `.example.com`, `*`). Empty: the secret goes nowhere.
    hosts: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, held)| (name, &held.hosts)))
            .finish()
    }
}

impl Secrets {
    /// No secrets.
    pub fn new() -> Self {
        Secrets::default()
    }

    /// Hold `value` under `name`, to be sent only to `hosts` (patterns as in a manifest's
    /// `network` list). Empty values are ignored; a secret held again gets the new value and
    /// the union of both bindings.
    pub fn insert(&mut self, name: &str, value: &str, hosts: &[String]) {
        if value.is_empty() {
            return;
        }
        let held = self.0.entry(name.to_owned()).or_insert_with(|| HeldSecret {
            value: String::new(),
            hosts: Vec::new(),
        });
        held.value = value.to_owned();
        for host in hosts {
            if !held.hosts.contains(host) {
                held.hosts.push(host.clone());
            }
        }
    }

    /// Whether a secret named `name` is held.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The hosts the secret `name` is bound to (empty when it is not held).
    pub fn hosts(&self, name: &str) -> &[String] {
        self.0.get(name).map_or(&[], |h| &h.hosts)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(|h| h.value.as_str())
    }

    /// Every name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// Every value, for redaction.
    pub(crate) fn values(&self) -> Vec<&str> {
        self.0.values().map(|h| h.value.as_str()).collect()
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

/// How long `send` waits for a response head when the plugin asks for 0 ms.
const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(120);

/// How long resolving a sandboxed command's host may take.
const DEFAULT_RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `next_chunk` waits when the plugin asks for 0 ms.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Largest request body a plugin may send.
const MAX_REQUEST_BODY: usize = 32 * 1024 * 1024;

/// Headers a plugin may not set: the kernel derives them from the URL and the body.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "proxy-authorization",
];

/// Headers dropped when a redirect leaves the origin the plugin asked for (besides the
/// secret headers, which are always dropped then).
const CREDENTIAL_HEADERS: &[&str] = &["authorization", "cookie", "x-api-key"];

/// A resolver that answers every name with the addresses the gate checked. The client also
/// gets a `resolve_to_addrs(host, addrs)` override for the URL's host; this catches any other
/// spelling of a name (a trailing dot, say) so the system resolver is never asked.
struct Pinned(Vec<SocketAddr>);

impl reqwest::dns::Resolve for Pinned {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs = self.0.clone();
        Box::pin(async move {
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// A hop the gate let through: where to connect.
struct Admitted {
    /// The normalized host (`api.example.com`, `127.0.0.1`, `[::1]`).
    host: String,
    /// The host without IPv6 brackets, as a resolver sees it.
    bare: String,
    /// The port.
    port: u16,
    /// The checked addresses the connection is pinned to, the one `check_resolved` chose
    /// first. Every address of the answer passed the check (one forbidden address refuses
    /// the whole answer), so falling back to the others is safe — `localhost` may answer
    /// `::1` first while the server listens on `127.0.0.1` only.
    addrs: Vec<SocketAddr>,
}

/// The kernel's HTTP client.
pub(crate) struct NetClient {
    config: NetConfig,
    bodies: Bodies,
    request_buffers: RequestBuffers,
    /// `(plugin, host)` pairs the user approved for the rest of the session.
    approved: Mutex<HashSet<(String, String)>>,
    /// Serializes appends to the audit log.
    audit: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An error's message and its causes, joined (reqwest's top-level message alone says little).
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn describe_reqwest(error: reqwest::Error) -> String {
    // Never the URL: its query may carry a key.
    describe(&error.without_url())
}

fn map_message(error: KernelError, f: impl FnOnce(String) -> String) -> KernelError {
    match error {
        KernelError::Invalid(m) => KernelError::Invalid(f(m)),
        KernelError::Conflict(m) => KernelError::Conflict(f(m)),
        KernelError::Denied(m) => KernelError::Denied(f(m)),
        KernelError::Unavailable(m) => KernelError::Unavailable(f(m)),
        KernelError::Failed(m) => KernelError::Failed(f(m)),
        KernelError::TimedOut(m) => KernelError::TimedOut(f(m)),
    }
}

fn or_default(d: Duration, default: Duration) -> Duration {
    if d.is_zero() { default } else { d }
}

impl NetClient {
    /// The `(plugin, host)` pairs approved for the rest of the session, sorted.
    pub(crate) fn approved_hosts(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<_> = lock(&self.approved).iter().cloned().collect();
        pairs.sort();
        pairs
    }

    /// Withdraws the session approval of `plugin` reaching `host`. Whether there was one.
    pub(crate) fn forget_host(&self, plugin: &str, host: &str) -> bool {
        lock(&self.approved).remove(&(plugin.to_owned(), host.to_owned()))
    }

    pub(crate) fn new(config: NetConfig) -> Self {
        NetClient {
            config,
            bodies: Bodies::default(),
            request_buffers: RequestBuffers::default(),
            approved: Mutex::new(HashSet::new()),
            audit: Mutex::new(()),
        }
    }

    /// A plugin's request body, copied out of its memory into the buffer kept for the next
    /// request ([`request_buffers`]).
    pub(crate) fn request_body(&self, body: &[u8]) -> bytes::Bytes {
        self.request_buffers.copy(body)
    }

    /// Values to redact from anything a plugin or a log could see.
    pub(crate) fn secret_values(&self) -> Vec<&str> {
        self.config.secrets.values()
    }

    /// The value of the secret `name`, for the environment of a process whose entry the person
    /// configured with it (`[mcp.servers.NAME] env`); never for a plugin.
    pub(crate) fn secret_value(&self, name: &str) -> Option<&str> {
        self.config.secrets.get(name)
    }

    fn redact(&self, text: &str) -> String {
        redact::redact(text, &self.secret_values())
    }

    /// Append one line to the audit log. An allowed request whose line cannot be written is
    /// not sent (fail closed); a refusal is refused anyway, so its write error is only logged.
    fn audit(
        &self,
        plugin: &str,
        host: &str,
        decision: NetDecision,
        reason: &str,
    ) -> Result<(), KernelError> {
        let Some(path) = &self.config.audit_log else {
            return Ok(());
        };
        let record = AuditRecord {
            time: rfc3339_utc(SystemTime::now()),
            plugin: plugin.to_owned(),
            host: self.redact(host),
            decision,
            reason: self.redact(reason),
        };
        let mut line = audit_line(&record);
        line.push('\n');
        let _guard = lock(&self.audit);
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let written = options
            .open(path)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        match written {
            Ok(()) => Ok(()),
            Err(e) => {
                let message = format!(
                    "cannot append to the network audit log {}: {e}; the request was not sent. \
                     Check that the directory exists and is writable",
                    path.display()
                );
                tracing::warn!(plugin, "{message}");
                if decision == NetDecision::Forbid {
                    Ok(())
                } else {
                    Err(KernelError::Unavailable(message))
                }
            }
        }
    }

    /// Record a refusal in the audit log and turn it into the plugin's error.
    fn refuse(&self, plugin: &str, host: &str, reason: &str, message: String) -> KernelError {
        let _ = self.audit(plugin, host, NetDecision::Forbid, reason);
        tracing::info!(
            plugin,
            host,
            "network request refused: {}",
            self.redact(&message)
        );
        KernelError::Denied(message)
    }

    /// Send `req` for `plugin`, whose manifest declares `hosts` and `secrets`.
    pub(crate) async fn send(
        &self,
        plugin: &str,
        hosts: &[String],
        secrets: &[String],
        req: HttpRequest,
        approver: Arc<dyn Approver>,
    ) -> Result<(u32, HttpHead), KernelError> {
        self.send_unredacted(plugin, hosts, secrets, req, approver)
            .await
            .map_err(|e| map_message(e, |m| self.redact(&m)))
    }

    async fn send_unredacted(
        &self,
        plugin: &str,
        hosts: &[String],
        secrets: &[String],
        req: HttpRequest,
        approver: Arc<dyn Approver>,
    ) -> Result<(u32, HttpHead), KernelError> {
        let mut method =
            reqwest::Method::from_bytes(req.method.trim().to_ascii_uppercase().as_bytes())
                .map_err(|_| {
                    KernelError::Invalid(format!(
                        "`{}` is not an HTTP method; use GET, POST, PUT, PATCH, DELETE or HEAD",
                        req.method.escape_default()
                    ))
                })?;
        if req.body.len() > MAX_REQUEST_BODY {
            return Err(KernelError::Invalid(format!(
                "the request body is {} bytes; at most {MAX_REQUEST_BODY} are sent",
                req.body.len()
            )));
        }
        let mut headers = self.plugin_headers(&req.headers)?;
        let secret_headers = match self.secret_headers(plugin, secrets, &req.secret_headers) {
            Ok(found) => found,
            Err(e) => {
                let host = self.config.policy.decide_url(&req.url).host;
                let _ = self.audit(plugin, &host, NetDecision::Forbid, &e.to_string());
                return Err(e);
            }
        };
        for (_, name, _) in &secret_headers {
            headers.remove(name);
        }
        if self.bodies.open_count(plugin) >= MAX_OPEN_BODIES {
            return Err(self.too_many_bodies(plugin));
        }
        let head_timeout = or_default(req.timeout, DEFAULT_HEAD_TIMEOUT);

        let mut url = req.url;
        // Shared, not copied, by each attempt (a redirect repeats it): a model request's body
        // is the whole conversation.
        let mut body = req.body;
        let mut origin: Option<(String, u16)> = None;
        let mut with_secrets = true;
        let mut hop = 0usize;
        loop {
            if let Some((host, port)) = &origin {
                let hop = self.config.policy.decide_url(&url);
                if with_secrets && (hop.host != *host || hop.port != Some(*port)) {
                    // A redirect left the origin: credentials stay behind.
                    with_secrets = false;
                    for name in CREDENTIAL_HEADERS {
                        headers.remove(*name);
                    }
                }
            }
            let carried: Vec<&str> = if with_secrets {
                secret_headers.iter().map(|(s, _, _)| s.as_str()).collect()
            } else {
                Vec::new()
            };
            let target = self
                .admit(
                    plugin,
                    hosts,
                    &carried,
                    method.as_str(),
                    &url,
                    &approver,
                    head_timeout,
                )
                .await?;
            if origin.is_none() {
                origin = Some((target.host.clone(), target.port));
            }
            let client = self.client_for(&target, head_timeout)?;
            let mut request = client
                .request(method.clone(), url.as_str())
                .headers(headers.clone())
                .body(body.clone());
            if with_secrets {
                for (_, name, value) in &secret_headers {
                    request = request.header(name.clone(), value.clone());
                }
            }
            let host = &target.host;
            let response = match tokio::time::timeout(head_timeout, request.send()).await {
                Err(_) => {
                    return Err(KernelError::TimedOut(format!(
                        "no response from `{host}` within {} ms",
                        head_timeout.as_millis()
                    )));
                }
                Ok(Err(e)) => {
                    return Err(KernelError::Unavailable(format!(
                        "the request to `{host}` failed: {}",
                        describe_reqwest(e)
                    )));
                }
                Ok(Ok(response)) => response,
            };
            let status = response.status();
            tracing::debug!(plugin, host, status = status.as_u16(), "network response");
            if status.is_redirection()
                && let Some(location) = response.headers().get(reqwest::header::LOCATION)
            {
                drop(client);
                let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
                drop(response);
                url = self.follow(plugin, &url, &location, hop)?;
                hop += 1;
                // 303 always, and 301/302 after a POST, continue as GET without a body (what
                // every HTTP client does); 307 and 308 repeat the request as it was.
                let to_get = status == reqwest::StatusCode::SEE_OTHER
                    || ((status == reqwest::StatusCode::MOVED_PERMANENTLY
                        || status == reqwest::StatusCode::FOUND)
                        && method == reqwest::Method::POST);
                if to_get && method != reqwest::Method::HEAD {
                    method = reqwest::Method::GET;
                    body = bytes::Bytes::new();
                    headers.remove(reqwest::header::CONTENT_TYPE);
                }
                continue;
            }
            let head = HttpHead {
                status: status.as_u16(),
                headers: response
                    .headers()
                    .iter()
                    .map(|(name, value)| {
                        (
                            name.as_str().to_owned(),
                            self.redact(&String::from_utf8_lossy(value.as_bytes())),
                        )
                    })
                    .collect(),
                url: self.redact(&url),
            };
            let id = self
                .bodies
                .insert(plugin, response)
                .ok_or_else(|| self.too_many_bodies(plugin))?;
            return Ok((id, head));
        }
    }

    fn too_many_bodies(&self, plugin: &str) -> KernelError {
        KernelError::Unavailable(format!(
            "plugin `{plugin}` holds {MAX_OPEN_BODIES} open response bodies, the most allowed; \
             read them to the end and close them (http.close) before sending more requests"
        ))
    }

    /// The plugin's own headers, validated.
    fn plugin_headers(&self, given: &[(String, String)]) -> Result<HeaderMap, KernelError> {
        let mut headers = HeaderMap::new();
        for (name, value) in given {
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                KernelError::Invalid(format!(
                    "`{}` is not a valid header name",
                    name.escape_default()
                ))
            })?;
            if RESERVED_HEADERS.contains(&name.as_str()) {
                return Err(KernelError::Invalid(format!(
                    "the `{name}` header is set by the kernel from the URL and body; leave it out"
                )));
            }
            // The value is not echoed: it may be a credential.
            let value = HeaderValue::from_str(value).map_err(|_| {
                KernelError::Invalid(format!(
                    "the value of header `{name}` contains characters a header cannot carry \
                     (control characters or non-ASCII)"
                ))
            })?;
            headers.append(name, value);
        }
        Ok(headers)
    }

    /// The secret headers, filled from kernel-held values and marked sensitive.
    fn secret_headers(
        &self,
        plugin: &str,
        declared: &[String],
        given: &[SecretHeader],
    ) -> Result<Vec<(String, HeaderName, HeaderValue)>, KernelError> {
        let mut out = Vec::new();
        for sh in given {
            let secret = &sh.secret;
            if !declared.iter().any(|d| d == secret) {
                return Err(KernelError::Denied(format!(
                    "plugin `{plugin}` may not use the secret `{secret}`: its keel.toml does not \
                     list it; add `secrets = [\"{secret}\"]` under [capabilities]"
                )));
            }
            let Some(value) = self.config.secrets.get(secret) else {
                return Err(KernelError::Denied(format!(
                    "secret `{secret}` is not set: set the environment variable `{secret}` \
                     before starting keel (secrets are read from the environment and never \
                     shown to plugins)"
                )));
            };
            let name = HeaderName::from_bytes(sh.header.trim().as_bytes()).map_err(|_| {
                KernelError::Invalid(format!(
                    "`{}` is not a valid header name for secret `{secret}`",
                    sh.header.escape_default()
                ))
            })?;
            if RESERVED_HEADERS.contains(&name.as_str()) {
                return Err(KernelError::Invalid(format!(
                    "the `{name}` header is set by the kernel; put secret `{secret}` into another header"
                )));
            }
            let mut value =
                HeaderValue::from_str(&format!("{}{value}", sh.prefix)).map_err(|_| {
                    KernelError::Invalid(format!(
                        "secret `{secret}` (with its prefix) contains characters a header cannot \
                     carry; check the value of the `{secret}` environment variable"
                    ))
                })?;
            value.set_sensitive(true);
            out.push((secret.clone(), name, value));
        }
        Ok(out)
    }

    /// A secret goes only to the hosts the user bound it to: a plugin that may use a key and
    /// may reach some other host still cannot send the key there. Checked on every hop that
    /// carries secrets, before anyone is asked; the refusal is audited.
    fn check_binding(
        &self,
        plugin: &str,
        secret: &str,
        host: &str,
        port: u16,
    ) -> Result<(), KernelError> {
        let hosts = self.config.secrets.hosts(secret);
        if declared::declares(hosts, host, port) {
            return Ok(());
        }
        let bound = if hosts.is_empty() {
            "no host".to_owned()
        } else {
            format!("only {}", hosts.join(", "))
        };
        Err(self.refuse(
            plugin,
            host,
            &format!("secret `{secret}` is not bound to this host"),
            format!(
                "plugin `{plugin}` may not send the secret `{secret}` to `{host}`: the secret is \
                 bound to {bound}; if it is meant for `{host}`, add the host in config.toml: \
                 [secrets] {secret} = {{ hosts = [\"{host}\"] }}"
            ),
        ))
    }

    /// Run the gate for one hop: the user's policy, the plugin's declared hosts, approval,
    /// resolution and the address check. Writes the hop's audit line. `secrets` are the
    /// secrets this hop carries.
    #[allow(clippy::too_many_arguments)]
    async fn admit(
        &self,
        plugin: &str,
        hosts: &[String],
        secrets: &[&str],
        method: &str,
        url: &str,
        approver: &Arc<dyn Approver>,
        resolve_timeout: Duration,
    ) -> Result<Admitted, KernelError> {
        // An origin the person granted this plugin alone widens the policy for this request
        // only (see `NetPolicy::with_origin_for`).
        let policy = self.config.policy.for_requester(plugin, url);
        let verdict = policy.decide_url(url);
        if let Some(refusal) = verdict.refusal() {
            return Err(self.refuse(plugin, &verdict.host, &refusal.reason, refusal.to_string()));
        }
        let host = verdict.host.clone();
        let Some(port) = verdict.port else {
            return Err(self.refuse(
                plugin,
                &host,
                "the URL has no port and its scheme has no default",
                format!("network request to {host} refused: the URL has no port"),
            ));
        };
        if !declared::declares(hosts, &host, port) {
            let default_port = url::Url::parse(url)
                .ok()
                .is_some_and(|u| u.port().is_none());
            let reason = format!("plugin `{plugin}` does not declare the host `{host}`");
            return Err(self.refuse(
                plugin,
                &host,
                &reason,
                format!(
                    "network request to {host} refused: {reason} in its keel.toml; add `{}` \
                     under [capabilities] (a `.{host}` entry covers its subdomains)",
                    declared::suggestion(&host, port, default_port)
                ),
            ));
        }
        for secret in secrets {
            self.check_binding(plugin, secret, &host, port)?;
        }
        let mut how = verdict.reason.clone();
        if verdict.decision == NetDecision::Prompt {
            let key = (plugin.to_owned(), host.clone());
            if lock(&self.approved).contains(&key) {
                how.push_str("; approved earlier in this session");
            } else {
                let request = ApprovalRequest {
                    tool: String::from("network"),
                    summary: format!("{method} {host}:{port} (plugin `{plugin}`)"),
                    key: Some(host.clone()),
                    reason: verdict.reason.clone(),
                    can_always: false,
                    preview: None,
                    requester: None,
                };
                let asker = Arc::clone(approver);
                let answer = tokio::task::spawn_blocking(move || asker.ask(&request))
                    .await
                    .unwrap_or(Answer::Deny);
                match answer {
                    Answer::Deny => {
                        let reason = format!("{}; the user declined", verdict.reason);
                        let suggestion = verdict.suggestion.clone().unwrap_or_default();
                        return Err(self.refuse(
                            plugin,
                            &host,
                            &reason,
                            format!(
                                "network request to {host} refused: the user declined it. {suggestion}"
                            ),
                        ));
                    }
                    Answer::Once => how.push_str("; approved by the user once"),
                    Answer::Session | Answer::Always => {
                        lock(&self.approved).insert(key);
                        how.push_str("; approved by the user for this session");
                    }
                }
            }
        }

        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host)
            .to_owned();
        let addrs: Vec<IpAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                let looked_up = tokio::time::timeout(
                    resolve_timeout,
                    tokio::net::lookup_host((bare.as_str(), port)),
                )
                .await;
                let found = match looked_up {
                    Err(_) => {
                        return Err(KernelError::TimedOut(format!(
                            "resolving `{host}` took longer than {} ms",
                            resolve_timeout.as_millis()
                        )));
                    }
                    Ok(Err(e)) => {
                        return Err(KernelError::Unavailable(format!(
                            "cannot resolve `{host}`: {e}; check the host name and the network"
                        )));
                    }
                    Ok(Ok(found)) => found,
                };
                let mut ips: Vec<IpAddr> = Vec::new();
                for sa in found {
                    if !ips.contains(&sa.ip()) {
                        ips.push(sa.ip());
                    }
                }
                ips
            }
        };
        let ip = policy
            .check_resolved(&host, port, &addrs)
            .map_err(|r| self.refuse(plugin, &host, &r.reason, r.to_string()))?;
        self.audit(
            plugin,
            &host,
            NetDecision::Allow,
            &format!("{how}; {method} to {ip} port {port}"),
        )?;
        tracing::debug!(plugin, host, %ip, port, "network request admitted");
        Ok(Admitted {
            host,
            bare,
            port,
            addrs: std::iter::once(ip)
                .chain(addrs.into_iter().filter(|a| *a != ip))
                .map(|a| SocketAddr::new(a, port))
                .collect(),
        })
    }

    /// Admit a connection a sandboxed command makes through keel's proxy
    /// ([`crate::sandbox::proxy`]): the same hop as a plugin's request whose manifest declares
    /// `*` (the user's policy decides, a prompt asks the person, private addresses need
    /// `allow_private`), with its audit line. The checked addresses to connect to.
    pub(crate) async fn admit_command(
        &self,
        who: &str,
        declared: &[String],
        method: &str,
        url: &str,
        approver: &Arc<dyn Approver>,
    ) -> Result<Vec<SocketAddr>, KernelError> {
        self.admit(
            who,
            declared,
            &[],
            method,
            url,
            approver,
            DEFAULT_RESOLVE_TIMEOUT,
        )
        .await
        .map(|admitted| admitted.addrs)
        .map_err(|e| map_message(e, |m| self.redact(&m)))
    }

    /// A client that connects only to the admitted address and follows no redirects.
    fn client_for(
        &self,
        target: &Admitted,
        connect_timeout: Duration,
    ) -> Result<reqwest::Client, KernelError> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(connect_timeout)
            .pool_max_idle_per_host(0)
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(Arc::new(Pinned(target.addrs.clone())));
        if target.bare.parse::<IpAddr>().is_err() {
            builder = builder.resolve_to_addrs(&target.bare, &target.addrs);
        }
        builder.build().map_err(|e| {
            KernelError::Unavailable(format!(
                "cannot set up the HTTP client: {}",
                describe_reqwest(e)
            ))
        })
    }

    /// Judge a redirect from `from` to `location` (hop `hop`, 0-based); the next URL. A
    /// target needing approval is passed on: the next hop's gate asks.
    fn follow(
        &self,
        plugin: &str,
        from: &str,
        location: &str,
        hop: usize,
    ) -> Result<String, KernelError> {
        let policy = match resolve_location(from, location) {
            Ok(next) => self.config.policy.for_requester(plugin, &next),
            Err(_) => std::borrow::Cow::Borrowed(&self.config.policy),
        };
        match policy.check_redirect(from, location, hop) {
            Ok(next) => Ok(next),
            Err(r) if r.check == NetCheck::Approval => resolve_location(from, location)
                .map_err(|r| self.refuse(plugin, &r.target, &r.reason, r.to_string())),
            Err(r) => Err(self.refuse(
                plugin,
                &r.target,
                &format!("redirect refused: {}", r.reason),
                format!("redirect refused: {r}"),
            )),
        }
    }

    /// The next chunk of body `id`, waiting at most `idle`.
    pub(crate) async fn next_chunk(
        &self,
        plugin: &str,
        id: u32,
        idle: Duration,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let Some(body) = self.bodies.get(plugin, id) else {
            return Err(KernelError::Invalid(format!(
                "plugin `{plugin}`: no open response body {id}"
            )));
        };
        let idle = or_default(idle, DEFAULT_IDLE_TIMEOUT);
        let mut body = body.lock().await;
        if let Some(bytes) = body.take_pending() {
            return Ok(Some(bytes));
        }
        if let Some(failed) = &body.failed {
            return Err(KernelError::Unavailable(failed.clone()));
        }
        let Some(response) = body.response.as_mut() else {
            return Ok(None);
        };
        match tokio::time::timeout(idle, response.chunk()).await {
            Err(_) => Err(KernelError::TimedOut(format!(
                "no data on response body {id} for {} ms",
                idle.as_millis()
            ))),
            Ok(Ok(Some(bytes))) => Ok(Some(body.hand_out(bytes.to_vec()))),
            Ok(Ok(None)) => {
                body.response = None;
                Ok(None)
            }
            Ok(Err(e)) => {
                let message = self.redact(&format!(
                    "connection dropped while reading the response body: {}",
                    describe_reqwest(e)
                ));
                body.response = None;
                body.failed = Some(message.clone());
                Err(KernelError::Unavailable(message))
            }
        }
    }

    /// Release body `id`.
    pub(crate) fn close(&self, plugin: &str, id: u32) {
        self.bodies.remove(plugin, id);
    }

    /// Release every body `plugin` still holds (it was unloaded or replaced).
    pub(crate) fn close_all(&self, plugin: &str) {
        self.bodies.remove_all(plugin);
    }
}
