//! What the agent tests of the `keel` binary share: the command with a private home and
//! workspace and no ambient provider settings or keys, and its `--json` output as values.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::path::Path;

/// `keel --home HOME --workspace WORKSPACE`, as a process to spawn.
pub fn keel_process(home: &Path, workspace: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("keel"));
    cmd.arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(workspace)
        .env_remove("KEEL_PROVIDER")
        .env_remove("KEEL_MODEL")
        .env_remove("KEEL_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1");
    cmd
}

/// The same, as an `assert_cmd` command to run to completion.
pub fn keel(home: &Path, workspace: &Path) -> assert_cmd::Command {
    assert_cmd::Command::from_std(keel_process(home, workspace))
}

/// The JSON lines of `stdout` (`keel … --json` prints one value a line).
pub fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Make `home` a keel home whose sessions use the scripted model playing `script` (TOML with
/// `[[step]]` tables): no key, no network.
pub fn use_scripted_model(home: &Path, script: &str) -> std::io::Result<()> {
    let file = home.join("script.toml");
    std::fs::write(&file, script)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[model]\nprovider = \"scripted\"\nscript = {:?}\n",
            file.display().to_string()
        ),
    )
}

/// Once `ready()` (checked every 100 ms, for at most 60 s), send `child` SIGINT, as Ctrl-C
/// does, and wait for it to exit.
pub async fn interrupt_when(
    mut child: std::process::Child,
    ready: impl Fn() -> bool,
) -> Result<std::process::Output, Box<dyn std::error::Error>> {
    let mut waited = 0;
    while !ready() {
        if waited > 600 {
            let _ = child.kill();
            return Err("the process never reached the point where it is interrupted".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        waited += 1;
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()?;
    assert!(status.success(), "kill -INT");
    Ok(tokio::task::spawn_blocking(move || child.wait_with_output()).await??)
}

/// The entries of the only session log in `home`.
pub fn only_session_log(home: &Path) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
    let entry = std::fs::read_dir(home.join("data/sessions"))?
        .filter_map(Result::ok)
        .next()
        .ok_or("no session log")?;
    Ok(std::fs::read_to_string(entry.path())?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// One `[[step]]` of a scripted model's TOML script asking for `calls` (tool name, arguments
/// as an inline TOML table) at once; the scripted model names them `call_<step>_<n>`, counting
/// from 1.
pub fn scripted_tool_step(calls: &[(&str, String)]) -> String {
    let mut step = String::from("[[step]]\n");
    for (tool, arguments) in calls {
        step.push_str(&format!(
            "[[step.tool_calls]]\nname = {tool:?}\narguments = {arguments}\n"
        ));
    }
    step.push('\n');
    step
}

/// The tool outcomes a `keel … --json` run printed, by call id: (tool, status, content).
pub fn tool_outcomes(
    stdout: &[u8],
) -> std::collections::BTreeMap<String, (String, String, String)> {
    json_lines(stdout)
        .iter()
        .filter(|l| l["topic"] == "session.event" && l["event"]["kind"] == "tool_outcome")
        .map(|l| {
            let o = &l["event"]["outcome"];
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (
                s(&o["call_id"]),
                (s(&o["tool"]), s(&o["status"]), s(&o["content"])),
            )
        })
        .collect()
}

/// The wire format a loopback model server speaks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Wire {
    OpenAi,
    Anthropic,
}

impl Wire {
    /// The variable holding the provider's API key.
    pub fn key_var(self) -> &'static str {
        match self {
            Wire::OpenAi => "OPENAI_API_KEY",
            Wire::Anthropic => "ANTHROPIC_API_KEY",
        }
    }

    /// The `[model]` table of a home whose sessions ask `server` in this format (its lines,
    /// so a caller may add settings).
    pub fn model_table(self, server: &keel_tests::model_server::ModelServer) -> String {
        let (provider, model, base) = match self {
            Wire::OpenAi => ("openai", "gpt-test", server.url("/v1")),
            Wire::Anthropic => ("anthropic", "claude-test", server.url("")),
        };
        format!("[model]\nprovider = \"{provider}\"\nmodel = \"{model}\"\nbase-url = \"{base}\"\n")
    }
}

/// A fresh home and workspace whose sessions ask the loopback `server` speaking `wire`.
pub fn homes_for_server(
    server: &keel_tests::model_server::ModelServer,
    wire: Wire,
) -> std::io::Result<(tempfile::TempDir, tempfile::TempDir)> {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    std::fs::write(home.path().join("config.toml"), wire.model_table(server))?;
    Ok((home, ws))
}

/// The ids of the sessions logged in `home`, sorted.
pub fn session_ids(home: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(home.join("data/sessions"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_suffix(".jsonl")
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// A home whose config points keel at `server` (with `extra` config lines), and a workspace.
pub fn home_for(
    server: &keel_tests::model_server::ModelServer,
    extra: &str,
) -> Result<(tempfile::TempDir, tempfile::TempDir), std::io::Error> {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[model]\nprovider = \"openai\"\nmodel = \"gpt-test\"\nbase-url = \"{}\"\n{extra}",
            server.url("/v1")
        ),
    )?;
    Ok((home, ws))
}
