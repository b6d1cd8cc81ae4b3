//! `keel run` in a real terminal (a pseudo-terminal): the approval question says what each
//! answer covers, Ctrl-C at the question denies and cancels the turn at once (no Enter
//! needed), Ctrl-C at the idle prompt asks before leaving, leaving shows how to resume, `/load`
//! takes a bundled plugin by name, a write is approved from its diff, `/approvals` lists and
//! withdraws answers, and nothing the model sends can drive the terminal.

use std::time::Duration;

use expectrl::ControlCode;
use keel_tests::model_server::{ModelServer, Step, sse_head};
use keel_tests::wire::{oa, oa_done, oa_text};
use serde_json::json;

use crate::common::{home_for, keel_process};

type R = Result<(), Box<dyn std::error::Error>>;

/// Names the step that failed, for a readable failure.
fn e<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err}")
}

/// A model that asks to run `touch x1.txt`, then answers `then`.
async fn touch_then(then: &'static str) -> Result<ModelServer, Box<dyn std::error::Error>> {
    call_then("exec_shell", json!({"command": "touch x1.txt"}), then).await
}

/// A model that calls `tool` with `args`, then answers `then`.
async fn call_then(
    tool: &'static str,
    args: serde_json::Value,
    then: &'static str,
) -> Result<ModelServer, Box<dyn std::error::Error>> {
    let args = args.to_string();
    Ok(ModelServer::start(move |n, _| {
        if n > 0 {
            return oa_text(&[then], "stop");
        }
        let mut steps = vec![sse_head()];
        steps.push(oa(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": tool, "arguments": args}}]}),
            None,
        ));
        steps.push(oa(json!({}), Some("tool_calls")));
        steps.extend(oa_done());
        steps
    })
    .await?)
}

