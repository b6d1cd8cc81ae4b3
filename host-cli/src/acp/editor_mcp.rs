//! MCP servers an editor passes in `session/new`, `session/load` and `session/resume`.
//!
//! An editor's server list is no more trusted than a repository's `.mcp.json`: editors read
//! it from project settings a cloned repository can carry (`.zed/settings.json`, `.vscode/…`),
//! and a client can send anything. So the same consent rule holds: a server starts only after
//! the person approved it for this workspace with `keel mcp approve --editor`, and an approval
//! names that exact server by its SHA-256 — a stdio server's name, command, arguments and
//! environment (values included), an HTTP server's name, URL and headers (names and values) —
//! so a changed server is a new request. An unapproved server is recorded as pending in keel's
//! home (its command and arguments or its URL, and the *names* of its environment variables or
//! headers, never their values) so the command can show the person what they approve.
//!
//! An approved stdio server runs as a `.mcp.json` server does: through the `mcp` plugin in the
//! OS sandbox, granted nothing (no folder to write, no host to reach, no secret), every tool
//! asking before it runs. An approved HTTP server (MCP's Streamable HTTP) is reached by the
//! `mcp` plugin through the kernel's network gate, as a configured HTTP server is, but only at
//! its own origin (scheme, host, port), granted to that plugin alone: no rule of the session's
//! network policy is added for any other plugin or command. `http://` is taken only for a
//! loopback address; anything else must be `https://`. Its headers become kernel-held secrets
//! bound to that origin: the kernel puts them into that server's requests, the plugin never
//! sees them, and they are redacted from what the gate reports. A client cannot widen any of
//! this: nothing it sends becomes a grant, and a name the person's own config uses is refused
//! rather than laid over that server's grants. SSE servers (a deprecated transport) are
//! refused (`mcpCapabilities` says `http: true, sse: false`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema as acp;
use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::config::{EditorHeaders, EnvValue, McpServer, UserConfig};

/// The file, in keel's home (never the workspace), holding approvals and pending requests.
const FILE: &str = "mcp-editor-approvals.json";

/// At most this many pending requests are kept (the oldest go first).
const MAX_PENDING: usize = 64;

/// At most this many servers are taken from one request; the rest are refused.
const MAX_SERVERS: usize = 32;

/// The largest server keel takes: its command, arguments and environment together, or its URL
/// and headers together, in bytes.
const MAX_SERVER_BYTES: usize = 64 << 10;

/// The longest URL of an HTTP server keel takes, in bytes.
const MAX_URL_BYTES: usize = 2048;

/// At most this many headers of one HTTP server.
const MAX_HEADERS: usize = 32;

/// The longest header name, and the longest header value, in bytes.
const MAX_HEADER_NAME_BYTES: usize = 256;
const MAX_HEADER_VALUE_BYTES: usize = 8 << 10;

/// Headers an editor may not set: those the kernel derives from the URL and body or that
/// manage the connection, and those MCP's transport defines (the transport's values are
/// used, as ACP says).
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// A server the editor passed, in keel's terms.
#[derive(Debug, Clone)]
pub struct Offered {
    /// Its keel name (lowercase, `-` for anything else); its tools are `mcp__NAME__TOOL`.
    pub name: String,
    /// What it runs or where it is reached, granted nothing.
    pub server: McpServer,
    /// The SHA-256 an approval names.
    pub sha256: String,
    /// Its environment variables' names (their values are hashed, never stored).
    pub env_names: Vec<String>,
    /// An HTTP server's header names (their values are hashed, never stored).
    pub header_names: Vec<String>,
}

