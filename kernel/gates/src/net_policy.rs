//! The network policy gate: decides whether an outbound HTTP request a plugin makes may go out
//! (Allow), needs the user's approval (Prompt), or must not go out at all (Forbid).
//!
//! This module is pure: it parses URLs and judges host names and addresses, but it never
//! resolves a name, opens a connection or writes a file. The HTTP client that uses it, and the
//! append-only audit log writer, live elsewhere. The client is expected to:
//!
//! 1. call [`NetPolicy::decide_url`] before anything else, refuse on [`NetDecision::Forbid`] and
//!    ask the user on [`NetDecision::Prompt`];
//! 2. resolve the host itself, pass *every* answer to [`NetPolicy::check_resolved`] and connect
//!    only to the address it returns (DNS pinning: a second resolution at connect time could
//!    point somewhere else);
//! 3. follow redirects by hand, passing each `Location` to [`NetPolicy::check_redirect`]
//!    (at most [`MAX_REDIRECTS`] hops, every hop re-checked from step 1);
//! 4. hand an HTTP error status (4xx, 5xx) back to the plugin as a normal response with its
//!    body rather than as a failure: an API's error body is the plugin's best diagnostic;
//! 5. write one [`audit_line`] per request to the audit log.
//!
//! # Decisions
//!
//! Rules map a host pattern to `allow`, `prompt` or `deny`. A pattern `example.com` covers
//! exactly that host; `.example.com` covers every subdomain (`api.example.com`,
//! `a.b.example.com`) but *not* the bare `example.com` — to cover both, list both. When several
//! rules match, the strictest wins (`allow < prompt < deny`, so deny always wins). When none
//! matches, the `default` applies (itself `prompt` when not configured). An unrecognised decision
//! value — a typo such as `"alow"`, a number — is read as `prompt` and reported as a warning: a
//! typo never silently opens the network.
//!
//! ```toml
//! [network]
//! default = "prompt"
//! rules = [
//!   { host = "api.openai.com", decision = "allow" },
//!   { host = ".evil.com", decision = "deny" },
//! ]
//! allow_private = ["127.0.0.1:11434", "localhost:11434"]
//! ```
//!
//! # What is refused whatever the rules say
//!
//! - Schemes other than `http` and `https`.
//! - URLs with userinfo (`http://user:pass@host/`). They are refused, not stripped: a password
//!   in a URL is either a mistake that would be logged or the classic disguise
//!   `https://api.openai.com@evil.com/`, and silently rewriting the request would hide both.
//! - Host names that always mean this machine or a cloud metadata service: `localhost`,
//!   `*.localhost`, `localhost.localdomain`, `ip6-localhost`, `ip6-loopback`,
//!   `metadata.google.internal`. (The real guard is [`NetPolicy::check_resolved`]: whatever a
//!   name resolves to is checked address by address.)
//! - Addresses in the ranges of [`forbidden_range`]: loopback, RFC 1918, link-local (with the
//!   metadata address 169.254.169.254), CGNAT, benchmarking, documentation, multicast, class E
//!   and broadcast, unspecified, unique-local, site-local and the other special IPv6 blocks.
//!   IPv6 addresses that embed an IPv4 address are unwrapped and the IPv4 address is judged:
//!   IPv4-mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96` (so IPv6-only networks with DNS64 keep
//!   working for public hosts) and 6to4 `2002::/16`. The deprecated IPv4-compatible form
//!   `::a.b.c.d`, local-use NAT64 `64:ff9b:1::/48` and Teredo `2001::/32` are refused outright:
//!   where they lead cannot be judged from the address.
//!
//! The one way through is `allow_private`: an exact `host:port` listed there (for example a
//! local model server at `127.0.0.1:11434`) is exempt from the name and address refusals — only
//! that host spelled that way (after normalization) and only that port. It does not bypass the
//! rules: a listed endpoint still gets the matching rule's decision or the default, and a deny
//! rule still wins.
//!
//! IP literals in odd forms (`http://2130706433/`, `http://0177.0.0.1/`, `http://0x7f.1/`,
//! `http://127.1/`, percent-encoded or full-width digits) are normalized by the WHATWG URL parser
//! of the `url` crate before any check, so they are judged as the address they denote. Host names
//! are lowercased, converted to ASCII with IDNA, and a single trailing dot is removed.
//!
//! Every refusal says what was refused, why, and what to do instead.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use url::{Host, Url};

/// The most redirects [`NetPolicy::check_redirect`] lets a request follow.
pub const MAX_REDIRECTS: usize = 5;

/// Where the user's config lives, as named in suggestions.
const CONFIG_PATH: &str = "~/.keel/config.toml";

/// Host names that always mean this machine or a cloud metadata service.
const LOCAL_NAMES: &[&str] = &[
    "localhost",
    "localhost.localdomain",
    "ip6-localhost",
    "ip6-loopback",
    "metadata.google.internal",
];

/// The network policy answers with the gates' one [`Decision`](crate::Decision); its
/// `Forbid` is what network configs used to spell `deny` (still accepted).
pub use crate::Decision as NetDecision;

