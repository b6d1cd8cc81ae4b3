//! A plugin reaches only the services and event topics its manifest declares, and the session
//! log takes entries only from keel and the agent: the hostile fixture `snooper` declares
//! nothing and tries to read sessions, forge entries, drive the model, query the verifier and
//! emit what it likes; the same code declaring everything still cannot forge or read the log.

use keel_kernel::GateConfig;
use keel_protocol::services;
use keel_tests::Harness;

type R = anyhow::Result<()>;

const GENUINE: &str = r#"{"kind":"message","session":"victim","message":{"role":"user","content":[{"type":"text","text":"GENUINE"}]}}"#;

async fn setup(
    snooper_manifest: impl Fn(&str) -> String,
) -> anyhow::Result<(Harness, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("sessions"))?;
    let h = Harness::with_gates(dir.path(), Some(data), None, GateConfig::locked_down())?;
    h.load_plugin("session-log").await?;
    h.load_fixture("canned-model").await?;
    let (manifest, component) =
        keel_tests::fixtures::fixture("snooper").expect("the fixture is built");
    let package =
        h.loader
            .from_embedded("fixture snooper", &snooper_manifest(manifest), component)?;
    h.kernel.load(package).await?;
    // keel itself writes a genuine entry: the shape the forged one copies is a valid one.
    h.kernel
        .call_service(services::SESSION_LOG, "append", GENUINE)
        .await?;
    Ok((h, dir))
}

fn attempts(answer: &str) -> std::collections::BTreeMap<String, String> {
    answer
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(what, result)| (what.to_owned(), result.to_owned()))
        .collect()
}

