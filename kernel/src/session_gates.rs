//! The sealed gate state of a session: what the host configured ([`GateConfig`]) and what the
//! kernel keeps for one session ([`SessionGates`]) — the exec policy and the approver, stored
//! and session approvals, the network client, the sandbox commands run in, the model's
//! recorded tool calls and the turn they belong to, what each in-flight call was approved for
//! and reached, Ctrl-C, and the budget for spilled outputs. Plugins never see it; the pipeline
//! in [`crate::dispatch`] and the host handles reach it through the kernel.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use keel_protocol::{Block, ExecRecord, ModelResponse, StopReason};
use serde_json::Value;

use crate::agents::SubagentPolicy;
use crate::gates::approvals::{
    Answer, ApprovalRequest, Approver, DenyAll, GrantStore, SessionApprovals,
};
use crate::gates::arg_repair;
use crate::gates::exec_policy::{ApprovalMode, Decision, ExecPolicy, NETWORK_RULE, Verdict};
use crate::gates::net_policy::{NetDecision, NetPolicy};
use crate::gates::{redact, safe_path};
use crate::net_client::{NetClient, NetConfig, Secrets};
use crate::processes::{ProcessEntry, ProcessTable};
use crate::sandbox::proxy::CommandNet;
use crate::sandbox::runner::{self, Containment, ExecCommand, ExecOutcome};
use crate::sandbox::{CommandNetwork, Confinement, SandboxConfig};
use crate::types::KernelError;

/// Bytes of a long tool output kept from its start and its end.
pub const KEEP_HEAD: usize = 22 * 1024;
/// See [`KEEP_HEAD`].
pub const KEEP_TAIL: usize = 8 * 1024;

/// An answer the person gave that still stands: it lets calls run without asking, or keeps
/// one refused. The person can list them and withdraw any (`/approvals`); withdrawing only
/// ever makes keel ask again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StandingAnswer {
    /// Calls with this approval key run for the rest of the session.
    Session(String),
    /// Calls with this approval key run in this workspace in every session (stored).
    Always(String),
    /// Exactly this call was refused; it is refused again without asking.
    Denied(String),
    /// `plugin` may reach `host` for the rest of the session.
    Host {
        /// The plugin.
        plugin: String,
        /// The host.
        host: String,
    },
}

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
    /// The long-lived programs each plugin may start (plugin → entry name → entry): the
    /// person's `[mcp.servers]` for `mcp`. Nothing else can start one.
    pub processes: BTreeMap<String, BTreeMap<String, ProcessEntry>>,
    /// What child agents may have and how deep they nest (`[subagents]`).
    pub subagents: SubagentPolicy,
    /// Records the workspace before each turn and before each tool call that may change files
    /// (`[checkpoints]`); `None` records nothing.
    pub checkpoints: Option<Arc<keel_checkpoints::Recorder>>,
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
            processes: BTreeMap::new(),
            subagents: SubagentPolicy::default(),
            checkpoints: None,
        }
    }
}

/// A tool call as the model stream delivered it.
#[derive(Debug, Clone)]
pub(crate) struct RecordedCall {
    pub(crate) name: String,
    pub(crate) raw: String,
    pub(crate) stop: StopReason,
    pub(crate) stop_raw: String,
    turn: u64,
    /// The child agent whose model made the call (0: the main agent); only it may dispatch
    /// or replay the call.
    scope: u64,
    /// Set once the call passed the gates and ran: its resolved tool and parsed input.
    executed: Option<(String, Value)>,
    dispatched: bool,
}

/// The in-flight record of the tool call a plugin serves, removed when the call ends however it
/// ends: a call dropped halfway (a turn stopped at Ctrl-C) must not leave its approved command
/// for the plugin's next service call or event handler to run unasked.
pub(crate) struct Serving<'a> {
    gates: &'a SessionGates,
    owner: &'a str,
}