/// Which check produced a verdict or a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetCheck {
    /// The URL (or host) could not be parsed or is not a usable host.
    Url,
    /// The scheme is not `http` or `https`.
    Scheme,
    /// The URL carries a user name or password.
    Userinfo,
    /// The host name always means this machine or a metadata service.
    HostName,
    /// The host is, or resolved to, a forbidden address.
    Address,
    /// A `[network]` rule decided.
    Rule,
    /// No rule matched; the `[network]` default decided.
    Default,
    /// The target needs the user's approval (a redirect to a `prompt` host).
    Approval,
    /// The name resolved to no address at all.
    Resolution,
    /// The redirect limit was reached or the `Location` was unusable.
    Redirect,
}

/// The decision for one URL, with what it concerns and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetVerdict {
    /// The decision.
    pub decision: NetDecision,
    /// The normalized host (`api.example.com`, `127.0.0.1`, `[::1]`); empty when the URL has
    /// none or could not be parsed.
    pub host: String,
    /// The port the request would use (explicit or the scheme's default), when known.
    pub port: Option<u16>,
    /// Which check decided.
    pub check: NetCheck,
    /// Why, in one sentence, naming the rule or range involved.
    pub reason: String,
    /// What to do instead (for Forbid) or how to stop being asked (for Prompt).
    pub suggestion: Option<String>,
}

impl NetVerdict {
    /// The refusal this verdict amounts to: `Some` exactly for [`NetDecision::Forbid`].
    pub fn refusal(&self) -> Option<NetRefusal> {
        (self.decision == NetDecision::Forbid).then(|| NetRefusal {
            check: self.check,
            target: if self.host.is_empty() {
                String::from("(unparsable URL)")
            } else {
                self.host.clone()
            },
            reason: self.reason.clone(),
            suggestion: self.suggestion.clone().unwrap_or_default(),
        })
    }
}

/// A refused request: what was refused, why, and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("network request to {target} refused: {reason}. {suggestion}")]
pub struct NetRefusal {
    /// Which check refused.
    pub check: NetCheck,
    /// What was refused: a host, `host:port`, or `host (address)`. Never a full URL, whose
    /// query may carry secrets.
    pub target: String,
    /// Why.
    pub reason: String,
    /// What to do instead.
    pub suggestion: String,
}

/// Why a `[network]` config was refused. Structural mistakes are errors; an unrecognised
/// decision value is not (it reads as `prompt`, see [`NetPolicyWarning`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetPolicyError {
    /// The document is not TOML.
    #[error("config is not valid TOML: {message}")]
    Toml {
        /// The parser's message.
        message: String,
    },
    /// A key of `[network]` has the wrong shape.
    #[error("config: [network] {key}: {message}")]
    Invalid {
        /// The key (`rules`, `rules[2]`, `allow_private[0]`, ...).
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A rule's host pattern is not a host name.
    #[error("config: [network] rule host `{host}` is not valid: {problem}")]
    BadHost {
        /// The pattern as written.
        host: String,
        /// What is wrong and what to write instead.
        problem: String,
    },
    /// An `allow_private` entry is not an exact `host:port`.
    #[error("config: [network] allow_private entry `{entry}` is not valid: {problem}")]
    BadAllowPrivate {
        /// The entry as written.
        entry: String,
        /// What is wrong and what to write instead.
        problem: String,
    },
}

/// Something in a `[network]` config that was accepted with a different effect than written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetPolicyWarning {
    /// What was read differently or ignored, and why.
    pub message: String,
}

impl fmt::Display for NetPolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config: [network] {}", self.message)
    }
}

/// A normalized host: a domain name (lowercase ASCII, no trailing dot) or an IP address.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NormHost {
    Domain(String),
    Ip(IpAddr),
}

impl NormHost {
    /// The canonical spelling: the domain, a dotted quad, or a bracketed IPv6 address.
    fn key(&self) -> String {
        match self {
            NormHost::Domain(d) => d.clone(),
            NormHost::Ip(IpAddr::V4(a)) => a.to_string(),
            NormHost::Ip(IpAddr::V6(a)) => format!("[{a}]"),
        }
    }
}

/// A rule's host pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// Exactly this host (canonical key).
    Exact(String),
    /// Every subdomain of a domain; stored with its leading dot (`.example.com`).
    Subdomains(String),
}

impl HostPattern {
    fn matches(&self, host: &NormHost) -> bool {
        match (self, host) {
            (HostPattern::Exact(k), h) => *k == h.key(),
            (HostPattern::Subdomains(suffix), NormHost::Domain(d)) => {
                d.len() > suffix.len() && d.ends_with(suffix.as_str())
            }
            (HostPattern::Subdomains(_), NormHost::Ip(_)) => false,
        }
    }

    fn as_written(&self) -> &str {
        match self {
            HostPattern::Exact(k) | HostPattern::Subdomains(k) => k,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    pattern: HostPattern,
    decision: NetDecision,
}

/// The network policy: rules, a default, and the private endpoints the user named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetPolicy {
    default: NetDecision,
    rules: Vec<HostRule>,
    /// Exact `(canonical host, port)` pairs exempt from the name and address refusals.
    allow_private: Vec<(String, u16)>,
    /// Origins one requester alone may reach: see [`NetPolicy::with_origin_for`].
    origin_grants: Vec<OriginGrant>,
}

/// One origin (scheme, canonical host, port) granted to one requester.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OriginGrant {
    requester: String,
    scheme: String,
    host: String,
    port: u16,
    /// Whether the origin is exempt from the refusal of private and loopback addresses.
    private: bool,
}

