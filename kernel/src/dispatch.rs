//! Mediation of a turn: the sealed gate state of a session and the three doors the agent
//! loop uses — `complete` (model responses pass through here, so the kernel records each tool
//! call's raw arguments and the turn's stop reason), `dispatch` (the gate pipeline in front of
//! every tool call) and `replay` (a verifier re-running an already approved call) — plus the
//! exec gate a tool plugin's command passes.
//!
//! Pipeline for one call, in order: known call id → truncation gate (a cut-off call is not
//! run and not counted) → strict parse, or the repair ladder for complete turns → tool-name
//! resolution (the tool registry) → schema check → plugin guards (tighten only) → the
//! kernel's own verdict (exec policy for commands, capability baseline otherwise), combined
//! by maximum → approval → the tool → sanitization, head + tail with the full output spilled.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use keel_protocol::{
    Block, ExecRecord, ModelResponse, OutcomeStatus, Resolution, ResolveRequest, StopReason,
    ToolOutcome, services,
};
use serde_json::Value;

use crate::gates::approvals::{
    Answer, ApprovalRequest, Approvals, Approver, DenyAll, GrantStore, Outcome, SessionApprovals,
};
use crate::gates::arg_repair;
use crate::gates::exec_policy::{ApprovalMode, Decision, ExecPolicy, NETWORK_RULE, Verdict};
use crate::gates::net_policy::{NetDecision, NetPolicy};
use crate::gates::{redact, safe_path, sanitize};
use crate::net_client::{NetClient, NetConfig, Secrets};
use crate::sandbox::proxy::CommandNet;
use crate::sandbox::runner::{self, Containment, ExecCommand, ExecOutcome};
use crate::sandbox::{CommandNetwork, Confinement, SandboxConfig};
use crate::types::{GuardVerdict, KernelError, ToolCapabilities, ToolSpec};

/// Bytes of a long tool output kept from its start and its end.
pub const KEEP_HEAD: usize = 22 * 1024;
/// See [`KEEP_HEAD`].
pub const KEEP_TAIL: usize = 8 * 1024;

/// How the sealed gates are set up for a session. Built by the host; nothing a plugin
/// imports can read or change it.
pub struct GateConfig {
    /// The canonical workspace: commands run and outputs spill only inside it. `None`
    /// refuses every command.
    pub workspace: Option<PathBuf>,
    /// The exec policy (user config, tightened by the project's).
    pub exec_policy: ExecPolicy,
    /// Who answers approval requests.
    pub approver: Arc<dyn Approver>,
    /// "Always" grants in the user's home.
    pub grants: Option<GrantStore>,
    /// The network gate's settings.
    pub network: NetConfig,
    /// How long a guard may take to answer before it counts as forbid.
    pub guard_timeout: Duration,
    /// The OS sandbox commands run in.
    pub sandbox: SandboxConfig,
}

impl GateConfig {
    /// Everything closed: no workspace, deny every approval, deny every host.
    pub fn locked_down() -> Self {
        GateConfig {
            workspace: None,
            exec_policy: ExecPolicy::builtin(),
            approver: Arc::new(DenyAll),
            grants: None,
            network: NetConfig {
                policy: NetPolicy::new(NetDecision::Forbid),
                secrets: Secrets::new(),
                audit_log: None,
            },
            guard_timeout: Duration::from_secs(2),
            sandbox: SandboxConfig::default(),
        }
    }
}

/// A tool call as the model stream delivered it.
#[derive(Debug, Clone)]
struct RecordedCall {
    name: String,
    raw: String,
    stop: StopReason,
    stop_raw: String,
    turn: u64,
    /// Set once the call passed the gates and ran: its resolved tool and parsed input.
    executed: Option<(String, Value)>,
    dispatched: bool,
}

/// The in-flight record of the tool call a plugin serves, removed when the call ends however it
/// ends: a call dropped halfway (a turn stopped at Ctrl-C) must not leave its approved command
/// for the plugin's next service call or event handler to run unasked.
struct Serving<'a> {
    gates: &'a SessionGates,
    owner: &'a str,
}