impl<'a> Serving<'a> {
    pub(crate) fn start(
        gates: &'a SessionGates,
        owner: &'a str,
        approved_command: Option<String>,
    ) -> Self {
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
    pub(crate) fn finish(self) -> Inflight {
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
pub(crate) struct Inflight {
    /// The command the person (or a stored grant, or the policy) approved for this call.
    pub(crate) approved_command: Option<String>,
    pub(crate) execs: Vec<ExecRecord>,
    pub(crate) hosts: Vec<String>,
}

/// The sealed per-session state of the gates.
pub(crate) struct SessionGates {
    pub(crate) workspace: Option<PathBuf>,
    pub(crate) policy: ExecPolicy,
    pub(crate) approver: Arc<dyn Approver>,
    pub(crate) grants: Option<GrantStore>,
    pub(crate) session: SessionApprovals,
    pub(crate) net: NetClient,
    secret_names: Vec<String>,
    pub(crate) guard_timeout: Duration,
    /// The sandbox settings of the session.
    sandbox: SandboxConfig,
    /// The sandbox commands run in, as probed. The probe (a bubblewrap run and a namespace
    /// check, a few milliseconds) starts on a thread of its own when the session does, beside
    /// plugin loading, and is waited for the first time the confinement is needed.
    containment: std::sync::OnceLock<Containment>,
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
    /// The programs each plugin may start (plugin → entry name → entry), from the user's config.
    process_entries: BTreeMap<String, BTreeMap<String, ProcessEntry>>,
    /// The long-lived processes plugins started.
    pub(crate) processes: ProcessTable,
    /// What child agents may have (`[subagents]`).
    pub(crate) subagents: SubagentPolicy,
    /// The number of the next child agent.
    next_child: AtomicU64,
    /// The workspace's checkpoints (see [`SessionGates::checkpoint_before_call`]).
    checkpoints: Option<Arc<keel_checkpoints::Recorder>>,
    /// Plan mode ([`crate::plan_mode`]): read-only tools and commands until the person
    /// accepts a plan. Set only by the host, through `Kernel::set_plan_mode`.
    plan: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SessionGates {
    /// Every answer that still stands: stored grants for the workspace first, then this
    /// session's approvals, network approvals and refusals.
    pub(crate) fn standing_answers(&self) -> Vec<StandingAnswer> {
        let always = match (&self.grants, &self.workspace) {
            (Some(store), Some(ws)) => store.list(ws).unwrap_or_default(),
            _ => Vec::new(),
        };
        let mut answers: Vec<StandingAnswer> =
            always.iter().cloned().map(StandingAnswer::Always).collect();
        answers.extend(
            self.session
                .approved_keys()
                .into_iter()
                // An "always" also approves the session; it is listed once, as what it is.
                .filter(|k| !always.contains(k))
                .map(StandingAnswer::Session),
        );
        answers.extend(
            self.net
                .approved_hosts()
                .into_iter()
                .map(|(plugin, host)| StandingAnswer::Host { plugin, host }),
        );
        answers.extend(
            self.session
                .rejected()
                .into_iter()
                .map(StandingAnswer::Denied),
        );
        answers
    }

    /// Withdraw `answer`: what it let run is asked about again (a stored grant is revoked on
    /// disk too), or what it refused may be asked about again.
    pub(crate) fn withdraw(&self, answer: &StandingAnswer) -> Result<(), KernelError> {
        let found = match answer {
            StandingAnswer::Session(key) => self.session.revoke(key),
            StandingAnswer::Always(key) => {
                let (Some(store), Some(ws)) = (&self.grants, &self.workspace) else {
                    return Err(KernelError::Unavailable(
                        "this session keeps no stored approvals".into(),
                    ));
                };
                store
                    .revoke(ws, key)
                    .map_err(|e| KernelError::Failed(format!("cannot revoke `{key}`: {e}")))?;
                self.session.revoke(key);
                true
            }
            StandingAnswer::Denied(command) => self.session.forget_rejection(command),
            StandingAnswer::Host { plugin, host } => self.net.forget_host(plugin, host),
        };
        if found {
            Ok(())
        } else {
            Err(KernelError::Invalid(format!(
                "{answer:?} is not a standing answer of this session"
            )))
        }
    }

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
            sandbox: {
                let probing = config.sandbox.clone();
                // The probe's result is kept process-wide; this only starts it early.
                std::thread::spawn(move || crate::sandbox::probe(&probing));
                config.sandbox
            },
            containment: std::sync::OnceLock::new(),
            calls: Mutex::new(BTreeMap::new()),
            next_call: AtomicU64::new(1),
            inflight: Mutex::new(HashMap::new()),
            plugin_locks: Mutex::new(HashMap::new()),
            turn: AtomicU64::new(0),
            cancel: tokio::sync::watch::Sender::new(false),
            spilled: AtomicU64::new(0),
            spill_limit: crate::quotas::MAX_SPILL_BYTES_PER_SESSION,
            process_entries: config.processes,
            processes: ProcessTable::default(),
            subagents: config.subagents,
            next_child: AtomicU64::new(1),
            checkpoints: config.checkpoints,
            plan: AtomicBool::new(false),
        }
    }

    /// Whether plan mode is on.
    pub(crate) fn plan_mode(&self) -> bool {
        self.plan.load(Ordering::SeqCst)
    }

    /// Switch plan mode (the host's door only; see [`crate::plan_mode`]).
    pub(crate) fn set_plan_mode(&self, on: bool) {
        self.plan.store(on, Ordering::SeqCst);
    }

    /// The kernel-held secrets' names (removed from every process's environment).
    pub(crate) fn secret_names(&self) -> &[String] {
        &self.secret_names
    }

    /// The programs `plugin` may start, by entry name.
    pub(crate) fn process_entries(&self, plugin: &str) -> Option<&BTreeMap<String, ProcessEntry>> {
        self.process_entries.get(plugin)
    }

    pub(crate) fn begin_turn(&self) {
        self.turn.fetch_add(1, Ordering::SeqCst);
        self.cancel.send_replace(false);
    }

    /// The checkpoint before a turn of `session`: what `keel rewind --turn N` restores.
    pub(crate) fn checkpoint_before_turn(
        &self,
        session: &str,
    ) -> Option<Result<keel_checkpoints::Checkpoint, String>> {
        let recorder = self.checkpoints.as_ref()?;
        Some(recorder.before_turn(session).map_err(|e| e.0))
    }

    /// The checkpoint after a turn's last call: what its commands and tools left.
    pub(crate) fn checkpoint_after_turn(
        &self,
    ) -> Option<Result<keel_checkpoints::Checkpoint, String>> {
        let recorder = self.checkpoints.as_ref()?;
        recorder.after_turn().map_err(|e| e.0).transpose()
    }

    /// The checkpoint before tool call `id` of `tool` runs, taken by the dispatcher after
    /// approval for every tool that may change files, so no plugin can leave it out. The walk
    /// runs on a blocking thread; a failure is logged and the call still runs (the index then
    /// has no checkpoint for it, which `keel checkpoints list` shows).
    pub(crate) async fn checkpoint_before_call(&self, id: &str, tool: &str) {
        let Some(recorder) = self.checkpoints.clone() else {
            return;
        };
        let (id, tool) = (id.to_owned(), tool.to_owned());
        let taken =
            tokio::task::spawn_blocking(move || recorder.before_call(&id, &tool).map(|_| ())).await;
        match taken {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("checkpoint before a tool call: {e}"),
            Err(e) => tracing::warn!("checkpoint before a tool call: {e}"),
        }
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

    /// [`SessionGates::redact`] for a process's words copied into keel's log: secret-looking
    /// `NAME=value` pairs lose their values too.
    pub(crate) fn redact_log(&self, text: &str) -> String {
        redact::redact_log(text, &self.net.secret_values())
    }

    /// Record the tool calls of a model response and clean its text. Returns the response as
    /// the agent will see it.
    /// A new child agent's number.
    pub(crate) fn next_child(&self) -> u64 {
        self.next_child.fetch_add(1, Ordering::SeqCst)
    }

    /// `scope` is the child agent whose model answered (0: the main agent).
    pub(crate) fn record_response(&self, mut response: ModelResponse, scope: u64) -> ModelResponse {
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
                            scope,
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
                scope: 0,
                executed: None,
                dispatched: false,
            },
        );
        id
    }

    pub(crate) fn plugin_lock(&self, plugin: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.plugin_locks)
            .entry(plugin.to_owned())
            .or_default()
            .clone()
    }

