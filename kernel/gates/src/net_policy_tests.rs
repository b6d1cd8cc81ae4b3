//! Unit tests of `kernel/gates/src/net_policy.rs`.

use super::*;
use proptest::prelude::*;
use std::time::Duration;

use NetCheck as C;
use NetDecision::{Allow, Forbid as Deny, Prompt};

fn open() -> NetPolicy {
    NetPolicy::new(Allow)
}

fn policy(toml: &str) -> NetPolicy {
    let (p, warnings) = NetPolicy::from_toml(toml).expect("valid config");
    assert!(warnings.is_empty(), "unexpected warnings: {warnings:?}");
    p
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse().expect("test IPv6 literal"))
}

/// Under a policy that allows every host, only the fixed refusals remain.
#[test]
fn url_table() {
    let cases: &[(&str, NetDecision, NetCheck, &str)] = &[
        // Public hosts and addresses.
        ("https://example.com/", Allow, C::Default, "example.com"),
        (
            "https://EXAMPLE.com./path?q=1",
            Allow,
            C::Default,
            "example.com",
        ),
        ("http://93.184.216.34/", Allow, C::Default, "93.184.216.34"),
        ("http://8.8.8.8:8080/x", Allow, C::Default, "8.8.8.8"),
        ("http://11.0.0.1/", Allow, C::Default, "11.0.0.1"),
        (
            "http://100.63.255.255/",
            Allow,
            C::Default,
            "100.63.255.255",
        ),
        ("http://100.128.0.0/", Allow, C::Default, "100.128.0.0"),
        (
            "http://172.15.255.255/",
            Allow,
            C::Default,
            "172.15.255.255",
        ),
        ("http://172.32.0.0/", Allow, C::Default, "172.32.0.0"),
        (
            "http://169.253.255.255/",
            Allow,
            C::Default,
            "169.253.255.255",
        ),
        (
            "http://198.17.255.255/",
            Allow,
            C::Default,
            "198.17.255.255",
        ),
        ("http://198.20.0.0/", Allow, C::Default, "198.20.0.0"),
        (
            "http://223.255.255.255/",
            Allow,
            C::Default,
            "223.255.255.255",
        ),
        (
            "https://[2606:4700:4700::1111]/",
            Allow,
            C::Default,
            "[2606:4700:4700::1111]",
        ),
        (
            "http://[::ffff:8.8.8.8]/",
            Allow,
            C::Default,
            "[::ffff:8.8.8.8]",
        ),
        (
            "http://[64:ff9b::808:808]/",
            Allow,
            C::Default,
            "[64:ff9b::808:808]",
        ),
        (
            "http://[2002:808:808::1]/",
            Allow,
            C::Default,
            "[2002:808:808::1]",
        ),
        ("http://münchen.de/", Allow, C::Default, "xn--mnchen-3ya.de"),
        (
            "HTTPS://Api.Example.COM:443/",
            Allow,
            C::Default,
            "api.example.com",
        ),
        // Local names.
        ("http://localhost/", Deny, C::HostName, "localhost"),
        ("http://LOCALHOST.:8080/x", Deny, C::HostName, "localhost"),
        ("http://api.localhost/", Deny, C::HostName, "api.localhost"),
        (
            "http://localhost.localdomain/",
            Deny,
            C::HostName,
            "localhost.localdomain",
        ),
        (
            "http://metadata.google.internal/",
            Deny,
            C::HostName,
            "metadata.google.internal",
        ),
        // Loopback and unspecified.
        ("http://127.0.0.1/", Deny, C::Address, "127.0.0.1"),
        (
            "http://127.255.255.254:9000/",
            Deny,
            C::Address,
            "127.255.255.254",
        ),
        ("http://[::1]/", Deny, C::Address, "[::1]"),
        ("http://0.0.0.0/", Deny, C::Address, "0.0.0.0"),
        ("http://0/", Deny, C::Address, "0.0.0.0"),
        ("http://0.1.2.3/", Deny, C::Address, "0.1.2.3"),
        ("http://[::]/", Deny, C::Address, "[::]"),
        // RFC 1918.
        ("http://10.1.2.3/", Deny, C::Address, "10.1.2.3"),
        ("http://172.16.0.1/", Deny, C::Address, "172.16.0.1"),
        ("http://172.31.255.255/", Deny, C::Address, "172.31.255.255"),
        ("http://192.168.1.1/", Deny, C::Address, "192.168.1.1"),
        // Link-local and metadata.
        (
            "http://169.254.169.254/latest/meta-data/",
            Deny,
            C::Address,
            "169.254.169.254",
        ),
        ("http://169.254.1.1/", Deny, C::Address, "169.254.1.1"),
        ("http://[fe80::1]/", Deny, C::Address, "[fe80::1]"),
        ("http://[febf::1]/", Deny, C::Address, "[febf::1]"),
        // CGNAT (Alibaba's metadata address is in it), benchmarking.
        ("http://100.64.0.1/", Deny, C::Address, "100.64.0.1"),
        (
            "http://100.127.255.255/",
            Deny,
            C::Address,
            "100.127.255.255",
        ),
        (
            "http://100.100.100.200/",
            Deny,
            C::Address,
            "100.100.100.200",
        ),
        ("http://198.18.0.1/", Deny, C::Address, "198.18.0.1"),
        ("http://198.19.255.255/", Deny, C::Address, "198.19.255.255"),
        // Documentation and IETF blocks.
        ("http://192.0.0.170/", Deny, C::Address, "192.0.0.170"),
        ("http://192.0.2.1/", Deny, C::Address, "192.0.2.1"),
        ("http://198.51.100.7/", Deny, C::Address, "198.51.100.7"),
        ("http://203.0.113.9/", Deny, C::Address, "203.0.113.9"),
        ("http://[2001:db8::1]/", Deny, C::Address, "[2001:db8::1]"),
        // Multicast, class E, broadcast.
        ("http://224.0.0.1/", Deny, C::Address, "224.0.0.1"),
        (
            "http://239.255.255.250/",
            Deny,
            C::Address,
            "239.255.255.250",
        ),
        ("http://[ff02::1]/", Deny, C::Address, "[ff02::1]"),
        ("http://240.0.0.1/", Deny, C::Address, "240.0.0.1"),
        (
            "http://255.255.255.255/",
            Deny,
            C::Address,
            "255.255.255.255",
        ),
        // Unique-local (AWS's IPv6 metadata address is in it), site-local.
        ("http://[fc00::1]/", Deny, C::Address, "[fc00::1]"),
        (
            "http://[fd00:ec2::254]/",
            Deny,
            C::Address,
            "[fd00:ec2::254]",
        ),
        ("http://[fec0::1]/", Deny, C::Address, "[fec0::1]"),
        // IPv4 inside IPv6.
        (
            "http://[::ffff:127.0.0.1]/",
            Deny,
            C::Address,
            "[::ffff:127.0.0.1]",
        ),
        (
            "http://[::ffff:7f00:1]/",
            Deny,
            C::Address,
            "[::ffff:127.0.0.1]",
        ),
        (
            "http://[::ffff:169.254.169.254]/",
            Deny,
            C::Address,
            "[::ffff:169.254.169.254]",
        ),
        (
            "http://[::ffff:10.0.0.1]/",
            Deny,
            C::Address,
            "[::ffff:10.0.0.1]",
        ),
        (
            "http://[0:0:0:0:0:ffff:c0a8:101]/",
            Deny,
            C::Address,
            "[::ffff:192.168.1.1]",
        ),
        ("http://[::127.0.0.1]/", Deny, C::Address, "[::7f00:1]"),
        ("http://[::8.8.8.8]/", Deny, C::Address, "[::808:808]"),
        (
            "http://[64:ff9b::7f00:1]/",
            Deny,
            C::Address,
            "[64:ff9b::7f00:1]",
        ),
        (
            "http://[64:ff9b::a9fe:a9fe]/",
            Deny,
            C::Address,
            "[64:ff9b::a9fe:a9fe]",
        ),
        ("http://[64:ff9b:1::1]/", Deny, C::Address, "[64:ff9b:1::1]"),
        (
            "http://[2002:7f00:1::]/",
            Deny,
            C::Address,
            "[2002:7f00:1::]",
        ),
        ("http://[2001::1]/", Deny, C::Address, "[2001::1]"),
        ("http://[100::1]/", Deny, C::Address, "[100::1]"),
        // Odd IPv4 literal forms, normalized by the URL parser.
        ("http://2130706433/", Deny, C::Address, "127.0.0.1"),
        ("http://0177.0.0.1/", Deny, C::Address, "127.0.0.1"),
        ("http://0x7f.1/", Deny, C::Address, "127.0.0.1"),
        ("http://0x7f000001/", Deny, C::Address, "127.0.0.1"),
        ("http://017700000001/", Deny, C::Address, "127.0.0.1"),
        ("http://127.1/", Deny, C::Address, "127.0.0.1"),
        ("http://127.0.0.1./", Deny, C::Address, "127.0.0.1"),
        ("http://%31%32%37.0.0.1/", Deny, C::Address, "127.0.0.1"),
        ("http://127。0。0。1/", Deny, C::Address, "127.0.0.1"),
        ("http://１２７.０.０.１/", Deny, C::Address, "127.0.0.1"),
        ("http://0xA9FEA9FE/", Deny, C::Address, "169.254.169.254"),
        (
            "http://0251.0376.0251.0376/",
            Deny,
            C::Address,
            "169.254.169.254",
        ),
        ("http://3232235777/", Deny, C::Address, "192.168.1.1"),
        ("http://10.1/", Deny, C::Address, "10.0.0.1"),
        // Schemes.
        ("file:///etc/passwd", Deny, C::Scheme, ""),
        ("ftp://example.com/", Deny, C::Scheme, "example.com"),
        ("gopher://example.com:70/", Deny, C::Scheme, "example.com"),
        ("javascript:alert(1)", Deny, C::Scheme, ""),
        ("data:text/plain,hi", Deny, C::Scheme, ""),
        ("ws://example.com/", Deny, C::Scheme, "example.com"),
        // Userinfo.
        (
            "http://user:pass@example.com/",
            Deny,
            C::Userinfo,
            "example.com",
        ),
        (
            "https://api.openai.com@evil.com/",
            Deny,
            C::Userinfo,
            "evil.com",
        ),
        ("http://user@example.com/", Deny, C::Userinfo, "example.com"),
        (
            "http://:secret@example.com/",
            Deny,
            C::Userinfo,
            "example.com",
        ),
        // Not URLs, or no usable host.
        ("", Deny, C::Url, ""),
        ("not a url", Deny, C::Url, ""),
        ("/relative/path", Deny, C::Url, ""),
        ("http://", Deny, C::Url, ""),
        ("http://[::1/", Deny, C::Url, ""),
        ("http://1.2.3.4.5/", Deny, C::Url, ""),
        ("http://256.0.0.1/", Deny, C::Url, ""),
        ("http://a..b/", Deny, C::Url, "a..b"),
        ("http://.example.com/", Deny, C::Url, ".example.com"),
        ("http://example.com../", Deny, C::Url, "example.com.."),
        ("http://*.evil.com/", Deny, C::Url, "*.evil.com"),
    ];
    assert!(cases.len() >= 40);
    let p = open();
    for (url, decision, check, host) in cases {
        let v = p.decide_url(url);
        assert_eq!(
            (v.decision, v.check, v.host.as_str()),
            (*decision, *check, *host),
            "{url}: {v:?}"
        );
        if v.decision == Deny {
            let r = v.refusal().expect("a deny is a refusal");
            assert!(
                !r.reason.is_empty() && !r.suggestion.is_empty(),
                "{url}: {r:?}"
            );
        } else {
            assert!(v.refusal().is_none());
        }
    }
}