impl Default for NetPolicy {
    /// No rules, no private endpoints, default `prompt`: what a config without `[network]`
    /// gets.
    fn default() -> Self {
        NetPolicy::new(NetDecision::Prompt)
    }
}

impl NetPolicy {
    /// A policy with no rules and no private endpoints, deciding `default` for every host.
    pub fn new(default: NetDecision) -> Self {
        NetPolicy {
            default,
            rules: Vec::new(),
            allow_private: Vec::new(),
            origin_grants: Vec::new(),
        }
    }

    /// Grants `requester` alone the origin of `url` (its scheme, host and port): a request of
    /// that requester to exactly that origin is decided as if the policy had an `allow` rule
    /// for the host and, with `private`, an `allow_private` entry for `host:port`
    /// ([`NetPolicy::for_requester`]);
    /// everyone else's requests, and this requester's to any other origin, are decided by the
    /// policy as it is. The person's own `deny` and `prompt` rules for the host still win
    /// (the strictest rule does). For an endpoint the person approved for one plugin (an MCP
    /// server an editor passed) without opening it to every plugin and command of the session.
    pub fn with_origin_for(
        mut self,
        requester: &str,
        url: &str,
        private: bool,
    ) -> Result<Self, NetPolicyError> {
        let bad = |problem: String| NetPolicyError::BadHost {
            host: url.to_owned(),
            problem,
        };
        let parsed = Url::parse(url).map_err(|e| bad(format!("it is not a URL ({e})")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad(String::from(
                "only an http:// or https:// origin is granted",
            )));
        }
        let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
            return Err(bad(String::from("it names no host and port")));
        };
        let grant = OriginGrant {
            requester: requester.to_owned(),
            scheme: parsed.scheme().to_owned(),
            host: normalize_bare_host(host).map_err(bad)?.key(),
            port,
            private,
        };
        if !self.origin_grants.contains(&grant) {
            self.origin_grants.push(grant);
        }
        Ok(self)
    }

    /// The policy that decides `requester`'s request to `url`: this one, widened by an
    /// origin granted to `requester` with [`NetPolicy::with_origin_for`] when `url` is on
    /// exactly that origin. Only ever used for that one request (and its resolution).
    pub fn for_requester(&self, requester: &str, url: &str) -> std::borrow::Cow<'_, NetPolicy> {
        use std::borrow::Cow;
        if self.origin_grants.is_empty() {
            return Cow::Borrowed(self);
        }
        let Ok(parsed) = Url::parse(url) else {
            return Cow::Borrowed(self);
        };
        let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
            return Cow::Borrowed(self);
        };
        let Ok(host) = normalize_bare_host(host).map(|h| h.key()) else {
            return Cow::Borrowed(self);
        };
        let Some(grant) = self.origin_grants.iter().find(|g| {
            g.requester == requester
                && g.scheme == parsed.scheme()
                && g.host == host
                && g.port == port
        }) else {
            return Cow::Borrowed(self);
        };
        let private = grant.private;
        let mut widened = self.clone();
        widened.origin_grants.clear();
        widened.rules.push(HostRule {
            pattern: HostPattern::Exact(host.clone()),
            decision: NetDecision::Allow,
        });
        if private && !widened.allow_private.contains(&(host.clone(), port)) {
            widened.allow_private.push((host, port));
        }
        Cow::Owned(widened)
    }

    /// Adds a rule (`example.com` for exactly that host, `.example.com` for its subdomains).
    pub fn with_rule(mut self, host: &str, decision: NetDecision) -> Result<Self, NetPolicyError> {
        let pattern = parse_pattern(host)?;
        self.rules.push(HostRule { pattern, decision });
        Ok(self)
    }

    /// Adds an exact `host:port` (`127.0.0.1:11434`, `localhost:11434`, `[::1]:8080`) that is
    /// exempt from the name and address refusals.
    pub fn with_allow_private(mut self, entry: &str) -> Result<Self, NetPolicyError> {
        let pair = parse_allow_private(entry)?;
        if !self.allow_private.contains(&pair) {
            self.allow_private.push(pair);
        }
        Ok(self)
    }

    /// The decision for hosts no rule matches.
    pub fn default_decision(&self) -> NetDecision {
        self.default
    }

    /// Reads the `[network]` table of a whole config document (other tables are ignored). A
    /// document without `[network]` gives [`NetPolicy::default`]. Unrecognised decision values
    /// and unknown keys come back as warnings (the value reads as `prompt`); anything else
    /// malformed — a rule without a host, a host that is not a host name, an `allow_private`
    /// entry without a port — is an error.
    pub fn from_toml(text: &str) -> Result<(NetPolicy, Vec<NetPolicyWarning>), NetPolicyError> {
        let doc: toml::Table = toml::from_str(text).map_err(|e| NetPolicyError::Toml {
            message: e.message().to_owned(),
        })?;
        let mut warnings = Vec::new();
        let Some(network) = doc.get("network") else {
            return Ok((NetPolicy::default(), warnings));
        };
        let network = network.as_table().ok_or_else(|| NetPolicyError::Invalid {
            key: String::from("network"),
            message: format!(
                "`network` must be a table (`[network]`), found {}",
                network.type_str()
            ),
        })?;

        let mut policy = NetPolicy::default();
        for (key, value) in network {
            match key.as_str() {
                "default" => policy.default = read_decision(value, "default", &mut warnings),
                "rules" => {
                    let rules = value.as_array().ok_or_else(|| NetPolicyError::Invalid {
                        key: String::from("rules"),
                        message: format!(
                            "must be an array of tables like `[{{ host = \"api.example.com\", decision = \"allow\" }}]`, found {}",
                            value.type_str()
                        ),
                    })?;
                    for (i, rule) in rules.iter().enumerate() {
                        policy.rules.push(read_rule(rule, i, &mut warnings)?);
                    }
                }
                "allow_private" => {
                    let entries = value.as_array().ok_or_else(|| NetPolicyError::Invalid {
                        key: String::from("allow_private"),
                        message: format!(
                            "must be an array of \"host:port\" strings like `[\"127.0.0.1:11434\"]`, found {}",
                            value.type_str()
                        ),
                    })?;
                    for (i, entry) in entries.iter().enumerate() {
                        let entry = entry.as_str().ok_or_else(|| NetPolicyError::Invalid {
                            key: format!("allow_private[{i}]"),
                            message: format!(
                                "must be a \"host:port\" string, found {}",
                                entry.type_str()
                            ),
                        })?;
                        let pair = parse_allow_private(entry)?;
                        if !policy.allow_private.contains(&pair) {
                            policy.allow_private.push(pair);
                        }
                    }
                }
                other => warnings.push(NetPolicyWarning {
                    message: format!(
                        "unknown key `{other}` ignored; the keys are `default`, `rules` and `allow_private`"
                    ),
                }),
            }
        }
        Ok((policy, warnings))
    }

    /// Judges one URL before any connection: scheme, userinfo, host name, IP literal, then the
    /// rules. Never panics; an unparsable URL is denied.
    pub fn decide_url(&self, url: &str) -> NetVerdict {
        let deny = |host: String, port, check, reason: String, suggestion: String| NetVerdict {
            decision: NetDecision::Forbid,
            host,
            port,
            check,
            reason,
            suggestion: Some(suggestion),
        };

        let parsed = match Url::parse(url) {
            Ok(u) => u,
            Err(e) => {
                return deny(
                    String::new(),
                    None,
                    NetCheck::Url,
                    format!("the URL cannot be parsed ({e})"),
                    String::from("send an absolute http(s) URL such as `https://example.com/path`"),
                );
            }
        };

        let scheme = parsed.scheme();
        if scheme != "http" && scheme != "https" {
            let host = parsed.host_str().unwrap_or_default().to_owned();
            let extra = if scheme == "file" {
                "; read local files with the file tools instead"
            } else {
                ""
            };
            return deny(
                host,
                None,
                NetCheck::Scheme,
                format!("the scheme `{scheme}` is not allowed; only http and https are"),
                format!("use an http:// or https:// URL{extra}"),
            );
        }

        let port = parsed.port_or_known_default();
        let Some(raw_host) = parsed.host() else {
            return deny(
                String::new(),
                port,
                NetCheck::Url,
                String::from("the URL has no host"),
                String::from("send an absolute http(s) URL such as `https://example.com/path`"),
            );
        };
        let host = match normalize_url_host(raw_host) {
            Ok(h) => h,
            Err(problem) => {
                return deny(
                    parsed.host_str().unwrap_or_default().to_owned(),
                    port,
                    NetCheck::Url,
                    format!("the host is not a valid host name: {problem}"),
                    String::from("check the host name in the URL"),
                );
            }
        };
        let key = host.key();

        if !parsed.username().is_empty() || parsed.password().is_some() {
            return deny(
                key,
                port,
                NetCheck::Userinfo,
                String::from(
                    "the URL contains a user name or password (`user:pass@host`), which would leak into logs and can disguise the real host",
                ),
                String::from(
                    "remove the `user:password@` part and send credentials in a request header such as `Authorization` instead",
                ),
            );
        }

        let exempt = port.is_some_and(|p| self.is_allowed_private(&key, p));
        if !exempt && let Some(refusal) = refuse_host(&host, port) {
            return deny(key, port, refusal.check, refusal.reason, refusal.suggestion);
        }

        self.rule_verdict(&host, key, port)
    }

    /// Judges the addresses `host` resolved to, before connecting. Every address is checked;
    /// if *any* is forbidden the whole answer is refused, so a DNS answer mixing public and
    /// internal addresses cannot be used for rebinding. On success returns the first address,
    /// which the client must pin the connection to (never resolve the name again).
    ///
    /// An exact `host:port` listed in `allow_private` may resolve anywhere. This checks
    /// addresses only; the rules were applied by [`NetPolicy::decide_url`].
    pub fn check_resolved(
        &self,
        host: &str,
        port: u16,
        addrs: &[IpAddr],
    ) -> Result<IpAddr, NetRefusal> {
        let host = normalize_bare_host(host).map_err(|problem| NetRefusal {
            check: NetCheck::Url,
            target: host.to_owned(),
            reason: format!("the host is not a valid host name: {problem}"),
            suggestion: String::from("check the host name in the URL"),
        })?;
        let key = host.key();
        let Some(first) = addrs.first().copied() else {
            return Err(NetRefusal {
                check: NetCheck::Resolution,
                target: format!("{key}:{port}"),
                reason: String::from("the host name resolved to no address"),
                suggestion: String::from("check the host name for typos"),
            });
        };
        if self.is_allowed_private(&key, port) {
            return Ok(first);
        }
        if let Some(refusal) = refuse_host(&host, Some(port)) {
            return Err(refusal);
        }
        for addr in addrs {
            if let Some(range) = forbidden_range(*addr) {
                return Err(NetRefusal {
                    check: NetCheck::Address,
                    target: format!("{key} ({addr})"),
                    reason: format!(
                        "`{key}` resolves to {addr}, which is {}; a name that resolves to an internal address is refused even when its other addresses are public (DNS rebinding)",
                        range.describe()
                    ),
                    suggestion: private_suggestion(&key, port),
                });
            }
        }
        Ok(first)
    }

    /// Judges a redirect: resolves `location` against `from` and re-checks the result with
    /// [`NetPolicy::decide_url`]. `hop` is how many redirects this request has already followed
    /// (0 for the first); at most [`MAX_REDIRECTS`] are followed. Returns the absolute URL to
    /// request next.
    ///
    /// A target whose decision is Prompt is refused with [`NetCheck::Approval`]: the client
    /// may ask the user (or use an approval already given for that host in this session) and
    /// then continue with [`resolve_location`]. The new host's addresses must still go through
    /// [`NetPolicy::check_resolved`].
    pub fn check_redirect(
        &self,
        from: &str,
        location: &str,
        hop: usize,
    ) -> Result<String, NetRefusal> {
        if hop >= MAX_REDIRECTS {
            let target = Url::parse(from)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .unwrap_or_else(|| String::from("(unparsable URL)"));
            return Err(NetRefusal {
                check: NetCheck::Redirect,
                target,
                reason: format!(
                    "the redirect limit was reached ({MAX_REDIRECTS} redirects already followed)"
                ),
                suggestion: String::from(
                    "request the final URL directly, or check the server for a redirect loop",
                ),
            });
        }
        let next = resolve_location(from, location)?;
        let verdict = self.decide_url(&next);
        match verdict.decision {
            NetDecision::Allow => Ok(next),
            NetDecision::Forbid => Err(verdict.refusal().unwrap_or_else(|| NetRefusal {
                check: verdict.check,
                target: verdict.host.clone(),
                reason: verdict.reason.clone(),
                suggestion: String::new(),
            })),
            NetDecision::Prompt => Err(NetRefusal {
                check: NetCheck::Approval,
                target: verdict.host.clone(),
                reason: format!(
                    "the request was redirected to `{}`, which needs approval: {}",
                    verdict.host, verdict.reason
                ),
                suggestion: verdict.suggestion.unwrap_or_else(|| {
                    String::from("approve the new host, or request a URL on an allowed host")
                }),
            }),
        }
    }

    fn is_allowed_private(&self, key: &str, port: u16) -> bool {
        self.allow_private
            .iter()
            .any(|(h, p)| *p == port && h == key)
    }

    /// The rules' verdict for a host that passed the fixed refusals.
    fn rule_verdict(&self, host: &NormHost, key: String, port: Option<u16>) -> NetVerdict {
        let mut best: Option<&HostRule> = None;
        for rule in &self.rules {
            if rule.pattern.matches(host) && best.is_none_or(|b| rule.decision > b.decision) {
                best = Some(rule);
            }
        }
        let allow_rule = format!(
            "add `{{ host = \"{key}\", decision = \"allow\" }}` under [network] rules in {CONFIG_PATH}"
        );
        match best {
            Some(rule) => {
                let pattern = rule.pattern.as_written();
                let (reason, suggestion) = match rule.decision {
                    NetDecision::Allow => {
                        (format!("`{key}` is allowed by the rule `{pattern}`"), None)
                    }
                    NetDecision::Prompt => (
                        format!("the rule `{pattern}` asks before every request to `{key}`"),
                        Some(format!(
                            "approve the request, or change the rule `{pattern}` under [network] rules in {CONFIG_PATH} to `allow`"
                        )),
                    ),
                    NetDecision::Forbid => (
                        format!(
                            "`{key}` is denied by the rule `{pattern}` (a deny rule wins over any allow rule)"
                        ),
                        Some(format!(
                            "use another host, or remove the rule `{pattern}` under [network] rules in {CONFIG_PATH} if `{key}` should be reachable"
                        )),
                    ),
                };
                NetVerdict {
                    decision: rule.decision,
                    host: key,
                    port,
                    check: NetCheck::Rule,
                    reason,
                    suggestion,
                }
            }
            None => {
                let (reason, suggestion) = match self.default {
                    NetDecision::Allow => (
                        format!("no [network] rule matches `{key}` and the default is `allow`"),
                        None,
                    ),
                    NetDecision::Prompt => (
                        format!("no [network] rule matches `{key}` and the default is `prompt`"),
                        Some(format!(
                            "approve the request, or {allow_rule} to stop being asked"
                        )),
                    ),
                    NetDecision::Forbid => (
                        format!("no [network] rule matches `{key}` and the default is `deny`"),
                        Some(format!("{allow_rule} if this host should be reachable")),
                    ),
                };
                NetVerdict {
                    decision: self.default,
                    host: key,
                    port,
                    check: NetCheck::Default,
                    reason,
                    suggestion,
                }
            }
        }
    }
}

