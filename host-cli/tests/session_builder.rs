//! Every command builds its kernel through one builder (`session::builder::KernelBuilder`), so
//! the commands without an agent session (`keel tool call`, `keel plugin …`) get the person's
//! `[timeouts]`, gates and sandbox as `keel run` does.

use std::path::Path;

use crate::common::{keel, use_scripted_model};

type R = Result<(), Box<dyn std::error::Error>>;

/// Make `home` a keel home that loads the hostile fixture plugin `name` (from `keel-tests`)
/// with `extra` TOML appended to its config.
fn with_fixture(home: &Path, name: &str, extra: &str) -> R {
    use_scripted_model(home, "[[step]]\ntext = \"unused\"\n")?;
    let (manifest, component) =
        keel_tests::fixtures::fixture(name).ok_or("the fixture is built")?;
    let dir = home.join(name);
    std::fs::create_dir(&dir)?;
    std::fs::write(dir.join("keel.toml"), manifest)?;
    std::fs::write(dir.join(format!("{name}.wasm")), component)?;
    let config = home.join("config.toml");
    let mut text = std::fs::read_to_string(&config)?;
    text.push_str(&format!(
        "\n[plugins]\npaths = [{:?}]\n{extra}",
        dir.display().to_string()
    ));
    std::fs::write(config, text)?;
    Ok(())
}

/// A tool that never returns (it sleeps on a WASI clock, which no CPU meter sees) ends at the
/// person's `[timeouts] tool-secs`, with an error naming the setting and a failing exit code;
/// `keel tool call` used to build its kernel with the default deadlines and ran it for five
/// minutes.
#[test]
fn tool_call_ends_a_tool_that_never_returns_at_the_configured_deadline() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    with_fixture(home.path(), "stall", "[timeouts]\ntool-secs = 1\n")?;
    let out = keel(home.path(), ws.path())
        .args(["tool", "call", "stall_sleep"])
        // Far above the configured second, far below the default five minutes.
        .timeout(std::time::Duration::from_secs(90))
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stall_sleep"), "{stderr}");
    assert!(stderr.contains("tool-secs"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The same plugin's tool that returns still works under the same kernel settings.
    let out = keel(home.path(), ws.path())
        .args(["tool", "call", "stall_ping"])
        .timeout(std::time::Duration::from_secs(90))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pong");
    Ok(())
}

/// `keel tool call` runs a tool under the person's gates: their `[exec]` rules and approval
/// mode decide, and a command runs in their workspace. (It used to get the kernel's
/// locked-down gates: no workspace, every approval denied, the person's rules unread.)
#[test]
fn tool_call_applies_the_persons_exec_rules_in_their_workspace() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    use_scripted_model(home.path(), "[[step]]\ntext = \"unused\"\n")?;
    let config = home.path().join("config.toml");
    let mut text = std::fs::read_to_string(&config)?;
    text.push_str(
        "[exec]\napproval = \"auto\"\nrules = [{ prefix = \"touch\", decision = \"allow\" }, \
         { prefix = \"echo\", decision = \"forbid\" }]\n",
    );
    std::fs::write(&config, text)?;
    let out = keel(home.path(), ws.path())
        .args([
            "tool",
            "call",
            "exec_shell",
            r#"{"command":"touch made.txt"}"#,
        ])
        .timeout(std::time::Duration::from_secs(90))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ws.path().join("made.txt").is_file());
    let out = keel(home.path(), ws.path())
        .args(["tool", "call", "exec_shell", r#"{"command":"echo hi"}"#])
        .timeout(std::time::Duration::from_secs(90))
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("user rule `echo` says forbid"), "{stderr}");
    Ok(())
}