/// `keel run ARGS` in `home` and `ws`, with a key for the loopback model.
fn keel_run(home: &std::path::Path, ws: &std::path::Path, args: &[&str]) -> std::process::Command {
    let mut cmd = keel_process(home, ws);
    cmd.env("OPENAI_API_KEY", "sk-term-0123456789abcdefghijklmnop")
        .arg("run")
        .args(args);
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_at_an_approval_denies_at_once_and_the_session_goes_on() -> R {
    let server = touch_then("Stopped.").await?;
    let (home, ws) = home_for(&server, "")?;
    let cmd = keel_run(home.path(), ws.path(), &["--approval", "ask"]);
    let screen = tokio::task::spawn_blocking(move || -> Result<(), String> {
        let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
        term.set_expect_timeout(Some(Duration::from_secs(60)));
        term.expect("› ").map_err(e("the prompt"))?;
        term.send_line("make a file").map_err(e("typing"))?;
        // The call's header comes first, then the question about it.
        term.expect("⏺ exec_shell")
            .map_err(e("the tool call header"))?;
        term.expect("wants to run: touch x1.txt")
            .map_err(e("the approval question"))?;
        term.expect("[s] yes, and for the rest of this session: any `touch …` in this workspace")
            .map_err(e("the session scope in words"))?;
        term.expect("Ctrl-C: no, and cancel the turn")
            .map_err(e("the question's end"))?;
        // The answer's own prompt: the line editor is reading.
        term.expect("answer: ").map_err(e("the answer prompt"))?;
        // No Enter: Ctrl-C alone answers.
        term.set_expect_timeout(Some(Duration::from_secs(10)));
        term.send(ControlCode::EndOfText).map_err(e("Ctrl-C"))?;
        term.expect("[denied: the turn is being cancelled]")
            .map_err(e("the denial"))?;
        term.expect("[turn ended: cancelled")
            .map_err(e("the cancelled turn"))?;
        term.expect("› ").map_err(e("the prompt again"))?;
        // At the idle prompt, Ctrl-C asks before leaving; a second one leaves.
        term.send(ControlCode::EndOfText)
            .map_err(e("idle Ctrl-C"))?;
        term.expect("(Ctrl-C again or /exit to leave)")
            .map_err(e("the idle hint"))?;
        term.expect("› ").map_err(e("the prompt after the hint"))?;
        term.send(ControlCode::EndOfText)
            .map_err(e("second Ctrl-C"))?;
        term.expect("continue it with `keel resume ")
            .map_err(e("the resume hint"))?;
        Ok(())
    })
    .await?;
    screen?;
    assert!(
        !ws.path().join("x1.txt").exists(),
        "the denied command did not run"
    );
    Ok(())
}

/// The text of the last user message in a request the model server received.
fn last_user_text(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_prompt_edits_recalls_history_across_sessions_completes_and_continues_lines() -> R {
    let server = ModelServer::start(|_, _| oa_text(&["Noted."], "stop")).await?;
    let (home, ws) = home_for(&server, "")?;
    let session = |home: std::path::PathBuf,
                   ws: std::path::PathBuf,
                   keys: Vec<(&'static str, &'static str)>| {
        tokio::task::spawn_blocking(move || -> Result<(), String> {
            let cmd = keel_run(&home, &ws, &[]);
            let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
            term.set_expect_timeout(Some(Duration::from_secs(60)));
            for (send, then) in keys {
                // Up (`\x1b[A`) and Enter (`\r`) alone act on the line being edited.
                if send != "\x1b[A" && send != "\r" {
                    term.expect("› ").map_err(e("the prompt"))?;
                }
                term.send(send).map_err(e("typing"))?;
                if !then.is_empty() {
                    term.expect(then)
                        .map_err(|err| format!("after {send:?}, waiting for {then:?}: {err}"))?;
                }
            }
            term.expect("› ").map_err(e("the last prompt"))?;
            term.send_line("/exit").map_err(e("exit"))?;
            term.expect("keel resume").map_err(e("leaving"))?;
            Ok(())
        })
    };
    let (h, w) = (home.path().to_path_buf(), ws.path().to_path_buf());
    session(
        h.clone(),
        w.clone(),
        vec![
            ("first request\r", "Noted."),
            // Left arrow back to the typo, a character, Enter: edited in place.
            (
                "secnd request\x1b[D\x1b[D\x1b[D\x1b[D\x1b[D\x1b[D\x1b[D\x1b[D\x1b[D\x1b[Do\r",
                "Noted.",
            ),
            // Up arrow twice: the first request again.
            ("\x1b[A", "second request"),
            ("\x1b[A", "first request"),
            ("\r", "Noted."),
            // Tab completes the command and the plugin name.
            ("/unl\tfs-t\t\r", "unloaded fs-tools"),
            // A line ending in `\` continues.
            ("line one\\\rline two\r", "Noted."),
        ],
    )
    .await??;
    let texts: Vec<String> = server
        .received()
        .iter()
        .map(|r| last_user_text(&r.json()))
        .collect();
    assert_eq!(
        texts,
        [
            "first request",
            "second request",
            "first request",
            "line one\nline two"
        ]
    );
    // A new session in the same workspace recalls the last one's requests.
    session(h, w, vec![("\x1b[A", "line two"), ("\r", "Noted.")]).await??;
    let last = server.received().last().map(|r| last_user_text(&r.json()));
    assert_eq!(last.as_deref(), Some("line one\nline two"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_model_shows_a_spinner_with_what_it_waits_for_and_the_time() -> R {
    // The answer comes after a stall (the server's own pause, as a slow provider's).
    let server = ModelServer::start(|_, _| {
        let mut steps = oa_text(&["Noted."], "stop");
        steps.insert(1, Step::Sleep(1500));
        steps
    })
    .await?;
    let (home, ws) = home_for(&server, "[config.model-openai]\nidle-timeout-ms = 10000\n")?;
    let cmd = keel_run(home.path(), ws.path(), &[]);
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
        term.set_expect_timeout(Some(Duration::from_secs(60)));
        term.expect("› ").map_err(e("the prompt"))?;
        term.send_line("hello").map_err(e("typing"))?;
        term.expect("waiting for the model · ")
            .map_err(e("the spinner"))?;
        term.expect(" s").map_err(e("the elapsed time"))?;
        term.expect("Noted.").map_err(e("the answer"))?;
        term.expect("› ").map_err(e("the prompt again"))?;
        term.send_line("/exit").map_err(e("exit"))?;
        term.expect("keel resume").map_err(e("leaving"))?;
        Ok(())
    })
    .await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_answer_is_rendered_as_markdown_on_a_terminal() -> R {
    let server = ModelServer::start(|_, _| {
        oa_text(
            &[
                "# Plan\n\nThis is **important** and `code`.\n",
                "- first\n- second\n\n```rust\nfn main() {}\n```\nDone.",
            ],
            "stop",
        )
    })
    .await?;
    let (home, ws) = home_for(&server, "")?;
    let cmd = keel_run(home.path(), ws.path(), &[]);
    let shown = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
        term.set_expect_timeout(Some(Duration::from_secs(60)));
        term.expect("› ").map_err(e("the prompt"))?;
        term.send_line("plan it").map_err(e("typing"))?;
        let answer = term.expect("Done.").map_err(e("the answer"))?;
        let shown = String::from_utf8_lossy(answer.before()).into_owned();
        term.expect("› ").map_err(e("the prompt again"))?;
        // A bundled plugin goes and comes back by name.
        term.send_line("/unload fs-tools").map_err(e("unload"))?;
        term.expect("unloaded fs-tools").map_err(e("unloaded"))?;
        term.send_line("/load fs-tools").map_err(e("load"))?;
        term.expect("loaded fs-tools 0.1.0")
            .map_err(e("loaded by name"))?;
        term.expect("› ").map_err(e("the prompt after loading"))?;
        term.send_line("/exit").map_err(e("exit"))?;
        term.expect("keel resume").map_err(e("leaving"))?;
        Ok(shown)
    })
    .await??;
    // The markers are gone; what they marked is there (NO_COLOR is set, so without colour).
    for marker in ["**", "# Plan", "- first", "`code`"] {
        assert!(!shown.contains(marker), "`{marker}` shown raw:\n{shown}");
    }
    for text in [
        "Plan",
        "important",
        "code",
        "first",
        "second",
        "fn main() {}",
    ] {
        assert!(shown.contains(text), "`{text}` missing:\n{shown}");
    }
    assert!(shown.contains("• first"), "no bullet:\n{shown}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_no_with_what_to_do_instead_reaches_the_model() -> R {
    let server = touch_then("Understood.").await?;
    let (home, ws) = home_for(&server, "")?;
    let cmd = keel_run(home.path(), ws.path(), &["--approval", "ask"]);
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
        term.set_expect_timeout(Some(Duration::from_secs(60)));
        term.expect("› ").map_err(e("the prompt"))?;
        term.send_line("make a file").map_err(e("typing"))?;
        term.expect("answer: ").map_err(e("the question"))?;
        term.send_line("no, write it under out/ instead")
            .map_err(e("answering"))?;
        term.expect("Understood.").map_err(e("the next answer"))?;
        term.expect("› ").map_err(e("the prompt again"))?;
        term.send_line("/exit").map_err(e("exit"))?;
        term.expect("keel resume").map_err(e("leaving"))?;
        Ok(())
    })
    .await??;
    let second = server.received()[1].body.clone();
    assert!(
        second.contains("and said: no, write it under out/ instead"),
        "{second}"
    );
    assert!(!ws.path().join("x1.txt").exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_approval_shows_the_diff_and_no_escape_sequence_reaches_the_terminal() -> R {
    let server = call_then(
        "write_file",
        json!({"path": "notes.txt", "content": "alpha\nBETA\ngamma\n"}),
        // A hostile answer: retitle the window, clear the screen, hide text.
        "Written.\x1b]0;pwned\x07\x1b[2J\x1b[8mhidden\x1b[0m All done.",
    )
    .await?;
    let (home, ws) = home_for(&server, "")?;
    std::fs::write(ws.path().join("notes.txt"), "alpha\nbeta\ngamma\n")?;
    let mut cmd = keel_run(home.path(), ws.path(), &["--approval", "ask"]);
    cmd.env("CLICOLOR_FORCE", "1");
    let shown = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
        term.set_expect_timeout(Some(Duration::from_secs(60)));
        term.expect("› ").map_err(e("the prompt"))?;
        term.send_line("fix the notes").map_err(e("typing"))?;
        let question = term.expect("answer: ").map_err(e("the question"))?;
        let question = String::from_utf8_lossy(question.before()).into_owned();
        term.send_line("y").map_err(e("answering"))?;
        let answer = term.expect("All done.").map_err(e("the answer"))?;
        let answer = String::from_utf8_lossy(answer.before()).into_owned();
        term.expect("› ").map_err(e("the prompt again"))?;
        term.send_line("/exit").map_err(e("exit"))?;
        term.expect("keel resume").map_err(e("leaving"))?;
        Ok(format!("{question}\n=====\n{answer}"))
    })
    .await??;
    let (question, answer) = shown.split_once("\n=====\n").ok_or("no split")?;
    assert!(
        question.contains("write_file wants to write notes.txt"),
        "{question}"
    );
    assert!(
        question.contains("why: the tool changes files"),
        "{question}"
    );
    assert!(question.contains("the change to notes.txt:"), "{question}");
    // The diff: the old line red, the new one green, context plain.
    assert!(question.contains("\x1b[31m  - beta\x1b[0m"), "{question:?}");
    assert!(question.contains("\x1b[32m  + BETA\x1b[0m"), "{question:?}");
    assert!(question.contains("    alpha"), "{question}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes.txt"))?,
        "alpha\nBETA\ngamma\n"
    );
    for hostile in ["\x1b]0;", "\x1b[2J", "\x1b[8m", "\x07"] {
        assert!(
            !answer.contains(hostile),
            "{hostile:?} reached the terminal: {answer:?}"
        );
    }
    assert!(answer.contains("Written."), "{answer:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_are_listed_and_withdrawn_and_clear_starts_a_new_conversation() -> R {
    // Each turn asks to touch the next file, then says it is done; the last turn only talks.
    let server = ModelServer::start(|n, _| {
        let file = n / 2 + 1;
        if n % 2 == 1 || file > 3 {
            return oa_text(&["Done with it."], "stop");
        }
        let args = json!({"command": format!("touch x{file}.txt")}).to_string();
        let mut steps = vec![sse_head()];
        steps.push(oa(
            json!({"tool_calls": [{"index": 0, "id": format!("call_{n}"), "type": "function",
                    "function": {"name": "exec_shell", "arguments": args}}]}),
            None,
        ));
        steps.push(oa(json!({}), Some("tool_calls")));
        steps.extend(oa_done());
        steps
    })
    .await?;
    let (home, ws) = home_for(&server, "")?;
    let cmd = keel_run(home.path(), ws.path(), &["--approval", "ask"]);
    let workspace = ws.path().to_owned();
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        let mut term = expectrl::Session::spawn(cmd).map_err(e("spawn"))?;
        term.set_expect_timeout(Some(Duration::from_secs(60)));
        term.expect("› ").map_err(e("the prompt"))?;
        term.send_line("make x1").map_err(e("typing"))?;
        term.expect("answer: ").map_err(e("the first question"))?;
        term.send_line("s").map_err(e("for the session"))?;
        term.expect("Done with it.")
            .map_err(e("the first answer"))?;
        term.expect("› ").map_err(e("the prompt again"))?;
        term.send_line("/approvals").map_err(e("listing"))?;
        term.expect("1. yes for this session: any `touch …`")
            .map_err(e("the session answer listed"))?;
        // Covered by the answer: no question.
        term.send_line("make x2").map_err(e("typing"))?;
        let turn = term
            .expect("Done with it.")
            .map_err(e("the second answer"))?;
        if String::from_utf8_lossy(turn.before()).contains("answer: ") {
            return Err("asked again although the session answer covers it".into());
        }
        if !workspace.join("x2.txt").exists() {
            return Err("x2.txt was not made".into());
        }
        term.send_line("/approvals revoke 1")
            .map_err(e("revoking"))?;
        term.expect("withdrawn: yes for this session: any `touch …`")
            .map_err(e("the withdrawal"))?;
        // Withdrawn: asked again; refused this time.
        term.send_line("make x3").map_err(e("typing"))?;
        term.expect("wants to run: touch x3.txt")
            .map_err(e("the question again"))?;
        term.expect("answer: ").map_err(e("the answer prompt"))?;
        term.send_line("n").map_err(e("refusing"))?;
        term.expect("Done with it.")
            .map_err(e("the third answer"))?;
        term.send_line("/approvals").map_err(e("listing again"))?;
        term.expect("1. no: `touch x3.txt`")
            .map_err(e("the refusal listed"))?;
        term.send_line("/clear").map_err(e("clearing"))?;
        term.expect("cleared: a new conversation, session ")
            .map_err(e("the clear"))?;
        term.expect("› ").map_err(e("the prompt after clearing"))?;
        term.send_line("fresh start").map_err(e("typing"))?;
        term.expect("Done with it.")
            .map_err(e("the fresh answer"))?;
        term.send_line("/exit").map_err(e("exit"))?;
        term.expect("keel resume").map_err(e("leaving"))?;
        Ok(())
    })
    .await??;
    assert!(ws.path().join("x1.txt").exists());
    assert!(
        !ws.path().join("x3.txt").exists(),
        "the refused command ran"
    );
    // After /clear the model sees only the new conversation.
    let requests = server.received();
    let last = requests.last().ok_or("no request")?.body.clone();
    assert!(last.contains("fresh start"), "{last}");
    assert!(
        !last.contains("make x1"),
        "the old conversation was sent: {last}"
    );
    Ok(())
}
