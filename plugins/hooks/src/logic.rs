//! The hooks' pure logic, natively tested: which hooks an event runs, the JSON a hook reads on
//! stdin (keel's fields, or Claude Code's for a hook from `.claude/settings.json`), the framed
//! answer keel's wrapper writes, and what a hook's exit code, stdout and stderr mean.

use keel_sanitize::sanitize::sanitize_tool_output;
use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Longest stdout of a hook keel reads (the wrapper cuts it there); the same number is in the
/// host's wrapper script.
pub const STDOUT_CAP: usize = 64 * 1024;
/// Longest stderr of a hook keel reads (the wrapper cuts both streams with one `head`).
pub const STDERR_CAP: usize = 64 * 1024;
/// Longest tool result handed to a post-tool-use hook.
pub const RESULT_CAP: usize = 64 * 1024;
/// Longest reason or context keel passes on from a hook.
pub const WORDS_CAP: usize = 4 * 1024;

/// The events a hook can run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    SessionStart,
    UserPromptSubmit,
    PreToolUse,
    PostToolUse,
    PreCompact,
    Stop,
    SubagentStop,
}

impl Event {
    /// keel's name (the config's table name).
    pub fn keel_name(self) -> &'static str {
        match self {
            Event::SessionStart => "session-start",
            Event::UserPromptSubmit => "user-prompt-submit",
            Event::PreToolUse => "pre-tool-use",
            Event::PostToolUse => "post-tool-use",
            Event::PreCompact => "pre-compact",
            Event::Stop => "stop",
            Event::SubagentStop => "subagent-stop",
        }
    }

    /// Claude Code's name (`hook_event_name`).
    pub fn claude_name(self) -> &'static str {
        match self {
            Event::SessionStart => "SessionStart",
            Event::UserPromptSubmit => "UserPromptSubmit",
            Event::PreToolUse => "PreToolUse",
            Event::PostToolUse => "PostToolUse",
            Event::PreCompact => "PreCompact",
            Event::Stop => "Stop",
            Event::SubagentStop => "SubagentStop",
        }
    }
}

/// Whose format a hook speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dialect {
    /// keel's fields (`event`, `tool`, `arguments`, `result`).
    #[default]
    Keel,
    /// Claude Code's (`hook_event_name`, `tool_name`, `tool_input`, `tool_response`), its
    /// tool names (`Bash`, `Write`, …) and absolute `file_path`s.
    Claude,
}

/// One hook as keel's host configured it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    pub event: Event,
    /// A regular expression the whole tool name must match; empty or `*`: every tool.
    #[serde(default)]
    pub matcher: String,
    /// The process entry the host made for it.
    pub entry: String,
    /// The command, for messages.
    pub command: String,
    pub timeout_ms: u32,
    #[serde(default)]
    pub dialect: Dialect,
}

/// The plugin's configuration, set by keel's host.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The workspace, absolute (the hook's `cwd`).
    #[serde(default)]
    pub workspace: String,
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
}

/// A hook ready to run: its configuration and its matcher compiled.
#[derive(Debug)]
pub struct Hook {
    pub config: HookConfig,
    matcher: Option<Regex>,
}

impl Hook {
    /// Compile the matcher; a bad one is an error naming the hook.
    pub fn new(config: HookConfig) -> Result<Hook, String> {
        let pattern = config.matcher.trim();
        let matcher = if pattern.is_empty() || pattern == "*" {
            None
        } else {
            Some(
                regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| {
                        format!(
                            "the matcher `{pattern}` of the hook `{}` is not a regular expression: {e}",
                            config.command
                        )
                    })?,
            )
        };
        Ok(Hook { config, matcher })
    }

    /// Whether this hook runs for `event` on `tool` (tool events; other events have no tool).
    pub fn matches(&self, event: Event, tool: Option<&str>) -> bool {
        if self.config.event != event {
            return false;
        }
        match (&self.matcher, tool) {
            (None, _) | (_, None) => true,
            (Some(re), Some(tool)) => {
                re.is_match(tool)
                    || (self.config.dialect == Dialect::Claude
                        && claude_tool_name(tool).is_some_and(|name| re.is_match(name)))
            }
        }
    }
}

