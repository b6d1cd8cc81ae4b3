//! Plan mode through the kernel's doors, with in-process plugins (a canned model, a command
//! tool, a file tool with a reader and a writer): what the model is offered and told, what the
//! dispatcher refuses before approval, what the exec gate lets run and how, and that no plugin
//! can leave the mode.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use keel_kernel::gates::approvals::{Answer, ApprovalRequest, Approver};
use keel_kernel::{GateConfig, Kernel, KernelConfig, Manifest};
use keel_protocol::{
    Block, Message, ModelRequest, ModelResponse, OutcomeStatus, Role, StopReason, ToolDef,
    ToolOutcome, Usage,
};

use crate::common::{Behaviour, Part, Script, package};

/// Approves everything and records what it was asked.
struct Yes(Mutex<Vec<String>>);

impl Approver for Yes {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        if let Ok(mut asked) = self.0.lock() {
            asked.push(request.summary.clone());
        }
        Answer::Once
    }
}

struct World {
    kernel: Kernel,
    script: Script,
    approver: Arc<Yes>,
    _dir: tempfile::TempDir,
    ws: std::path::PathBuf,
}

fn manifest(text: &str) -> Manifest {
    Manifest::parse(text, Path::new("test/keel.toml")).expect("manifest parses")
}

async fn world() -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().canonicalize().expect("canonical");
    let approver = Arc::new(Yes(Mutex::new(Vec::new())));
    let kernel = Kernel::with_gates(
        KernelConfig::default(),
        GateConfig {
            workspace: Some(ws.clone()),
            approver: approver.clone(),
            ..GateConfig::locked_down()
        },
    );
    let script = Script::default();
    let plugins = [
        (
            Part::Model,
            "name = \"model\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n[provides]\nmodel = \"1.0.0\"\n",
        ),
        (
            Part::Shell,
            "name = \"shell\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n[capabilities]\nexec = true\n",
        ),
        (
            Part::Files,
            "name = \"files\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n",
        ),
        // A plugin that tries every door of the kernel it may use.
        (
            Part::Plain,
            "name = \"prober\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n[capabilities]\n\
             services = [\"keel.prompt\", \"keel.agents\", \"keel.conversation\"]\n",
        ),
    ];
    for (part, text) in plugins {
        let behaviour = Behaviour {
            part,
            script: script.clone(),
            ..Behaviour::default()
        };
        kernel
            .load(package(manifest(text), behaviour))
            .await
            .expect("loads");
    }
    World {
        kernel,
        script,
        approver,
        _dir: dir,
        ws,
    }
}

fn call(id: &str, tool: &str, args: &str) -> Block {
    Block::ToolCall {
        id: id.into(),
        name: tool.into(),
        arguments: args.into(),
    }
}

fn tool_def(name: &str) -> ToolDef {
    ToolDef {
        name: name.into(),
        description: String::new(),
        input_schema: serde_json::json!({"type": "object"}),
    }
}

impl World {
    /// The model answers `blocks`; the request sent offers every registered tool.
    async fn respond(&self, blocks: Vec<Block>) {
        *self.script.response.lock().expect("lock") = Some(ModelResponse {
            message: Message {
                role: Role::Assistant,
                content: blocks,
            },
            stop_reason: StopReason::ToolUse,
            stop_reason_raw: "tool_use".into(),
            usage: Usage::default(),
            model: "canned".into(),
            retries: 0,
        });
        let request = ModelRequest {
            compacts_on_overflow: false,
            conversation: None,
            model: String::new(),
            system: String::new(),
            messages: vec![Message::user_text("go")],
            tools: ["exec_shell", "read_file", "write_file"]
                .into_iter()
                .map(tool_def)
                .collect(),
            max_tokens: 100,
        };
        let request = serde_json::to_string(&request).expect("request");
        self.kernel.complete(&request).await.expect("complete");
    }

    /// The tools the model was offered in the last request.
    fn offered(&self) -> Vec<String> {
        let requests = self.script.requests.lock().expect("lock");
        let last: ModelRequest =
            serde_json::from_str(requests.last().expect("a request")).expect("a ModelRequest");
        last.tools.into_iter().map(|t| t.name).collect()
    }