    /// The sandbox commands run in (waits for the probe the first time).
    pub(crate) fn containment(&self) -> &Containment {
        self.containment.get_or_init(|| Containment {
            config: self.sandbox.clone(),
            confinement: crate::sandbox::probe(&self.sandbox),
        })
    }

    /// The sandbox a plan-mode command runs in: the session's, read-only and without
    /// network. Only called once [`SessionGates::check_exec_in`] saw bubblewrap in use.
    fn read_only_containment(&self) -> Containment {
        let mut config = self.sandbox.clone();
        config.mode = crate::sandbox::SandboxMode::ReadOnly;
        config.network = CommandNetwork::None;
        Containment {
            config,
            confinement: Confinement::Bubblewrap(
                crate::sandbox::SandboxMode::ReadOnly,
                CommandNetwork::None,
            ),
        }
    }

    /// Which confinement commands run under.
    pub(crate) fn confinement(&self) -> &Confinement {
        &self.containment().confinement
    }

    /// The exec policy's verdict on `line`, raised to "ask first" when the sandbox that should
    /// contain commands cannot start: an unconfined command never runs without the person.
    pub(crate) fn decide_exec(&self, line: &str) -> Verdict {
        let mut verdict = self.policy.decide(line);
        if verdict.decision == Decision::Allow
            && let Confinement::Unavailable(reason) = &self.containment().confinement
        {
            verdict.decision = Decision::Prompt;
            verdict.reason = format!("commands are NOT sandboxed ({reason})");
        }
        verdict
    }