#[test]
fn address_table() {
    let cases: &[(IpAddr, Option<&str>)] = &[
        (v4(8, 8, 8, 8), None),
        (v4(1, 1, 1, 1), None),
        (v4(0, 0, 0, 0), Some("0.0.0.0/8")),
        (v4(10, 255, 255, 255), Some("10.0.0.0/8")),
        (v4(100, 64, 0, 0), Some("100.64.0.0/10")),
        (v4(127, 0, 0, 1), Some("127.0.0.0/8")),
        (v4(169, 254, 169, 254), Some("169.254.169.254")),
        (v4(169, 254, 0, 1), Some("169.254.0.0/16")),
        (v4(172, 20, 1, 1), Some("172.16.0.0/12")),
        (v4(192, 168, 0, 1), Some("192.168.0.0/16")),
        (v4(198, 18, 5, 5), Some("198.18.0.0/15")),
        (v4(230, 1, 1, 1), Some("224.0.0.0/4")),
        (v4(250, 1, 1, 1), Some("240.0.0.0/4")),
        (v4(255, 255, 255, 255), Some("255.255.255.255")),
        (v6("2606:4700::1"), None),
        (v6("::"), Some("::/128")),
        (v6("::1"), Some("::1/128")),
        (v6("::ffff:127.0.0.1"), Some("127.0.0.0/8")),
        (v6("::ffff:1.1.1.1"), None),
        (v6("::1.1.1.1"), Some("::/96")),
        (v6("::ffff:0:1.1.1.1"), Some("::ffff:0:0:0/96")),
        (v6("64:ff9b::10.0.0.1"), Some("10.0.0.0/8")),
        (v6("64:ff9b::1.1.1.1"), None),
        (v6("2002:c0a8:101::"), Some("192.168.0.0/16")),
        (v6("fe80::abcd"), Some("fe80::/10")),
        (v6("fdff::1"), Some("fc00::/7")),
        (v6("ff0e::1"), Some("ff00::/8")),
    ];
    for (ip, want) in cases {
        assert_eq!(forbidden_range(*ip).map(|r| r.cidr), *want, "{ip}");
    }
    let mapped = forbidden_range(v6("::ffff:169.254.169.254")).expect("forbidden");
    assert!(
        mapped.describe().contains("IPv4-mapped"),
        "{}",
        mapped.describe()
    );
}

