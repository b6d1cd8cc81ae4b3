//! A conversation the kernel holds, rendered once per message across requests and assembled
//! over the body sent before (`keel_model_wire::fragments`): whatever the conversation and
//! however it grows, is rewritten or gets another system prompt, the body of each step is
//! byte for byte the body of the same messages sent inline, and each step reads only the
//! messages added since the step before — and reads, so a request the kernel did not hand
//! over gets nothing from the cache.

use keel_model_wire::driver::AdapterConfig;
use keel_model_wire::fragments::{ConversationCache, ConversationSource};
use keel_model_wire::request::RequestView;
use keel_protocol::{
    Block, ConversationRef, HeldConversation, Message, ModelRequest, Role, ToolDef,
};
use proptest::prelude::*;
use serde_json::json;

/// The kernel as the adapter sees it: the messages it holds, and every read asked of it.
#[derive(Default)]
struct Kernel {
    messages: Vec<Message>,
    reads: Vec<(usize, usize)>,
}

impl ConversationSource for Kernel {
    fn read_conversation(&mut self, from: usize, to: usize) -> Result<String, String> {
        self.reads.push((from, to));
        let slice = self.messages.get(from..to).ok_or("out of range")?;
        serde_json::to_string(slice).map_err(|e| e.to_string())
    }
}

fn request(messages: Vec<Message>, held: Option<(usize, u64)>) -> String {
    request_with(messages, held, "sys \"prompt\"")
}

fn request_with(messages: Vec<Message>, held: Option<(usize, u64)>, system: &str) -> String {
    let req = ModelRequest {
        model: String::new(),
        system: system.into(),
        messages,
        tools: vec![ToolDef {
            name: "read_file".into(),
            description: "reads".into(),
            input_schema: json!({"type": "object"}),
        }],
        max_tokens: 64,
        compacts_on_overflow: true,
        conversation: held.map(|(messages, revision)| ConversationRef {
            session: "s".into(),
            messages,
            held: Some(HeldConversation {
                keeper: "agent-loop".into(),
                revision,
            }),
        }),
    };
    serde_json::to_string(&req).unwrap_or_default()
}

fn configs() -> [AdapterConfig; 2] {
    [AdapterConfig::openai("m"), AdapterConfig::anthropic("m")]
}

/// The body of the first `n` held messages, rendered through `cache`.
fn held_body(
    config: &AdapterConfig,
    cache: &mut ConversationCache,
    kernel: &mut Kernel,
    n: usize,
    revision: u64,
) -> Result<Vec<u8>, String> {
    held_body_with(config, cache, kernel, n, revision, "sys \"prompt\"")
}

/// [`held_body`] with `system` as the system prompt; the body is lent back to the cache
/// afterwards, as the driver does once it is sent.
fn held_body_with(
    config: &AdapterConfig,
    cache: &mut ConversationCache,
    kernel: &mut Kernel,
    n: usize,
    revision: u64,
    system: &str,
) -> Result<Vec<u8>, String> {
    let text = request_with(Vec::new(), Some((n, revision)), system);
    let view = RequestView::parse(&text).map_err(|e| e.to_string())?;
    let body = config
        .render_held(&view, cache, kernel)
        .map(|r| r.body)
        .map_err(|e| e.to_string())?;
    cache.lent_back(body.clone());
    Ok(body)
}

fn inline_body(config: &AdapterConfig, messages: &[Message]) -> Result<Vec<u8>, String> {
    inline_body_with(config, messages, "sys \"prompt\"")
}

fn inline_body_with(
    config: &AdapterConfig,
    messages: &[Message],
    system: &str,
) -> Result<Vec<u8>, String> {
    let text = request_with(messages.to_vec(), None, system);
    let view = RequestView::parse(&text).map_err(|e| e.to_string())?;
    config
        .render(&view)
        .map(|r| r.body)
        .map_err(|e| e.to_string())
}

fn block() -> impl Strategy<Value = Block> {
    let text = "[a-z\"\\\\\\n ]{0,12}";
    prop_oneof![
        text.prop_map(|text| Block::Text { text }),
        text.prop_map(|text| Block::Thinking { text }),
        (
            text,
            prop_oneof![Just("{\"p\":1}".to_string()), text.boxed()]
        )
            .prop_map(|(id, arguments)| Block::ToolCall {
                id,
                name: "read_file".into(),
                arguments,
            }),
        (text, text, any::<bool>()).prop_map(|(call_id, content, is_error)| {
            Block::ToolResult {
                call_id,
                content,
                is_error,
            }
        }),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    (any::<bool>(), prop::collection::vec(block(), 0..4)).prop_map(|(user, content)| Message {
        role: if user { Role::User } else { Role::Assistant },
        content,
    })
}

/// One step of a session: messages added, the conversation rewritten (a compaction: the
/// kernel's revision changes), or the system prompt changed (the body's head: a skill or a
/// memory loaded; the messages stay as they were).
#[derive(Debug, Clone)]
enum Step {
    Add(Vec<Message>),
    Rewrite(Vec<Message>),
    System(String),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec(message(), 0..4).prop_map(Step::Add),
        1 => prop::collection::vec(message(), 0..6).prop_map(Step::Rewrite),
        1 => "[a-z\"]{0,3}".prop_map(Step::System),
    ]
}