    async fn dispatch(&self, id: &str) -> ToolOutcome {
        let out = self.kernel.dispatch(&[id.to_owned()]).await;
        serde_json::from_str(&out[0]).expect("outcome")
    }

    fn runs(&self) -> usize {
        self.script.tool_runs.load(Ordering::SeqCst)
    }

    fn asked(&self) -> Vec<String> {
        self.approver.0.lock().expect("lock").clone()
    }

    async fn fragments(&self) -> String {
        self.kernel
            .call_service("keel.prompt", "fragments", "")
            .await
            .expect("fragments")
    }
}

#[tokio::test]
async fn plan_mode_offers_only_read_only_tools_and_tells_the_model_to_plan() {
    let w = world().await;
    let generation = w
        .kernel
        .call_service("keel.prompt", "generation", "")
        .await
        .expect("generation");
    w.respond(vec![Block::Text { text: "hi".into() }]).await;
    assert_eq!(w.offered(), ["exec_shell", "read_file", "write_file"]);
    assert!(!w.fragments().await.contains("Plan mode"));

    w.kernel.set_plan_mode(true);
    assert!(w.kernel.plan_mode());
    w.respond(vec![Block::Text { text: "hi".into() }]).await;
    assert_eq!(
        w.offered(),
        ["exec_shell", "read_file"],
        "the writer is not offered in plan mode"
    );
    let fragments = w.fragments().await;
    assert!(
        fragments.contains("plan mode") && fragments.contains("Markdown"),
        "{fragments}"
    );
    // The agent keeps its prompt and tools by this: the mode must change it.
    let planning = w
        .kernel
        .call_service("keel.prompt", "generation", "")
        .await
        .expect("generation");
    assert_ne!(generation, planning);

    w.kernel.set_plan_mode(false);
    w.respond(vec![Block::Text { text: "hi".into() }]).await;
    assert_eq!(w.offered(), ["exec_shell", "read_file", "write_file"]);
    assert!(!w.fragments().await.contains("Plan mode"));
}