/// Resolves a redirect's `Location` against the URL that answered with it, giving the absolute
/// URL (fragment kept). Refuses an empty or unparsable `Location` and an unparsable `from`.
pub fn resolve_location(from: &str, location: &str) -> Result<String, NetRefusal> {
    let base = Url::parse(from).map_err(|e| NetRefusal {
        check: NetCheck::Redirect,
        target: String::from("(unparsable URL)"),
        reason: format!("the redirecting URL cannot be parsed ({e})"),
        suggestion: String::from("send an absolute http(s) URL such as `https://example.com/path`"),
    })?;
    let target = base.host_str().unwrap_or_default().to_owned();
    let location = location.trim();
    if location.is_empty() {
        return Err(NetRefusal {
            check: NetCheck::Redirect,
            target,
            reason: String::from("the server sent a redirect with an empty `Location`"),
            suggestion: String::from("request the final URL directly"),
        });
    }
    base.join(location)
        .map(String::from)
        .map_err(|e| NetRefusal {
            check: NetCheck::Redirect,
            target,
            reason: format!("the redirect `Location` cannot be parsed ({e})"),
            suggestion: String::from("request the final URL directly"),
        })
}

/// A forbidden address range, as named in refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ForbiddenRange {
    /// The range in CIDR notation (`127.0.0.0/8`), or the single address.
    pub cidr: &'static str,
    /// What the range is (`loopback`, `private network (RFC 1918)`, ...).
    pub name: &'static str,
    /// How the IPv4 address was found inside an IPv6 one (`IPv4-mapped IPv6`, ...), if it was.
    pub embedded_in: Option<&'static str>,
}

