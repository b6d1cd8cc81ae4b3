//! `keel doctor`: checks the config, the keys, the configured model endpoint and the sandbox,
//! and says how to fix what fails.

use std::process::ExitCode;
use std::time::Duration;

use crate::config::Context;
use crate::session::terminal_safe;
use crate::settings::load_policy;
use crate::settings::{ModelChoice, default_profile, network_policy, secrets};

struct Report {
    failed: usize,
}

impl Report {
    fn ok(&self, what: &str) {
        println!("ok    {what}");
    }

    fn fail(&mut self, what: &str, fix: &str) {
        self.failed += 1;
        println!("FAIL  {what}\n      fix: {fix}");
    }

    fn warn(&self, what: &str) {
        println!("warn  {what}");
    }
}

pub async fn run(ctx: &Context) -> anyhow::Result<ExitCode> {
    let mut r = Report { failed: 0 };
    r.ok(&format!(
        "config {} parsed",
        ctx.home.join("config.toml").display()
    ));
    match load_policy(ctx) {
        Ok(p) => r.ok(&format!(
            "exec policy loaded (approval `{}`)",
            p.approval().as_str()
        )),
        Err(e) => r.fail(
            &format!("exec policy: {e:#}"),
            "fix the [exec] section it names",
        ),
    }
    let choice = ModelChoice::from(ctx);
    match network_policy(ctx, &choice) {
        Ok(_) => r.ok("network policy loaded"),
        Err(e) => r.fail(
            &format!("network policy: {e:#}"),
            "fix the [network] or [model] section",
        ),
    }
    r.ok(&format!(
        "model provider `{}`{}",
        choice.provider,
        choice
            .model
            .as_deref()
            .map(|m| format!(", model `{m}`"))
            .unwrap_or_default()
    ));
    let held = secrets(ctx);
    if let Some(name) = choice.secret_name() {
        if held.contains(name) {
            r.ok(&format!("{name} is set (its value is never shown)"));
        } else if choice.base_url.is_some() {
            r.warn(&format!(
                "{name} is not set; fine for a local server that needs no key"
            ));
        } else {
            r.fail(
                &format!("{name} is not set"),
                &format!("export {name}=… or add it under [secrets] in config.toml"),
            );
        }
    }
    for name in held.names() {
        if held.hosts(&name).is_empty() {
            r.warn(&format!(
                "secret {name} is bound to no host, so no plugin can send it; bind it in \
                 config.toml: [secrets] {name} = {{ hosts = [\"api.example.com\"] }}"
            ));
        }
    }
    for name in default_profile(&choice.provider)
        .iter()
        .chain(ctx.config.profile.plugins.iter())
    {
        if name.contains('/') || keel_bundled_plugins::get(name).is_some() {
            continue;
        }
        r.fail(
            &format!("profile plugin `{name}` is not bundled"),
            "use a bundled name or a path under [profile] plugins",
        );
    }
    if let Some(url) = choice.endpoint() {
        match reachable(&url).await {
            Ok(()) => r.ok(&format!("endpoint {url} is reachable")),
            Err(e) => r.fail(
                &format!("endpoint {url} is not reachable: {e}"),
                "check the network, or set [model] base-url to a server that is running",
            ),
        }
    }
    match sandbox_check(ctx) {
        Ok(()) => r.ok("WebAssembly sandbox starts and compiles a plugin"),
        Err(e) => r.fail(
            &format!("sandbox: {e:#}"),
            "reinstall keel; report the error",
        ),
    }
    match crate::settings::sandbox_config(ctx) {
        Ok(config) => match keel_kernel::sandbox::probe(&config) {
            keel_kernel::sandbox::Confinement::Unavailable(reason) => r.fail(
                &format!("commands: NOT sandboxed: {reason}; every command needs approval"),
                "install bubblewrap (`apt-get install bubblewrap`) where user namespaces work",
            ),
            keel_kernel::sandbox::Confinement::Off => {
                r.warn(&keel_kernel::sandbox::Confinement::Off.describe())
            }
            confined => r.ok(&confined.describe()),
        },
        Err(e) => r.fail(&format!("{e:#}"), "fix the [sandbox] section"),
    }
    for line in crate::commands::mcp::project_lines(ctx) {
        r.ok(&line);
    }
    match crate::commands::mcp::server_status(ctx).await {
        Ok(None) => {}
        Ok(Some(status)) => {
            for server in status["servers"].as_array().into_iter().flatten() {
                let name = terminal_safe(server["name"].as_str().unwrap_or_default());
                if server["state"] == "running" {
                    r.ok(&format!(
                        "MCP server `{name}` starts in the sandbox and offers {} tool(s)",
                        server["tools"].as_array().map_or(0, Vec::len)
                    ));
                } else {
                    r.fail(
                        &format!(
                            "MCP server `{name}` does not start: {}",
                            terminal_safe(server["error"].as_str().unwrap_or_default())
                        ),
                        "check its [mcp.servers] entry (`keel mcp list` shows what it wrote \
                         on stderr); files under /tmp need `read = [...]` (the sandbox gives it \
                         its own /tmp), and keel's home is never visible to it",
                    );
                }
            }
        }
        Err(e) => r.fail(&format!("MCP servers: {e:#}"), "fix the [mcp] section"),
    }
    if r.failed == 0 {
        println!("\nall checks passed");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\n{} check(s) failed", r.failed);
        Ok(ExitCode::from(1))
    }
}

/// A TCP connection to the endpoint's host and port (no request is sent, no key used).
async fn reachable(url: &str) -> anyhow::Result<()> {
    let parsed = url::Url::parse(url)?;
    let host = parsed
        .host_str()
        .ok_or_else(|| anyhow::anyhow!("no host in the URL"))?;
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| anyhow::anyhow!("no port for the URL's scheme"))?;
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no answer within 5 s"))??;
    Ok(())
}

fn sandbox_check(ctx: &Context) -> anyhow::Result<()> {
    let host = keel_kernel::WasmHost::new(keel_kernel::WasmHostConfig {
        cache_dir: Some(ctx.component_cache()),
        ..keel_kernel::WasmHostConfig::default()
    })?;
    let bundled = keel_bundled_plugins::all()
        .first()
        .ok_or_else(|| anyhow::anyhow!("no bundled plugin"))?;
    host.compile(bundled.name, &bundled.component())?;
    Ok(())
}