#[tokio::test]
async fn a_write_is_refused_before_approval_in_plan_mode_and_runs_after_it() {
    let w = world().await;
    w.kernel.set_plan_mode(true);
    w.respond(vec![
        call("w1", "write_file", r#"{"path":"a.txt"}"#),
        call("r1", "read_file", r#"{"path":"a.txt"}"#),
    ])
    .await;
    let write = w.dispatch("w1").await;
    assert_eq!(write.status, OutcomeStatus::Refused, "{write:?}");
    assert!(
        write.content.contains("plan mode") && write.content.contains("writes files"),
        "{}",
        write.content
    );
    assert_eq!(w.runs(), 0, "the writer did not run");
    assert!(w.asked().is_empty(), "nobody was asked: {:?}", w.asked());
    let read = w.dispatch("r1").await;
    assert_eq!(read.status, OutcomeStatus::Ok, "{read:?}");
    assert_eq!(w.runs(), 1, "reading goes on in plan mode");

    // The plan accepted: the same kind of call goes through approval and runs.
    w.kernel.set_plan_mode(false);
    w.respond(vec![call("w2", "write_file", r#"{"path":"a.txt"}"#)])
        .await;
    let write = w.dispatch("w2").await;
    assert_eq!(write.status, OutcomeStatus::Ok, "{write:?}");
    assert_eq!(w.runs(), 2);
    assert_eq!(w.asked(), ["write_file a.txt"]);
}

#[tokio::test]
async fn in_plan_mode_only_reading_commands_run_and_only_in_the_read_only_sandbox() {
    let w = world().await;
    std::fs::write(w.ws.join("notes.txt"), "hello\n").expect("notes");
    w.kernel.set_plan_mode(true);
    w.respond(vec![
        call("c1", "exec_shell", r#"{"command":"touch made.txt"}"#),
        call("c2", "exec_shell", r#"{"command":"cat notes.txt"}"#),
    ])
    .await;
    let touch = w.dispatch("c1").await;
    assert_eq!(touch.status, OutcomeStatus::Refused, "{touch:?}");
    assert!(
        touch.content.contains("plan mode") && touch.content.contains("only read"),
        "{}",
        touch.content
    );
    assert!(!w.ws.join("made.txt").exists());
    assert!(w.asked().is_empty(), "{:?}", w.asked());
    assert_eq!(w.runs(), 0, "the command tool was not even called");

    let cat = w.dispatch("c2").await;
    let confined = matches!(
        w.kernel.confinement(),
        keel_kernel::sandbox::Confinement::Bubblewrap(..)
    );
    if confined {
        assert_eq!(cat.status, OutcomeStatus::Ok, "{cat:?}");
        assert!(cat.content.contains("hello"), "{}", cat.content);
    } else {
        // Without bubblewrap a command cannot be held read-only, so none runs.
        assert_eq!(cat.status, OutcomeStatus::Error, "{cat:?}");
        assert!(cat.content.contains("read-only sandbox"), "{}", cat.content);
    }

    // The tool approved for a reading command tries to run a writing one: the exec gate
    // refuses it in plan mode, whatever the call was approved for.
    *w.script.exec_override.lock().expect("lock") = Some("touch sneaky.txt".into());
    w.respond(vec![call("c3", "exec_shell", r#"{"command":"ls"}"#)])
        .await;
    let sneaky = w.dispatch("c3").await;
    assert_eq!(sneaky.status, OutcomeStatus::Error, "{sneaky:?}");
    assert!(sneaky.content.contains("plan mode"), "{}", sneaky.content);
    assert!(!w.ws.join("sneaky.txt").exists());
}

#[tokio::test]
async fn a_command_the_policy_passes_still_cannot_write_in_plan_mode() {
    let w = world().await;
    if !matches!(
        w.kernel.confinement(),
        keel_kernel::sandbox::Confinement::Bubblewrap(..)
    ) {
        eprintln!("skipped: no bubblewrap here, so no command runs in plan mode at all");
        return;
    }
    // `cargo metadata` only reads, to the policy; it also writes a missing `Cargo.lock`. In
    // plan mode the read-only sandbox keeps that write from happening.
    std::fs::create_dir_all(w.ws.join("src")).expect("src");
    std::fs::write(
        w.ws.join("Cargo.toml"),
        "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .expect("manifest");
    std::fs::write(w.ws.join("src/lib.rs"), "").expect("lib");
    let metadata = r#"{"command":"cargo metadata --format-version 1 --offline"}"#;
    w.kernel.set_plan_mode(true);
    w.respond(vec![call("c1", "exec_shell", metadata)]).await;
    let out = w.dispatch("c1").await;
    assert_eq!(out.status, OutcomeStatus::Ok, "{out:?}");
    assert!(!w.ws.join("Cargo.lock").exists(), "{out:?}");
    // Out of plan mode the same command writes it.
    w.kernel.set_plan_mode(false);
    w.respond(vec![call("c2", "exec_shell", metadata)]).await;
    let out = w.dispatch("c2").await;
    assert!(w.ws.join("Cargo.lock").exists(), "{out:?}");
}

#[tokio::test]
async fn no_plugin_can_leave_plan_mode() {
    let w = world().await;
    w.kernel.set_plan_mode(true);
    // Every kernel service a plugin may call, with every method a switch could hide behind.
    for service in [
        "keel.prompt",
        "keel.agents",
        "keel.conversation",
        "keel.caller",
    ] {
        for method in ["plan", "set-plan", "plan-mode", "leave-plan", "mode"] {
            let payload = format!("{service} {method} false");
            let answer = w
                .kernel
                .call_service("prober", "call-method", &payload)
                .await;
            assert!(answer.is_err(), "{service}.{method} answered {answer:?}");
        }
    }
    // Unloading and loading plugins does not reset it either.
    w.kernel.unload("prober").await.expect("unload");
    assert!(w.kernel.plan_mode(), "plan mode left by a plugin");
    w.respond(vec![call("w1", "write_file", r#"{"path":"a.txt"}"#)])
        .await;
    let write = w.dispatch("w1").await;
    assert_eq!(write.status, OutcomeStatus::Refused, "{write:?}");
    assert_eq!(w.runs(), 0);
}