impl ForbiddenRange {
    /// One phrase for messages: `in the loopback range 127.0.0.0/8`.
    pub fn describe(&self) -> String {
        match self.embedded_in {
            Some(via) => format!("in the {} range {} (via {via})", self.name, self.cidr),
            None => format!("in the {} range {}", self.name, self.cidr),
        }
    }
}

const fn range(cidr: &'static str, name: &'static str) -> Option<ForbiddenRange> {
    Some(ForbiddenRange {
        cidr,
        name,
        embedded_in: None,
    })
}

/// The forbidden range `ip` falls in, if any (IPv6 forms embedding an IPv4 address are
/// unwrapped first, see the module docs). `None` means the address is public.
pub fn forbidden_range(ip: IpAddr) -> Option<ForbiddenRange> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<ForbiddenRange> {
    let [a, b, c, _] = ip.octets();
    match (a, b, c) {
        (0, _, _) => range("0.0.0.0/8", "unspecified (\"this network\")"),
        (10, _, _) => range("10.0.0.0/8", "private network (RFC 1918)"),
        (100, 64..=127, _) => range("100.64.0.0/10", "carrier-grade NAT (RFC 6598)"),
        (127, _, _) => range("127.0.0.0/8", "loopback"),
        (169, 254, _) if ip == Ipv4Addr::new(169, 254, 169, 254) => {
            range("169.254.169.254", "cloud metadata service")
        }
        (169, 254, _) => range("169.254.0.0/16", "link-local"),
        (172, 16..=31, _) => range("172.16.0.0/12", "private network (RFC 1918)"),
        (192, 0, 0) => range("192.0.0.0/24", "IETF protocol assignments"),
        (192, 0, 2) => range("192.0.2.0/24", "documentation (TEST-NET-1)"),
        (192, 88, 99) => range("192.88.99.0/24", "6to4 relay anycast"),
        (192, 168, _) => range("192.168.0.0/16", "private network (RFC 1918)"),
        (198, 18..=19, _) => range("198.18.0.0/15", "benchmarking (RFC 2544)"),
        (198, 51, 100) => range("198.51.100.0/24", "documentation (TEST-NET-2)"),
        (203, 0, 113) => range("203.0.113.0/24", "documentation (TEST-NET-3)"),
        (224..=239, _, _) => range("224.0.0.0/4", "multicast"),
        _ if ip == Ipv4Addr::BROADCAST => range("255.255.255.255", "broadcast"),
        (240..=255, _, _) => range("240.0.0.0/4", "reserved (class E)"),
        _ => None,
    }
}

