//! The plugin side of the network gate: which hosts a plugin's manifest declares.
//!
//! A `network` entry in a plugin's `keel.toml` is one of:
//!
//! - `api.example.com`: exactly that host, any port;
//! - `api.example.com:8443`, `127.0.0.1:11434`, `[::1]:9000`: exactly that host and port;
//! - `.example.com`: every subdomain of `example.com` (`api.example.com`, `a.b.example.com`),
//!   but not `example.com` itself — the same reading as the user's `[network]` rules;
//! - `*`: any host the user's network policy lets through. The policy still decides (allow,
//!   prompt or deny) and private addresses still need `allow_private`; `*` only says the
//!   plugin does not know its hosts in advance (a model adapter with a configurable base URL).
//!
//! Matching is ASCII case-insensitive and ignores one trailing dot. The host being matched is
//! the normalized host of [`crate::gates::net_policy::NetVerdict`] (lowercase ASCII, IPv6 in
//! brackets).

/// Whether `patterns` (a manifest's `network` list, or the hosts a secret is bound to)
/// declare `host` at `port`.
pub fn declares(patterns: &[String], host: &str, port: u16) -> bool {
    patterns.iter().any(|p| matches(p, host, port))
}

fn normalize(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    match s.strip_suffix('.') {
        Some(stripped) => stripped.to_owned(),
        None => s,
    }
}

fn matches(pattern: &str, host: &str, port: u16) -> bool {
    let pattern = normalize(pattern);
    let host = normalize(host);
    if pattern == "*" {
        return true;
    }
    if let Some(suffix) = pattern.strip_prefix('.') {
        return !suffix.is_empty()
            && host.len() > suffix.len() + 1
            && host.ends_with(&pattern)
            && !host.starts_with('[');
    }
    if let Some((h, p)) = split_host_port(&pattern) {
        return p == port && same_host(h, &host);
    }
    same_host(&pattern, &host)
}

/// `host:port` (with `[v6]:port` for IPv6), or `None` when the pattern has no port.
fn split_host_port(pattern: &str) -> Option<(&str, u16)> {
    if let Some(rest) = pattern.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?.parse().ok()?;
        return Some((&pattern[..inner.len() + 2], port));
    }
    let (h, p) = pattern.rsplit_once(':')?;
    if h.contains(':') {
        // A bare IPv6 address, not host:port.
        return None;
    }
    Some((h, p.parse().ok()?))
}

/// Host equality, where a bare IPv6 pattern (`::1`) equals its bracketed form (`[::1]`).
fn same_host(pattern: &str, host: &str) -> bool {
    pattern == host || (pattern.contains(':') && format!("[{pattern}]") == host)
}

/// The manifest line that would declare `host` at `port`, for refusals.
pub(crate) fn suggestion(host: &str, port: u16, default_port: bool) -> String {
    if default_port {
        format!("network = [\"{host}\"]")
    } else {
        format!("network = [\"{host}:{port}\"]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn exact_suffix_port_and_star() {
        let list = p(&[
            "api.example.com",
            ".corp.example",
            "127.0.0.1:11434",
            "[::1]:9000",
        ]);
        assert!(declares(&list, "api.example.com", 443));
        assert!(declares(&list, "API.example.com.", 80));
        assert!(!declares(&list, "x.api.example.com", 443));
        assert!(!declares(&list, "example.com", 443));
        assert!(declares(&list, "a.corp.example", 443));
        assert!(declares(&list, "a.b.corp.example", 443));
        assert!(!declares(&list, "corp.example", 443));
        assert!(!declares(&list, "evilcorp.example", 443));
        assert!(declares(&list, "127.0.0.1", 11434));
        assert!(!declares(&list, "127.0.0.1", 11435));
        assert!(declares(&list, "[::1]", 9000));
        assert!(!declares(&list, "[::1]", 9001));
        assert!(declares(&p(&["::1"]), "[::1]", 1));
        assert!(declares(&p(&["*"]), "anything.example", 1));
        assert!(!declares(&[], "api.example.com", 443));
    }

    #[test]
    fn suggestions_name_the_manifest_line() {
        assert_eq!(
            suggestion("api.example.com", 443, true),
            "network = [\"api.example.com\"]"
        );
        assert_eq!(
            suggestion("127.0.0.1", 8080, false),
            "network = [\"127.0.0.1:8080\"]"
        );
    }
}