#[test]
fn subdomain_rule_does_not_cover_the_bare_domain() {
    let p = policy(
        r#"[network]
default = "prompt"
rules = [{ host = ".example.com", decision = "allow" }]"#,
    );
    assert_eq!(p.decide_url("https://api.example.com/").decision, Allow);
    assert_eq!(p.decide_url("https://a.b.example.com/").decision, Allow);
    assert_eq!(p.decide_url("https://API.EXAMPLE.COM./").decision, Allow);
    assert_eq!(p.decide_url("https://example.com/").decision, Prompt);
    assert_eq!(p.decide_url("https://notexample.com/").decision, Prompt);
    assert_eq!(
        p.decide_url("https://example.com.evil.net/").decision,
        Prompt
    );
}

#[test]
fn exact_rule_covers_only_that_host() {
    let p = policy(
        r#"[network]
default = "deny"
rules = [{ host = "Example.COM.", decision = "allow" }]"#,
    );
    let v = p.decide_url("https://example.com/x");
    assert_eq!((v.decision, v.check), (Allow, C::Rule));
    assert_eq!(p.decide_url("https://www.example.com/").decision, Deny);
    assert_eq!(p.decide_url("https://example.com.au/").decision, Deny);
}

#[test]
fn idna_rules_match_idna_hosts() {
    let p = NetPolicy::new(Deny)
        .with_rule("münchen.de", Allow)
        .expect("valid rule");
    assert_eq!(p.decide_url("https://MÜNCHEN.de/").decision, Allow);
    assert_eq!(p.decide_url("https://xn--mnchen-3ya.de/").decision, Allow);
}

