//! The gate pipeline of a turn: the doors the agent loop uses — `dispatch` (every tool call
//! the model made passes here) and `replay` (a verifier re-running an already approved call).
//! The sealed state the pipeline reads and records into is [`crate::session_gates`].
//!
//! Pipeline for one call, in order: known call id → truncation gate (a cut-off call is not
//! run and not counted) → strict parse, or the repair ladder for complete turns → tool-name
//! resolution (the tool registry) → schema check → control directories (a file tool never
//! writes `.git`, `.keel`, …) → plugin guards (tighten only) → the
//! kernel's own verdict (exec policy for commands, capability baseline otherwise), combined
//! by maximum → approval → the tool → sanitization, head + tail with the full output spilled.

use std::sync::Arc;

use keel_protocol::{OutcomeStatus, Resolution, ResolveRequest, ToolOutcome, services};
use serde_json::Value;

use crate::gates::approvals::{Approvals, Outcome, Preview};
use crate::gates::arg_repair;
use crate::gates::exec_policy::Decision;
use crate::gates::sanitize;
use crate::types::{GuardVerdict, KernelError, ToolCapabilities, ToolSpec};

use crate::session_gates::{KEEP_HEAD, KEEP_TAIL, Serving, SessionGates, refusal_text};

/// The kernel-facing side of the pipeline: what `Shared` provides to it.
pub(crate) trait Mediator: Send + Sync {
    /// Call a typed service on behalf of the chain.
    fn call_service_typed<'a>(
        &'a self,
        chain: &'a crate::call_chain::CallChain,
        call: &'a crate::ServiceCall,
    ) -> futures::future::BoxFuture<'a, Result<crate::ServiceAnswer, KernelError>>;
    /// Run a tool.
    fn invoke_tool<'a>(
        &'a self,
        chain: &'a crate::call_chain::CallChain,
        name: &'a str,
        input: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<String, KernelError>>;
    /// Ask one guard.
    fn check_guard<'a>(
        &'a self,
        chain: &'a crate::call_chain::CallChain,
        guard: &'a str,
        tool: &'a str,
        input: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<GuardVerdict, KernelError>>;
    /// The registered tool `name`: its spec and owner.
    fn tool(&self, name: &str) -> Option<(ToolSpec, String)>;
    /// Registered guards as (name, plugin).
    fn guards(&self) -> Vec<(String, String)>;
    /// Whether a service is provided.
    fn has_service(&self, name: &str) -> bool;
    /// The plugin that provides service `name` now.
    fn provider(&self, name: &str) -> Option<String>;
    /// Whether `plugin` can act beyond its sandbox during a tool call (run commands, reach
    /// the network, start processes): then its calls run one at a time, so what it does
    /// belongs to exactly one call and its approval.
    fn acts_outside(&self, plugin: &str) -> bool;
    /// Whether `plugin` can reach the network or start programs of its own (what plan mode
    /// cannot confine; its commands go through the exec gate and are judged there).
    fn reaches_out(&self, plugin: &str) -> bool;
    /// Whether `plugin` holds a directory it may write (what plan mode cannot see it write).
    fn writes_own_dirs(&self, plugin: &str) -> bool;
}

fn outcome(call_id: &str, tool: &str, status: OutcomeStatus, content: String) -> ToolOutcome {
    ToolOutcome {
        call_id: call_id.to_owned(),
        tool: tool.to_owned(),
        status,
        content,
        exec: Vec::new(),
        spill: None,
    }
}