fn embedded(v4: Ipv4Addr, via: &'static str) -> Option<ForbiddenRange> {
    forbidden_v4(v4).map(|r| ForbiddenRange {
        embedded_in: Some(via),
        ..r
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<ForbiddenRange> {
    let s = ip.segments();
    let o = ip.octets();
    let low_v4 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if ip.is_unspecified() {
        return range("::/128", "unspecified");
    }
    if ip.is_loopback() {
        return range("::1/128", "loopback");
    }
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => embedded(low_v4, "IPv4-mapped IPv6 ::ffff:0:0/96"),
        [0, 0, 0, 0, 0, 0, _, _] => range("::/96", "deprecated IPv4-compatible IPv6"),
        [0, 0, 0, 0, 0xffff, 0, _, _] => range("::ffff:0:0:0/96", "IPv4-translated IPv6"),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => embedded(low_v4, "NAT64 64:ff9b::/96"),
        [0x64, 0xff9b, 1, ..] => range("64:ff9b:1::/48", "local-use NAT64"),
        [0x100, 0, 0, 0, ..] => range("100::/64", "discard-only"),
        [0x2001, 0, ..] => range("2001::/32", "Teredo tunnelling"),
        [0x2001, 0xdb8, ..] => range("2001:db8::/32", "documentation"),
        [0x2002, hi, lo, ..] => {
            let [a, b] = hi.to_be_bytes();
            let [c, d] = lo.to_be_bytes();
            embedded(Ipv4Addr::new(a, b, c, d), "6to4 2002::/16")
        }
        [first, ..] if first & 0xfe00 == 0xfc00 => range("fc00::/7", "unique-local"),
        [first, ..] if first & 0xffc0 == 0xfe80 => range("fe80::/10", "link-local"),
        [first, ..] if first & 0xffc0 == 0xfec0 => range("fec0::/10", "deprecated site-local"),
        [first, ..] if first & 0xff00 == 0xff00 => range("ff00::/8", "multicast"),
        _ => None,
    }
}

/// The fixed refusals for a host (ignoring `allow_private`, which the caller checks): local
/// and metadata names, forbidden IP literals.
fn refuse_host(host: &NormHost, port: Option<u16>) -> Option<NetRefusal> {
    let key = host.key();
    let port = port.unwrap_or(80);
    match host {
        NormHost::Domain(d) => {
            let local = LOCAL_NAMES.contains(&d.as_str()) || d.ends_with(".localhost");
            local.then(|| NetRefusal {
                check: NetCheck::HostName,
                target: format!("{key}:{port}"),
                reason: format!(
                    "`{key}` names this machine or a cloud metadata service, which plugins may not reach"
                ),
                suggestion: private_suggestion(&key, port),
            })
        }
        NormHost::Ip(ip) => forbidden_range(*ip).map(|range| NetRefusal {
            check: NetCheck::Address,
            target: format!("{key}:{port}"),
            reason: format!("{key} is {}", range.describe()),
            suggestion: private_suggestion(&key, port),
        }),
    }
}

fn private_suggestion(key: &str, port: u16) -> String {
    format!(
        "use the service's public host name; if this is a local service you trust (such as a model server), add \"{key}:{port}\" to [network] allow_private in {CONFIG_PATH}"
    )
}

/// Normalizes the host of a parsed URL.
fn normalize_url_host(host: Host<&str>) -> Result<NormHost, String> {
    match host {
        Host::Ipv4(a) => Ok(NormHost::Ip(IpAddr::V4(a))),
        Host::Ipv6(a) => Ok(NormHost::Ip(IpAddr::V6(a))),
        Host::Domain(d) => normalize_domain(d),
    }
}

/// Normalizes a host written on its own (a rule, an `allow_private` entry, the `host` given
/// to [`NetPolicy::check_resolved`]): IPv6 with or without brackets, IDNA, odd IPv4 forms.
fn normalize_bare_host(text: &str) -> Result<NormHost, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(String::from("it is empty"));
    }
    let unbracketed = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    if let Ok(v6) = unbracketed.parse::<Ipv6Addr>() {
        return Ok(NormHost::Ip(IpAddr::V6(v6)));
    }
    match Host::parse(text) {
        Ok(Host::Ipv4(a)) => Ok(NormHost::Ip(IpAddr::V4(a))),
        Ok(Host::Ipv6(a)) => Ok(NormHost::Ip(IpAddr::V6(a))),
        Ok(Host::Domain(d)) => normalize_domain(&d),
        Err(e) => Err(format!(
            "{e}; write a bare host name such as `api.example.com`"
        )),
    }
}