#[test]
fn deny_wins_whatever_the_order() {
    for rules in [
        r#"[{ host = "bad.example.com", decision = "allow" }, { host = ".example.com", decision = "deny" }]"#,
        r#"[{ host = ".example.com", decision = "deny" }, { host = "bad.example.com", decision = "allow" }]"#,
    ] {
        let p = policy(&format!("[network]\ndefault = \"allow\"\nrules = {rules}"));
        let v = p.decide_url("https://bad.example.com/");
        assert_eq!((v.decision, v.check), (Deny, C::Rule), "{rules}");
        assert!(v.reason.contains(".example.com"), "{}", v.reason);
    }
    let p = NetPolicy::new(Allow)
        .with_rule("x.com", Allow)
        .and_then(|p| p.with_rule("x.com", Prompt))
        .expect("valid rules");
    assert_eq!(p.decide_url("https://x.com/").decision, Prompt);
}

#[test]
fn a_deny_rule_beats_allow_private() {
    let p = NetPolicy::new(Allow)
        .with_allow_private("127.0.0.1:11434")
        .and_then(|p| p.with_rule("127.0.0.1", Deny))
        .expect("valid");
    let v = p.decide_url("http://127.0.0.1:11434/");
    assert_eq!((v.decision, v.check), (Deny, C::Rule));
}

#[test]
fn allow_private_is_exact_host_and_port() {
    let p = policy(
        r#"[network]
default = "allow"
allow_private = ["127.0.0.1:11434", "localhost:8080", "[::1]:9000"]"#,
    );
    let allowed = [
        "http://127.0.0.1:11434/api/chat",
        "http://2130706433:11434/",
        "http://127.1:11434/",
        "http://localhost:8080/",
        "http://LOCALHOST.:8080/",
        "http://[::1]:9000/",
    ];
    for url in allowed {
        assert_eq!(p.decide_url(url).decision, Allow, "{url}");
    }
    let refused = [
        "http://127.0.0.1:11435/",
        "http://127.0.0.1/",
        "http://127.0.0.2:11434/",
        "http://localhost:11434/",
        "http://api.localhost:8080/",
        "http://localhost:80/",
        "http://[::1]:11434/",
        "http://[::ffff:127.0.0.1]:11434/",
    ];
    for url in refused {
        assert_eq!(p.decide_url(url).decision, Deny, "{url}");
    }
    // The rules still apply to a listed endpoint.
    let p = policy(
        r#"[network]
default = "prompt"
allow_private = ["127.0.0.1:11434"]"#,
    );
    assert_eq!(p.decide_url("http://127.0.0.1:11434/").decision, Prompt);
}

