//! keel plugin `hooks`: commands a person configured (`[[hooks.pre-tool-use]]` and the other
//! events in `config.toml`), and a workspace's own (`.keel/config.toml`, `.claude/settings.json`)
//! once the person approved them, run at points of a session.
//!
//! Each hook is a process entry keel's host made for this plugin: the plugin names the entry,
//! never a command line, and the kernel starts it in the OS sandbox (the workspace writable,
//! no network unless the hook says so). The host wraps the command in a small shell script
//! that reads one line (the event as JSON, after this run's random mark and the line's length)
//! for the hook's stdin, passes the hook's stdout through, and ends it with the mark and the
//! exit code, then the hook's stderr; so the plugin learns the exit code and stderr through the
//! one pipe the `processes` door gives it, and the hook's stdin ends as a file's does.
//!
//! `pre-tool-use` is a guard (`hooks.pre-tool-use`): the kernel combines its answer with the
//! exec policy by maximum, so `allow` never loosens anything; a deny, `exit 2` or a hook that
//! fails or runs past its timeout (killed) refuses the call, with the reason the model is told.
//! `post-tool-use` is the `hooks` service's method the kernel calls after a tool ran and before
//! its result goes back, so a formatter's change is in place for the next step; what a hook
//! says comes back as context appended to the result. `session-start`, `user-prompt-submit`
//! and `stop` are methods keel's host calls around a turn; `pre-compact` hooks run when the
//! agent loop says on the bus that a compaction started, `subagent-stop` hooks when a child's
//! turn-ended entry passes on it.

mod logic;

use std::time::{Duration, Instant};

use keel_protocol::{
    HookContext, HookPrompt, HookSessionStart, HookStop, HookToolStatus, HookToolUse,
    PromptVerdict, StopVerdict, topics,
};
use keel_sdk::{
    Event as BusEvent, GuardDecision, GuardVerdict, Plugin, events, guards, log, processes,
    services,
};
use serde_json::{Value, json};

use logic::{Config, Decision, Event, Facts, Framed, Hook, Said, event_line};

/// The guard the kernel asks before every tool call.
const GUARD: &str = "hooks.pre-tool-use";
/// The service the kernel calls after a tool ran.
const SERVICE: &str = "hooks";
/// A mark of this run's own that ends the hook's stdout in its wrapper's answer: random (the
/// standard library seeds its hashers from the system's randomness), so the hook's output
/// cannot end it early by chance. (A hook that wanted to could misreport its own run only.)
fn run_mark() -> String {
    use std::hash::{BuildHasher, Hasher};
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        h.finish()
    };
    format!("keel-hook-{:016x}{:016x}", word(), word())
}

#[derive(Debug)]
struct Hooks {
    workspace: String,
    hooks: Vec<Hook>,
    /// The session the host last named (`session-start`, a prompt, a stop): tool calls reach
    /// the plugin through the kernel's guard and hooks points, which carry no session.
    session: Option<String>,
    /// The children (the kernel's numbers) whose subagent-stop hooks ran: once each, however
    /// often their holder says they ended.
    stopped: std::collections::BTreeSet<u64>,
}

/// How a hook's run ended.
enum Ran {
    Exited(logic::Exited),
    /// It ran past its timeout and was killed.
    TimedOut,
    /// It could not be run or its answer could not be read.
    Failed(String),
}

fn run(hook: &Hook, line: &str) -> Ran {
    let timeout = Duration::from_millis(u64::from(hook.config.timeout_ms));
    let deadline = Instant::now() + timeout;
    let left_ms = || {
        let left = deadline.saturating_duration_since(Instant::now());
        u32::try_from(left.as_millis()).unwrap_or(u32::MAX)
    };
    let process = match processes::start(&hook.config.entry) {
        Ok(p) => p,
        Err(e) => return Ran::Failed(format!("it could not start: {}", e.message())),
    };
    let mark = run_mark();
    let input = logic::wrapper_input(&mark, line);
    if let Err(e) = processes::write(process, &input, left_ms().max(1)) {
        processes::kill(process);
        if left_ms() == 0 {
            return Ran::TimedOut;
        }
        return Ran::Failed(format!("it did not take its input: {}", e.message()));
    }
    let mut framed = Framed::new();
    loop {
        let wait = left_ms();
        if wait == 0 {
            processes::kill(process);
            return Ran::TimedOut;
        }
        match processes::read(process, 64 * 1024, wait) {
            Ok(Some(bytes)) => framed.push(&bytes),
            Ok(None) => break,
            Err(_) if left_ms() == 0 => {
                processes::kill(process);
                return Ran::TimedOut;
            }
            Err(e) => {
                processes::kill(process);
                return Ran::Failed(format!("its output could not be read: {}", e.message()));
            }
        }
    }
    // It ended; releasing the handle.
    processes::kill(process);
    match framed.parse(&mark) {
        Ok(exited) => Ran::Exited(exited),
        Err(e) => Ran::Failed(e),
    }
}