proptest! {
    #[test]
    fn each_step_is_the_inline_body_and_reads_only_what_is_new(
        steps in prop::collection::vec(step(), 1..12),
    ) {
        for config in configs() {
            let mut kernel = Kernel::default();
            let mut cache = ConversationCache::default();
            let mut revision = 0;
            let mut rendered = 0;
            let mut system = "sys \"prompt\"".to_string();
            for step in &steps {
                match step {
                    Step::Add(more) => kernel.messages.extend(more.iter().cloned()),
                    Step::Rewrite(all) => {
                        kernel.messages = all.clone();
                        revision += 1;
                        rendered = 0;
                    }
                    Step::System(prompt) => system = prompt.clone(),
                }
                kernel.reads.clear();
                let n = kernel.messages.len();
                let held = held_body_with(&config, &mut cache, &mut kernel, n, revision, &system);
                let inline = inline_body_with(&config, &kernel.messages, &system);
                prop_assert_eq!(&held, &inline);
                // One read a step (the kernel's say-so), of what is new only.
                prop_assert_eq!(&kernel.reads, &[(rendered, n)]);
                rendered = n;
            }
        }
    }
}

#[test]
fn a_conversation_named_with_fewer_messages_is_rendered_with_those_only() -> Result<(), String> {
    let says = |text: &str| Message {
        role: Role::User,
        content: vec![Block::Text { text: text.into() }],
    };
    for config in configs() {
        let mut kernel = Kernel {
            messages: vec![says("a"), says("b"), says("c")],
            ..Kernel::default()
        };
        let mut cache = ConversationCache::default();
        held_body(&config, &mut cache, &mut kernel, 3, 7)?;
        let two = held_body(&config, &mut cache, &mut kernel, 2, 7)?;
        assert_eq!(two, inline_body(&config, &kernel.messages[..2])?);
        assert_eq!(
            kernel.reads,
            [(0, 3), (2, 2)],
            "the two were rendered already"
        );
    }
    Ok(())
}

#[test]
fn a_request_the_kernel_refuses_to_serve_gets_nothing_from_the_cache() -> Result<(), String> {
    let says = Message {
        role: Role::User,
        content: vec![Block::Text {
            text: "SECRET".into(),
        }],
    };
    for config in configs() {
        let mut kernel = Kernel {
            messages: vec![says.clone()],
            ..Kernel::default()
        };
        let mut cache = ConversationCache::default();
        let body = held_body(&config, &mut cache, &mut kernel, 1, 3)?;
        assert!(String::from_utf8_lossy(&body).contains("SECRET"));
        // The same conversation named again by a caller the kernel gave no say-so: the
        // kernel refuses the read, and the cached rendering is not sent.
        let mut refusing = Kernel::default();
        let err = held_body(&config, &mut cache, &mut refusing, 1, 3).expect_err("refused");
        assert!(err.contains("cannot read the conversation"), "{err}");
        assert_eq!(refusing.reads, [(1, 1)]);
    }
    Ok(())
}

#[test]
fn a_held_request_with_messages_of_its_own_or_an_unreadable_conversation_is_refused() {
    let config = AdapterConfig::openai("m");
    let says = Message {
        role: Role::User,
        content: vec![Block::Text { text: "x".into() }],
    };
    let text = request(vec![says], Some((1, 0)));
    let view = RequestView::parse(&text).expect("parses");
    let err = config
        .render_held(
            &view,
            &mut ConversationCache::default(),
            &mut Kernel::default(),
        )
        .expect_err("refused");
    assert!(err.to_string().contains("carries no messages"), "{err}");

    // The kernel refuses the read (or holds fewer messages than named): said, not rendered.
    let err = held_body(
        &config,
        &mut ConversationCache::default(),
        &mut Kernel::default(),
        2,
        0,
    )
    .expect_err("refused");
    assert!(err.contains("cannot read the conversation"), "{err}");
}