#[test]
fn unknown_decisions_read_as_prompt_with_a_warning() {
    let (p, warnings) = NetPolicy::from_toml(
        r#"[network]
default = "yes"
rules = [
  { host = "a.com", decision = "alow" },
  { host = "b.com", decision = 1 },
  { host = "c.com" },
  { host = "d.com", decision = "ALLOW", note = "x" },
]"#,
    )
    .expect("loads");
    assert_eq!(p.default_decision(), Prompt);
    assert_eq!(p.decide_url("https://a.com/").decision, Prompt);
    assert_eq!(p.decide_url("https://b.com/").decision, Prompt);
    assert_eq!(p.decide_url("https://c.com/").decision, Prompt);
    assert_eq!(p.decide_url("https://d.com/").decision, Allow);
    assert_eq!(warnings.len(), 5, "{warnings:#?}");
    assert!(
        warnings[0].to_string().contains("\"yes\""),
        "{}",
        warnings[0]
    );
    assert!(warnings.iter().any(|w| w.message.contains("\"alow\"")));
    assert!(warnings.iter().any(|w| w.message.contains("`note`")));

    let (p, warnings) =
        NetPolicy::from_toml("[network]\ndefault = 3\ntrusted_fakeip_cidrs = []").expect("ok");
    assert_eq!(p.default_decision(), Prompt);
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
}

#[test]
fn from_toml_reads_only_network() {
    let (p, warnings) = NetPolicy::from_toml(
        r#"
[exec]
approval = "ask"

[network]
default = "deny"

[[network.rules]]
host = "api.openai.com"
decision = "allow"

[[network.rules]]
host = ".evil.com"
decision = "deny"

[trust]
native = ["echo"]
"#,
    )
    .expect("loads");
    assert!(warnings.is_empty());
    assert_eq!(p.decide_url("https://api.openai.com/v1").decision, Allow);
    assert_eq!(p.decide_url("https://x.evil.com/").decision, Deny);
    assert_eq!(p.decide_url("https://other.com/").decision, Deny);

    let (p, warnings) = NetPolicy::from_toml("[exec]\napproval = \"ask\"\n").expect("loads");
    assert_eq!(p, NetPolicy::default());
    assert_eq!(p.default_decision(), Prompt);
    assert!(warnings.is_empty());
}

#[test]
fn from_toml_errors() {
    let bad: &[(&str, &str)] = &[
        ("[network", "Toml"),
        ("network = 5", "Invalid"),
        ("[network]\nrules = \"x\"", "Invalid"),
        ("[network]\nrules = [\"x.com\"]", "Invalid"),
        ("[network]\nrules = [{ decision = \"allow\" }]", "Invalid"),
        (
            "[network]\nrules = [{ host = \"*.x.com\", decision = \"allow\" }]",
            "BadHost",
        ),
        (
            "[network]\nrules = [{ host = \"https://x.com/\", decision = \"allow\" }]",
            "BadHost",
        ),
        (
            "[network]\nrules = [{ host = \".1.2.3.4\", decision = \"deny\" }]",
            "BadHost",
        ),
        (
            "[network]\nrules = [{ host = \"\", decision = \"deny\" }]",
            "BadHost",
        ),
        (
            "[network]\nrules = [{ host = \"a b\", decision = \"deny\" }]",
            "BadHost",
        ),
        ("[network]\nallow_private = \"127.0.0.1:1\"", "Invalid"),
        ("[network]\nallow_private = [11434]", "Invalid"),
        (
            "[network]\nallow_private = [\"127.0.0.1\"]",
            "BadAllowPrivate",
        ),
        (
            "[network]\nallow_private = [\"::1:11434\"]",
            "BadAllowPrivate",
        ),
        ("[network]\nallow_private = [\"[::1]\"]", "BadAllowPrivate"),
        (
            "[network]\nallow_private = [\"127.0.0.1:0\"]",
            "BadAllowPrivate",
        ),
        (
            "[network]\nallow_private = [\"127.0.0.1:70000\"]",
            "BadAllowPrivate",
        ),
        (
            "[network]\nallow_private = [\".localhost:1\"]",
            "BadAllowPrivate",
        ),
    ];
    for (text, kind) in bad {
        let err = NetPolicy::from_toml(text).expect_err(text);
        let got = match err {
            NetPolicyError::Toml { .. } => "Toml",
            NetPolicyError::Invalid { .. } => "Invalid",
            NetPolicyError::BadHost { .. } => "BadHost",
            NetPolicyError::BadAllowPrivate { .. } => "BadAllowPrivate",
        };
        assert_eq!(got, *kind, "{text}: {err}");
    }
    let err =
        NetPolicy::from_toml("[network]\nrules = [{ host = \"*.x.com\" }]").expect_err("wildcard");
    assert!(err.to_string().contains("`.x.com`"), "{err}");
}