/// Claude Code's name for a keel tool, where it has one.
pub fn claude_tool_name(tool: &str) -> Option<&'static str> {
    Some(match tool {
        "exec_shell" => "Bash",
        "write_file" => "Write",
        "edit_file" => "Edit",
        "read_file" => "Read",
        "grep" => "Grep",
        "list_dir" => "LS",
        "task" => "Task",
        _ => return None,
    })
}

/// What an event is about.
#[derive(Debug, Default)]
pub struct Facts<'a> {
    pub tool: Option<&'a str>,
    pub arguments: Option<&'a Value>,
    pub result: Option<&'a str>,
    /// `ok` or `error`, for post-tool-use.
    pub status: Option<&'a str>,
    pub prompt: Option<&'a str>,
    /// The session the event belongs to, once the host named it.
    pub session: Option<&'a str>,
    /// For session-start: `startup`, `resume` or `clear`.
    pub source: Option<&'a str>,
    /// For pre-compact: `manual` (`/compact`) or `auto`.
    pub trigger: Option<&'a str>,
    /// For subagent-stop: the child's `label`, the `parent_call` it served and how its turn
    /// ended (`end`).
    pub subagent: Option<&'a Value>,
    /// For stop: whether the turn that ended was one a stop hook asked for (Claude Code's
    /// `stop_hook_active`), so a hook can let the agent stop the second time.
    pub stop_hook_active: Option<bool>,
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The fields of the session events, named alike in both dialects.
fn session_facts(v: &mut Map<String, Value>, facts: &Facts) {
    if let Some(source) = facts.source {
        v.insert("source".into(), source.into());
    }
    if let Some(trigger) = facts.trigger {
        v.insert("trigger".into(), trigger.into());
    }
    if let Some(subagent) = facts.subagent {
        v.insert("subagent".into(), subagent.clone());
    }
    if let Some(active) = facts.stop_hook_active {
        v.insert("stop_hook_active".into(), active.into());
    }
}

/// The JSON line a hook reads on stdin (no newline inside; the wrapper reads one line).
pub fn event_line(event: Event, dialect: Dialect, workspace: &str, facts: &Facts) -> String {
    let result = facts.result.map(|r| cut(r, RESULT_CAP));
    let value = match dialect {
        Dialect::Keel => {
            let mut v = Map::new();
            v.insert("event".into(), event.keel_name().into());
            v.insert("workspace".into(), workspace.into());
            if let Some(session) = facts.session {
                v.insert("session".into(), session.into());
            }
            session_facts(&mut v, facts);
            if let Some(tool) = facts.tool {
                v.insert("tool".into(), tool.into());
            }
            if let Some(arguments) = facts.arguments {
                v.insert("arguments".into(), arguments.clone());
            }
            if let Some(result) = result {
                v.insert("result".into(), result.into());
            }
            if let Some(status) = facts.status {
                v.insert("status".into(), status.into());
            }
            if let Some(prompt) = facts.prompt {
                v.insert("prompt".into(), prompt.into());
            }
            Value::Object(v)
        }
        Dialect::Claude => {
            let mut v = Map::new();
            v.insert("hook_event_name".into(), event.claude_name().into());
            v.insert(
                "session_id".into(),
                facts.session.unwrap_or_default().into(),
            );
            session_facts(&mut v, facts);
            v.insert("cwd".into(), workspace.into());
            v.insert("permission_mode".into(), "default".into());
            if let Some(tool) = facts.tool {
                v.insert(
                    "tool_name".into(),
                    claude_tool_name(tool).unwrap_or(tool).into(),
                );
            }
            if let Some(arguments) = facts.arguments {
                v.insert("tool_input".into(), claude_input(arguments, workspace));
            }
            if let Some(result) = result {
                v.insert(
                    "tool_response".into(),
                    json!({"output": result, "success": facts.status != Some("error")}),
                );
            }
            if let Some(prompt) = facts.prompt {
                v.insert("prompt".into(), prompt.into());
            }
            Value::Object(v)
        }
    };
    value.to_string()
}