/// The servers of `servers` keel can take, and a line for each it cannot.
pub fn offered(servers: &[acp::McpServer]) -> (Vec<Offered>, Vec<String>) {
    let mut taken: Vec<Offered> = Vec::new();
    let mut refused = Vec::new();
    for (at, server) in servers.iter().enumerate() {
        if at == MAX_SERVERS {
            refused.push(format!(
                "{} more: keel takes at most {MAX_SERVERS} servers from an editor",
                servers.len() - MAX_SERVERS
            ));
            break;
        }
        let given = match server {
            acp::McpServer::Stdio(stdio) => &stdio.name,
            acp::McpServer::Http(http) => &http.name,
            acp::McpServer::Sse(sse) => {
                refused.push(format!(
                    "`{}`: keel does not speak MCP over SSE (a deprecated transport); use the \
                     server's Streamable HTTP or stdio form",
                    sse.name
                ));
                continue;
            }
            _ => {
                refused.push("a server of a transport keel does not know".to_owned());
                continue;
            }
        };
        let name = crate::project_mcp::keel_name(given);
        if !keel_kernel::is_valid_plugin_name(&name) {
            refused.push(format!("`{given}`: its name cannot name a keel server"));
            continue;
        }
        if taken.iter().any(|t| t.name == name) {
            refused.push(format!(
                "`{given}`: another server the editor passed is also called `{name}`"
            ));
            continue;
        }
        let made = match server {
            acp::McpServer::Stdio(stdio) => stdio_server(name, stdio),
            acp::McpServer::Http(http) => http_server(name, http),
            _ => continue,
        };
        match made {
            Ok(offered) => taken.push(offered),
            Err(why) => refused.push(why),
        }
    }
    (taken, refused)
}

/// A stdio server, granted nothing; or why it is refused.
fn stdio_server(name: String, stdio: &acp::McpServerStdio) -> Result<Offered, String> {
    let Some(command) = stdio.command.to_str().filter(|c| !c.is_empty()) else {
        return Err(format!(
            "`{}`: its command is empty or not UTF-8",
            stdio.name
        ));
    };
    let size = command.len()
        + stdio.args.iter().map(String::len).sum::<usize>()
        + stdio
            .env
            .iter()
            .map(|v| v.name.len() + v.value.len())
            .sum::<usize>();
    if size > MAX_SERVER_BYTES {
        return Err(format!(
            "`{name}`: its command, arguments and environment exceed {} KiB",
            MAX_SERVER_BYTES >> 10
        ));
    }
    let env: BTreeMap<String, String> = stdio
        .env
        .iter()
        .map(|v| (v.name.clone(), v.value.clone()))
        .collect();
    let sha256 = fingerprint(&name, command, &stdio.args, &env);
    Ok(Offered {
        env_names: env.keys().cloned().collect(),
        header_names: Vec::new(),
        server: McpServer {
            command: Some(command.to_owned()),
            args: stdio.args.clone(),
            env: env
                .into_iter()
                .map(|(k, v)| (k, EnvValue::Plain(v)))
                .collect(),
            // Granted nothing, as a repository's `.mcp.json` server.
            from_project: true,
            ..McpServer::default()
        },
        name,
        sha256,
    })
}

/// Whether `name` is an HTTP header name (a token of RFC 9110).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// An HTTP server (MCP's Streamable HTTP), reached at its origin alone with its headers held
/// by the kernel; or why it is refused. The errors never quote a header's value.
fn http_server(name: String, http: &acp::McpServerHttp) -> Result<Offered, String> {
    let url = http.url.trim();
    if url.len() > MAX_URL_BYTES {
        return Err(format!(
            "`{name}`: its URL is longer than {MAX_URL_BYTES} bytes"
        ));
    }
    let parsed =
        url::Url::parse(url).map_err(|e| format!("`{name}`: its URL is not a URL ({e})"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(format!(
            "`{name}`: its URL carries a user name or password; pass credentials as a header"
        ));
    }
    let loopback = crate::settings::is_loopback(&parsed);
    match parsed.scheme() {
        "https" if parsed.host_str().is_some() => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "`{name}`: `http://` is taken only for this machine's loopback address \
                 (127.0.0.1, [::1], localhost); give the server's `https://` URL"
            ));
        }
        _ => {
            return Err(format!(
                "`{name}`: give an `https://` URL (or `http://` to a loopback address)"
            ));
        }
    }
    if http.headers.len() > MAX_HEADERS {
        return Err(format!(
            "`{name}`: it has {} headers; keel takes at most {MAX_HEADERS}",
            http.headers.len()
        ));
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    for header in &http.headers {
        let header_name = header.name.trim();
        // The name is shown only once it is known to be a short token.
        if header_name.len() > MAX_HEADER_NAME_BYTES || !is_header_name(header_name) {
            return Err(format!(
                "`{name}`: a header name is not an HTTP header name (letters, digits and \
                 !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME_BYTES} bytes)"
            ));
        }
        let lower = header_name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(format!(
                "`{name}`: the `{header_name}` header is set by keel and MCP's transport; \
                 leave it out"
            ));
        }
        if headers.iter().any(|(n, _)| *n == lower) {
            return Err(format!(
                "`{name}`: the `{header_name}` header is given twice"
            ));
        }
        let value = header.value.trim();
        if value.is_empty()
            || value.len() > MAX_HEADER_VALUE_BYTES
            || !value
                .bytes()
                .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return Err(format!(
                "`{name}`: the value of its `{header_name}` header is empty, longer than {} KiB \
                 or holds characters a header cannot carry (control characters or non-ASCII)",
                MAX_HEADER_VALUE_BYTES >> 10
            ));
        }
        headers.push((lower, value.to_owned()));
    }
    let size = url.len()
        + headers
            .iter()
            .map(|(n, v)| n.len() + v.len())
            .sum::<usize>();
    if size > MAX_SERVER_BYTES {
        return Err(format!(
            "`{name}`: its URL and headers exceed {} KiB",
            MAX_SERVER_BYTES >> 10
        ));
    }
    headers.sort();
    let sha256 = keel_registry::sha256_hex(
        serde_json::json!({
            "name": name,
            "url": url,
            "headers": headers,
        })
        .to_string()
        .as_bytes(),
    );
    Ok(Offered {
        env_names: Vec::new(),
        header_names: headers.iter().map(|(n, _)| n.clone()).collect(),
        server: McpServer {
            url: Some(url.to_owned()),
            editor_headers: EditorHeaders(headers),
            // Granted nothing but its own origin, for the `mcp` plugin alone.
            from_project: true,
            from_editor: true,
            ..McpServer::default()
        },
        name,
        sha256,
    })
}

