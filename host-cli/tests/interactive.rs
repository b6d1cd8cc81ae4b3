//! An interactive `keel run` session changing its own plugins with slash commands between
//! turns: the session goes on, its conversation survives a reload of the agent loop and its
//! replacement by another copy, and the tools offered follow what is loaded.

use std::time::Duration;

use common::keel;
use keel_protocol::{OutcomeStatus, Role, SessionEvent};

use crate::common;

type R = Result<(), Box<dyn std::error::Error>>;

/// One answer per model request. The scripted model plays the step at the index of the
/// number of assistant messages in the request, so a conversation lost in a reload would
/// replay "First answer." instead of going on.
const SCRIPT: &str = r#"
[[step]]
text = "First answer."

[[step]]
text = "Second answer."

[[step]]
text = "Third answer."

[[step]]
text = "Reading it."
[[step.tool_calls]]
name = "read_file"
arguments = { path = "hello.txt" }

[[step]]
text = "Fourth answer."

[[step]]
text = "Fifth answer."
"#;

/// A directory holding bundled plugin `name`, as `/load DIR` takes it.
fn plugin_copy(root: &std::path::Path, name: &str) -> Result<std::path::PathBuf, String> {
    let bundled = keel_bundled_plugins::get(name).ok_or(format!("{name} is bundled"))?;
    let dir = root.join(format!("{name}-copy"));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir(&dir)?;
        std::fs::write(dir.join("keel.toml"), bundled.manifest)?;
        std::fs::write(dir.join(format!("{name}.wasm")), bundled.component())
    };
    write().map_err(|e| format!("copying {name}: {e}"))?;
    Ok(dir)
}

#[test]
fn slash_commands_unload_reload_and_load_plugins_while_the_session_goes_on() -> R {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    std::fs::write(ws.path().join("hello.txt"), "hi from the workspace\n")?;
    common::use_scripted_model(home.path(), SCRIPT)?;
    let agent_loop = plugin_copy(home.path(), "agent-loop")?;
    let input = [
        "hello",
        "/plugins",
        "/sessions",
        "/unload fs-tools",
        "again",
        "/reload agent-loop",
        "third",
        // A bundled plugin by name.
        "/load fs-tools",
        "read it",
        // The whole result of that read, on stderr.
        "/expand",
        // Another agent loop takes over: it is given the conversation from the log. Until
        // then, a request says what to load rather than failing.
        "/unload agent-loop",
        "anyone there?",
        &format!("/load {}", agent_loop.display()),
        "fifth",
        "/exit",
    ]
    .join("\n");
    let out = keel(home.path(), ws.path())
        .arg("run")
        .env("KEEL_YES", "1")
        .write_stdin(input)
        .timeout(Duration::from_secs(240))
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel run failed:\n{stderr}");
    assert!(!stderr.contains("error:"), "a command failed:\n{stderr}");
    assert!(
        stderr.contains("loaded agent-loop 0.2.0; it continues this session (10 messages)"),
        "{stderr}"
    );
    assert!(stderr.contains("loaded fs-tools 0.1.0\n"), "{stderr}");
    assert!(stderr.contains("unloaded fs-tools"), "{stderr}");
    assert!(
        stderr.contains("no agent loop is loaded, so nothing can answer: `/load agent-loop`"),
        "{stderr}"
    );
    // On the way out: how to come back.
    let resume = stderr
        .lines()
        .last()
        // (after the prompts that piped input leaves without line breaks)
        .and_then(|l| l.rsplit_once("session "))
        .map(|(_, l)| l)
        .and_then(|l| l.split_once(" is in its log; continue it with `keel resume "))
        .map(|(id, rest)| (id.to_owned(), rest.to_owned()))
        .ok_or(format!("no resume hint at the end:\n{stderr}"))?;
    assert_eq!(resume.1, format!("{}`", resume.0));
    assert!(
        stderr.contains("⎿ read_file, in full:\n") && stderr.contains("hi from the workspace"),
        "`/expand` did not show the read:\n{stderr}"
    );
    // `/sessions` listed this session, marked, with its entries so far.
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("* 20") && l.contains(" entries  hello")),
        "`/sessions` does not mark this session:\n{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("agent-loop") && l.contains("provides agent ")),
        "`/plugins` does not say what agent-loop provides:\n{stderr}"
    );
    // `/plugins` listed the session's plugins, all active.
    for name in ["agent-loop", "fs-tools", "session-log", "model-scripted"] {
        assert!(
            stderr.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                words.contains(&name) && words.contains(&"Active")
            }),
            "`/plugins` does not show {name} active:\n{stderr}"
        );
    }

    let sessions = home.path().join("data").join("sessions");
    let mut logs = std::fs::read_dir(&sessions)?.collect::<Result<Vec<_>, _>>()?;
    assert_eq!(logs.len(), 1, "one session log in {}", sessions.display());
    let read = keel_agent_kit::session_log::read_log_file(&logs.remove(0).path())?;
    assert!(read.warnings.is_empty(), "{:?}", read.warnings);

    // Each assistant answer, with whether `read_file` was offered in its request.
    let mut offered = false;
    let mut answers = Vec::new();
    let mut read_outcome = None;
    for line in &read.lines {
        match &line.event {
            SessionEvent::Context { tools, .. } => {
                offered = tools.iter().any(|t| t.name == "read_file");
            }
            SessionEvent::Message { message, .. } if message.role == Role::Assistant => {
                answers.push((message.text(), offered));
            }
            SessionEvent::ToolOutcome { outcome, .. } => read_outcome = Some(outcome.clone()),
            _ => {}
        }
    }
    let expected = [
        ("First answer.", true),
        ("Second answer.", false),
        ("Third answer.", false),
        ("Reading it.", true),
        ("Fourth answer.", true),
        ("Fifth answer.", true),
    ];
    assert_eq!(
        answers,
        expected.map(|(text, offered)| (text.to_owned(), offered)),
        "answers and whether read_file was offered"
    );
    let outcome = read_outcome.ok_or("the reloaded read_file never ran")?;
    assert_eq!(outcome.status, OutcomeStatus::Ok, "{outcome:?}");
    assert!(
        outcome.content.contains("hi from the workspace"),
        "{outcome:?}"
    );
    Ok(())
}
