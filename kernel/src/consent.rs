//! What a plugin's manifest lets it reach, in plain words, for the consent prompt of
//! `keel run --plugin DIR` and `keel registry install`. One function, so both prompts list the
//! same things: every service it calls, every topic it emits, directories, hosts, secrets,
//! commands, the agent, what it replaces and limits above the default. A plugin whose lines
//! say "nothing beyond its own sandbox" can reach nothing else through the kernel.

use crate::manifest::{DirAccess, Manifest, PluginKind};
use crate::wasm_host::WasmLimits;

/// The consent lines for `manifest`, each `LABEL: what it may do`.
pub fn capability_lines(manifest: &Manifest) -> Vec<String> {
    let caps = &manifest.capabilities;
    let mut lines = Vec::new();
    if manifest.kind == PluginKind::Native {
        lines.push(
            "FULL TRUST: native code, runs outside the sandbox with all of your rights".to_owned(),
        );
    }
    if let Some(replaced) = &manifest.replaces {
        lines.push(format!(
            "REPLACES: takes over `{replaced}`: unloads it and serves what it served"
        ));
    }
    let called = manifest
        .requires
        .keys()
        .chain(caps.services.iter())
        .collect::<std::collections::BTreeSet<_>>();
    for service in called {
        lines.push(service_line(service));
    }
    for topic in &caps.emits {
        lines.push(format!(
            "EVENTS: may emit `{topic}` to the plugins that listen"
        ));
    }
    for d in &caps.dirs {
        let access = match d.access {
            DirAccess::Read => "read",
            DirAccess::ReadWrite => "read and write",
        };
        lines.push(format!(
            "FILES: may {access} {} (seen as {})",
            d.path.display(),
            d.guest
        ));
    }
    for host in &caps.network {
        if host == "*" {
            lines.push("NETWORK: may send requests to any host your network policy allows".into());
        } else {
            lines.push(format!("NETWORK: may send requests to {host}"));
        }
    }
    for secret in &caps.secrets {
        lines.push(format!(
            "SECRETS: may have keel put your `{secret}` into its requests (only to the hosts \
             that secret is bound to)"
        ));
    }
    if caps.processes {
        lines.push(
            "PROCESSES: may start the servers listed for it in your config (each in the OS \
             sandbox with that entry's grants)"
                .to_owned(),
        );
    }
    if caps.exec {
        lines.push("EXEC: may ask to run commands (each judged by the exec policy)".to_owned());
    }
    if caps.agent {
        lines.push(
            "AGENT: can send requests to your model with your API key and run tool calls \
             through the gates"
                .to_owned(),
        );
    }
    let defaults = WasmLimits::default();
    if let Some(mib) = manifest.limits.memory_mib
        && mib.saturating_mul(1 << 20) > defaults.memory_bytes
    {
        lines.push(format!(
            "LIMITS: asks for {mib} MiB of memory (default {} MiB; more needs `[limits.{}]` in \
             your config)",
            defaults.memory_bytes >> 20,
            manifest.name
        ));
    }
    if let Some(ms) = manifest.limits.cpu_ms
        && u128::from(ms) > defaults.cpu.as_millis()
    {
        lines.push(format!(
            "LIMITS: asks for {ms} ms of CPU per call (default {} ms; more needs `[limits.{}]` \
             in your config)",
            defaults.cpu.as_millis(),
            manifest.name
        ));
    }
    if let Some(n) = manifest.limits.instances.filter(|n| *n > 1) {
        lines.push(format!(
            "LIMITS: asks to run {n} instances at once, each with its own memory (default 1; \
             more needs `[limits.{}] instances` in your config)",
            manifest.name
        ));
    }
    if lines.is_empty() {
        lines.push("nothing beyond its own sandbox".to_owned());
    }
    lines
}

/// One service a plugin calls, said for what it gives the plugin.
fn service_line(service: &str) -> String {
    use keel_protocol::services;
    match service {
        services::MODEL => "MODEL: can send requests to your model with your API key".to_owned(),
        services::SESSION_LOG => "SESSION LOGS: can ask for your session logs".to_owned(),
        services::VERIFIER => {
            "VERIFIER: can ask the claim verifier, which replays commands".to_owned()
        }
        services::TOOL_REGISTRY => "TOOLS: can look up every plugin's tools".to_owned(),
        services::AGENT => "AGENT: can start agent turns".to_owned(),
        services::PROMPT => "PROMPT: can read every plugin's prompt fragments".to_owned(),
        other => format!("SERVICE: can call `{other}`, provided by another plugin"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        let m = Manifest::parse(
            &format!("name = \"p\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n{text}"),
            std::path::Path::new("keel.toml"),
        )
        .expect("manifest");
        capability_lines(&m)
    }

    #[test]
    fn nothing_declared_says_so() {
        assert_eq!(lines(""), ["nothing beyond its own sandbox"]);
    }

    #[test]
    fn every_widening_is_named() {
        let all = lines(
            "replaces = \"tool-registry\"\n\
             [requires]\nmodel = \"^1\"\n\"session-log\" = { version = \"^1\", optional = true }\n\
             [capabilities]\nservices = [\"keel.prompt\", \"example.x\"]\nemits = [\"session.event\"]\n\
             network = [\"*\", \"api.example.com\"]\nsecrets = [\"OPENAI_API_KEY\"]\nexec = true\n\
             agent = true\ndirs = [{ path = \".\", guest = \"/workspace\", access = \"read-write\" }]\n\
             [limits]\nmemory-mib = 512\ncpu-ms = 500\n",
        )
        .join("\n");
        for expected in [
            "REPLACES: takes over `tool-registry`",
            "MODEL: can send requests to your model with your API key",
            "SESSION LOGS: can ask for your session logs",
            "PROMPT: can read every plugin's prompt fragments",
            "SERVICE: can call `example.x`",
            "EVENTS: may emit `session.event`",
            "NETWORK: may send requests to any host your network policy allows",
            "NETWORK: may send requests to api.example.com",
            "SECRETS: may have keel put your `OPENAI_API_KEY`",
            "EXEC: may ask to run commands",
            "AGENT: can send requests to your model with your API key",
            "FILES: may read and write . (seen as /workspace)",
            "LIMITS: asks for 512 MiB of memory (default 64 MiB",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in\n{all}");
        }
        // A lower CPU limit than the default widens nothing.
        assert!(!all.contains("ms of CPU"), "{all}");
    }
}