/// What one hook's run means; a hook that timed out or could not run is a hook error.
fn said(hook: &Hook, ran: Ran) -> Said {
    let command = &hook.config.command;
    match ran {
        Ran::Exited(exited) => logic::interpret(&exited, command),
        Ran::TimedOut => Said {
            error: Some(format!(
                "the hook `{command}` did not finish within {} s and was killed",
                hook.config.timeout_ms.div_ceil(1000)
            )),
            ..Said::default()
        },
        Ran::Failed(why) => Said {
            error: Some(format!("the hook `{command}` did not run: {why}")),
            ..Said::default()
        },
    }
}

impl Hooks {
    /// Run every hook of `event` that matches, in order, until one denies.
    fn run_event(&self, event: Event, facts: &Facts) -> Vec<Said> {
        let mut answers = Vec::new();
        for hook in self.hooks.iter().filter(|h| h.matches(event, facts.tool)) {
            let line = event_line(event, hook.config.dialect, &self.workspace, facts);
            let answer = said(hook, run(hook, &line));
            if let Some(error) = &answer.error {
                log::warn(error);
            }
            let denied = answer.decision == Some(Decision::Deny);
            answers.push(answer);
            if denied {
                break;
            }
        }
        answers
    }
}

/// The answers of a `pre-tool-use` as a guard's verdict. A hook error counts as a deny: a
/// guard that cannot answer must not let a call through (the kernel does the same with a
/// guard that fails), and the person sees the refusal and its reason in the transcript.
fn verdict(answers: &[Said]) -> GuardVerdict {
    let mut decision = Decision::Allow;
    let mut reasons = Vec::new();
    for answer in answers {
        let this = if answer.error.is_some() {
            Decision::Deny
        } else {
            answer.decision.unwrap_or(Decision::Allow)
        };
        if this > Decision::Allow {
            let why = answer
                .error
                .clone()
                .unwrap_or_else(|| answer.reason.clone());
            if !why.is_empty() {
                reasons.push(why);
            }
        }
        decision = decision.max(this);
    }
    GuardVerdict {
        decision: match decision {
            Decision::Allow => GuardDecision::Allow,
            Decision::Ask => GuardDecision::Prompt,
            Decision::Deny => GuardDecision::Forbid,
        },
        reason: if reasons.is_empty() {
            "a hook refused it".to_owned()
        } else {
            reasons.join("; ")
        },
    }
}

/// What the hooks of a `post-tool-use` said, as text appended to the tool's result: context,
/// a hook's objection (Claude Code's `decision: "block"` after a tool is feedback for the
/// model) and hook errors, each labelled.
fn post_context(answers: &[Said]) -> String {
    let mut lines = Vec::new();
    for answer in answers {
        if !answer.context.is_empty() {
            lines.push(format!("[post-tool-use hook] {}", answer.context));
        }
        if answer.decision == Some(Decision::Deny) && !answer.reason.is_empty() {
            lines.push(format!("[post-tool-use hook objects] {}", answer.reason));
        }
        if let Some(error) = &answer.error {
            lines.push(format!("[post-tool-use hook error] {error}"));
        }
    }
    lines.join("\n")
}