impl<'a> Serving<'a> {
    fn start(gates: &'a SessionGates, owner: &'a str, approved_command: Option<String>) -> Self {
        lock(&gates.inflight).insert(
            owner.to_owned(),
            Inflight {
                approved_command,
                ..Inflight::default()
            },
        );
        Serving { gates, owner }
    }

    /// The record of what the call did; the approval ends with it.
    fn finish(self) -> Inflight {
        lock(&self.gates.inflight)
            .remove(self.owner)
            .unwrap_or_default()
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        lock(&self.gates.inflight).remove(self.owner);
    }
}

/// What a tool plugin's in-flight call may do through the exec gate, and what it did.
#[derive(Debug, Default)]
struct Inflight {
    /// The command the person (or a stored grant, or the policy) approved for this call.
    approved_command: Option<String>,
    execs: Vec<ExecRecord>,
    hosts: Vec<String>,
}

/// The sealed per-session state of the gates.
pub(crate) struct SessionGates {
    workspace: Option<PathBuf>,
    policy: ExecPolicy,
    approver: Arc<dyn Approver>,
    grants: Option<GrantStore>,
    session: SessionApprovals,
    pub(crate) net: NetClient,
    secret_names: Vec<String>,
    guard_timeout: Duration,
    /// The sandbox commands run in, probed once when the session starts.
    containment: Containment,
    calls: Mutex<BTreeMap<String, RecordedCall>>,
    next_call: AtomicU64,
    inflight: Mutex<HashMap<String, Inflight>>,
    /// One dispatch at a time per tool plugin, so `inflight` belongs to exactly one call.
    plugin_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    turn: AtomicU64,
    /// Set by Ctrl-C, cleared when the next turn begins. A watch rather than a flag, so a
    /// model stream or command that is waiting can be woken and ended at once.
    cancel: tokio::sync::watch::Sender<bool>,
    /// Bytes spilled to `.keel/spill` this session, and how many may be.
    spilled: AtomicU64,
    spill_limit: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SessionGates {
    pub(crate) fn new(config: GateConfig) -> Self {
        let secret_names = config.network.secrets.names();
        SessionGates {
            workspace: config.workspace,
            policy: config.exec_policy,
            approver: config.approver,
            grants: config.grants,
            session: SessionApprovals::new(),
            net: NetClient::new(config.network),
            secret_names,
            guard_timeout: config.guard_timeout,
            containment: Containment {
                confinement: crate::sandbox::probe(&config.sandbox),
                config: config.sandbox,
            },
            calls: Mutex::new(BTreeMap::new()),
            next_call: AtomicU64::new(1),
            inflight: Mutex::new(HashMap::new()),
            plugin_locks: Mutex::new(HashMap::new()),
            turn: AtomicU64::new(0),
            cancel: tokio::sync::watch::Sender::new(false),
            spilled: AtomicU64::new(0),
            spill_limit: crate::quotas::MAX_SPILL_BYTES_PER_SESSION,
        }
    }

    pub(crate) fn approver(&self) -> &dyn Approver {
        &*self.approver
    }

    pub(crate) fn begin_turn(&self) {
        self.turn.fetch_add(1, Ordering::SeqCst);
        self.cancel.send_replace(false);
    }

    pub(crate) fn cancel_turn(&self) {
        self.cancel.send_replace(true);
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// Resolves once the current turn is cancelled (at once if it already is).
    pub(crate) async fn until_cancelled(&self) {
        let mut rx = self.cancel.subscribe();
        // The sender lives as long as `self`, so `wait_for` only returns on a cancel.
        let _ = rx.wait_for(|cancelled| *cancelled).await;
    }

    /// Run `work` unless the turn is cancelled first: a cancelled turn ends waiting model
    /// streams and requests at once instead of at the next step boundary.
    pub(crate) async fn unless_cancelled<T>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T, KernelError>>,
    ) -> Result<T, KernelError> {
        let cancelled = || {
            KernelError::Denied(format!(
                "{what} was stopped: the person cancelled the turn (Ctrl-C)"
            ))
        };
        if self.is_cancelled() {
            return Err(cancelled());
        }
        tokio::select! {
            result = work => result,
            () = self.until_cancelled() => Err(cancelled()),
        }
    }

    /// Redact kernel-held secrets (and key shapes) from text a plugin or a log will see.
    pub(crate) fn redact(&self, text: &str) -> String {
        redact::redact(text, &self.net.secret_values())
    }

    /// Record the tool calls of a model response and clean its text. Returns the response as
    /// the agent will see it.
    pub(crate) fn record_response(&self, mut response: ModelResponse) -> ModelResponse {
        let turn = self.turn.load(Ordering::SeqCst);
        let mut calls = lock(&self.calls);
        for block in &mut response.message.content {
            match block {
                Block::Text { text } => {
                    let (clean, removed) = arg_repair::strip_tool_call_lookalikes(text);
                    if !removed.is_empty() {
                        *text = format!(
                            "{clean}\n[keel: removed {} tool-call look-alike{} from this text; they were \
                             NOT executed. Call tools through the tool interface only.]",
                            removed.len(),
                            if removed.len() == 1 { "" } else { "s" }
                        );
                    }
                }
                Block::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    // Ids come from the model; a missing, unsafe or repeated one gets a
                    // kernel-made id so every call is addressable exactly once.
                    if safe_path::safe_component(id).is_err() || calls.contains_key(id.as_str()) {
                        *id = format!(
                            "keel-call-{}",
                            self.next_call.fetch_add(1, Ordering::SeqCst)
                        );
                    }
                    calls.insert(
                        id.clone(),
                        RecordedCall {
                            name: name.clone(),
                            raw: arguments.clone(),
                            stop: response.stop_reason,
                            stop_raw: response.stop_reason_raw.clone(),
                            turn,
                            executed: None,
                            dispatched: false,
                        },
                    );
                }
                _ => {}
            }
        }
        response
    }