#[test]
fn refusals_say_what_to_do() {
    let v = NetPolicy::default().decide_url("http://127.0.0.1:11434/api/chat");
    let r = v.refusal().expect("refused");
    let text = r.to_string();
    assert!(text.contains("127.0.0.1"), "{text}");
    assert!(text.contains("loopback"), "{text}");
    assert!(
        text.contains("add \"127.0.0.1:11434\" to [network] allow_private"),
        "{text}"
    );

    let v = NetPolicy::default().decide_url("https://api.example.com/v1?key=SECRET");
    assert_eq!((v.decision, v.check), (Prompt, C::Default));
    let s = v.suggestion.expect("prompt explains how to allow");
    assert!(
        s.contains(r#"add `{ host = "api.example.com", decision = "allow" }` under [network] rules in ~/.keel/config.toml"#),
        "{s}"
    );
    assert!(!v.reason.contains("SECRET"));

    let v = NetPolicy::new(Deny).decide_url("https://api.example.com/");
    assert!(
        v.suggestion
            .is_some_and(|s| s.contains("decision = \"allow\""))
    );

    let v = open().decide_url("file:///etc/passwd");
    assert!(v.suggestion.is_some_and(|s| s.contains("file tools")));
    let v = open().decide_url("https://user:pw@example.com/");
    assert!(!v.reason.contains("pw") || !v.reason.contains("user:pw"));
    assert!(v.suggestion.is_some_and(|s| s.contains("Authorization")));
}

#[test]
fn check_resolved_checks_every_address_and_pins_the_first() {
    let p = open();
    let public = [v4(93, 184, 216, 34), v6("2606:2800:220:1::1")];
    assert_eq!(p.check_resolved("example.com", 443, &public), Ok(public[0]));

    for mixed in [
        [v4(93, 184, 216, 34), v4(127, 0, 0, 1)],
        [v4(10, 0, 0, 1), v4(93, 184, 216, 34)],
        [v4(93, 184, 216, 34), v6("::ffff:169.254.169.254")],
    ] {
        let r = p
            .check_resolved("rebind.example", 80, &mixed)
            .expect_err("mixed");
        assert_eq!(r.check, C::Address);
        assert!(r.reason.contains("rebinding"), "{}", r.reason);
    }
    let r = p.check_resolved("example.com", 80, &[]).expect_err("empty");
    assert_eq!(r.check, C::Resolution);
    let r = p
        .check_resolved("localhost", 80, &public)
        .expect_err("local name");
    assert_eq!(r.check, C::HostName);
    let r = p.check_resolved("a..b", 80, &public).expect_err("bad host");
    assert_eq!(r.check, C::Url);
    let r = p
        .check_resolved("[::1]", 80, &[v6("::1")])
        .expect_err("loopback literal");
    assert_eq!(r.check, C::Address);
}

#[test]
fn check_resolved_honours_allow_private_exactly() {
    let p = NetPolicy::default()
        .with_allow_private("localhost:11434")
        .and_then(|p| p.with_allow_private("[::1]:9000"))
        .expect("valid");
    let local = [v4(127, 0, 0, 1), v6("::1")];
    assert_eq!(p.check_resolved("localhost", 11434, &local), Ok(local[0]));
    assert_eq!(p.check_resolved("LOCALHOST.", 11434, &local), Ok(local[0]));
    assert!(p.check_resolved("localhost", 11435, &local).is_err());
    assert!(p.check_resolved("127.0.0.1", 11434, &local).is_err());
    assert_eq!(p.check_resolved("::1", 9000, &[v6("::1")]), Ok(v6("::1")));
    assert_eq!(p.check_resolved("[::1]", 9000, &[v6("::1")]), Ok(v6("::1")));
}

#[test]
fn redirects_are_rechecked_and_limited() {
    let p = policy(
        r#"[network]
default = "prompt"
rules = [
  { host = ".good.com", decision = "allow" },
  { host = "bad.good.com", decision = "deny" },
]"#,
    );
    let from = "https://a.good.com/start?x=1";
    assert_eq!(
        p.check_redirect(from, "/next", 0),
        Ok(String::from("https://a.good.com/next"))
    );
    assert_eq!(
        p.check_redirect(from, "../up#frag", 1),
        Ok(String::from("https://a.good.com/up#frag"))
    );
    assert_eq!(
        p.check_redirect(from, "//b.good.com/x", 2),
        Ok(String::from("https://b.good.com/x"))
    );
    assert_eq!(
        p.check_redirect(from, "  http://c.good.com/  ", 4),
        Ok(String::from("http://c.good.com/"))
    );

    let check = |location: &str| {
        p.check_redirect(from, location, 0)
            .expect_err(location)
            .check
    };
    assert_eq!(
        check("http://169.254.169.254/latest/meta-data/"),
        C::Address
    );
    assert_eq!(check("http://[::ffff:127.0.0.1]/"), C::Address);
    assert_eq!(check("http://localhost:8080/"), C::HostName);
    assert_eq!(check("file:///etc/passwd"), C::Scheme);
    assert_eq!(check("https://user:pw@b.good.com/"), C::Userinfo);
    assert_eq!(check("https://bad.good.com/"), C::Rule);
    assert_eq!(check("https://elsewhere.com/"), C::Approval);
    assert_eq!(check(""), C::Redirect);
    assert_eq!(check("http://[::1"), C::Redirect);
    assert_eq!(
        p.check_redirect("not a url", "/x", 0)
            .expect_err("bad from")
            .check,
        C::Redirect
    );

    // Following a chain: five redirects pass, the sixth is refused.
    let mut url = String::from("https://a.good.com/0");
    for hop in 0..MAX_REDIRECTS {
        url = p
            .check_redirect(&url, &format!("/{}", hop + 1), hop)
            .expect("within the limit");
    }
    assert_eq!(url, "https://a.good.com/5");
    let r = p
        .check_redirect(&url, "/6", MAX_REDIRECTS)
        .expect_err("over the limit");
    assert_eq!(r.check, C::Redirect);
    assert!(r.reason.contains('5'), "{}", r.reason);
    assert!(p.check_redirect(&url, "/6", usize::MAX).is_err());
}

#[test]
fn audit_line_is_one_json_line() {
    let v = NetPolicy::default().decide_url("http://169.254.169.254/");
    let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    let record = AuditRecord::new("evil\nplugin", &v, at);
    let line = audit_line(&record);
    assert!(!line.contains('\n'), "{line}");
    let json: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(json["time"], "2023-11-14T22:13:20.123Z");
    assert_eq!(json["plugin"], "evil\nplugin");
    assert_eq!(json["host"], "169.254.169.254");
    assert_eq!(json["decision"], "forbid");
    assert!(
        json["reason"]
            .as_str()
            .is_some_and(|r| r.contains("metadata")),
        "{json}"
    );
}

#[test]
fn rfc3339_dates() {
    let at = |secs: u64| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs));
    assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000Z");
    assert_eq!(at(1_709_164_800), "2024-02-29T00:00:00.000Z");
    assert_eq!(at(1_735_689_599), "2024-12-31T23:59:59.000Z");
    assert_eq!(at(4_102_444_800), "2100-01-01T00:00:00.000Z");
    let before = UNIX_EPOCH
        .checked_sub(Duration::from_secs(10))
        .expect("representable");
    assert_eq!(rfc3339_utc(before), "1970-01-01T00:00:00.000Z");
}