impl Plugin for Hooks {
    fn activate(config: &str) -> Result<Self, String> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| format!("the hooks configuration keel made is not valid: {e}"))?;
        let hooks = config
            .hooks
            .into_iter()
            .map(Hook::new)
            .collect::<Result<Vec<_>, _>>()?;
        if hooks.iter().any(|h| h.config.event == Event::PreToolUse) {
            guards::register(GUARD).map_err(|e| e.message().to_owned())?;
        }
        // pre-compact hooks hear of a compaction from the agent loop's status on the bus; they
        // run while it goes on and cannot hold it back (nor can Claude Code's).
        if hooks.iter().any(|h| h.config.event == Event::PreCompact) {
            events::subscribe(topics::COMPACTION_STATUS).map_err(|e| e.message().to_owned())?;
        }
        // subagent-stop hooks, from a child's turn-ended entry (which the kernel lets only the
        // plugin serving that child emit); they run once the child has answered.
        if hooks.iter().any(|h| h.config.event == Event::SubagentStop) {
            events::subscribe(topics::SUBAGENT_EVENT).map_err(|e| e.message().to_owned())?;
        }
        services::provide(SERVICE, "1.0.0").map_err(|e| e.message().to_owned())?;
        Ok(Hooks {
            workspace: config.workspace,
            hooks,
            session: None,
            stopped: std::collections::BTreeSet::new(),
        })
    }

    fn on_event(&mut self, event: BusEvent) {
        let Ok(payload) = serde_json::from_str::<Value>(&event.payload) else {
            return;
        };
        let text = |key: &str| payload.get(key).and_then(Value::as_str);
        // Nobody waits for these answers; errors go to the log.
        if event.topic == topics::COMPACTION_STATUS && text("state") == Some("started") {
            let facts = Facts {
                session: text("session").or(self.session.as_deref()),
                trigger: text("trigger"),
                ..Facts::default()
            };
            self.run_event(Event::PreCompact, &facts);
        } else if event.topic == topics::SUBAGENT_EVENT
            && payload["event"]["kind"] == "turn_ended"
            && payload["child"]
                .as_u64()
                .is_some_and(|child| self.stopped.insert(child))
        {
            let subagent = json!({
                "label": payload["label"],
                "parent_call": payload["parent_call"],
                "end": payload["event"]["end"],
            });
            let facts = Facts {
                session: self.session.as_deref(),
                subagent: Some(&subagent),
                ..Facts::default()
            };
            self.run_event(Event::SubagentStop, &facts);
        }
    }

    fn check_tool_call(&mut self, guard: &str, tool: &str, input: &str) -> GuardVerdict {
        if guard != GUARD {
            return GuardVerdict {
                decision: GuardDecision::Forbid,
                reason: format!("no guard `{guard}` here"),
            };
        }
        let arguments: Value = serde_json::from_str(input).unwrap_or(Value::Null);
        let facts = Facts {
            tool: Some(tool),
            arguments: Some(&arguments),
            session: self.session.as_deref(),
            ..Facts::default()
        };
        verdict(&self.run_event(Event::PreToolUse, &facts))
    }

    fn handle_call(
        &mut self,
        service: &str,
        method: &str,
        payload: &str,
    ) -> Result<String, String> {
        if service != SERVICE {
            return Err(format!("no such service: {service}"));
        }
        fn read<T: serde::de::DeserializeOwned>(method: &str, payload: &str) -> Result<T, String> {
            serde_json::from_str(payload)
                .map_err(|e| format!("`{method}` takes a JSON object: {e}"))
        }
        let answer = match method {
            "session-start" => json!(self.session_start(&read(method, payload)?)),
            "post-tool-use" => json!({ "context": self.post_tool_use(&read(method, payload)?) }),
            "user-prompt-submit" => json!(self.user_prompt_submit(&read(method, payload)?)),
            "stop" => json!(self.stop(&read(method, payload)?)),
            other => {
                return Err(format!(
                    "the hooks service has no method `{other}`; it serves `session-start`, \
                     `post-tool-use`, `user-prompt-submit` and `stop`"
                ));
            }
        };
        Ok(answer.to_string())
    }
}

/// The `hooks` service's methods, which both doors serve: `handle_call` (JSON) and the typed
/// export (ABI 0.7.0).
impl Hooks {
    /// The session a call names becomes the one the next hooks are told of.
    fn note_session(&mut self, session: &str) {
        if !session.is_empty() {
            self.session = Some(session.to_owned());
        }
    }

    /// Nothing to hold back at a session's start: what the hooks say is context for the
    /// model's first turn, their errors are said to the person.
    fn session_start(&mut self, request: &HookSessionStart) -> HookContext {
        self.note_session(&request.session);
        let facts = Facts {
            session: self.session.as_deref(),
            source: Some(&request.source),
            ..Facts::default()
        };
        let answers = self.run_event(Event::SessionStart, &facts);
        let context: Vec<&str> = answers
            .iter()
            .map(|a| a.context.as_str())
            .filter(|c| !c.is_empty())
            .collect();
        HookContext {
            context: context.join("\n"),
            errors: answers.iter().filter_map(|a| a.error.clone()).collect(),
        }
    }