/// Checks and canonicalizes an (already IDNA-processed) domain: one trailing dot removed, no
/// empty labels, only `a-z 0-9 - _ .`, DNS length limits. A domain that turns out to be an IPv4
/// literal once the dot is gone becomes an address.
fn normalize_domain(domain: &str) -> Result<NormHost, String> {
    let lower = domain.to_ascii_lowercase();
    let d = lower.strip_suffix('.').unwrap_or(&lower);
    if d.is_empty() {
        return Err(String::from("it is empty"));
    }
    if d.starts_with('.') || d.ends_with('.') || d.contains("..") {
        return Err(String::from("it has an empty label"));
    }
    if let Some(bad) = d
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "the character `{}` cannot appear in a host name",
            bad.escape_default()
        ));
    }
    if d.len() > 253 || d.split('.').any(|label| label.len() > 63) {
        return Err(String::from("it is longer than DNS allows"));
    }
    match Host::parse(d) {
        Ok(Host::Ipv4(a)) => Ok(NormHost::Ip(IpAddr::V4(a))),
        Ok(Host::Ipv6(a)) => Ok(NormHost::Ip(IpAddr::V6(a))),
        Ok(Host::Domain(_)) => Ok(NormHost::Domain(d.to_owned())),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_pattern(host: &str) -> Result<HostPattern, NetPolicyError> {
    let bad = |problem: String| NetPolicyError::BadHost {
        host: host.to_owned(),
        problem,
    };
    let text = host.trim();
    if let Some(rest) = text.strip_prefix("*.") {
        return Err(bad(format!(
            "wildcards are written with a leading dot: `.{rest}` covers every subdomain of `{rest}` (add `{rest}` too for the bare domain)"
        )));
    }
    if text.contains("://") || text.contains('/') {
        return Err(bad(String::from(
            "write only the host, without scheme or path, e.g. `api.example.com`",
        )));
    }
    if let Some(rest) = text.strip_prefix('.') {
        return match normalize_bare_host(rest).map_err(&bad)? {
            NormHost::Domain(d) => Ok(HostPattern::Subdomains(format!(".{d}"))),
            NormHost::Ip(_) => Err(bad(String::from(
                "a leading dot means \"every subdomain\", which an IP address does not have; write the address without the dot",
            ))),
        };
    }
    Ok(HostPattern::Exact(
        normalize_bare_host(text).map_err(&bad)?.key(),
    ))
}

fn parse_allow_private(entry: &str) -> Result<(String, u16), NetPolicyError> {
    let bad = |problem: String| NetPolicyError::BadAllowPrivate {
        entry: entry.to_owned(),
        problem,
    };
    let text = entry.trim();
    let (host, port) = if text.starts_with('[') {
        let (h, p) = text.split_once("]:").ok_or_else(|| {
            bad(String::from(
                "an IPv6 entry needs brackets and a port, e.g. \"[::1]:11434\"",
            ))
        })?;
        (format!("{h}]"), p)
    } else {
        let (h, p) = text.rsplit_once(':').ok_or_else(|| {
            bad(format!(
                "it needs an exact port, e.g. \"{text}:11434\" (only that host and port are exempted)"
            ))
        })?;
        if h.contains(':') {
            return Err(bad(String::from(
                "write IPv6 addresses in brackets, e.g. \"[::1]:11434\"",
            )));
        }
        (h.to_owned(), p)
    };
    let port: u16 = match port.parse() {
        Ok(p) if p != 0 => p,
        _ => {
            return Err(bad(format!(
                "`{port}` is not a port number between 1 and 65535"
            )));
        }
    };
    if host.starts_with('.') || host.starts_with('*') {
        return Err(bad(String::from(
            "only an exact host is accepted here, not a pattern",
        )));
    }
    let host = normalize_bare_host(&host).map_err(bad)?;
    Ok((host.key(), port))
}

fn read_decision(
    value: &toml::Value,
    key: &str,
    warnings: &mut Vec<NetPolicyWarning>,
) -> NetDecision {
    if let Some(d) = value.as_str().and_then(NetDecision::parse) {
        return d;
    }
    let shown = match value.as_str() {
        Some(s) => format!("\"{}\"", s.escape_default()),
        None => value.type_str().to_owned(),
    };
    warnings.push(NetPolicyWarning {
        message: format!(
            "{key}: unknown decision {shown} read as \"prompt\" (never as allow); expected \"allow\", \"prompt\" or \"deny\""
        ),
    });
    NetDecision::Prompt
}

fn read_rule(
    rule: &toml::Value,
    index: usize,
    warnings: &mut Vec<NetPolicyWarning>,
) -> Result<HostRule, NetPolicyError> {
    let key = format!("rules[{index}]");
    let table = rule.as_table().ok_or_else(|| NetPolicyError::Invalid {
        key: key.clone(),
        message: format!(
            "must be a table like `{{ host = \"api.example.com\", decision = \"allow\" }}`, found {}",
            rule.type_str()
        ),
    })?;
    let host = table
        .get("host")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| NetPolicyError::Invalid {
            key: key.clone(),
            message: String::from(
                "needs a string `host`, like `{ host = \"api.example.com\", decision = \"allow\" }`",
            ),
        })?;
    let pattern = parse_pattern(host)?;
    let decision = match table.get("decision") {
        Some(v) => read_decision(v, &format!("{key} (`{host}`)"), warnings),
        None => {
            warnings.push(NetPolicyWarning {
                message: format!(
                    "{key} (`{host}`): no `decision`, read as \"prompt\"; write decision = \"allow\", \"prompt\" or \"deny\""
                ),
            });
            NetDecision::Prompt
        }
    };
    for other in table.keys().filter(|k| *k != "host" && *k != "decision") {
        warnings.push(NetPolicyWarning {
            message: format!(
                "{key} (`{host}`): unknown key `{other}` ignored; a rule has `host` and `decision`"
            ),
        });
    }
    Ok(HostRule { pattern, decision })
}