/// A keel tool's input as Claude Code's hooks expect it: a workspace-relative `path` also as
/// an absolute `file_path`.
fn claude_input(arguments: &Value, workspace: &str) -> Value {
    let mut input = arguments.clone();
    if let Some(object) = input.as_object_mut()
        && !object.contains_key("file_path")
        && let Some(path) = object.get("path").and_then(Value::as_str)
    {
        let absolute = if path.starts_with('/') || workspace.is_empty() {
            path.to_owned()
        } else {
            format!("{}/{path}", workspace.trim_end_matches('/'))
        };
        object.insert("file_path".into(), absolute.into());
    }
    input
}

/// How a hook's run ended, as keel's wrapper reported it.
#[derive(Debug, PartialEq)]
pub struct Exited {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// What the plugin writes to a hook's wrapper: `MARK LEN`, then the event's line of LEN
/// bytes. The wrapper reads a short line with the shell's own `read` (no process to start) and
/// a long one with `head`, and ends the hook's stdout with `MARK CODE`: `mark` is this run's
/// own (random), so output of the hook's cannot pass for the end.
pub fn wrapper_input(mark: &str, line: &str) -> Vec<u8> {
    format!("{mark} {}\n{line}\n", line.len()).into_bytes()
}

/// The most bytes of a wrapper's answer kept: the hook's stdout past [`STDOUT_CAP`] is cut,
/// the end (`MARK CODE` and stderr) always kept.
pub struct Framed {
    head: Vec<u8>,
    tail: Vec<u8>,
    cut: bool,
}

impl Framed {
    /// The bytes kept from the end: the mark's line and the capped stderr.
    const TAIL: usize = STDERR_CAP + 256;

    pub fn new() -> Framed {
        Framed {
            head: Vec::new(),
            tail: Vec::new(),
            cut: false,
        }
    }

    /// Take more of the answer; what lies between the first [`STDOUT_CAP`] bytes and the last
    /// [`Self::TAIL`] is dropped.
    pub fn push(&mut self, bytes: &[u8]) {
        let room = STDOUT_CAP.saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        self.tail.extend_from_slice(rest);
        if self.tail.len() > 2 * Self::TAIL {
            self.tail.drain(..self.tail.len() - Self::TAIL);
            self.cut = true;
        }
    }