/// Run one recorded call through the whole pipeline.
pub(crate) async fn dispatch_one(
    gates: &Arc<SessionGates>,
    m: &dyn Mediator,
    chain: &crate::call_chain::CallChain,
    id: &str,
) -> ToolOutcome {
    // A plugin that opened a child agent dispatches as that child: only the child's calls,
    // only the child's tools, approvals in its name.
    let child = chain.opened_agent().cloned();
    let scope = child.as_ref().map_or(0, |c| c.id);
    let call = match gates.take_for_dispatch(id, scope) {
        Ok(call) => call,
        Err(reason) => return outcome(id, "", OutcomeStatus::Refused, format!("[keel] {reason}")),
    };
    // Truncation gate: a call cut off by the output limit is never repaired or run.
    let input = match arg_repair::parse_strict(&call.raw) {
        Ok(v) => v,
        Err(_) if call.stop.is_truncation() => {
            let stop = if call.stop_raw.is_empty() {
                "max_tokens"
            } else {
                &call.stop_raw
            };
            return outcome(
                id,
                &call.name,
                OutcomeStatus::NotExecuted,
                arg_repair::truncated_call_notice(&call.name, stop, call.raw.len()),
            );
        }
        Err(strict) => match arg_repair::repair(&call.raw) {
            Ok(repaired) => repaired.value,
            Err(e) => {
                return outcome(
                    id,
                    &call.name,
                    OutcomeStatus::Error,
                    format!(
                        "[keel] the arguments of `{}` are not valid JSON ({strict}) and could not \
                         be repaired ({e}); resend the call with a JSON object as arguments",
                        call.name
                    ),
                );
            }
        },
    };
    let tool = match resolve(m, chain, &call.name).await {
        Ok(name) => name,
        Err((status, text)) => return outcome(id, &call.name, status, text),
    };
    let Some((spec, owner)) = m.tool(&tool) else {
        return outcome(
            id,
            &tool,
            OutcomeStatus::Error,
            format!("[keel] tool `{tool}` is no longer registered; its plugin was unloaded"),
        );
    };
    if let Some(child) = &child
        && !child.tools.contains(&tool)
    {
        return outcome(
            id,
            &tool,
            OutcomeStatus::Refused,
            format!(
                "[keel] `{tool}` is not among the tools of {} ({}); use those, or finish and \
                 tell your parent what you need",
                child.name(),
                child
                    .tools
                    .iter()
                    .map(|t| format!("`{t}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    // Plan mode: what may change something is refused here, before guards and approval, in
    // every agent (a child's tools are narrowed further, never widened).
    if gates.plan_mode()
        && let Some(refusal) = plan_refusal(m, &tool, &spec, &owner, &input)
    {
        return outcome(id, &tool, OutcomeStatus::Refused, refusal);
    }
    if let Err(problem) = check_schema(&spec, &input) {
        return outcome(
            id,
            &tool,
            OutcomeStatus::Error,
            format!(
                "[keel] the input of `{tool}` does not match its schema: {problem}; resend the \
                 call with input that matches the schema"
            ),
        );
    }
    if let Some(refusal) = control_write_refusal(gates, &tool, &spec, &input) {
        return outcome(id, &tool, OutcomeStatus::Refused, refusal);
    }
    let command = command_of(&spec, &input);
    let requester = child.as_ref().map(|c| c.name());
    let decision = judge(
        gates,
        m,
        chain,
        (&tool, &spec, &input),
        command.as_deref(),
        requester,
    )
    .await;
    let approved_command = match decision {
        Judged::Refused(reason) => {
            return outcome(
                id,
                &tool,
                OutcomeStatus::Refused,
                format!("[keel] {reason}"),
            );
        }
        Judged::Run { approved_command } => approved_command,
    };
    gates.mark_executed(id, &tool, &input);
    if may_change_files(m, &spec, &owner) {
        gates.checkpoint_before_call(id, &tool).await;
    }
    run_tool(
        gates,
        m,
        chain,
        id,
        &tool,
        &spec,
        &owner,
        &input,
        approved_command,
    )
    .await
}

/// Replay an approved, executed call of the current turn with exactly the same input.
pub(crate) async fn replay(
    gates: &Arc<SessionGates>,
    m: &dyn Mediator,
    chain: &crate::call_chain::CallChain,
    id: &str,
) -> Result<ToolOutcome, KernelError> {
    let scope = chain.acting_agent().map_or(0, |c| c.id);
    let (tool, input) = gates.replayable(id, scope).map_err(KernelError::Denied)?;
    let Some((spec, owner)) = m.tool(&tool) else {
        return Err(KernelError::Unavailable(format!(
            "tool `{tool}` is no longer registered"
        )));
    };
    if gates.plan_mode()
        && let Some(refusal) = plan_refusal(m, &tool, &spec, &owner, &input)
    {
        return Err(KernelError::Denied(refusal));
    }
    let command = command_of(&spec, &input);
    // The earlier approval covers exactly this input; forbidden stays forbidden and guards
    // are asked again.
    if let Some(cmd) = &command {
        let verdict = gates.decide_exec(cmd);
        if verdict.decision == Decision::Forbid {
            return Err(KernelError::Denied(refusal_text(&verdict)));
        }
    }
    let (decision, reason) = ask_guards(gates, m, chain, &tool, &input).await;
    if decision == Decision::Forbid {
        return Err(KernelError::Denied(reason));
    }
    if may_change_files(m, &spec, &owner) {
        gates.checkpoint_before_call(id, &tool).await;
    }
    Ok(run_tool(gates, m, chain, id, &tool, &spec, &owner, &input, command).await)
}

async fn resolve(
    m: &dyn Mediator,
    chain: &crate::call_chain::CallChain,
    name: &str,
) -> Result<String, (OutcomeStatus, String)> {
    if m.tool(name).is_some() {
        return Ok(name.to_owned());
    }
    if !m.has_service(services::TOOL_REGISTRY) {
        return Err((
            OutcomeStatus::Error,
            format!("[keel] no tool named `{name}` is registered; use one of the tools offered"),
        ));
    }
    let call = crate::ServiceCall::ResolveTool(ResolveRequest {
        name: name.to_owned(),
    });
    let answer = m.call_service_typed(chain, &call).await.map_err(|e| {
        (
            OutcomeStatus::Error,
            format!("[keel] resolving tool `{name}` failed: {e}"),
        )
    })?;
    let crate::ServiceAnswer::Resolution(resolution) = answer else {
        // The kernel routes a `resolve` only to the export that answers it.
        return Err((
            OutcomeStatus::Error,
            format!("[keel] resolving tool `{name}` got another method's answer"),
        ));
    };
    match resolution {
        Resolution::Found { name } => Ok(name),
        Resolution::Unknown { did_you_mean } if did_you_mean.is_empty() => Err((
            OutcomeStatus::Error,
            format!("[keel] no tool named `{name}` is registered; use one of the tools offered"),
        )),
        Resolution::Unknown { did_you_mean } => Err((
            OutcomeStatus::Error,
            format!(
                "[keel] no tool named `{name}` is registered; did you mean {}?",
                did_you_mean
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        )),
        Resolution::Disabled { name, reason } => Err((
            OutcomeStatus::Refused,
            format!("[keel] tool `{name}` is disabled: {reason}"),
        )),
    }
}

/// A file-writing tool aimed at one of the workspace's control directories (`.git`, `.keel`,
/// …) is refused here, before guards or approval, under every approval policy: what is
/// written there runs later outside the sandbox (a hook, `core.fsmonitor`) or becomes keel's
/// own configuration. Commands are kept out of them by the sandbox's read-only binds.
fn control_write_refusal(
    gates: &SessionGates,
    tool: &str,
    spec: &ToolSpec,
    input: &Value,
) -> Option<String> {
    if !spec.capabilities.writes_files {
        return None;
    }
    let workspace = gates.workspace.as_deref()?;
    let (path, dir) = crate::sandbox::control::control_path_in(workspace, input)?;
    Some(format!(
        "[keel] `{tool}` did not run: `{}` is inside the workspace's `{dir}`, a control \
         directory keel never lets a tool write (what is there runs later outside the sandbox, \
         or configures keel). Do not retry; if the change is needed, tell the person what to \
         write there and why, and let them do it",
        sanitize::sanitize_for_display(&path)
    ))
}

/// Why a call may not run in plan mode, or `None` when it may (see [`crate::plan_mode`]): a
/// tool that writes or reaches out is refused; a command tool's command must be one the
/// built-in policy knows to only read (the exec gate checks it again and confines it).
fn plan_refusal(
    m: &dyn Mediator,
    tool: &str,
    spec: &ToolSpec,
    owner: &str,
    input: &Value,
) -> Option<String> {
    use crate::plan_mode::{PlanTool, judge_command, judge_tool, refusal};
    match judge_tool(spec, m.reaches_out(owner), m.writes_own_dirs(owner)) {
        PlanTool::Reads => None,
        PlanTool::Refused(why) => Some(refusal(tool, why)),
        PlanTool::Commands => match command_of(spec, input) {
            None => Some(refusal(
                tool,
                "it runs code and names no `command` keel could judge as read-only",
            )),
            Some(command) => judge_command(&command).err().map(|why| refusal(tool, &why)),
        },
    }
}

/// Whether a call of this tool may change the workspace's files, so a checkpoint precedes it:
/// a file-writing or command tool, or one served by a plugin that acts outside its sandbox
/// (MCP servers, subagents' loops).
fn may_change_files(m: &dyn Mediator, spec: &ToolSpec, owner: &str) -> bool {
    spec.capabilities.writes_files || spec.capabilities.executes_code || m.acts_outside(owner)
}

/// The command a command tool would run: the string `command` of a tool that executes code.
fn command_of(spec: &ToolSpec, input: &Value) -> Option<String> {
    if !spec.capabilities.executes_code {
        return None;
    }
    input
        .get("command")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

enum Judged {
    Refused(String),
    Run { approved_command: Option<String> },
}

async fn ask_guards(
    gates: &SessionGates,
    m: &dyn Mediator,
    chain: &crate::call_chain::CallChain,
    tool: &str,
    input: &Value,
) -> (Decision, String) {
    let input_text = input.to_string();
    let mut decision = Decision::Allow;
    let mut reasons = Vec::new();
    for (guard, plugin) in m.guards() {
        let answer = tokio::time::timeout(
            gates.guard_timeout,
            m.check_guard(chain, &guard, tool, &input_text),
        )
        .await;
        let verdict = match answer {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => GuardVerdict {
                decision: Decision::Forbid,
                reason: format!(
                    "guard `{guard}` of plugin `{plugin}` failed ({e}), which counts as forbid"
                ),
            },
            Err(_) => GuardVerdict {
                decision: Decision::Forbid,
                reason: format!(
                    "guard `{guard}` of plugin `{plugin}` did not answer within {} ms, which counts as forbid",
                    gates.guard_timeout.as_millis()
                ),
            },
        };
        if verdict.decision > Decision::Allow {
            reasons.push(format!("guard `{guard}`: {}", verdict.reason));
        }
        decision = decision.max(verdict.decision);
    }
    (decision, reasons.join("; "))
}

/// Guards, the kernel's verdict and the approver, combined by maximum.
async fn judge(
    gates: &Arc<SessionGates>,
    m: &dyn Mediator,
    chain: &crate::call_chain::CallChain,
    (tool, spec, input): (&str, &ToolSpec, &Value),
    command: Option<&str>,
    requester: Option<String>,
) -> Judged {
    let (guard_decision, guard_reason) = ask_guards(gates, m, chain, tool, input).await;
    let mut verdict = command.map(|c| gates.decide_exec(c));
    let policy_decision = verdict.as_ref().map_or(Decision::Allow, |v| v.decision);
    // One ordered decision: the strictest of the guards and the exec policy wins, so a guard
    // can raise a call to "ask first" or "refuse", never lower anything.
    let mut caps = spec.capabilities;
    match policy_decision.max(guard_decision) {
        Decision::Forbid => {
            return Judged::Refused(match &verdict {
                Some(v) if v.decision == Decision::Forbid => refusal_text(v),
                _ => format!("`{tool}` was refused by a guard: {guard_reason}"),
            });
        }
        Decision::Prompt if guard_decision == Decision::Prompt => match &mut verdict {
            Some(v) if v.decision == Decision::Allow => {
                v.decision = Decision::Prompt;
                v.reason = guard_reason.clone();
            }
            Some(_) => {}
            // No command to judge: the capability baseline asks for a tool that runs code.
            None => {
                caps = ToolCapabilities {
                    executes_code: true,
                    ..caps
                }
            }
        },
        _ => {}
    }
    let summary = command.map_or_else(|| summarize(tool, input), str::to_owned);
    let key = command.and_then(|c| gates.policy.approval_key(c));
    let preview = command.is_none().then(|| Preview::of(input)).flatten();
    let gates2 = gates.clone();
    let tool2 = tool.to_owned();
    let verdict2 = verdict.clone();
    let ruling = tokio::task::spawn_blocking(move || {
        let workspace = gates2.workspace.clone().unwrap_or_default();
        Approvals {
            session: &gates2.session,
            grants: gates2.grants.as_ref(),
            workspace: &workspace,
            approver: &*gates2.approver,
        }
        .authorize_for(
            requester.as_deref(),
            &tool2,
            &caps,
            &summary,
            key.as_deref(),
            verdict2.as_ref(),
            preview,
        )
    })
    .await;
    let ruling = match ruling {
        Ok(r) => r,
        Err(e) => return Judged::Refused(format!("the approver failed ({e}); nothing ran")),
    };
    for w in &ruling.warnings {
        tracing::warn!("approvals: {w}");
    }
    match ruling.outcome {
        Outcome::Run => Judged::Run {
            approved_command: command.map(str::to_owned),
        },
        Outcome::Refused { reason } => Judged::Refused(format!(
            "`{tool}` did not run: {reason}. Do not retry the same call; choose another approach \
             or ask the user"
        )),
    }
}

/// One line describing a non-command call for the approver.
fn summarize(tool: &str, input: &Value) -> String {
    let path = input
        .get("path")
        .and_then(Value::as_str)
        .map(|p| format!(" {p}"))
        .unwrap_or_default();
    format!("{tool}{path}")
}

#[allow(clippy::too_many_arguments)]
async fn run_tool(
    gates: &Arc<SessionGates>,
    m: &dyn Mediator,
    chain: &crate::call_chain::CallChain,
    id: &str,
    tool: &str,
    spec: &ToolSpec,
    owner: &str,
    input: &Value,
    approved_command: Option<String>,
) -> ToolOutcome {
    let outer = chain;
    let chain = chain.serving_call(id, owner);
    let input_text = input.to_string();
    // A plugin that acts outside its sandbox serves one call at a time, so the approved
    // command and the hosts reached belong to that call; any other (a subagent's whole loop)
    // may serve several at once.
    let (result, inflight) = if m.acts_outside(owner) {
        let plugin_lock = gates.plugin_lock(owner);
        let _one_at_a_time = plugin_lock.lock().await;
        let serving = Serving::start(gates, owner, approved_command);
        let result = m.invoke_tool(&chain, tool, &input_text).await;
        (result, serving.finish())
    } else {
        let result = m.invoke_tool(&chain, tool, &input_text).await;
        (result, crate::session_gates::Inflight::default())
    };
    let (status, text) = match result {
        Ok(text) => (OutcomeStatus::Ok, text),
        Err(e) => (OutcomeStatus::Error, tool_failure(&e)),
    };
    let mut text = gates.redact(&text);
    if let Some(context) = post_tool_hooks(gates, m, outer, tool, input, status, &text).await {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&context);
    }
    // Output can neither hide text from the person reading the transcript nor pass for a role
    // turn, a tool call or a notice of keel's; what was changed is said at the end.
    let sanitized = sanitize::sanitize_tool_output(&text);
    let mut clean = sanitized.text;
    if spec.capabilities.network || !inflight.hosts.is_empty() {
        let host = inflight.hosts.first().map_or(tool, String::as_str);
        clean = sanitize::wrap_external(host, &clean);
    }
    if let Some(notice) = sanitized.report.notice() {
        if !clean.is_empty() && !clean.ends_with('\n') {
            clean.push('\n');
        }
        clean.push_str(&notice);
    }
    let mut spill = None;
    if clean.len() > KEEP_HEAD + KEEP_TAIL {
        let pointer = gates.spill(id, &clean);
        let truncated = match &pointer {
            Some((path, read)) => {
                spill = Some(path.clone());
                sanitize::head_tail_with_pointer(&clean, KEEP_HEAD, KEEP_TAIL, read)
            }
            None => sanitize::head_tail(&clean, KEEP_HEAD, KEEP_TAIL),
        };
        clean = truncated.kept;
    }
    ToolOutcome {
        call_id: id.to_owned(),
        tool: tool.to_owned(),
        status,
        content: clean,
        exec: inflight.execs,
        spill,
    }
}

/// The service a plugin provides to hear of every tool call the kernel ran (the bundled
/// `hooks` plugin, for the person's `post-tool-use` hooks).
pub const HOOKS_SERVICE: &str = "hooks";

/// The plugin keel tells of the person's prompts and tool calls: the provider of the `hooks`
/// service when it is the plugin named `hooks` that the host handed the person's hooks (their
/// process entries). Any other provider of a service of that name hears nothing.
pub(crate) fn hooks_provider(gates: &SessionGates, provider: Option<String>) -> Option<String> {
    let provider = provider?;
    let handed = gates
        .process_entries(&provider)
        .is_some_and(|entries| !entries.is_empty());
    (provider == HOOKS_SERVICE && handed).then_some(provider)
}

/// Ask the `hooks` service, if one is provided, about a call that just ran, before its result
/// goes back to the agent loop: a hook that formats the file an edit wrote has done so before
/// the model's next request. The service sees the (redacted) result and may answer text to
/// append to it (`{"context": …}`), which is cleaned with the rest of the result. It is bounded
/// by the guard timeout; a failure or time-out is said in the result, never fatal to the call.
///
/// Only the plugin the person's hooks were handed to hears of every call and may add to its
/// result: the one named `hooks` that the host gave the person's `[hooks]` entries (the
/// bundled plugin, loaded only when hooks are configured). Any other plugin that provides a
/// service of that name is not called.
async fn post_tool_hooks(
    gates: &SessionGates,
    m: &dyn Mediator,
    chain: &crate::call_chain::CallChain,
    tool: &str,
    input: &Value,
    status: OutcomeStatus,
    result: &str,
) -> Option<String> {
    hooks_provider(gates, m.provider(HOOKS_SERVICE))?;
    let call = crate::ServiceCall::HookToolUse(keel_protocol::HookToolUse {
        tool: tool.to_owned(),
        arguments: input.clone(),
        result: result.to_owned(),
        status: if status == OutcomeStatus::Ok {
            keel_protocol::HookToolStatus::Ok
        } else {
            keel_protocol::HookToolStatus::Error
        },
    });
    let answer =
        tokio::time::timeout(gates.guard_timeout, m.call_service_typed(chain, &call)).await;
    let context = match answer {
        Ok(Ok(crate::ServiceAnswer::HookAdded(context))) => context,
        Ok(Ok(_)) => "[keel] the post-tool-use hooks answered another call's answer".to_owned(),
        Ok(Err(e)) => format!("[keel] the post-tool-use hooks failed: {e}"),
        Err(_) => format!(
            "[keel] the post-tool-use hooks did not finish within {} ms",
            gates.guard_timeout.as_millis()
        ),
    };
    (!context.is_empty()).then_some(context)
}

/// What the model reads when a tool call did not return a result: the plugin's own words, of
/// the kind it said (an input to correct, a refusal, something absent for now), or what became
/// of the plugin; never the kernel's routing.
fn tool_failure(error: &KernelError) -> String {
    match error {
        KernelError::Failed(message) => message.clone(),
        KernelError::Invalid(message) => format!("invalid input: {message}"),
        other => other.to_string(),
    }
}

/// A minimal JSON Schema check for tool input: `type`, `required`, `properties`, `enum`,
/// `items` and `additionalProperties: false`. Enough to catch a model's wrong shapes early
/// with a precise message; the tool still validates its own input.
pub(crate) fn check_schema(spec: &ToolSpec, input: &Value) -> Result<(), String> {
    let schema: Value = match serde_json::from_str(&spec.input_schema) {
        Ok(s) => s,
        Err(_) => return Ok(()),
    };
    check_value(&schema, input, "input")
}

fn check_value(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(ty) = schema.get("type") {
        let types: Vec<&str> = match ty {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !types.is_empty() && !types.iter().any(|t| type_matches(t, value)) {
            return Err(format!(
                "`{at}` should be {} but is {}",
                types.join(" or "),
                type_name(value)
            ));
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.contains(value)
    {
        return Err(format!(
            "`{at}` must be one of {}",
            Value::Array(options.clone())
        ));
    }
    if let Value::Object(map) = value {
        if let Some(Value::Array(required)) = schema.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                if !map.contains_key(r) {
                    return Err(format!("`{at}` is missing the required field `{r}`"));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, v) in map {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => check_value(sub, v, &format!("{at}.{k}"))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    let known: Vec<&String> = props.map(|p| p.keys().collect()).unwrap_or_default();
                    return Err(format!(
                        "`{at}` has an unknown field `{k}`; the fields are: {}",
                        known
                            .iter()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                None => {}
            }
        }
    }
    if let (Value::Array(items), Some(item_schema)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check_value(item_schema, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(schema: &str) -> ToolSpec {
        ToolSpec {
            name: "t".into(),
            description: "d".into(),
            input_schema: schema.into(),
            capabilities: ToolCapabilities::default(),
            parallel_safe: false,
        }
    }

    #[test]
    fn schema_check_names_the_field_and_the_way_out() {
        let s = spec(
            r#"{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}},
               "required":["path"],"additionalProperties":false}"#,
        );
        assert!(check_schema(&s, &serde_json::json!({"path": "a"})).is_ok());
        let e = check_schema(&s, &serde_json::json!({})).expect_err("missing");
        assert!(e.contains("required field `path`"), "{e}");
        let e = check_schema(&s, &serde_json::json!({"path": 3})).expect_err("type");
        assert!(e.contains("`input.path` should be string"), "{e}");
        let e = check_schema(&s, &serde_json::json!({"path": "a", "limit": 1.5})).expect_err("int");
        assert!(e.contains("integer"), "{e}");
        let e = check_schema(&s, &serde_json::json!({"path": "a", "x": 1})).expect_err("extra");
        assert!(
            e.contains("unknown field `x`") && e.contains("`limit`"),
            "{e}"
        );
        let e = check_schema(&s, &serde_json::json!("text")).expect_err("not an object");
        assert!(e.contains("should be object"), "{e}");
    }
}