#[test]
fn fuzz_seed_corpus_replays() {
    let seeds = crate::fuzz_seeds("net_policy");
    for (_, text) in &seeds {
        crate::properties::net_policy(text.as_bytes());
    }
    assert!(seeds.len() >= 16, "expected seeds, found {}", seeds.len());
}

/// URL-ish pieces for [`crate::properties::net_policy`]: schemes, hosts in every spelling
/// the address checks must see through, redirects and resolved addresses.
fn netish() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        "http://",
        "https://",
        "ftp://",
        "file:///",
        "//",
        "user:pw@",
        "example.com",
        "localhost",
        "127.0.0.1",
        "0x7f.1",
        "2130706433",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "169.254.169.254",
        "metadata.google.internal",
        "10.0.0.1",
        "8.8.8.8",
        ":80",
        ":0",
        "/",
        "/a?token=secret",
        "#frag",
        "%2e",
        "..",
        "\n",
        "\n93.184.216.34",
        "\n::1",
        ".",
        "@",
        "\\",
        " ",
        "\u{0}",
    ]);
    prop::collection::vec(atoms, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn net_policy_properties_hold(s in netish(), hop in 0u8..8) {
        let mut data = vec![hop];
        data.extend_from_slice(s.as_bytes());
        crate::properties::net_policy(&data);
        crate::properties::net_policy(s.as_bytes());
    }

    #[test]
    fn decide_url_never_panics(s in any::<String>()) {
        let p = open();
        let v = p.decide_url(&s);
        prop_assert!(v.decision != Deny || v.suggestion.is_some());
        let _ = p.decide_url(&format!("http://{s}"));
        let _ = p.decide_url(&format!("https://{s}/"));
        let _ = p.check_redirect("https://example.com/a", &s, 0);
    }

    #[test]
    fn host_inputs_never_panic(host in any::<String>(), port in any::<u16>(), ip in any::<u128>()) {
        let p = open();
        let _ = p.check_resolved(&host, port, &[IpAddr::V6(Ipv6Addr::from(ip))]);
        let _ = NetPolicy::new(Allow).with_rule(&host, Deny);
        let _ = NetPolicy::new(Allow).with_allow_private(&host);
        let _ = NetPolicy::from_toml(&host);
        let _ = NetPolicy::from_toml(&format!(
            "[network]\nrules = [{{ host = {host:?}, decision = \"deny\" }}]\nallow_private = [{host:?}]"
        ));
    }

    #[test]
    fn ipv4_literal_verdict_matches_the_table(a in any::<u32>()) {
        let ip = Ipv4Addr::from(a);
        let v = open().decide_url(&format!("http://{a}/"));
        prop_assert_eq!(v.host, ip.to_string());
        let refused = forbidden_range(IpAddr::V4(ip)).is_some();
        prop_assert_eq!(v.decision == Deny, refused);
        let mapped = ip.to_ipv6_mapped();
        prop_assert_eq!(forbidden_range(IpAddr::V6(mapped)).is_some(), refused);
    }
}