    /// Read the answer: the hook's stdout, then `\nMARK CODE\n`, then at most
    /// [`STDERR_CAP`] bytes of its stderr.
    pub fn parse(&self, mark: &str) -> Result<Exited, String> {
        let whole: Vec<u8>;
        let (bytes, stdout_end) = if self.cut {
            (&self.tail[..], None)
        } else {
            whole = [&self.head[..], &self.tail[..]].concat();
            (&whole[..], Some(()))
        };
        let needle = format!("\n{mark} ");
        let at = find_last(bytes, needle.as_bytes())
            .ok_or("the hook's wrapper ended without saying how the hook ended")?;
        let after = &bytes[at + needle.len()..];
        let newline = after
            .iter()
            .position(|b| *b == b'\n')
            .ok_or("the hook's wrapper ended in the middle of its last line")?;
        let code_text = String::from_utf8_lossy(&after[..newline]);
        let code: i32 = code_text
            .trim()
            .parse()
            .map_err(|_| format!("the hook's wrapper gave the exit code `{code_text}`"))?;
        let stderr = &after[newline + 1..];
        let stdout = match stdout_end {
            Some(()) => &bytes[..at.min(STDOUT_CAP)],
            None => &self.head[..],
        };
        Ok(Exited {
            code,
            stdout: String::from_utf8_lossy(stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr[..stderr.len().min(STDERR_CAP)]).into_owned(),
        })
    }
}

impl Default for Framed {
    fn default() -> Self {
        Framed::new()
    }
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// A decision a hook can give, ordered as the kernel orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Decision {
    Allow,
    Ask,
    Deny,
}

/// What a hook said.
#[derive(Debug, PartialEq, Default)]
pub struct Said {
    /// Its decision, if it gave one (exit 2 is a deny).
    pub decision: Option<Decision>,
    /// Why (for a deny: what the model is told).
    pub reason: String,
    /// Extra context for the model.
    pub context: String,
    /// A hook error for the person (an exit code other than 0 and 2).
    pub error: Option<String>,
    /// It said Claude Code's `"continue": false` (stop altogether), which denies a call or a
    /// prompt but never asks a stopping agent to go on.
    pub halt: bool,
}

/// Words from a hook, made safe to pass on: cleaned as tool output is, and cut.
pub fn clean(text: &str) -> String {
    let cleaned = sanitize_tool_output(text.trim()).text;
    cut(&cleaned, WORDS_CAP).to_owned()
}

fn decision_word(word: &str) -> Option<Decision> {
    match word {
        "deny" | "block" => Some(Decision::Deny),
        "ask" => Some(Decision::Ask),
        "allow" | "approve" => Some(Decision::Allow),
        _ => None,
    }
}

/// What an exit code, stdout and stderr mean: exit 0 goes on (stdout may be JSON with a
/// `decision` — keel's `deny`/`ask`/`allow` or Claude Code's `block`/`approve` and
/// `hookSpecificOutput.permissionDecision` — a `reason`, and extra `context` /
/// `additionalContext`; `continue: false` is a deny); exit 2 denies with stderr as the reason;
/// any other code is a hook error.
pub fn interpret(exited: &Exited, command: &str) -> Said {
    match exited.code {
        0 => {
            let Ok(Value::Object(answer)) = serde_json::from_str::<Value>(exited.stdout.trim())
            else {
                return Said::default();
            };
            let specific = answer.get("hookSpecificOutput").and_then(Value::as_object);
            let text = |v: Option<&Value>| v.and_then(Value::as_str).map(clean);
            let mut decision = specific
                .and_then(|s| s.get("permissionDecision"))
                .and_then(Value::as_str)
                .and_then(decision_word)
                .into_iter()
                .chain(
                    answer
                        .get("decision")
                        .and_then(Value::as_str)
                        .and_then(decision_word),
                )
                .max();
            let mut reason = text(specific.and_then(|s| s.get("permissionDecisionReason")))
                .or_else(|| text(answer.get("reason")))
                .unwrap_or_default();
            let halt = answer.get("continue") == Some(&Value::Bool(false));
            if halt {
                decision = Some(Decision::Deny);
                if reason.is_empty() {
                    reason = text(answer.get("stopReason")).unwrap_or_default();
                }
            }
            let context = text(answer.get("context"))
                .or_else(|| text(answer.get("additionalContext")))
                .or_else(|| text(specific.and_then(|s| s.get("additionalContext"))))
                .unwrap_or_default();
            Said {
                decision,
                reason,
                context,
                error: None,
                halt,
            }
        }
        2 => {
            let reason = clean(&exited.stderr);
            Said {
                decision: Some(Decision::Deny),
                reason: if reason.is_empty() {
                    format!("the hook `{command}` refused it (exit code 2)")
                } else {
                    reason
                },
                ..Said::default()
            }
        }
        code => {
            let stderr = clean(&exited.stderr);
            Said {
                error: Some(if stderr.is_empty() {
                    format!("the hook `{command}` failed with exit code {code}")
                } else {
                    format!("the hook `{command}` failed with exit code {code}: {stderr}")
                }),
                ..Said::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(event: Event, matcher: &str, dialect: Dialect) -> Hook {
        Hook::new(HookConfig {
            event,
            matcher: matcher.into(),
            entry: "hook-1".into(),
            command: "guard.sh".into(),
            timeout_ms: 1000,
            dialect,
        })
        .expect("hook")
    }

    #[test]
    fn matchers_match_whole_tool_names_and_claude_names_for_claude_hooks() {
        let h = hook(Event::PreToolUse, "exec_shell|write_file", Dialect::Keel);
        assert!(h.matches(Event::PreToolUse, Some("exec_shell")));
        assert!(h.matches(Event::PreToolUse, Some("write_file")));
        assert!(!h.matches(Event::PreToolUse, Some("exec_shell_x")));
        assert!(!h.matches(Event::PostToolUse, Some("exec_shell")));
        assert!(hook(Event::PreToolUse, "*", Dialect::Keel).matches(Event::PreToolUse, Some("x")));
        assert!(hook(Event::PreToolUse, "", Dialect::Keel).matches(Event::PreToolUse, Some("x")));
        let claude = hook(Event::PreToolUse, "Edit|Write", Dialect::Claude);
        assert!(claude.matches(Event::PreToolUse, Some("write_file")));
        assert!(!claude.matches(Event::PreToolUse, Some("exec_shell")));
        assert!(
            !hook(Event::PreToolUse, "Bash", Dialect::Keel)
                .matches(Event::PreToolUse, Some("exec_shell"))
        );
        let bad = Hook::new(HookConfig {
            matcher: "(".into(),
            ..h.config.clone()
        });
        assert!(bad.is_err_and(|e| e.contains("not a regular expression")));
    }

    #[test]
    fn the_event_line_is_one_line_in_either_dialect() {
        let args = json!({"path": "a.sh", "content": "x\ny"});
        let facts = Facts {
            tool: Some("write_file"),
            arguments: Some(&args),
            result: Some("wrote\n3 bytes"),
            status: Some("ok"),
            session: Some("s-1"),
            ..Facts::default()
        };
        let keel = event_line(Event::PostToolUse, Dialect::Keel, "/ws", &facts);
        assert!(!keel.contains('\n'));
        let v: Value = serde_json::from_str(&keel).expect("json");
        assert_eq!(v["event"], "post-tool-use");
        assert_eq!(v["session"], "s-1");
        assert_eq!(v["tool"], "write_file");
        assert_eq!(v["arguments"]["path"], "a.sh");
        assert_eq!(v["result"], "wrote\n3 bytes");
        let claude = event_line(Event::PostToolUse, Dialect::Claude, "/ws", &facts);
        let v: Value = serde_json::from_str(&claude).expect("json");
        assert_eq!(v["hook_event_name"], "PostToolUse");
        assert_eq!(v["session_id"], "s-1");
        assert_eq!(v["tool_name"], "Write");
        assert_eq!(v["tool_input"]["file_path"], "/ws/a.sh");
        assert_eq!(v["cwd"], "/ws");
        assert_eq!(v["tool_response"]["output"], "wrote\n3 bytes");
        let long = "é".repeat(RESULT_CAP);
        let facts = Facts {
            result: Some(&long),
            ..Facts::default()
        };
        let v: Value = serde_json::from_str(&event_line(
            Event::PostToolUse,
            Dialect::Keel,
            "/ws",
            &facts,
        ))
        .expect("json");
        assert!(v["result"].as_str().expect("result").len() <= RESULT_CAP);
    }

    fn framed(chunks: &[&[u8]]) -> Framed {
        let mut f = Framed::new();
        for chunk in chunks {
            f.push(chunk);
        }
        f
    }

    #[test]
    fn the_framed_answer_ends_at_this_runs_mark() {
        let mark = "keel-hook-0123";
        // The hook printed a line that looks like an end, but with another mark.
        let f = framed(&[
            b"out\nkeel-hook-9999 0\nmore",
            b"\nkeel-hook-0123 2\n{\"err",
        ]);
        assert_eq!(
            f.parse(mark).expect("framed"),
            Exited {
                code: 2,
                stdout: "out\nkeel-hook-9999 0\nmore".into(),
                stderr: "{\"err".into()
            }
        );
        // Stdout past its cap is cut, the end still read.
        let mut big = framed(&[]);
        for _ in 0..100 {
            big.push(&[b'a'; 4096]);
        }
        big.push(b"\nkeel-hook-0123 0\nwarning");
        // A hook that floods its stdout is held in bounded memory until it ends or times out.
        assert!(big.head.len() + big.tail.len() <= STDOUT_CAP + 2 * Framed::TAIL);
        let exited = big.parse(mark).expect("big");
        assert_eq!(exited.stdout.len(), STDOUT_CAP);
        assert_eq!((exited.code, exited.stderr.as_str()), (0, "warning"));
        assert!(framed(&[b"out\n"]).parse(mark).is_err());
        assert!(framed(&[b"\nkeel-hook-0123 x\n"]).parse(mark).is_err());
        assert!(framed(&[b"\nkeel-hook-0123 0"]).parse(mark).is_err());
        assert_eq!(
            wrapper_input(mark, "{}"),
            b"keel-hook-0123 2\n{}\n".to_vec()
        );
    }

    fn exited(code: i32, stdout: &str, stderr: &str) -> Exited {
        Exited {
            code,
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn exit_codes_and_answers_mean_what_the_docs_say() {
        assert_eq!(interpret(&exited(0, "", ""), "h"), Said::default());
        assert_eq!(interpret(&exited(0, "not json", ""), "h"), Said::default());
        let deny = interpret(&exited(2, "ignored", "no rm here\n"), "h");
        assert_eq!(deny.decision, Some(Decision::Deny));
        assert_eq!(deny.reason, "no rm here");
        let said = interpret(
            &exited(0, r#"{"decision": "ask", "reason": "sure?"}"#, ""),
            "h",
        );
        assert_eq!(
            (said.decision, said.reason.as_str()),
            (Some(Decision::Ask), "sure?")
        );
        let claude = interpret(
            &exited(
                0,
                r#"{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "protected"}}"#,
                "",
            ),
            "h",
        );
        assert_eq!(
            (claude.decision, claude.reason.as_str()),
            (Some(Decision::Deny), "protected")
        );
        // The stricter of two decisions in one answer stands.
        let both = interpret(
            &exited(
                0,
                r#"{"decision": "approve", "hookSpecificOutput": {"permissionDecision": "ask"}}"#,
                "",
            ),
            "h",
        );
        assert_eq!(both.decision, Some(Decision::Ask));
        let stop = interpret(
            &exited(0, r#"{"continue": false, "stopReason": "halt"}"#, ""),
            "h",
        );
        assert_eq!(
            (stop.decision, stop.reason.as_str(), stop.halt),
            (Some(Decision::Deny), "halt", true)
        );
        // Claude Code's `block` from a stop hook asks the agent to go on; it is no halt.
        let block = interpret(
            &exited(0, r#"{"decision": "block", "reason": "tests"}"#, ""),
            "h",
        );
        assert_eq!((block.decision, block.halt), (Some(Decision::Deny), false));
        let context = interpret(
            &exited(
                0,
                r#"{"hookSpecificOutput": {"additionalContext": "formatted"}}"#,
                "",
            ),
            "h",
        );
        assert_eq!(context.context, "formatted");
        let failed = interpret(&exited(1, "", "boom"), "guard.sh");
        assert_eq!(failed.decision, None);
        assert!(failed.error.is_some_and(|e| e.contains("guard.sh")
            && e.contains("exit code 1")
            && e.contains("boom")));
    }
}