    /// What the post-tool-use hooks add to a call's result.
    fn post_tool_use(&mut self, call: &HookToolUse) -> String {
        let status = match call.status {
            HookToolStatus::Ok => "ok",
            HookToolStatus::Error => "error",
        };
        let facts = Facts {
            tool: Some(&call.tool),
            arguments: Some(&call.arguments),
            result: Some(&call.result),
            status: Some(status),
            session: self.session.as_deref(),
            ..Facts::default()
        };
        post_context(&self.run_event(Event::PostToolUse, &facts))
    }

    /// As before a tool call: a hook that denies, asks or cannot answer holds the prompt back
    /// (nobody is asked here: the person is the one who wrote it).
    fn user_prompt_submit(&mut self, request: &HookPrompt) -> PromptVerdict {
        self.note_session(&request.session);
        let facts = Facts {
            prompt: Some(&request.prompt),
            session: self.session.as_deref(),
            ..Facts::default()
        };
        let answers = self.run_event(Event::UserPromptSubmit, &facts);
        let held = verdict(&answers);
        let context: Vec<&str> = answers
            .iter()
            .map(|a| a.context.as_str())
            .filter(|c| !c.is_empty())
            .collect();
        PromptVerdict {
            blocked: !matches!(held.decision, GuardDecision::Allow),
            reason: held.reason,
            context: context.join("\n"),
        }
    }

    /// A hook that denies (`exit 2`, `deny`, Claude Code's `block`) asks the agent to go on,
    /// its reason told to the model. A hook that fails does not: an error must not keep a
    /// turn running.
    fn stop(&mut self, request: &HookStop) -> StopVerdict {
        self.note_session(&request.session);
        let facts = Facts {
            session: self.session.as_deref(),
            stop_hook_active: Some(request.stop_hook_active),
            ..Facts::default()
        };
        let answers = self.run_event(Event::Stop, &facts);
        let go_on: Vec<&str> = answers
            .iter()
            .filter(|a| a.error.is_none() && !a.halt && a.decision == Some(Decision::Deny))
            .map(|a| a.reason.as_str())
            .collect();
        StopVerdict {
            errors: answers.iter().filter_map(|a| a.error.clone()).collect(),
            go_on: !go_on.is_empty(),
            reason: go_on.join("; "),
        }
    }
}

keel_sdk::export_plugin!(Hooks);

#[cfg(test)]
mod tests {
    use super::*;
    use keel_sdk::mock;

    fn config(hooks: Value) -> String {
        json!({"workspace": "/ws", "hooks": hooks}).to_string()
    }