/// One line of the network audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// When, as RFC 3339 UTC with milliseconds (`2025-01-31T12:00:00.000Z`).
    pub time: String,
    /// The plugin that made the request.
    pub plugin: String,
    /// The normalized host.
    pub host: String,
    /// The decision.
    pub decision: NetDecision,
    /// Why.
    pub reason: String,
}

impl AuditRecord {
    /// The record of `verdict` for `plugin`, stamped with `at`.
    pub fn new(plugin: &str, verdict: &NetVerdict, at: SystemTime) -> Self {
        AuditRecord {
            time: rfc3339_utc(at),
            plugin: plugin.to_owned(),
            host: verdict.host.clone(),
            decision: verdict.decision,
            reason: verdict.reason.clone(),
        }
    }
}

/// The record as one line of JSON (no trailing newline; control characters in fields are
/// escaped, so the line never breaks).
pub fn audit_line(record: &AuditRecord) -> String {
    match serde_json::to_string(record) {
        Ok(line) => line,
        // Not reachable for this struct (strings and a unit enum), but never panic.
        Err(e) => format!(
            "{{\"error\":\"audit record not serializable: {}\"}}",
            e.to_string().escape_default()
        ),
    }
}

/// Formats a time as RFC 3339 UTC with milliseconds; times before 1970 are clamped to the epoch.
pub fn rfc3339_utc(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let millis = since.subsec_millis();
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm, unsigned).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
#[path = "net_policy_tests.rs"]
mod tests;