/// An origin granted to one requester is allowed for that requester's requests to exactly that
/// scheme, host and port; nobody else's, and no other origin, is widened.
#[test]
fn an_origin_granted_to_one_requester_widens_nothing_else() {
    let base = NetPolicy::default()
        .with_origin_for("mcp", "http://127.0.0.1:8931/mcp", true)
        .expect("valid origin")
        .with_origin_for("mcp", "https://tools.example.com/mcp", false)
        .expect("valid origin");
    let decide = |who: &str, url: &str| base.for_requester(who, url).decide_url(url).decision;
    assert_eq!(decide("mcp", "http://127.0.0.1:8931/other/path"), Allow);
    assert_eq!(decide("mcp", "https://TOOLS.example.com./mcp"), Allow);
    // Another requester, port, scheme or host: the policy as it is.
    assert_eq!(decide("mcp (server x)", "http://127.0.0.1:8931/mcp"), Deny);
    assert_eq!(decide("shell", "https://tools.example.com/mcp"), Prompt);
    assert_eq!(decide("mcp", "http://127.0.0.1:8932/mcp"), Deny);
    assert_eq!(decide("mcp", "https://127.0.0.1:8931/mcp"), Deny);
    assert_eq!(decide("mcp", "http://tools.example.com/mcp"), Prompt);
    assert_eq!(decide("mcp", "https://tools.example.com:8443/mcp"), Prompt);
    assert_eq!(decide("mcp", "https://api.tools.example.com/mcp"), Prompt);
    // The loopback origin's address is exempt for its requester only; a public origin granted
    // without `private` still has its resolved addresses checked.
    let lo = [v4(127, 0, 0, 1)];
    assert!(
        base.for_requester("mcp", "http://127.0.0.1:8931/")
            .check_resolved("127.0.0.1", 8931, &lo)
            .is_ok()
    );
    assert!(base.check_resolved("127.0.0.1", 8931, &lo).is_err());
    assert!(
        base.for_requester("mcp", "https://tools.example.com/")
            .check_resolved("tools.example.com", 443, &[v4(10, 0, 0, 5)])
            .is_err()
    );
    // The person's own deny rule still wins.
    let denied =
        policy("[network]\nrules = [{ host = \"tools.example.com\", decision = \"deny\" }]\n")
            .with_origin_for("mcp", "https://tools.example.com/mcp", false)
            .expect("valid origin");
    let url = "https://tools.example.com/mcp";
    assert_eq!(
        denied.for_requester("mcp", url).decide_url(url).decision,
        Deny
    );
    // Not a web origin.
    assert!(
        NetPolicy::default()
            .with_origin_for("mcp", "ftp://h/", false)
            .is_err()
    );
    assert!(
        NetPolicy::default()
            .with_origin_for("mcp", "not a url", false)
            .is_err()
    );
}