/// The SHA-256 of a server's name, command, arguments and environment, in a canonical JSON
/// form (the environment sorted by name).
fn fingerprint(
    name: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> String {
    let canonical = serde_json::json!({
        "name": name,
        "command": command,
        "args": args,
        "env": env,
    });
    keel_registry::sha256_hex(canonical.to_string().as_bytes())
}

#[derive(Serialize, Deserialize, Default)]
struct Approvals {
    #[serde(default)]
    approved: Vec<Approved>,
    #[serde(default)]
    pending: Vec<Pending>,
}

#[derive(Serialize, Deserialize, PartialEq, Clone)]
struct Approved {
    workspace: PathBuf,
    sha256: String,
}

/// A server an editor asked for in a workspace, not approved yet.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Pending {
    pub workspace: PathBuf,
    pub sha256: String,
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env_names: Vec<String>,
    /// An HTTP server's URL (its `command` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// An HTTP server's header names; their values are never stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub header_names: Vec<String>,
}

impl Pending {
    /// What the person approves, in one line: the command and its arguments, or the URL,
    /// with the names of the environment variables or headers. Not yet terminal-safe.
    fn describe(&self) -> String {
        let what = match &self.url {
            Some(url) => url.clone(),
            None => format!("{} {}", self.command, self.args.join(" ")),
        };
        let mut extra = Vec::new();
        if !self.env_names.is_empty() {
            extra.push(format!("environment: {}", self.env_names.join(", ")));
        }
        if !self.header_names.is_empty() {
            extra.push(format!("headers: {}", self.header_names.join(", ")));
        }
        if extra.is_empty() {
            what.trim_end().to_owned()
        } else {
            format!("{} ({})", what.trim_end(), extra.join("; "))
        }
    }
}

fn file(home: &Path) -> PathBuf {
    home.join(FILE)
}