    /// A hook the kernel cannot start (the mock host starts no process) refuses the call: a
    /// guard that cannot answer must not let it through.
    #[test]
    fn a_hook_that_cannot_run_refuses_the_call() {
        let plugin = mock::activate::<Hooks>(&config(json!([{
            "event": "pre-tool-use", "matcher": "exec_shell", "entry": "hook-1",
            "command": "guard.sh", "timeout_ms": 1000
        }])))
        .expect("activate");
        let v = plugin.check_tool_call(GUARD, "exec_shell", r#"{"command": "ls"}"#);
        assert_eq!(v.decision, GuardDecision::Forbid);
        assert!(
            v.reason.contains("guard.sh") && v.reason.contains("did not run"),
            "{}",
            v.reason
        );
        // A tool the matcher does not name runs no hook.
        let v = plugin.check_tool_call(GUARD, "read_file", r#"{"path": "a"}"#);
        assert_eq!(v.decision, GuardDecision::Allow);
        let post = plugin
            .handle_call(
                SERVICE,
                "post-tool-use",
                r#"{"tool": "read_file", "result": "x"}"#,
            )
            .expect("post");
        assert_eq!(post, r#"{"context":""}"#);
    }

    /// A child's subagent-stop hooks run once, however often its holder says it ended (each
    /// run here logs that the hook could not start: the mock host starts no process).
    #[test]
    fn a_childs_stop_hooks_run_once_however_often_it_is_said_to_end() {
        mock::reset();
        let plugin = mock::activate::<Hooks>(&config(json!([{
            "event": "subagent-stop", "entry": "hook-1",
            "command": "notify.sh", "timeout_ms": 1000
        }])))
        .expect("activate");
        let ended = |child: u64| {
            json!({"parent_call": "call_1", "child": child, "label": "read",
                   "event": {"kind": "turn_ended", "session": "s", "end": "completed"}})
            .to_string()
        };
        let runs = || {
            mock::with_host(|h| {
                h.logged()
                    .iter()
                    .filter(|m| m.contains("notify.sh"))
                    .count()
            })
        };
        plugin.on_event(topics::SUBAGENT_EVENT, "subagents", &ended(7));
        assert_eq!(runs(), 1);
        plugin.on_event(topics::SUBAGENT_EVENT, "subagents", &ended(7));
        assert_eq!(runs(), 1, "the same child again");
        plugin.on_event(topics::SUBAGENT_EVENT, "subagents", &ended(8));
        assert_eq!(runs(), 2, "another child");
    }

    #[test]
    fn a_bad_matcher_fails_activation_with_the_hook_named() {
        let err = mock::activate::<Hooks>(&config(json!([{
            "event": "pre-tool-use", "matcher": "(", "entry": "hook-1",
            "command": "guard.sh", "timeout_ms": 1000
        }])))
        .expect_err("bad matcher");
        assert!(format!("{err:?}").contains("guard.sh"), "{err:?}");
    }

    #[test]
    fn answers_combine_by_the_strictest_and_allow_loosens_nothing() {
        let allow = Said {
            decision: Some(Decision::Allow),
            ..Said::default()
        };
        let ask = Said {
            decision: Some(Decision::Ask),
            reason: "sure?".into(),
            ..Said::default()
        };
        let error = Said {
            error: Some("the hook `x` failed".into()),
            ..Said::default()
        };
        assert_eq!(verdict(&[]).decision, GuardDecision::Allow);
        let v = verdict(&[ask, allow]);
        assert_eq!(
            (v.decision, v.reason.as_str()),
            (GuardDecision::Prompt, "sure?")
        );
        let v = verdict(&[error]);
        assert_eq!(v.decision, GuardDecision::Forbid);
        assert!(v.reason.contains("failed"));
    }
}

/// `hooks` served typed (ABI 0.7.0's world `hooks-service`): keel's calls cross as records, to
/// the same methods `handle_call` serves.
#[allow(unsafe_code, missing_docs, clippy::all, clippy::unwrap_used)]
mod typed {
    wit_bindgen::generate!({
        path: [
            "../../wit/keel-plugin-0.2.0",
            "../../wit/keel-plugin-0.3.0",
            "../../wit/keel-plugin-0.4.0",
            "../../wit/keel-plugin-0.5.0",
            "../../wit/keel-plugin-0.6.0",
            "../../wit/keel-plugin-0.7.0",
        ],
        world: "keel:plugin/hooks-service@0.7.0",
        with: {
            "keel:plugin/types@0.2.0": keel_sdk::bindings::keel::plugin0_2_0::types,
        },
    });
}

use keel_sdk::bindings::keel::plugin0_2_0::types::KernelError as RawKernelError;
use typed::exports::keel::plugin0_7_0::hooks as hooks_export;

struct TypedHooks;

/// The person's hooks' types and the `hooks` export's records, by the macro the kernel expands
/// too.
mod hook_records {
    use super::hooks_export as hooks;

    keel_protocol::wit_hook_conversions!();
}

impl hooks_export::Guest for TypedHooks {
    fn session_start(
        request: hooks_export::SessionStartRequest,
    ) -> Result<hooks_export::HookContext, RawKernelError> {
        let request = hook_records::session_start_from_wit(request);
        let said = keel_sdk::with_plugin(|hooks: &mut Hooks| hooks.session_start(&request))?;
        Ok(hook_records::hook_context_to_wit(said))
    }

    fn post_tool_use(call: hooks_export::ToolUse) -> Result<String, RawKernelError> {
        let call = hook_records::tool_use_from_wit(call);
        Ok(keel_sdk::with_plugin(|hooks: &mut Hooks| {
            hooks.post_tool_use(&call)
        })?)
    }

    fn user_prompt_submit(
        request: hooks_export::PromptRequest,
    ) -> Result<hooks_export::PromptVerdict, RawKernelError> {
        let request = hook_records::prompt_from_wit(request);
        let verdict =
            keel_sdk::with_plugin(|hooks: &mut Hooks| hooks.user_prompt_submit(&request))?;
        Ok(hook_records::prompt_verdict_to_wit(verdict))
    }

    fn stop(
        request: hooks_export::StopRequest,
    ) -> Result<hooks_export::StopVerdict, RawKernelError> {
        let request = hook_records::stop_from_wit(request);
        let verdict = keel_sdk::with_plugin(|hooks: &mut Hooks| hooks.stop(&request))?;
        Ok(hook_records::stop_verdict_to_wit(verdict))
    }
}

#[allow(unsafe_code)]
const _: () = {
    typed::export!(TypedHooks with_types_in typed);
};