    /// [`SessionGates::check_exec_in`] under the mode now (the unit tests' door).
    #[cfg(test)]
    pub(crate) fn check_exec(&self, plugin: &str, line: &str) -> Result<bool, KernelError> {
        self.check_exec_in(plugin, line, self.plan_mode())
    }

    /// The exec gate: may `plugin` run `line` now? Forbidden never; allowed always; prompt
    /// only when it is exactly the command approved for the call being served. `Ok(true)`
    /// when the command may also use the network (through keel's proxy): the sandbox setting
    /// allows every command, or the policy asked because the command talks to the network and
    /// the approval it passed included that. `plan` is plan mode as the caller read it: then
    /// only a command the built-in policy knows to only read, only when the sandbox can hold
    /// it read-only, and never with network.
    fn check_exec_in(&self, plugin: &str, line: &str, plan: bool) -> Result<bool, KernelError> {
        if plan {
            crate::plan_mode::judge_command(line)
                .map_err(|why| KernelError::Denied(format!("plan mode: {why}")))?;
            if !matches!(self.confinement(), Confinement::Bubblewrap(..)) {
                return Err(KernelError::Denied(format!(
                    "plan mode: `{line}` was not run: in plan mode commands run only inside \
                     keel's read-only sandbox, and commands here are not sandboxed ({})",
                    self.confinement().describe()
                )));
            }
        }
        let verdict = self.decide_exec(line);
        // Unconfined commands have the whole network anyway; no proxy is put in front.
        let network = match self.containment().confinement {
            Confinement::Bubblewrap(_, CommandNetwork::None)
            | Confinement::Off
            | Confinement::Unavailable(_) => false,
            Confinement::Bubblewrap(_, CommandNetwork::All) => true,
            Confinement::Bubblewrap(_, CommandNetwork::Approved) => verdict
                .segments
                .iter()
                .any(|s| s.rule.as_deref() == Some(NETWORK_RULE)),
        } && !plan;
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
        &self,
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
        // Read once: the command is judged and confined under the same mode.
        let plan = self.plan_mode();
        let network = self
            .check_exec_in(plugin, &cmd.line, plan)?
            .then(|| CommandNet::new(&self.net, plugin, self.approver.clone()));
        let read_only;
        let containment = if plan {
            read_only = self.read_only_containment();
            &read_only
        } else {
            self.containment()
        };
        if self.is_cancelled() {
            return Err(KernelError::Denied(
                "the command was not started: the person cancelled the turn (Ctrl-C)".into(),
            ));
        }
        let mut outcome = runner::run(
            workspace,
            &cmd,
            &self.secret_names,
            containment,
            network.as_ref(),
            self.until_cancelled(),
        )
        .await
        .map_err(|e| KernelError::Invalid(e.to_string()))?;
        let mut ran_in = ran_in(&containment.confinement, network.is_some());
        // Plan mode never offers a run outside the sandbox.
        if !plan
            && let Some(rerun) = self
                .offer_unconfined(plugin, workspace, &cmd, &outcome, network.is_some())
                .await
        {
            outcome = rerun;
            ran_in = "outside the sandbox (approved)".to_owned();
        }
        outcome.output = self.redact(&outcome.output);
        if let Some(i) = lock(&self.inflight).get_mut(plugin) {
            i.execs.push(ExecRecord {
                command: cmd.line.clone(),
                exit_code: outcome.exit_code,
                timed_out: outcome.timed_out,
                sandbox: Some(ran_in),
            });
        }
        Ok(outcome)
    }

