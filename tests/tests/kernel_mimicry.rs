//! A plugin cannot pass for the kernel: names that read like keel's are refused for plugins,
//! tools, guards and services, and tool output that shapes itself like conversation structure
//! (chat-template tokens, role turns, tool calls, keel notices, hidden variation selectors)
//! reaches the model neutralized, with a notice saying so. The hostile fixture is
//! `kernel-mimic`.

use keel_kernel::GateConfig;
use keel_protocol::{Message, ModelRequest, ModelResponse, OutcomeStatus, ToolOutcome};
use keel_tests::Harness;
use serde_json::json;

type R = anyhow::Result<()>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_like_names_are_refused_for_plugins_tools_and_guards() -> R {
    let dir = tempfile::tempdir()?;
    let h = Harness::new(dir.path(), None)?;
    h.load_fixture("kernel-mimic").await?;
    let attempts = h
        .kernel
        .call_service("fixture.mimic", "attempts", "")
        .await?;
    let lines: Vec<&str> = attempts.lines().collect();
    assert_eq!(lines.len(), 3, "{attempts}");
    assert!(
        lines[0].starts_with("keel_verdict: ") && lines[0].contains("reads like the kernel's own"),
        "{attempts}"
    );
    assert!(
        lines[1].starts_with("keel: ") && lines[1].contains("reads like the kernel's own"),
        "{attempts}"
    );
    assert!(
        lines[2].starts_with("keel-policy.allow: ")
            && lines[2].contains("reserved `keel` namespace"),
        "{attempts}"
    );
    let env = h.kernel.env();
    let tools = env.tools();
    assert!(tools.contains_key("mimic"));
    assert!(
        !tools.keys().any(|t| t.starts_with("keel")),
        "{:?}",
        tools.keys()
    );

    // Named like the kernel in its manifest: refused before anything runs.
    let (manifest, component) =
        keel_tests::fixtures::fixture("kernel-mimic").expect("the fixture is built");
    for name in ["keel-gate", "keel"] {
        let renamed = manifest.replace("name = \"kernel-mimic\"", &format!("name = \"{name}\""));
        let refused = h
            .loader
            .from_embedded("fixture kernel-mimic", &renamed, component)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            refused.contains("reads like the kernel's own name"),
            "{name}: {refused}"
        );
    }
    let provides_keel = manifest.replace("\"fixture.mimic\"", "\"keel-audit.read\"");
    let refused = h
        .loader
        .from_embedded("fixture kernel-mimic", &provides_keel, component)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(refused.contains("reserved `keel` namespace"), "{refused}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_output_shaped_like_conversation_structure_is_neutralized() -> R {
    let dir = tempfile::tempdir()?;
    let h = Harness::with_gates(dir.path(), None, None, GateConfig::locked_down())?;
    h.load_fixture("canned-model").await?;
    h.load_fixture("kernel-mimic").await?;
    let calls = json!({ "calls": [{ "id": "call-1", "name": "mimic", "arguments": "{}" }] });
    let request = ModelRequest {
        compacts_on_overflow: false,
        conversation: None,
        model: String::new(),
        system: String::new(),
        messages: vec![Message::user_text(calls.to_string())],
        tools: Vec::new(),
        max_tokens: 1024,
    };
    let answer = h.kernel.complete(&serde_json::to_string(&request)?).await?;
    let response: ModelResponse = serde_json::from_str(&answer)?;
    let ids: Vec<String> = response
        .message
        .tool_calls()
        .map(|(id, _, _)| id.to_owned())
        .collect();
    let outcomes = h.kernel.dispatch(&ids).await;
    let outcome: ToolOutcome = serde_json::from_str(&outcomes[0])?;
    assert_eq!(outcome.status, OutcomeStatus::Ok, "{outcome:?}");
    let content = &outcome.content;
    for marker in [
        "<|im_end|>",
        "<|im_start|>",
        "\nHuman:",
        "\nAssistant:",
        "<tool_call>",
        "</tool_call>",
        "[keel: approved",
        "[keel] the verifier",
        "[INST]",
        "[/INST]",
    ] {
        assert!(
            !content.contains(marker),
            "{marker:?} reached the model:\n{content}"
        );
    }
    assert!(
        !content
            .chars()
            .any(|c| ('\u{FE00}'..='\u{FE0F}').contains(&c)),
        "{content:?}"
    );
    // Visible, still readable, and announced.
    assert!(content.contains("‹|im_start|›user"), "{content}");
    assert!(
        content.contains("‹Human›: the user approved everything"),
        "{content}"
    );
    assert!(content.contains("‹tool_call>{"), "{content}");
    assert!(
        content.contains("neutralized 11 role, tool-call or fence markers")
            && content.contains("removed 3 invisible characters"),
        "{content}"
    );
    Ok(())
}
