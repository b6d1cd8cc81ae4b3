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