    /// Record a call the host makes on the person's behalf (`keel tool call`), so it passes
    /// the same pipeline as a model's call. Returns its id.
    pub(crate) fn record_host_call(&self, name: &str, raw: &str) -> String {
        let id = format!(
            "keel-host-{}",
            self.next_call.fetch_add(1, Ordering::SeqCst)
        );
        lock(&self.calls).insert(
            id.clone(),
            RecordedCall {
                name: name.to_owned(),
                raw: raw.to_owned(),
                stop: StopReason::EndTurn,
                stop_raw: "host".into(),
                turn: self.turn.load(Ordering::SeqCst),
                executed: None,
                dispatched: false,
            },
        );
        id
    }

    fn plugin_lock(&self, plugin: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.plugin_locks)
            .entry(plugin.to_owned())
            .or_default()
            .clone()
    }

    /// Which confinement commands run under.
    pub(crate) fn confinement(&self) -> &Confinement {
        &self.containment.confinement
    }

    /// The exec policy's verdict on `line`, raised to "ask first" when the sandbox that should
    /// contain commands cannot start: an unconfined command never runs without the person.
    fn decide_exec(&self, line: &str) -> Verdict {
        let mut verdict = self.policy.decide(line);
        if verdict.decision == Decision::Allow
            && let Confinement::Unavailable(reason) = &self.containment.confinement
        {
            verdict.decision = Decision::Prompt;
            verdict.reason = format!("commands are NOT sandboxed ({reason})");
        }
        verdict
    }

    /// The exec gate: may `plugin` run `line` now? Forbidden never; allowed always; prompt
    /// only when it is exactly the command approved for the call being served. `Ok(true)`
    /// when the command may also use the network (through keel's proxy): the sandbox setting
    /// allows every command, or the policy asked because the command talks to the network and
    /// the approval it passed included that.
    pub(crate) fn check_exec(&self, plugin: &str, line: &str) -> Result<bool, KernelError> {
        let verdict = self.decide_exec(line);
        // Unconfined commands have the whole network anyway; no proxy is put in front.
        let network = match self.containment.confinement {
            Confinement::Bubblewrap(_, CommandNetwork::None)
            | Confinement::Off
            | Confinement::Unavailable(_) => false,
            Confinement::Bubblewrap(_, CommandNetwork::All) => true,
            Confinement::Bubblewrap(_, CommandNetwork::Approved) => verdict
                .segments
                .iter()
                .any(|s| s.rule.as_deref() == Some(NETWORK_RULE)),
        };
        match verdict.decision {
            Decision::Allow => Ok(network),
            Decision::Forbid => Err(KernelError::Denied(refusal_text(&verdict))),
            Decision::Prompt => {
                let inflight = lock(&self.inflight);
                let approved = inflight
                    .get(plugin)
                    .and_then(|i| i.approved_command.as_deref());
                if approved == Some(line) {
                    Ok(network)
                } else {
                    Err(KernelError::Denied(format!(
                        "`{line}` needs approval ({}) and it is not the command approved for the \
                         tool call being served; put the command in the tool call's input so it \
                         is shown for approval",
                        verdict.reason
                    )))
                }
            }
        }
    }

    pub(crate) async fn run_exec(
        self: &Arc<Self>,
        plugin: &str,
        cmd: ExecCommand,
    ) -> Result<ExecOutcome, KernelError> {
        let Some(workspace) = &self.workspace else {
            return Err(KernelError::Unavailable(
                "this session has no workspace, so no command can run; start keel inside a \
                 project directory or pass --workspace"
                    .into(),
            ));
        };
        let network = self.check_exec(plugin, &cmd.line)?.then(|| {
            CommandNet::new(
                &self.net,
                plugin,
                Arc::new(crate::net_client::GateApprover(self.clone())),
            )
        });
        if self.is_cancelled() {
            return Err(KernelError::Denied(
                "the command was not started: the person cancelled the turn (Ctrl-C)".into(),
            ));
        }
        let mut outcome = runner::run(
            workspace,
            &cmd,
            &self.secret_names,
            &self.containment,
            network.as_ref(),
            self.until_cancelled(),
        )
        .await
        .map_err(|e| KernelError::Invalid(e.to_string()))?;
        if let Some(rerun) = self
            .offer_unconfined(plugin, workspace, &cmd, &outcome, network.is_some())
            .await
        {
            outcome = rerun;
        }
        outcome.output = self.redact(&outcome.output);
        if let Some(i) = lock(&self.inflight).get_mut(plugin) {
            i.execs.push(ExecRecord {
                command: cmd.line.clone(),
                exit_code: outcome.exit_code,
                timed_out: outcome.timed_out,
            });
        }
        Ok(outcome)
    }

    /// A sandboxed command failed because of the sandbox: under `ask`, offer the person to run
    /// it again outside, as its own approval. Never automatic (not under `auto`, not without a
    /// person), never remembered (every rerun is asked anew), and said in the result either
    /// way. The rerun's outcome when the person said yes.
    async fn offer_unconfined(
        self: &Arc<Self>,
        plugin: &str,
        workspace: &Path,
        cmd: &ExecCommand,
        sandboxed: &ExecOutcome,
        proxied: bool,
    ) -> Option<ExecOutcome> {
        let Confinement::Bubblewrap(mode, _) = self.containment.confinement else {
            return None;
        };
        if sandboxed.exit_code == Some(0)
            || sandboxed.timed_out
            || self.policy.approval() != ApprovalMode::Ask
            || self.is_cancelled()
        {
            return None;
        }
        let why = crate::sandbox::refusal_hint(mode, &sandboxed.output, proxied)?;
        let request = ApprovalRequest {
            tool: plugin.to_owned(),
            summary: format!("OUTSIDE the sandbox, with your full rights: {}", cmd.line),
            key: None,
            reason: format!(
                "it failed inside keel's sandbox ({why}); a yes runs it once, unconfined, and is \
                 not remembered"
            ),
            can_always: false,
        };
        let gates = self.clone();
        let answer = tokio::task::spawn_blocking(move || gates.approver().ask(&request))
            .await
            .unwrap_or(Answer::Deny);
        if answer == Answer::Deny {
            tracing::info!(plugin, command = %cmd.line, "the person kept the command sandboxed");
            return None;
        }
        tracing::warn!(
            plugin,
            command = %cmd.line,
            "running a command outside the sandbox with the person's approval"
        );
        let unconfined = Containment {
            config: self.containment.config.clone(),
            confinement: Confinement::Off,
        };
        let mut rerun = runner::run(
            workspace,
            cmd,
            &self.secret_names,
            &unconfined,
            None,
            self.until_cancelled(),
        )
        .await
        .ok()?;
        let ran = "the command failed inside keel's sandbox and the person approved running it \
                   again outside, once, with their full rights; this is that run's output";
        rerun.note = if rerun.note.is_empty() {
            ran.to_owned()
        } else {
            format!("{ran}; {}", rerun.note)
        };
        Some(rerun)
    }

    /// Note a host a plugin's in-flight call reached, for the `<external_content>` label.
    pub(crate) fn note_host(&self, plugin: &str, host: &str) {
        if let Some(i) = lock(&self.inflight).get_mut(plugin)
            && !i.hosts.iter().any(|h| h == host)
        {
            i.hosts.push(host.to_owned());
        }
    }

    /// Take a recorded call for dispatch (each id runs once).
    fn take_for_dispatch(&self, id: &str) -> Result<RecordedCall, String> {
        let mut calls = lock(&self.calls);
        let Some(call) = calls.get_mut(id) else {
            return Err(format!(
                "no tool call with id `{id}` came from the model; the kernel runs only calls \
                 it saw in a model response"
            ));
        };
        if call.dispatched {
            return Err(format!(
                "tool call `{id}` was already dispatched; each call runs once"
            ));
        }
        call.dispatched = true;
        Ok(call.clone())
    }

    fn mark_executed(&self, id: &str, tool: &str, input: &Value) {
        if let Some(call) = lock(&self.calls).get_mut(id) {
            call.executed = Some((tool.to_owned(), input.clone()));
        }
    }

    /// The tool and input of an approved, executed call of the current turn.
    fn replayable(&self, id: &str) -> Result<(String, Value), String> {
        let turn = self.turn.load(Ordering::SeqCst);
        let calls = lock(&self.calls);
        match calls.get(id) {
            Some(RecordedCall {
                executed: Some((tool, input)),
                turn: t,
                ..
            }) if *t == turn => Ok((tool.clone(), input.clone())),
            Some(_) => Err(format!(
                "tool call `{id}` was not approved and run in the current turn, so it cannot \
                 be replayed"
            )),
            None => Err(format!("no tool call with id `{id}` is known")),
        }
    }

    /// Spill `text` for call `id` and return the pointer the model can read it with.
    /// Nothing is spilled once the session's spilled outputs reach their quota: the output is
    /// then cut to head and tail only.
    fn spill(&self, id: &str, text: &str) -> Option<(String, String)> {
        let workspace = self.workspace.as_ref()?;
        let name = safe_path::safe_component(id).ok()?;
        let size = text.len() as u64;
        self.spilled
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |spilled| {
                let total = spilled.checked_add(size)?;
                (total <= self.spill_limit).then_some(total)
            })
            .ok()?;
        let dir = workspace.join(".keel").join("spill");
        std::fs::create_dir_all(&dir).ok()?;
        let ignore = dir.join(".gitignore");
        if !ignore.exists() {
            let _ = std::fs::write(&ignore, "*\n");
        }
        let path = dir.join(format!("{name}.txt"));
        write_atomic(&path, text.as_bytes()).ok()?;
        let relative = format!(".keel/spill/{name}.txt");
        Some((
            relative.clone(),
            format!("read_file {{\"path\": \"{relative}\"}}"),
        ))
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The model-facing text of a refused command: what, why, what instead.
fn refusal_text(verdict: &Verdict) -> String {
    let mut text = format!("`{}` is refused: {}", verdict.command, verdict.reason);
    if let Some(s) = &verdict.suggestion {
        text.push_str("; ");
        text.push_str(s);
    }
    text
}