fn read(home: &Path) -> Approvals {
    std::fs::read(file(home))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Change the file under its lock, written atomically.
fn update(home: &Path, change: impl FnOnce(&mut Approvals)) -> anyhow::Result<()> {
    let path = file(home);
    let _lock = keel_registry::lock_for_update(&path)
        .with_context(|| format!("cannot lock {} for the change", path.display()))?;
    let mut all = read(home);
    change(&mut all);
    keel_registry::atomic_write(&path, &serde_json::to_vec_pretty(&all)?, true)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Whether the person approved this server for `workspace`.
pub fn is_approved(home: &Path, workspace: &Path, offered: &Offered) -> bool {
    read(home).approved.contains(&Approved {
        workspace: workspace.to_path_buf(),
        sha256: offered.sha256.clone(),
    })
}

/// Record `offered` as waiting for the person's approval in `workspace`.
fn note_pending(home: &Path, workspace: &Path, offered: &[&Offered]) -> anyhow::Result<()> {
    update(home, |all| {
        for o in offered {
            all.pending
                .retain(|p| !(p.workspace == workspace && p.sha256 == o.sha256));
            all.pending.push(Pending {
                workspace: workspace.to_path_buf(),
                sha256: o.sha256.clone(),
                name: o.name.clone(),
                command: o.server.command.clone().unwrap_or_default(),
                args: o.server.args.clone(),
                env_names: o.env_names.clone(),
                url: o.server.url.clone(),
                header_names: o.header_names.clone(),
            });
        }
        let excess = all.pending.len().saturating_sub(MAX_PENDING);
        all.pending.drain(..excess);
    })
}

/// The requests waiting in `workspace`.
pub fn pending(home: &Path, workspace: &Path) -> Vec<Pending> {
    read(home)
        .pending
        .into_iter()
        .filter(|p| p.workspace == workspace)
        .collect()
}

/// Approve the requests `approved` of `workspace`.
pub fn approve(home: &Path, workspace: &Path, approved: &[Pending]) -> anyhow::Result<()> {
    update(home, |all| {
        for p in approved {
            all.pending
                .retain(|q| !(q.workspace == workspace && q.sha256 == p.sha256));
            let entry = Approved {
                workspace: workspace.to_path_buf(),
                sha256: p.sha256.clone(),
            };
            if !all.approved.contains(&entry) {
                all.approved.push(entry);
            }
        }
    })
}

/// Add the approved servers of `servers` to `config`, granted nothing; the lines telling the
/// editor (and stderr) what was not started and how to approve it.
pub fn add_approved(
    home: &Path,
    workspace: &Path,
    servers: &[acp::McpServer],
    config: &mut UserConfig,
) -> Vec<String> {
    if servers.is_empty() {
        return Vec::new();
    }
    let (offered, mut notices) = offered(servers);
    let mut waiting = Vec::new();
    let mut added = false;
    for o in &offered {
        if config.mcp.servers.contains_key(&o.name) {
            notices.push(format!(
                "`{}`: keel's own config has a server of that name, which keeps its grants; \
                 the editor's is not started",
                o.name
            ));
        } else if is_approved(home, workspace, o) {
            config.mcp.servers.insert(o.name.clone(), o.server.clone());
            added = true;
        } else {
            waiting.push(o);
        }
    }
    if added {
        config.configure_mcp_plugin();
    }
    if !waiting.is_empty() {
        if let Err(e) = note_pending(home, workspace, &waiting) {
            notices.push(format!(
                "cannot record the servers waiting for approval: {e:#}"
            ));
        }
        notices.push(format!(
            "not started: {} — the MCP server(s) your editor passed are not approved for this \
             workspace (an editor's server list can come from a repository's settings). Read \
             them, then run `keel mcp approve --editor` in {} and open a new session; they are \
             granted nothing (a command runs in keel's sandbox, an HTTP server is reached at \
             its own address alone), each tool asking before it runs",
            waiting
                .iter()
                .map(|o| match &o.server.url {
                    Some(url) => format!("`{}` ({url})", o.name),
                    None => format!(
                        "`{}` ({} {})",
                        o.name,
                        o.server.command.as_deref().unwrap_or_default(),
                        o.server.args.join(" ")
                    ),
                })
                .collect::<Vec<_>>()
                .join(", "),
            workspace.display()
        ));
    }
    notices
}

/// `keel mcp approve --editor`: show the servers editors asked for in this workspace and
/// approve them.
pub fn approve_command(
    ctx: &crate::config::Context,
    yes: bool,
) -> anyhow::Result<std::process::ExitCode> {
    use crate::session::terminal_safe;
    let waiting = pending(&ctx.home, &ctx.workspace);
    if waiting.is_empty() {
        stdoutln!(
            "no MCP server an editor passed is waiting for approval in {}",
            ctx.workspace.display()
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    stdoutln!(
        "MCP servers an editor passed in {}, not approved:",
        ctx.workspace.display()
    );
    for p in &waiting {
        stdoutln!(
            "  {}: {}",
            terminal_safe(&p.name),
            terminal_safe(&p.describe())
        );
    }
    stdoutln!(
        "Each is granted nothing, and every tool asks before it runs: a command runs in the OS \
         sandbox with no folder to write, no host to reach and no secret; an HTTP server is \
         reached at its own address alone, its headers sent only there."
    );
    if !yes && !crate::commands::confirm("Start these servers when an editor passes them here?")? {
        stdoutln!("not approved");
        return Ok(std::process::ExitCode::FAILURE);
    }
    approve(&ctx.home, &ctx.workspace, &waiting)?;
    stdoutln!(
        "approved; a changed server (command, arguments or environment; URL or headers) needs \
         approving again"
    );
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(name: &str, args: &[&str], env: &[(&str, &str)]) -> acp::McpServer {
        acp::McpServer::Stdio(
            acp::McpServerStdio::new(name, "python3")
                .args(args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
                .env(
                    env.iter()
                        .map(|(k, v)| acp::EnvVariable::new(*k, *v))
                        .collect::<Vec<_>>(),
                ),
        )
    }

    #[test]
    fn a_changed_server_is_a_new_request_and_grants_nothing() {
        let (a, _) = offered(&[stdio("Tools", &["s.py"], &[("K", "1")])]);
        let (b, _) = offered(&[stdio("Tools", &["s.py"], &[("K", "2")])]);
        let (c, _) = offered(&[stdio("Tools", &["s.py", "--x"], &[("K", "1")])]);
        assert_eq!(a[0].name, "tools");
        assert_ne!(
            a[0].sha256, b[0].sha256,
            "an env value is part of the approval"
        );
        assert_ne!(
            a[0].sha256, c[0].sha256,
            "an argument is part of the approval"
        );
        let s = &a[0].server;
        assert!(s.from_project && s.dirs.is_empty() && s.hosts.is_empty());
        assert!(s.read.is_empty() && s.allow.is_empty() && s.url.is_none());
    }

    #[test]
    fn too_many_or_too_large_servers_are_refused() {
        let many: Vec<_> = (0..40).map(|i| stdio(&format!("s{i}"), &[], &[])).collect();
        let (taken, refused) = offered(&many);
        assert_eq!(taken.len(), MAX_SERVERS);
        assert_eq!(refused.len(), 1, "{refused:?}");
        let big = "x".repeat(MAX_SERVER_BYTES);
        let (taken, refused) = offered(&[stdio("big", &[&big], &[])]);
        assert!(taken.is_empty() && refused.len() == 1, "{refused:?}");
    }

    fn http(name: &str, url: &str, headers: &[(&str, &str)]) -> acp::McpServer {
        acp::McpServer::Http(
            acp::McpServerHttp::new(name, url).headers(
                headers
                    .iter()
                    .map(|(k, v)| acp::HttpHeader::new(*k, *v))
                    .collect::<Vec<_>>(),
            ),
        )
    }

    #[test]
    fn sse_and_duplicate_servers_are_refused() {
        let sse = acp::McpServer::Sse(acp::McpServerSse::new("old", "https://h.example/sse"));
        let (taken, refused) = offered(&[
            sse,
            stdio("a", &[], &[]),
            stdio("A", &[], &[]),
            http("a", "https://h.example/", &[]),
        ]);
        assert_eq!(taken.len(), 1);
        assert_eq!(refused.len(), 3, "{refused:?}");
    }

    #[test]
    fn an_http_servers_url_and_headers_are_its_approval_and_its_values_are_never_shown() {
        let token = "tok-SECRET-9";
        let one = |url: &str, value: &str| {
            let (taken, refused) = offered(&[http(
                "Web",
                url,
                &[("Authorization", value), ("X-Team", "core")],
            )]);
            assert!(refused.is_empty(), "{refused:?}");
            taken.into_iter().next().expect("taken")
        };
        let a = one("https://mcp.example.com/mcp", token);
        assert_eq!(a.name, "web");
        assert_eq!(a.header_names, ["authorization", "x-team"]);
        assert_ne!(
            a.sha256,
            one("https://mcp.example.com/mcp", "tok-other").sha256,
            "a header value is part of the approval"
        );
        assert_ne!(
            a.sha256,
            one("https://mcp.example.com/other", token).sha256,
            "the URL is part of the approval"
        );
        let (renamed, _) = offered(&[http(
            "Web",
            "https://mcp.example.com/mcp",
            &[("X-Token", token), ("X-Team", "core")],
        )]);
        assert_ne!(a.sha256, renamed[0].sha256, "a header name is part of it");
        // Granted nothing but its origin; its headers are held, and no debug print shows them.
        let s = &a.server;
        assert!(s.from_project && s.from_editor && s.command.is_none());
        assert!(s.dirs.is_empty() && s.hosts.is_empty() && s.allow.is_empty());
        assert_eq!(s.url.as_deref(), Some("https://mcp.example.com/mcp"));
        assert!(!format!("{a:?}").contains(token), "{a:?}");
        // The pending record names the headers, never their values.
        let home = tempfile::tempdir().expect("tempdir");
        note_pending(home.path(), Path::new("/ws"), &[&a]).expect("noted");
        let stored = std::fs::read_to_string(file(home.path())).expect("stored");
        assert!(stored.contains("authorization") && stored.contains("mcp.example.com"));
        assert!(!stored.contains(token), "{stored}");
        let waiting = pending(home.path(), Path::new("/ws"));
        assert_eq!(
            waiting[0].describe(),
            "https://mcp.example.com/mcp (headers: authorization, x-team)"
        );
        approve(home.path(), Path::new("/ws"), &waiting).expect("approved");
        assert!(is_approved(home.path(), Path::new("/ws"), &a));
        assert!(!is_approved(
            home.path(),
            Path::new("/ws"),
            &one("https://mcp.example.com/mcp", "tok-other")
        ));
        // Refusals never quote a value.
        let (_, refused) = offered(&[http("w", "https://h.example/", &[("Bad Name", token)])]);
        assert!(
            refused.len() == 1 && !refused[0].contains(token),
            "{refused:?}"
        );
        let (_, refused) = offered(&[http("w", "https://h.example/", &[("X-K", "a\nb")])]);
        assert!(
            refused.len() == 1 && !refused[0].contains("a\nb"),
            "{refused:?}"
        );
    }

    #[test]
    fn http_only_to_loopback_and_bounded() {
        let taken =
            |url: &str, headers: &[(&str, &str)]| offered(&[http("w", url, headers)]).0.len();
        assert_eq!(taken("http://127.0.0.1:8931/mcp", &[]), 1);
        assert_eq!(taken("http://[::1]:8931/mcp", &[]), 1);
        assert_eq!(taken("http://localhost:8931/mcp", &[]), 1);
        assert_eq!(taken("https://10.0.0.5/mcp", &[]), 1);
        assert_eq!(
            taken("http://mcp.example.com/mcp", &[]),
            0,
            "plain http off this machine"
        );
        assert_eq!(taken("http://10.0.0.5/mcp", &[]), 0);
        assert_eq!(taken("ftp://mcp.example.com/", &[]), 0);
        assert_eq!(taken("https://user:pw@mcp.example.com/", &[]), 0);
        assert_eq!(taken("not a url", &[]), 0);
        let long = format!("https://h.example/{}", "a".repeat(MAX_URL_BYTES));
        assert_eq!(taken(&long, &[]), 0);
        // The transport's and the connection's headers are keel's.
        for reserved in ["Host", "content-type", "Mcp-Session-Id", "Content-Length"] {
            assert_eq!(
                taken("https://h.example/", &[(reserved, "x")]),
                0,
                "{reserved}"
            );
        }
        assert_eq!(
            taken("https://h.example/", &[("X-A", "1"), ("x-a", "2")]),
            0
        );
        assert_eq!(taken("https://h.example/", &[("X-A", "")]), 0);
        assert_eq!(taken("https://h.example/", &[("X-A", "é")]), 0);
        let names: Vec<String> = (0..=MAX_HEADERS).map(|i| format!("x-{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        assert_eq!(taken("https://h.example/", &many), 0);
        assert_eq!(taken("https://h.example/", &many[..MAX_HEADERS]), 1);
        let big = "v".repeat(MAX_HEADER_VALUE_BYTES + 1);
        assert_eq!(taken("https://h.example/", &[("x-a", &big)]), 0);
        let near = "v".repeat(MAX_HEADER_VALUE_BYTES);
        let total: Vec<(&str, &str)> = names[..9]
            .iter()
            .map(|n| (n.as_str(), near.as_str()))
            .collect();
        assert_eq!(
            taken("https://h.example/", &total),
            0,
            "over 64 KiB together"
        );
    }
}
