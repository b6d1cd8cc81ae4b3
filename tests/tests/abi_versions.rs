//! Plugins built against every ABI keel hosts load and run side by side: a 0.3.0 component
//! (the fixture `abi-0-3-tool`, bound to the 0.3.0 WIT) through the kernel's version glue, a
//! 0.4.0 one (the bundled `echo-tool`, on keel-sdk's typed API) directly, and 0.6.0 ones (the
//! bundled `agent-loop`, which asks the kernel's own services and the plugins' `memory` and
//! `compaction` through their typed doors, and the fixture `typed-memory`, which serves one).

use keel_kernel::{KernelError, PluginState, WasmHost, WasmHostConfig, inspect_component};
use keel_tests::Harness;

type R = anyhow::Result<()>;

fn harness() -> anyhow::Result<(Harness, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    Ok((Harness::new(dir.path(), None)?, dir))
}

/// The message of a failed call, which is the plugin's own: no kernel routing around it.
fn own_message(e: Result<String, KernelError>) -> String {
    match e {
        Err(KernelError::Failed(m)) => m,
        other => panic!("expected a failed call, got {other:?}"),
    }
}

#[test]
fn the_fixture_is_a_0_3_component_and_echo_tool_a_0_4_one() -> R {
    let host = WasmHost::new(WasmHostConfig::default())?;
    let (_, legacy) = keel_tests::fixtures::fixture("abi-0-3-tool")
        .ok_or_else(|| anyhow::anyhow!("the fixture is built"))?;
    let report = inspect_component(&host, "abi-0-3-tool", legacy)?;
    assert_eq!(report.abi_version.to_string(), "0.3.0");
    assert!(
        report
            .exports
            .contains(&"keel:plugin/plugin@0.2.0".to_owned())
    );
    assert!(
        report
            .imports
            .contains(&"keel:plugin/tool-list@0.3.0".to_owned())
    );

    let echo = keel_tests::plugins::plugin("echo-tool")
        .ok_or_else(|| anyhow::anyhow!("echo-tool is bundled"))?;
    let report = inspect_component(&host, "echo-tool", &echo.component())?;
    assert_eq!(report.abi_version.to_string(), "0.4.0");
    assert!(
        report
            .exports
            .contains(&"keel:plugin/plugin@0.4.0".to_owned())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_against_abi_0_3_loads_runs_and_fails_as_a_failure() -> R {
    let (h, _dir) = harness()?;
    let status = h.load_fixture("abi-0-3-tool").await?;
    assert_eq!(status.state, PluginState::Active, "{status:?}");
    let tools: Vec<String> = h.kernel.tools().into_iter().map(|t| t.name).collect();
    assert!(tools.contains(&"legacy_echo".to_owned()), "{tools:?}");
    assert!(
        !tools.contains(&"legacy_gone".to_owned()),
        "0.3.0's tool-list withdrew it: {tools:?}"
    );

    assert_eq!(
        h.kernel
            .invoke_tool("legacy_echo", r#"{"text":"still here ✓"}"#)
            .await?,
        "still here ✓"
    );
    // Its error string is adapted to a failure: the message as the plugin wrote it, no kind.
    assert_eq!(
        own_message(
            h.kernel
                .invoke_tool("legacy_echo", r#"{"fail":"on purpose"}"#)
                .await
        ),
        "the legacy tool failed: on purpose"
    );

    // Beside it, a 0.4.0 plugin's typed error keeps its kind: the caller gets an invalid
    // input to correct, in the plugin's words.
    h.load_bundled("echo-tool").await?;
    assert_eq!(
        h.kernel.invoke_tool("echo", r#"{"text":"typed"}"#).await?,
        "typed"
    );
    match h.kernel.invoke_tool("echo", r#"{"text":7}"#).await {
        Err(KernelError::Invalid(m)) => assert!(
            m.starts_with("tool `echo`: invalid type: integer `7`"),
            "{m}"
        ),
        other => panic!("expected an invalid input, got {other:?}"),
    }
    // And the older plugin still answers after the newer one loaded.
    assert_eq!(
        h.kernel
            .invoke_tool("legacy_echo", r#"{"text":"again"}"#)
            .await?,
        "again"
    );
    Ok(())
}

/// A 0.3.0 component still asks the kernel's own services through `services.call`, JSON text
/// in and out, beside the typed doors 0.5.0 added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_3_plugin_asks_the_kernel_services_through_json() -> R {
    let (h, _dir) = harness()?;
    h.load_plugin("greeter").await?;
    let status = h.load_fixture("abi-0-3-tool").await?;
    assert_eq!(status.state, PluginState::Active, "{status:?}");
    let answer = h.kernel.invoke_tool("legacy_kernel", "{}").await?;
    let parts: Vec<&str> = answer.splitn(4, '|').collect();
    assert_eq!(parts.len(), 4, "{answer}");
    assert_eq!(parts[0], "keel", "the host called the tool: {answer}");
    assert_eq!(parts[1], "greeter", "{answer}");
    assert!(parts[2].parse::<u64>().is_ok(), "{answer}");
    let fragments: Vec<keel_protocol::PromptFragment> = serde_json::from_str(parts[3])?;
    assert!(
        fragments.iter().any(|f| f.plugin == "greeter"),
        "{fragments:?}"
    );
    Ok(())
}

/// The agent loop is a 0.8.0 component: it imports the typed `caller` and `prompt-context`
/// (so its prompt and the compaction provider come through them), the typed `memory`,
/// `compaction`, `tool-registry` and `verifier` it asks the plugins providing them through,
/// asks the model and the dispatcher through 0.7.0's typed `agent` door only, and records its
/// calls' start through 0.8.0's typed `session-log`. The providers export their typed door
/// beside 0.4.0's `plugin`, as the agent loop exports `turns` (the `agent` service keel runs
/// turns through), the HTTP model adapters `model` and the session log `session-log`.
/// The subagents plugin, which still asks through `services.call`, stays 0.4.0.
#[test]
fn the_agent_loop_uses_the_typed_services() -> R {
    let host = WasmHost::new(WasmHostConfig::default())?;
    let report = |name: &str| -> anyhow::Result<keel_kernel::ComponentReport> {
        let plugin = keel_tests::plugins::plugin(name)
            .ok_or_else(|| anyhow::anyhow!("{name} is bundled"))?;
        Ok(inspect_component(&host, name, &plugin.component())?)
    };
    let agent = report("agent-loop")?;
    assert_eq!(agent.abi_version.to_string(), "0.8.0");
    for typed in [
        "keel:plugin/caller@0.5.0",
        "keel:plugin/prompt-context@0.5.0",
        "keel:plugin/memory@0.6.0",
        "keel:plugin/compaction@0.6.0",
        "keel:plugin/tool-registry@0.6.0",
        "keel:plugin/verifier@0.6.0",
        "keel:plugin/agent@0.7.0",
        "keel:plugin/session-log@0.8.0",
    ] {
        assert!(
            agent.calling_imports.contains(&typed.to_owned()),
            "{agent:?}"
        );
    }
    assert!(
        agent
            .exports
            .contains(&"keel:plugin/plugin@0.4.0".to_owned())
    );
    for (provider, export, abi) in [
        ("memory", "keel:plugin/memory@0.6.0", "0.6.0"),
        ("compaction", "keel:plugin/compaction@0.6.0", "0.7.0"),
        ("tool-registry", "keel:plugin/tool-registry@0.6.0", "0.6.0"),
        ("agent-loop", "keel:plugin/turns@0.6.0", "0.8.0"),
        ("verifier", "keel:plugin/verifier@0.6.0", "0.7.0"),
        ("model-openai", "keel:plugin/model@0.7.0", "0.7.0"),
        ("model-anthropic", "keel:plugin/model@0.7.0", "0.7.0"),
        ("hooks", "keel:plugin/hooks@0.7.0", "0.7.0"),
        ("session-log", "keel:plugin/session-log@0.8.0", "0.8.0"),
    ] {
        let report = report(provider)?;
        assert_eq!(report.abi_version.to_string(), abi, "{report:?}");
        assert!(report.exports.contains(&export.to_owned()), "{report:?}");
        assert!(
            report
                .exports
                .contains(&"keel:plugin/plugin@0.4.0".to_owned()),
            "{report:?}"
        );
    }
    // Compaction asks the model through the typed `model` import.
    assert!(
        report("compaction")?
            .calling_imports
            .contains(&"keel:plugin/model@0.7.0".to_owned())
    );
    // HTTP bodies and processes are resources (0.7.0): the HTTP adapters and the MCP client
    // read their bodies through them, not through 0.2.0's numbered handles, and the MCP
    // client holds its servers as process resources (it still lists its entries through
    // 0.3.0's `processes`).
    for plugin in ["model-openai", "model-anthropic", "mcp"] {
        let report = report(plugin)?;
        assert!(
            report
                .calling_imports
                .contains(&"keel:plugin/http@0.7.0".to_owned())
                && !report
                    .calling_imports
                    .contains(&"keel:plugin/http@0.2.0".to_owned()),
            "{plugin}: {report:?}"
        );
    }
    assert!(
        report("mcp")?
            .calling_imports
            .contains(&"keel:plugin/processes@0.7.0".to_owned())
    );
    // The scripted model takes the conversation in the request (model 1.0.0): it keeps its
    // JSON door, through which the kernel hands it the kept messages without decoding them.
    let scripted = report("model-scripted")?;
    assert!(
        !scripted
            .exports
            .contains(&"keel:plugin/model@0.7.0".to_owned()),
        "{scripted:?}"
    );
    assert_eq!(report("subagents")?.abi_version.to_string(), "0.4.0");
    Ok(())
}

/// A typed service call goes to the provider's typed export when it has one, and the same
/// call through `services.call` to its JSON door (the fixture answers each in its own
/// words); what the typed door answers keeps its kind; and a plugin's typed import is refused
/// a service it did not declare, as `services.call` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_call_takes_the_providers_typed_door() -> R {
    use keel_kernel::{ServiceAnswer, ServiceCall};
    use keel_protocol::{RecallRequest, RecalledEntry};

    let (h, _dir) = harness()?;
    let status = h.load_fixture("typed-memory").await?;
    assert_eq!(status.state, PluginState::Active, "{status:?}");
    let recall = |input: &str| {
        ServiceCall::Recall(RecallRequest {
            session: "s1".into(),
            input: input.into(),
        })
    };
    let entry = |source: &str, text: &str| RecalledEntry {
        source: source.into(),
        text: text.into(),
    };
    assert_eq!(
        h.kernel.call_service_typed(&recall("how to build")).await?,
        ServiceAnswer::Recalled(vec![entry("typed door", "how to build")])
    );
    // A caller of an earlier ABI still reaches it, through `handle-call`.
    let call = recall("how to test");
    let json = h
        .kernel
        .call_service("memory", "recall", &call.to_json())
        .await?;
    assert_eq!(
        call.answer_from_json(&json),
        Ok(ServiceAnswer::Recalled(vec![entry(
            "json door",
            "how to test"
        )]))
    );
    match h.kernel.call_service_typed(&recall("refuse")).await {
        Err(KernelError::Invalid(m)) => assert_eq!(m, "refused by the typed door"),
        other => panic!("expected the provider's invalid input, got {other:?}"),
    }
    // A typed export that never returns is bounded like every other call into a plugin: its
    // CPU limit stops it, the caller hears so, and the next call gets a fresh instance.
    match h.kernel.call_service_typed(&recall("spin")).await {
        Err(KernelError::Failed(m)) => {
            assert!(m.contains("typed-memory") && m.contains("cpu limit"), "{m}")
        }
        other => panic!("expected the CPU limit, got {other:?}"),
    }
    assert_eq!(
        h.kernel.call_service_typed(&recall("again")).await?,
        ServiceAnswer::Recalled(vec![entry("typed door", "again")])
    );
    let refused = h.kernel.invoke_tool("summarize_undeclared", "{}").await?;
    assert!(
        refused.starts_with(
            "error: denied: plugin `typed-memory` did not declare the service `compaction`"
        ),
        "{refused}"
    );
    Ok(())
}

/// The bundled tool registry answers alike through its typed door, which the kernel's
/// dispatcher and the agent loop use, and its JSON one, which callers of earlier ABIs use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_registry_answers_alike_through_both_doors() -> R {
    use keel_kernel::{ServiceAnswer, ServiceCall};
    use keel_protocol::{Resolution, ResolveRequest};

    let (h, _dir) = harness()?;
    h.load_bundled("tool-registry").await?;
    h.load_bundled("echo-tool").await?;
    let typed = h.kernel.call_service_typed(&ServiceCall::ListTools).await?;
    let json = h.kernel.call_service("tool-registry", "list", "{}").await?;
    assert_eq!(
        ServiceCall::ListTools.answer_from_json(&json),
        Ok(typed.clone())
    );
    match &typed {
        ServiceAnswer::Tools(tools) => {
            let echo = tools.iter().find(|t| t.name == "echo");
            assert!(
                echo.is_some_and(|t| t.input_schema["type"] == "object"),
                "{tools:?}"
            );
        }
        other => panic!("expected the tools, got {other:?}"),
    }
    let resolve = |name: &str| ServiceCall::ResolveTool(ResolveRequest { name: name.into() });
    assert_eq!(
        h.kernel.call_service_typed(&resolve("Echo")).await?,
        ServiceAnswer::Resolution(Resolution::Found {
            name: "echo".into()
        })
    );
    assert_eq!(
        h.kernel.call_service_typed(&resolve("ecko")).await?,
        ServiceAnswer::Resolution(Resolution::Unknown {
            did_you_mean: vec!["echo".into()]
        })
    );
    Ok(())
}