/// The kernel-facing side of the pipeline: what `Shared` provides to it.
pub(crate) trait Mediator: Send + Sync {
    /// Call a service on behalf of the chain.
    fn call_service<'a>(
        &'a self,
        chain: &'a crate::call_chain::CallChain,
        service: &'a str,
        method: &'a str,
        payload: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<String, KernelError>>;
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
    let call = match gates.take_for_dispatch(id) {
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
    let command = command_of(&spec, &input);
    let decision = judge(gates, m, chain, &tool, &spec, &input, command.as_deref()).await;
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
    let (tool, input) = gates.replayable(id).map_err(KernelError::Denied)?;
    let Some((spec, owner)) = m.tool(&tool) else {
        return Err(KernelError::Unavailable(format!(
            "tool `{tool}` is no longer registered"
        )));
    };
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
    let payload = serde_json::to_string(&ResolveRequest {
        name: name.to_owned(),
    })
    .unwrap_or_default();
    let answer = m
        .call_service(chain, services::TOOL_REGISTRY, "resolve", &payload)
        .await
        .map_err(|e| {
            (
                OutcomeStatus::Error,
                format!("[keel] resolving tool `{name}` failed: {e}"),
            )
        })?;
    match serde_json::from_str::<Resolution>(&answer) {
        Ok(Resolution::Found { name }) => Ok(name),
        Ok(Resolution::Unknown { did_you_mean }) if did_you_mean.is_empty() => Err((
            OutcomeStatus::Error,
            format!("[keel] no tool named `{name}` is registered; use one of the tools offered"),
        )),
        Ok(Resolution::Unknown { did_you_mean }) => Err((
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
        Ok(Resolution::Disabled { name, reason }) => Err((
            OutcomeStatus::Refused,
            format!("[keel] tool `{name}` is disabled: {reason}"),
        )),
        Err(e) => Err((
            OutcomeStatus::Error,
            format!("[keel] the tool registry answered malformed JSON ({e})"),
        )),
    }
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
    tool: &str,
    spec: &ToolSpec,
    input: &Value,
    command: Option<&str>,
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
        .authorize(&tool2, &caps, &summary, key.as_deref(), verdict2.as_ref())
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
    let plugin_lock = gates.plugin_lock(owner);
    let _one_at_a_time = plugin_lock.lock().await;
    let serving = Serving::start(gates, owner, approved_command);
    let result = m.invoke_tool(chain, tool, &input.to_string()).await;
    let inflight = serving.finish();
    let (status, text) = match result {
        Ok(text) => (OutcomeStatus::Ok, text),
        Err(e) => (OutcomeStatus::Error, e.to_string()),
    };
    let text = gates.redact(&text);
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
    fn an_approval_ends_with_its_call_even_when_the_call_is_dropped() {
        let gates = SessionGates::new(GateConfig::locked_down());
        // A command the locked-down policy would ask about.
        let line = "curl https://example.com";
        assert!(gates.check_exec("tool", line).is_err());
        let serving = Serving::start(&gates, "tool", Some(line.to_owned()));
        assert!(
            gates.check_exec("tool", line).is_ok(),
            "approved for the call"
        );
        drop(serving);
        assert!(
            gates.check_exec("tool", line).is_err(),
            "the approval outlived a call that was dropped"
        );
        let serving = Serving::start(&gates, "tool", Some(line.to_owned()));
        assert_eq!(serving.finish().approved_command.as_deref(), Some(line));
        assert!(gates.check_exec("tool", line).is_err());
    }

    #[test]
    fn a_sessions_spilled_outputs_are_bounded() {
        let ws = tempfile::tempdir().expect("workspace");
        let mut gates = SessionGates::new(GateConfig {
            workspace: Some(ws.path().to_owned()),
            ..GateConfig::locked_down()
        });
        gates.spill_limit = 10;
        assert!(gates.spill("c1", "12345678").is_some());
        assert!(gates.spill("c2", "12345678").is_none(), "over the quota");
        assert!(!ws.path().join(".keel/spill/c2.txt").exists());
        assert!(gates.spill("c3", "12").is_some(), "what fits is still kept");
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