    /// A sandboxed command failed because of the sandbox: under `ask`, offer the person to run
    /// it again outside, as its own approval. Never automatic (not under `auto`, not without a
    /// person), never remembered (every rerun is asked anew), and said in the result either
    /// way. The rerun's outcome when the person said yes.
    async fn offer_unconfined(
        &self,
        plugin: &str,
        workspace: &Path,
        cmd: &ExecCommand,
        sandboxed: &ExecOutcome,
        proxied: bool,
    ) -> Option<ExecOutcome> {
        let Confinement::Bubblewrap(mode, _) = self.containment().confinement else {
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
            preview: None,
            requester: None,
        };
        let approver = self.approver.clone();
        let answer = tokio::task::spawn_blocking(move || approver.ask(&request))
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
            config: self.sandbox.clone(),
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

    /// Take a recorded call for dispatch (each id runs once, and only by the agent whose
    /// model made it: `scope`, 0 for the main agent).
    pub(crate) fn take_for_dispatch(&self, id: &str, scope: u64) -> Result<RecordedCall, String> {
        let mut calls = lock(&self.calls);
        let Some(call) = calls.get_mut(id).filter(|c| c.scope == scope) else {
            return Err(format!(
                "no tool call with id `{id}` came from this agent's model; the kernel runs \
                 only calls it saw in a model response, for the agent that asked"
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

    pub(crate) fn mark_executed(&self, id: &str, tool: &str, input: &Value) {
        if let Some(call) = lock(&self.calls).get_mut(id) {
            call.executed = Some((tool.to_owned(), input.clone()));
        }
    }

    /// The tool and input of an approved, executed call of the current turn.
    pub(crate) fn replayable(&self, id: &str, scope: u64) -> Result<(String, Value), String> {
        let turn = self.turn.load(Ordering::SeqCst);
        let calls = lock(&self.calls);
        match calls.get(id).filter(|c| c.scope == scope) {
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
    pub(crate) fn spill(&self, id: &str, text: &str) -> Option<(String, String)> {
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
    // Named with keel's pid, so what a killed keel left is known as its (`keel doctor --fix`).
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.{}-0-", std::process::id()))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The model-facing text of a refused command: what, why, what instead.
pub(crate) fn refusal_text(verdict: &Verdict) -> String {
    let mut text = format!("`{}` is refused: {}", verdict.command, verdict.reason);
    if let Some(s) = &verdict.suggestion {
        text.push_str("; ");
        text.push_str(s);
    }
    text
}

/// Where a command ran, in a few words for its record (the session log, the web page).
fn ran_in(confinement: &Confinement, network: bool) -> String {
    match confinement {
        Confinement::Bubblewrap(mode, net) if network || *net == CommandNetwork::All => {
            format!("bubblewrap {}, network through keel's gate", mode.as_str())
        }
        Confinement::Bubblewrap(mode, _) => format!("bubblewrap {}, no network", mode.as_str()),
        Confinement::Off => "not sandboxed (sandbox off in the config)".to_owned(),
        Confinement::Unavailable(_) => "not sandboxed (the sandbox could not start)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn in_plan_mode_a_writing_command_is_refused_even_as_the_approved_one() {
        let gates = SessionGates::new(GateConfig::locked_down());
        let line = "touch made.txt";
        let _serving = Serving::start(&gates, "tool", Some(line.to_owned()));
        assert!(
            gates.check_exec("tool", line).is_ok(),
            "approved for the call"
        );
        gates.set_plan_mode(true);
        let refused = gates.check_exec("tool", line).expect_err("plan mode");
        assert!(refused.to_string().contains("plan mode"), "{refused}");
        gates.set_plan_mode(false);
        assert!(gates.check_exec("tool", line).is_ok());
    }

    #[test]
    fn a_call_is_dispatched_and_replayed_only_by_the_agent_whose_model_made_it() {
        let gates = SessionGates::new(GateConfig::locked_down());
        let response = |id: &str| ModelResponse {
            message: keel_protocol::Message {
                role: keel_protocol::Role::Assistant,
                content: vec![Block::ToolCall {
                    id: id.into(),
                    name: "read_file".into(),
                    arguments: "{}".into(),
                }],
            },
            stop_reason: StopReason::ToolUse,
            stop_reason_raw: String::new(),
            usage: keel_protocol::Usage::default(),
            model: String::new(),
            retries: 0,
        };
        gates.record_response(response("call_1"), 0);
        // A child's model reusing the id gets one of the kernel's.
        let child = gates.record_response(response("call_1"), 7);
        let child_id = child
            .message
            .tool_calls()
            .next()
            .map(|(id, _, _)| id.to_owned());
        let child_id = child_id.expect("a call");
        assert_ne!(child_id, "call_1");
        // Neither may take the other's call.
        assert!(gates.take_for_dispatch("call_1", 7).is_err());
        assert!(gates.take_for_dispatch(&child_id, 0).is_err());
        assert!(gates.take_for_dispatch(&child_id, 3).is_err());
        assert!(gates.take_for_dispatch("call_1", 0).is_ok());
        assert!(gates.take_for_dispatch(&child_id, 7).is_ok());
        gates.mark_executed("call_1", "read_file", &Value::Null);
        assert!(gates.replayable("call_1", 7).is_err());
        assert!(gates.replayable("call_1", 0).is_ok());
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
}