async fn victim_log(h: &Harness) -> anyhow::Result<String> {
    h.kernel.settle_events().await;
    Ok(h.kernel
        .call_service(services::SESSION_LOG, "read", r#"{"session":"victim"}"#)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_services_and_topics_are_refused() -> R {
    let (h, _dir) = setup(str::to_owned).await?;
    let answer = h.kernel.call_service("fixture.snoop", "try", "").await?;
    let tried = attempts(&answer);
    for what in [
        "list", "read", "append", "complete", "verify", "turn", "hooks", "editor",
    ] {
        let result = &tried[what];
        assert!(
            result.contains("did not declare the service"),
            "{what}: {result}\n{answer}"
        );
    }
    for what in [
        "agent-complete",
        "agent-dispatch",
        "typed-agent-complete",
        "typed-agent-dispatch",
    ] {
        assert!(
            tried[what].contains("has no `agent` capability"),
            "{what}: {}",
            tried[what]
        );
    }
    assert!(tried["open-child"].contains("did not declare the service"));
    assert!(tried["conversation-read"].contains("did not declare the service"));
    // ABI 0.5.0's and 0.6.0's typed doors are refused exactly where the JSON ones are.
    assert_eq!(tried["typed-open-child"], tried["open-child"]);
    assert_eq!(tried["typed-conversation-read"], tried["conversation-read"]);
    assert_eq!(tried["typed-editor"], tried["editor"]);
    for (what, service) in [
        ("typed-recall", "memory"),
        ("typed-summarize", "compaction"),
        ("typed-list-tools", "tool-registry"),
        ("typed-turn", "agent"),
        ("typed-verify", "verifier"),
        ("typed-complete", "model"),
        ("typed-log-list", "session-log"),
        ("typed-log-read", "session-log"),
        ("typed-log-resume", "session-log"),
        ("typed-log-append", "session-log"),
        ("typed-log-started", "session-log"),
    ] {
        assert!(
            tried[what].contains(&format!("did not declare the service `{service}`")),
            "{what}: {}",
            tried[what]
        );
    }
    for what in ["typed-fragments", "typed-generation", "typed-fence"] {
        assert!(
            tried[what].contains("did not declare the service `keel.prompt`"),
            "{what}: {}",
            tried[what]
        );
    }
    for what in [
        "emit-session",
        "emit-compaction",
        "emit-other",
        "emit-subagent",
    ] {
        assert!(
            tried[what].contains("did not declare the event topic"),
            "{what}: {}",
            tried[what]
        );
    }
    for what in ["processes", "process-read", "process-status"] {
        assert!(
            tried[what].contains("has no `processes` capability"),
            "{what}: {}",
            tried[what]
        );
    }
    let log = victim_log(&h).await?;
    assert!(log.contains("GENUINE") && !log.contains("FORGED"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_a_door_does_not_let_a_plugin_forge_or_read_the_session_log() -> R {
    let declare_everything = |manifest: &str| {
        manifest.replace(
            "[requires]\n",
            "[requires]\n\"session-log\" = \"^1\"\nmodel = \"^1\"\nagent = \"^1\"\n",
        )
        .replace(
            "[capabilities]\n",
            "[capabilities]\nservices = [\"verifier\", \"hooks\", \"keel.agents\", \"keel.conversation\", \"keel.prompt\", \"keel.editor\"]\nemits = [\"session.event\", \"compaction.status\", \"fixture.snooped\", \"subagent.event\"]\nprocesses = true\nagent = true\n",
        )
    };
    let (h, _dir) = setup(declare_everything).await?;
    h.load_plugin("agent-loop").await?;
    let answer = h.kernel.call_service("fixture.snoop", "try", "").await?;
    let tried = attempts(&answer);
    // Through either door: the log's typed export checks the caller as its JSON one does.
    for what in [
        "list",
        "read",
        "append",
        "typed-log-list",
        "typed-log-read",
        "typed-log-resume",
        "typed-log-append",
        "typed-log-started",
    ] {
        assert!(
            tried[what]
                .contains("session-log serves only keel and the plugin that provides `agent`"),
            "{what}: {}",
            tried[what]
        );
    }
    // The typed door refuses with the kind `denied`, said once.
    for what in [
        "typed-log-list",
        "typed-log-read",
        "typed-log-resume",
        "typed-log-append",
        "typed-log-started",
    ] {
        assert!(
            tried[what].starts_with("denied: session-log serves only"),
            "{what}: {}",
            tried[what]
        );
    }
    for what in ["emit-session", "emit-compaction"] {
        assert!(
            tried[what].contains("only the plugin that provides `agent` may emit"),
            "{what}: {}",
            tried[what]
        );
    }
    assert!(
        tried["hooks"].contains("the person's hooks run only when keel runs them"),
        "{}",
        tried["hooks"]
    );
    // Declared, the editor is still refused to a plugin not granted the whole workspace.
    assert!(
        tried["editor"].contains("may not read through the editor"),
        "{}",
        tried["editor"]
    );
    // Declaring `processes` names no program: only the person's config does, and it lists
    // none for this plugin.
    assert!(
        tried["processes"].contains("the person's config lists no such entry"),
        "{}",
        tried["processes"]
    );
    // Declaring `agent` does not make it the agent: it drives no conversation, opens no child
    // outside a tool call, and files no entry under a call it does not serve.
    for what in [
        "agent-complete",
        "agent-dispatch",
        "typed-agent-complete",
        "typed-agent-dispatch",
    ] {
        assert!(
            tried[what].contains("does not provide `agent`"),
            "{what}: {}",
            tried[what]
        );
    }
    assert!(
        tried["open-child"].contains("is not serving a tool call"),
        "{}",
        tried["open-child"]
    );
    assert!(
        tried["emit-subagent"].contains("has no child agent open"),
        "{}",
        tried["emit-subagent"]
    );
    // Declaring the conversation door reads nothing: only the plugin serving a model request
    // that names a held conversation reads it, while it serves that request.
    assert!(
        tried["conversation-read"].contains("answers only the model adapter serving"),
        "{}",
        tried["conversation-read"]
    );
    // Declaring `agent` does not let it run a turn of the person's session (whose input the
    // log would keep as the person's words, and `keel resume` replay as theirs): the agent
    // loop serves keel only.
    for what in ["turn", "typed-turn"] {
        assert!(
            tried[what].starts_with(
                "denied: the agent loop runs turns, loads and compacts sessions only for keel"
            ),
            "{what}: {}",
            tried[what]
        );
    }
    // The typed doors refuse the same calls with the same words.
    assert_eq!(tried["typed-open-child"], tried["open-child"]);
    assert_eq!(tried["typed-editor"], tried["editor"]);
    assert_eq!(tried["typed-conversation-read"], tried["conversation-read"]);
    assert!(
        tried["typed-fragments"].starts_with("ok "),
        "{}",
        tried["typed-fragments"]
    );
    // What it declared, and the person consented to, it may use.
    for what in ["complete", "typed-complete"] {
        assert!(tried[what].starts_with("ok "), "{what}: {}", tried[what]);
    }
    assert!(
        tried["emit-other"].starts_with("ok"),
        "{}",
        tried["emit-other"]
    );
    let log = victim_log(&h).await?;
    assert!(log.contains("GENUINE") && !log.contains("FORGED"), "{log}");
    assert!(!log.contains("call_1"), "{log}");
    Ok(())
}

/// The control for the editor door refused above: the same code granted the whole workspace
/// (which it could read from the disk anyway) passes it (no editor here, so no text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_editor_door_opens_to_a_plugin_granted_the_whole_workspace() -> R {
    let granted = |manifest: &str| {
        manifest.replace(
            "[capabilities]\n",
            "[capabilities]\nservices = [\"keel.editor\"]\n\
             dirs = [{ path = \".\", guest = \"/workspace\", access = \"read\" }]\n",
        )
    };
    let (h, _dir) = setup(granted).await?;
    let tried = attempts(&h.kernel.call_service("fixture.snoop", "try", "").await?);
    assert_eq!(tried["editor"], r#"ok {"text":null}"#);
    assert_eq!(tried["typed-editor"], "ok None");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_learns_its_kernel_attested_caller() -> R {
    let (h, _dir) = setup(str::to_owned).await?;
    // The host calls as `keel`; outside a call nobody is calling.
    let list = h
        .kernel
        .call_service(services::SESSION_LOG, "list", "")
        .await?;
    assert!(list.contains("victim"), "{list}");
    assert_eq!(
        h.kernel
            .call_service(keel_kernel::CALLER_SERVICE, "name", "")
            .await?,
        ""
    );
    assert_eq!(
        h.kernel
            .call_service(keel_kernel::CALLER_SERVICE, "provider", "fixture.snoop")
            .await?,
        "snooper"
    );
    Ok(())
}

/// The kernel tells the `hooks` service of every tool call that ran, with its arguments and
/// result, and appends what it answers to the result the model reads. Only the plugin the
/// person's hooks were handed to hears it: the `snooper` fixture providing a service of that
/// name is not called, with the person's hooks given to it or not; the same code named
/// `hooks` and handed the hooks is (the test would see it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_plugin_given_the_persons_hooks_hears_of_every_tool_call() -> R {
    use std::collections::BTreeMap;
    async fn echo_through(name: &str, hooks_for: Option<&str>) -> anyhow::Result<String> {
        let dir = tempfile::tempdir()?;
        let mut gates = GateConfig::locked_down();
        if let Some(plugin) = hooks_for {
            let entry = keel_kernel::ProcessEntry {
                command: "true".into(),
                args: Vec::new(),
                env: BTreeMap::new(),
                secret_env: BTreeMap::new(),
                cwd: None,
                dirs: Vec::new(),
                read: Vec::new(),
                hosts: Vec::new(),
                pinned: Vec::new(),
            };
            gates.processes = BTreeMap::from([(
                plugin.to_owned(),
                BTreeMap::from([("hook-0".to_owned(), entry)]),
            )]);
        }
        let h = Harness::with_gates(dir.path(), None, None, gates)?;
        h.load_bundled("echo-tool").await?;
        let (manifest, component) =
            keel_tests::fixtures::fixture("snooper").expect("the fixture is built");
        let manifest = manifest
            .replace("name = \"snooper\"", &format!("name = \"{name}\""))
            .replace("[provides]\n", "[provides]\nhooks = \"1.0.0\"\n");
        let package = h
            .loader
            .from_embedded("fixture snooper", &manifest, component)?;
        h.kernel.load(package).await?;
        assert_eq!(
            h.kernel
                .call_service(keel_kernel::CALLER_SERVICE, "provider", "hooks")
                .await?,
            name
        );
        // The host sends the person's prompts by the same rule.
        assert_eq!(
            h.kernel.person_hooks_run(),
            name == "hooks" && hooks_for == Some("hooks"),
            "{name} handed {hooks_for:?}"
        );
        Ok(h.kernel.call_tool("echo", r#"{"text":"hello"}"#).await)
    }
    for (name, hooks_for) in [
        ("snooper", None),
        ("snooper", Some("snooper")),
        ("hooks", None),
    ] {
        let outcome = echo_through(name, hooks_for).await?;
        assert!(outcome.contains("hello"), "{outcome}");
        assert!(
            !outcome.contains("SNOOPED"),
            "{name} (hooks handed to {hooks_for:?}) heard the call: {outcome}"
        );
    }
    let outcome = echo_through("hooks", Some("hooks")).await?;
    assert!(outcome.contains("SNOOPED"), "{outcome}");
    Ok(())
}

/// ABI 0.5.0's typed `caller` and `prompt-context` answer what `services.call` answers for
/// `keel.caller` and `keel.prompt`: the same caller, providers, fragments, generation and
/// fence, asked by one plugin through both doors in the same call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typed_kernel_services_answer_what_the_json_ones_do() -> R {
    let declare_prompt = |manifest: &str| {
        manifest.replace(
            "[capabilities]\n",
            "[capabilities]\nservices = [\"keel.prompt\"]\n",
        )
    };
    let (h, _dir) = setup(declare_prompt).await?;
    // A plugin that adds a fragment, so there is one to list.
    h.load_plugin("greeter").await?;
    let answer = h
        .kernel
        .call_service("fixture.snoop", "compare", "")
        .await?;
    let compared: std::collections::BTreeMap<&str, (&str, &str)> = answer
        .split('\u{1e}')
        .filter_map(|record| {
            let mut parts = record.split('\u{1f}');
            Some((parts.next()?, (parts.next()?, parts.next()?)))
        })
        .collect();
    assert_eq!(compared.len(), 6, "{answer:?}");
    for (what, (json, typed)) in &compared {
        if *what == "fragments" {
            let json: serde_json::Value = serde_json::from_str(json)?;
            let typed: serde_json::Value = serde_json::from_str(typed)?;
            assert_eq!(json, typed, "{what}");
        } else {
            assert_eq!(json, typed, "{what}");
        }
    }
    // And they are the right answers, not two equal wrong ones.
    assert_eq!(compared["caller-name"].1, "keel");
    assert_eq!(compared["provider"].1, "snooper");
    assert_eq!(compared["provider-none"].1, "");
    let fragments: Vec<keel_protocol::PromptFragment> =
        serde_json::from_str(compared["fragments"].1)?;
    assert!(
        fragments
            .iter()
            .any(|f| f.plugin == "greeter" && f.text == "You can greet people."),
        "{fragments:?}"
    );
    assert!(
        compared["generation"].1.parse::<u64>().is_ok(),
        "{:?}",
        compared["generation"]
    );
    let fenced = compared["fence"].1;
    assert!(
        fenced.starts_with("<external_content source=\"notes\">"),
        "{fenced}"
    );
    assert_eq!(fenced.matches("</external_content>").count(), 1, "{fenced}");
    assert!(!fenced.contains("\nHuman:"), "{fenced}");
    Ok(())
}
