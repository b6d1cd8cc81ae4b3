//! An agent session: the kernel with the session's sealed gates, the profile's plugins, and
//! the turns the person drives. Nothing here is agent logic — the loop, the model, the tools,
//! the log and the verifier are plugins. The gates are wired from the settings in `gates`,
//! plugins come in through `loading`, and what the plugins emit is shown by `output`.

mod builder;
mod failure;
pub(crate) mod gates;
mod input;
mod loading;
mod output;
pub(crate) mod preview;
mod rewind;
pub(crate) mod running;
mod signals;
mod syntax;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::{Kernel, PluginLoader, ServiceAnswer, ServiceCall};
use keel_protocol::{SessionEvent, TurnEnd, TurnReport, TurnRequest, services, topics};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::config::Context;
use crate::runtime;
use crate::runtime::Origin;
use crate::settings::{ModelChoice, model_overrides};
pub use builder::KernelBuilder;
pub(crate) use gates::PageApprover;
pub(crate) use input::{Reply, answer, prompt_from, use_line_editor};
use output::Printer;
pub use output::{Display, JSON_VERSION};
pub(crate) use output::{terminal_safe, terminal_safe_name};
pub(crate) use signals::{
    exit_status as signal_exit_status, install as handle_stop_signals, output_lost, terminated,
};

/// Settings of one session.
pub struct SessionOptions {
    /// `--approval`; `None` means the config's `[exec] approval`.
    pub approval: Option<ApprovalMode>,
    /// Extra plugin directories for this session only.
    pub extra_plugins: Vec<PathBuf>,
    /// How to show events.
    pub display: Display,
    /// Resume this session instead of starting a new one.
    pub resume: Option<String>,
    /// Plugin config overrides laid over everything else, `(plugin, key, value)`.
    pub overrides: Vec<(String, String, serde_json::Value)>,
}

/// A running session.
pub struct Session {
    pub kernel: Kernel,
    pub loader: PluginLoader,
    /// The session's id; `/clear` starts a new one. Shared with the web page, which follows
    /// the session across a `/clear`.
    id: std::sync::Arc<Mutex<String>>,
    /// The model the session talks to, as the session log records it.
    model: String,
    display: Display,
    ctx_workspace: PathBuf,
    /// keel's home, where installed plugins are found (`/load NAME`).
    home: PathBuf,
    /// Where each plugin came from, for `/reload`, and the capability lines its loading was
    /// agreed to with: a reload that asks for more needs a new yes.
    origins: Mutex<Vec<(String, Origin, Vec<String>)>>,
    /// The last tool result in full, for `/expand` (the transcript shows its last lines).
    last_result: output::LastResult,
    /// How many of a result's last lines the transcript shows.
    result_lines: usize,
    overrides: Vec<(String, String, serde_json::Value)>,
    user_config: std::collections::BTreeMap<String, toml::Table>,
    /// `keel exec --raw`: the answer's exact bytes on a stdout that is not a terminal.
    exact_answer: bool,
    /// The lock saying this process runs the session (`running`), so `keel rewind` refuses
    /// to work under it; replaced by the new session's on `/clear`.
    running: Mutex<Option<running::Running>>,
    /// The session `keel resume` named, for a `session-start` hook's `source`.
    resumed: Option<String>,
    /// The session the `session-start` hooks last ran for: they run before its first turn,
    /// again after `/clear`.
    hooks_started: Mutex<Option<String>>,
    /// What the session-start hooks said for the model when a user-prompt-submit hook held
    /// that prompt back: offered with the next prompt instead.
    start_context: Mutex<Option<String>>,
    /// The web page serving this session (`keel run --web`, `/web`), while it runs.
    page: Mutex<Option<crate::web::Served>>,
    /// The OpenTelemetry exporter, when `[telemetry] otlp-endpoint` is set.
    telemetry: Option<crate::telemetry::Telemetry>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The most turns the stop hooks may ask for after one prompt: a hook that always asks must
/// not keep a session running unattended (Claude Code's hooks see `stop_hook_active` instead).
const MAX_STOP_HOOK_TURNS: u32 = 8;

/// The next turn's input when the stop hooks asked the agent to go on (`asked`: why) after
/// `report`'s turn: only after a turn the model ended itself, and at most
/// [`MAX_STOP_HOOK_TURNS`] times per prompt (`went_on` counts them).
fn go_on(report: &TurnReport, asked: Option<String>, went_on: &mut u32) -> Option<String> {
    let reason = asked?;
    if report.end != TurnEnd::Completed {
        return None;
    }
    if *went_on >= MAX_STOP_HOOK_TURNS {
        stderrln!(
            "warning: the stop hooks asked the agent to go on {MAX_STOP_HOOK_TURNS} times after              one prompt; keel stops here ({reason})"
        );
        return None;
    }
    *went_on += 1;
    stderrln!("a stop hook asks the agent to go on: {reason}");
    Some(format!("[stop hook] {reason}"))
}

/// A prompt after the person's hooks.
enum Prompted {
    /// As it goes to the agent, with what the hooks said for the model.
    Ready(String),
    /// A `user-prompt-submit` hook held it back, for this reason (safe to print).
    HeldBack(String),
}

/// How a client's turn went ([`Session::turn_for_client`]).
pub enum ClientTurn {
    /// It ran.
    Ran(TurnReport),
    /// A `user-prompt-submit` hook held the prompt back, for this reason; nothing ran.
    HeldBack(String),
}

impl Session {
    /// Start (or resume) a session in `ctx.workspace`.
    pub async fn start(ctx: &Context, opts: SessionOptions) -> anyhow::Result<Session> {
        Session::start_asking(ctx, opts, None).await
    }

    /// [`Session::start`] with `asker` answering approval questions under `ask` in place of
    /// the terminal (an editor over ACP); everything else, the gates included, is built as
    /// for `keel run`.
    pub async fn start_asking(
        ctx: &Context,
        opts: SessionOptions,
        asker: Option<std::sync::Arc<dyn keel_kernel::gates::approvals::Approver>>,
    ) -> anyhow::Result<Session> {
        let choice = ModelChoice::from(ctx);
        let runtime::Runtime { kernel, loader } = KernelBuilder::new(ctx)
            .approval(opts.approval)
            .asker(asker)
            .build()?;
        // Before any plugin loads, so their loading is seen too.
        let telemetry = crate::telemetry::Telemetry::start(ctx, &choice, &kernel);
        let id = match &opts.resume {
            Some(id) => id.clone(),
            None => keel_agent_kit::session_log::new_session_id(now_ms(), rand_u32()),
        };
        let running = match running::take(&ctx.home, &id) {
            Ok(held) => Some(held),
            Err(running::NotTaken::Held) => anyhow::bail!(
                "{}; it can be resumed once it has ended (leave it with `/exit`)",
                running::held_words(&id)
            ),
            Err(running::NotTaken::Failed(why)) => {
                stderrln!(
                    "warning: session {id} is not marked as running ({why}), so `keel rewind` \
                     cannot tell it is"
                );
                None
            }
        };
        let model = choice
            .model
            .clone()
            .unwrap_or_else(|| choice.provider.clone());
        let mut overrides = model_overrides(ctx, &choice)?;
        overrides.extend(opts.overrides);
        let session = Session {
            kernel,
            loader,
            id: std::sync::Arc::new(Mutex::new(id)),
            model,
            display: opts.display,
            ctx_workspace: ctx.workspace.clone(),
            home: ctx.home.clone(),
            origins: Mutex::new(Vec::new()),
            last_result: output::LastResult::default(),
            result_lines: ctx
                .config
                .display
                .result_lines
                .unwrap_or(output::RESULT_LINES),
            overrides,
            user_config: ctx.config.config.clone(),
            exact_answer: false,
            running: Mutex::new(running),
            resumed: opts.resume.clone(),
            hooks_started: Mutex::new(None),
            start_context: Mutex::new(None),
            page: Mutex::new(None),
            telemetry,
        };
        let sources = runtime::session_plugins(ctx, &session.loader)?;
        runtime::say_if_compiling(&session.loader, &sources);
        for prepared in runtime::prepare(&session.loader, sources) {
            session
                .load_package(prepared.package?, prepared.origin)
                .await?;
        }
        for path in &opts.extra_plugins {
            session.load_path(path, true).await?;
        }
        session.check_ready()?;
        if let Some(resume) = &opts.resume {
            if !session.is_logged(resume).await {
                anyhow::bail!(
                    "there is no session `{resume}` in this home's logs; `keel sessions list` \
                     shows the sessions"
                );
            }
            let n = session.seed_conversation(resume).await.with_context(|| {
                format!("cannot resume session `{resume}`; `keel sessions list` shows the sessions")
            })?;
            if session.display.is_human() {
                stderrln!("resumed session {resume}: {n} messages");
            }
        }
        session.announce();
        Ok(session)
    }

    /// The web page for this session: its URL, serving it first if it is not served yet.
    pub async fn open_page(&self, options: &crate::web::Options) -> anyhow::Result<String> {
        if let Some(served) = &*self
            .page
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            return served.url();
        }
        let id = self.id.clone();
        let sources = crate::web::Sources {
            kernel: self.kernel.clone(),
            live: Some(std::sync::Arc::new(move || {
                id.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            })),
            logs: None,
        };
        let served = crate::web::serve(sources, options).await?;
        let url = served.url()?;
        *self
            .page
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(served);
        Ok(url)
    }

    /// The session's id.
    pub fn id(&self) -> String {
        self.id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Tell the plugins (the session log first of all) that the session began.
    fn announce(&self) {
        self.emit(&SessionEvent::SessionStarted {
            session: self.id(),
            workspace: self.ctx_workspace.display().to_string(),
            model: self.model.clone(),
        });
    }

    /// `/clear`: go on with an empty conversation, as a new session with its own id and log;
    /// the one left stays in its log, whole and resumable. The id of the session left.
    pub fn clear(&self) -> String {
        let new = keel_agent_kit::session_log::new_session_id(now_ms(), rand_u32());
        let old = std::mem::replace(
            &mut *self
                .id
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            new.clone(),
        );
        let held = match running::take(&self.home, &new) {
            Ok(held) => Some(held),
            Err(running::NotTaken::Held) => {
                stderrln!("warning: {}", running::held_words(&new));
                None
            }
            Err(running::NotTaken::Failed(why)) => {
                stderrln!("warning: session {new} is not marked as running ({why})");
                None
            }
        };
        // The session left is no longer running here: it may be rewound or resumed elsewhere.
        *self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = held;
        *self
            .last_result
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.announce();
        old
    }

    /// Whether the session log lists session `id` (false when no log plugin answers).
    pub(crate) async fn is_logged(&self, id: &str) -> bool {
        crate::commands::sessions::list(&self.kernel)
            .await
            .is_ok_and(|list| list.iter().any(|s| s.id == id))
    }

    /// Give the agent plugin the conversation of session `id`, read back from its log; the
    /// number of messages. The log's `resume` repairs what an interrupted session left (a
    /// call without its result is answered as interrupted) and records that repair in the
    /// log, so the conversation is always one the provider accepts.
    async fn seed_conversation(&self, id: &str) -> anyhow::Result<usize> {
        // Read through the session log's service, so a replaced session-log plugin is the one
        // asked.
        let conversation = crate::commands::sessions::conversation(&self.kernel, id, true).await?;
        for w in &conversation.warnings {
            stderrln!(
                "warning: session `{id}` line {}: {}",
                w.line,
                terminal_safe(&w.message)
            );
        }
        for repair in &conversation.repairs {
            stderrln!("note: session `{id}`: {}", terminal_safe(repair));
        }
        let held = conversation.messages.len();
        let load = ServiceCall::LoadConversation(keel_protocol::LoadRequest {
            session: id.to_owned(),
            messages: conversation.messages,
            context_window: conversation.context_window,
        });
        self.kernel
            .call_service_typed(&load)
            .await
            .map_err(|e| anyhow::anyhow!("the agent plugin could not load session `{id}`: {e}"))?;
        Ok(held)
    }

    /// Whether the session log wrote everything since it was last asked: an error naming
    /// what failed (a full disk) when it did not. A session without a log plugin, or with
    /// one that does not answer `health`, is taken at its word.
    async fn check_log(&self) -> anyhow::Result<()> {
        self.kernel.settle_events().await;
        let Ok(health) = crate::commands::sessions::health(&self.kernel).await else {
            return Ok(());
        };
        let failed = health.failed;
        if failed == 0 {
            return Ok(());
        }
        anyhow::bail!(
            "the session log could not record {failed} entr{} of this turn ({}); the record of \
             session `{}` is incomplete. Free space in keel's home ({}), then `keel resume {}` \
             continues from what was recorded",
            if failed == 1 { "y" } else { "ies" },
            terminal_safe(health.error.as_deref().unwrap_or("no reason given")),
            self.id(),
            self.home.display(),
            self.id()
        )
    }

    fn emit(&self, event: &SessionEvent) {
        if let Ok(json) = serde_json::to_string(event)
            && let Err(e) = self.kernel.emit(topics::SESSION_EVENT, &json)
        {
            stderrln!("warning: {e}");
        }
    }

    /// Run one turn, showing what happens; Ctrl-C, SIGTERM and SIGHUP cancel it. An error
    /// when the session log could not record it.
    pub async fn turn(&self, input: &str) -> anyhow::Result<TurnReport> {
        if let Some(status) = signals::exit_status() {
            anyhow::bail!(
                "keel was asked to stop (signal {}) before the turn began",
                i32::from(status) - 128
            );
        }
        let input = match self.hooked_prompt(input).await? {
            Prompted::Ready(input) => input,
            Prompted::HeldBack(reason) => {
                anyhow::bail!("a user-prompt-submit hook held the prompt back: {reason}")
            }
        };
        self.turns_until_stop(input, true, |call| self.agent_call(call))
            .await
    }

    /// Turns of `input` until the stop hooks let the agent stop (see [`go_on`]), each between
    /// its checkpoints, its report shown when `show`: the last one's report. `call` makes a
    /// turn's call of the agent from its payload.
    async fn turns_until_stop<F, Call>(
        &self,
        mut input: String,
        show: bool,
        mut call: F,
    ) -> anyhow::Result<TurnReport>
    where
        F: FnMut(ServiceCall) -> Call,
        Call: std::future::Future<Output = Result<ServiceAnswer, keel_kernel::KernelError>>,
    {
        let mut went_on = 0;
        loop {
            let session = self.id();
            let request = ServiceCall::Turn(TurnRequest {
                session: session.clone(),
                input,
            });
            let (report, checkpoint_warnings) =
                self.checkpointed_turn(&session, call(request)).await;
            let asked = self.stop_hooks(went_on > 0).await;
            let report = report?;
            if show {
                self.show_report(&report);
            }
            // After the report, so a warning never lands on the line of the streamed answer.
            for warning in checkpoint_warnings {
                stderrln!("{warning}");
            }
            self.check_log().await?;
            match go_on(&report, asked, &mut went_on) {
                Some(next) => input = next,
                None => return Ok(report),
            }
        }
    }

    /// `input` as it goes to the agent after the person's `session-start` hooks (before the
    /// session's first turn) and `user-prompt-submit` hooks, or why a hook held it back (what
    /// the session-start hooks said then waits for the next prompt).
    async fn hooked_prompt(&self, input: &str) -> anyhow::Result<Prompted> {
        let lock = || {
            self.start_context
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let started = match self.session_start_hooks().await {
            Some(context) => Some(context),
            None => lock().take(),
        };
        let mut input = match self.user_prompt_hooks(input).await? {
            Prompted::Ready(input) => input,
            held => {
                *lock() = started;
                return Ok(held);
            }
        };
        if let Some(context) = started {
            input.push_str("\n\n[session-start hook] ");
            input.push_str(&context);
        }
        Ok(Prompted::Ready(input))
    }

    /// The person's `session-start` hooks, before the session's first turn (`source`: a new
    /// session, a resumed one, or the one `/clear` began): what they say for the model, if
    /// anything. They cannot hold anything back; their errors are said on stderr.
    async fn session_start_hooks(&self) -> Option<String> {
        if !self.kernel.person_hooks_run() {
            return None;
        }
        let id = self.id();
        let source = {
            let mut started = self
                .hooks_started
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if started.as_deref() == Some(id.as_str()) {
                return None;
            }
            let source = if started.is_some() {
                "clear"
            } else if self.resumed.as_deref() == Some(id.as_str()) {
                "resume"
            } else {
                "startup"
            };
            *started = Some(id.clone());
            source
        };
        let call = ServiceCall::HookSessionStart(keel_protocol::HookSessionStart {
            session: id,
            source: source.to_owned(),
        });
        let answer = match self.kernel.call_service_typed(&call).await {
            Ok(ServiceAnswer::HookContext(answer)) => answer,
            other => {
                let why = other.err().map_or_else(
                    || "the hooks plugin answered another call's answer".to_owned(),
                    |e| e.to_string(),
                );
                stderrln!(
                    "warning: the session-start hooks did not run: {}",
                    terminal_safe(&why)
                );
                return None;
            }
        };
        for error in &answer.errors {
            stderrln!("warning: a session-start hook: {}", terminal_safe(error));
        }
        (!answer.context.is_empty()).then_some(answer.context)
    }

    /// The person's `user-prompt-submit` hooks on `input`: the prompt as it goes to the agent
    /// (with what a hook added for the model), or why a hook held it back.
    async fn user_prompt_hooks(&self, input: &str) -> anyhow::Result<Prompted> {
        if !self.kernel.person_hooks_run() {
            return Ok(Prompted::Ready(input.to_owned()));
        }
        let call = ServiceCall::HookPrompt(keel_protocol::HookPrompt {
            session: self.id(),
            prompt: input.to_owned(),
        });
        // A hook that cannot answer holds the prompt back, as one that denies does.
        let verdict = match self.kernel.call_service_typed(&call).await {
            Ok(ServiceAnswer::PromptVerdict(verdict)) => verdict,
            Ok(_) => anyhow::bail!("the user-prompt-submit hooks answered another call's answer"),
            Err(e) => anyhow::bail!(
                "the user-prompt-submit hooks did not run: {}",
                terminal_safe(&e.to_string())
            ),
        };
        if verdict.blocked {
            return Ok(Prompted::HeldBack(terminal_safe(
                if verdict.reason.is_empty() {
                    "no reason given"
                } else {
                    &verdict.reason
                },
            )));
        }
        Ok(Prompted::Ready(if verdict.context.is_empty() {
            input.to_owned()
        } else {
            format!("{input}\n\n[user-prompt-submit hook] {}", verdict.context)
        }))
    }

    /// The person's `stop` hooks, once a turn ended (`again`: a turn they asked for): why they
    /// ask the agent to go on, if they do. Their errors are said on stderr.
    async fn stop_hooks(&self, again: bool) -> Option<String> {
        if !self.kernel.person_hooks_run() {
            return None;
        }
        let call = ServiceCall::HookStop(keel_protocol::HookStop {
            session: self.id(),
            stop_hook_active: again,
        });
        match self.kernel.call_service_typed(&call).await {
            Ok(ServiceAnswer::StopVerdict(verdict)) => {
                for error in &verdict.errors {
                    stderrln!("warning: a stop hook: {}", terminal_safe(error));
                }
                verdict.go_on.then(|| {
                    if verdict.reason.is_empty() {
                        "a stop hook asked you to go on".to_owned()
                    } else {
                        terminal_safe(&verdict.reason)
                    }
                })
            }
            other => {
                let why = other.err().map_or_else(
                    || "the hooks plugin answered another call's answer".to_owned(),
                    |e| e.to_string(),
                );
                stderrln!(
                    "warning: the stop hooks did not run: {}",
                    terminal_safe(&why)
                );
                None
            }
        }
    }

    /// The turn `call` runs in `session`, between the workspace's checkpoints before and after
    /// it (what its commands left: the states `keel rewind` goes back to; a checkpoint that
    /// fails is said, and the turn still runs): its report.
    async fn checkpointed_turn(
        &self,
        session: &str,
        call: impl std::future::Future<Output = Result<ServiceAnswer, keel_kernel::KernelError>>,
    ) -> (anyhow::Result<TurnReport>, Vec<String>) {
        let before = match self.kernel.checkpoint_before_turn(session) {
            Some(Err(e)) => {
                stderrln!("warning: no checkpoint before this turn: {e}");
                None
            }
            taken => taken.and_then(Result::ok),
        };
        let answer = call.await;
        let warnings = match self.kernel.checkpoint_after_turn() {
            Some(Err(e)) => vec![format!("warning: no checkpoint after this turn: {e}")],
            // What the turn's checkpoints left out (a store that filled, a file over the
            // size limit) is said now, not found at a rewind.
            Some(Ok(after)) => rewind::newly_not_recorded(before.as_ref(), &after),
            None => Vec::new(),
        };
        (self.report_of(answer), warnings)
    }

    /// The turn's report from the agent's answer, or why the turn failed.
    fn report_of(
        &self,
        answer: Result<ServiceAnswer, keel_kernel::KernelError>,
    ) -> anyhow::Result<TurnReport> {
        let answer = answer.map_err(|e| {
            let agent = self.agent_plugin();
            anyhow::anyhow!(
                "the turn failed: {}",
                failure::turn_failure(&e, &agent, &self.id())
            )
        })?;
        match answer {
            ServiceAnswer::TurnReport(report) => Ok(report),
            other => anyhow::bail!("the agent plugin answered a turn with {other:?}"),
        }
    }

    /// Run one turn for a client other than the terminal (an editor over ACP). Nothing is
    /// shown or asked here: the client reads the turn's events from `self.kernel.events()`,
    /// subscribed before this call, and answers approvals through the asker it started the
    /// session with. `cancel` finishing cancels the turn as Ctrl-C does in `keel run`. The
    /// same hooks, checkpoints and log check as [`Session::turn`]; a prompt a hook held back
    /// is not run.
    pub async fn turn_for_client(
        &self,
        input: &str,
        cancel: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<ClientTurn> {
        let input = match self.hooked_prompt(input).await? {
            Prompted::Ready(input) => input,
            Prompted::HeldBack(reason) => return Ok(ClientTurn::HeldBack(reason)),
        };
        // Shared, so each turn's call waits on the one cancel; once it fired, every later
        // turn is cancelled at once (and so is never asked to go on).
        let cancel = futures::FutureExt::shared(cancel);
        let call = |request: ServiceCall| {
            let cancel = cancel.clone();
            async move {
                self.kernel.begin_turn();
                let call = self.kernel.call_service_typed(&request);
                tokio::pin!(call);
                let mut cancelled = false;
                loop {
                    tokio::select! {
                        answer = &mut call => break answer,
                        () = cancel.clone(), if !cancelled => {
                            cancelled = true;
                            self.kernel.cancel_turn();
                        }
                    }
                }
            }
        };
        self.turns_until_stop(input, false, call)
            .await
            .map(ClientTurn::Ran)
    }

    /// `/compact [focus]`: the agent's conversation compacted now; what it says it did.
    pub async fn compact(&self, focus: &str) -> anyhow::Result<String> {
        let compact = ServiceCall::Compact(keel_protocol::CompactRequest {
            session: self.id(),
            focus: focus.to_owned(),
        });
        match self
            .agent_call(compact)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
        {
            ServiceAnswer::Compacted(done) => Ok(format!(
                "compacted: {} messages replaced by a summary, about {} → {} tokens",
                done.replaced, done.tokens_before, done.tokens_after
            )),
            other => anyhow::bail!("the agent plugin answered a compaction with {other:?}"),
        }
    }

    /// Call the agent (a turn, a compaction) as a turn: its events shown as they come, its
    /// questions asked, Ctrl-C cancelling it.
    async fn agent_call(
        &self,
        call: ServiceCall,
    ) -> Result<ServiceAnswer, keel_kernel::KernelError> {
        input::clear_interrupt();
        self.kernel.begin_turn();
        let mut events = self.kernel.events();
        let display = self.display;
        let last_result = self.last_result.clone();
        let result_lines = self.result_lines;
        let (turn_over, mut stop) = tokio::sync::oneshot::channel::<()>();
        let (questions, mut asked) = tokio::sync::mpsc::unbounded_channel::<input::Question>();
        input::route_questions(Some(questions));
        let printer = tokio::spawn(async move {
            let mut printer = Printer::new(display, last_result, result_lines);
            let mut draining = false;
            // On a terminal, a spinner says what the turn waits for while nothing is shown.
            let spin = display.is_human() && std::io::stderr().is_terminal();
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            loop {
                let next = if draining {
                    // Everything the turn emitted was queued before its call returned: show
                    // what is left, then stop.
                    match events.try_recv() {
                        Ok(event) => Ok(event),
                        Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                        Err(_) => break,
                    }
                } else {
                    tokio::select! {
                        next = events.recv() => next,
                        _ = &mut stop => {
                            draining = true;
                            printer.clear_spinner();
                            continue;
                        }
                        _ = tick.tick(), if spin => {
                            printer.spin();
                            continue;
                        }
                        Some((question, shown)) = asked.recv() => {
                            // What the turn emitted before it asked is shown first.
                            while let Ok(event) = events.try_recv() {
                                printer.show(display, &event);
                            }
                            printer.clear_spinner();
                            stderr!("{question}");
                            crate::std_streams::flush(crate::std_streams::Stream::Stderr);
                            let _ = shown.send(());
                            continue;
                        }
                    }
                };
                match next {
                    Ok(event) => {
                        printer.clear_spinner();
                        printer.show(display, &event);
                    }
                    Err(RecvError::Lagged(n)) => {
                        if display.is_human() {
                            stderrln!("[{n} display events skipped]");
                        }
                    }
                    Err(RecvError::Closed) => break,
                }
            }
            printer.finish();
            input::route_questions(None);
        });
        let kernel = self.kernel.clone();
        let call = kernel.call_service_typed(&call);
        tokio::pin!(call);
        let mut interrupts = 0;
        let mut terminating = false;
        let answer = loop {
            tokio::select! {
                answer = &mut call => break answer,
                // SIGTERM or SIGHUP: the turn ends as for Ctrl-C; a second signal leaves at
                // once (`signals`).
                () = signals::terminated(), if !terminating => {
                    terminating = true;
                    self.kernel.cancel_turn();
                    input::interrupt();
                }
                // Ctrl-C: a signal, or the line editor's key at an approval question.
                () = async {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        () = input::cancel_requested() => {}
                    }
                } => {
                    interrupts += 1;
                    if interrupts > 1 {
                        // The way out at once: the first Ctrl-C stops every call of the turn
                        // (the agent's own after 2 s); events still queued for the session
                        // log may be lost, which the person chose.
                        stderrln!("\n[second Ctrl-C: leaving now]");
                        std::process::exit(130);
                    }
                    self.kernel.cancel_turn();
                    input::interrupt();
                    if display.is_human() {
                        stderrln!("\n[cancelling the turn; press Ctrl-C again to leave at once]");
                    }
                }
            }
        };
        let _ = turn_over.send(());
        let _ = printer.await;
        answer
    }

    /// How a turn ended, as the display shows it.
    fn show_report(&self, report: &TurnReport) {
        let display = self.display;
        match display {
            // End the streamed text's line where the transcript went.
            Display::Human => stdoutln!(),
            Display::Answer => stderrln!(),
            Display::Json { .. } => {}
        }
        if display.is_human() {
            let ended = output::end_words(report.end);
            let detail = terminal_safe(&report.detail);
            match (report.end, report.detail.is_empty()) {
                (TurnEnd::Completed, true) => {}
                (TurnEnd::Completed, false) => stderrln!("[{detail}]"),
                (_, true) => stderrln!("[turn ended: {ended}]"),
                (_, false) => stderrln!("[turn ended: {ended}: {detail}]"),
            }
        }
        if display == Display::Answer && !report.text.is_empty() {
            // The model's words go through the display cleaner even into a pipe: `keel exec …
            // | cat` still ends on a terminal, where an escape sequence could write the
            // clipboard or retitle the window. `--raw` asks for the exact bytes, and only
            // into a pipe or file.
            if self.exact_answer && !std::io::stdout().is_terminal() {
                stdoutln!("{}", report.text);
            } else {
                stdoutln!("{}", terminal_safe(&report.text));
            }
        }
    }

    /// The last tool result in full, with its tool's name (`/expand`).
    pub fn last_result(&self) -> Option<(String, String)> {
        self.last_result
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Print the answer's exact bytes when stdout is not a terminal (`keel exec --raw`);
    /// otherwise it goes through the display cleaner.
    pub fn print_exact_answer(&mut self, exact: bool) {
        self.exact_answer = exact;
    }

    /// The workspace of the session.
    pub fn workspace(&self) -> &Path {
        &self.ctx_workspace
    }

    /// Unload everything (the session log flushes as its plugin deactivates).
    pub async fn close(&self) {
        if let Err(e) = self.kernel.shutdown().await {
            stderrln!("warning: {e}");
        }
        // After the unloading, so the exporter sees it; bounded whatever the collector does.
        if let Some(telemetry) = &self.telemetry {
            telemetry.close().await;
        }
        // What this session's `remember` added to an offered project memory stays offered.
        crate::commands::memory::keep_own_writes(
            &self.home,
            &self.ctx_workspace,
            &self.user_config,
        );
    }
}

fn rand_u32() -> u32 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

/// A kernel with the session's gates and only its model plugin: for the offline jobs that ask
/// the model one question (`keel memory consolidate`, `keel doctor --analyze`), never a tool.
pub async fn model_only(ctx: &Context) -> anyhow::Result<Kernel> {
    let choice = ModelChoice::from(ctx);
    offline_kernel(ctx, &[&format!("model-{}", choice.provider)]).await
}

/// One question to the `model` service of `kernel`, with no tools: the answer's text, or
/// what went wrong in words for a person.
pub async fn ask_model(
    kernel: &Kernel,
    system: String,
    question: String,
    max_tokens: u32,
) -> Result<String, String> {
    let request = keel_protocol::ModelRequest {
        compacts_on_overflow: false,
        conversation: None,
        model: String::new(),
        system,
        messages: vec![keel_protocol::Message::user_text(question)],
        tools: Vec::new(),
        max_tokens,
    };
    let payload = serde_json::to_string(&request).map_err(|e| e.to_string())?;
    let answer = kernel
        .call_service(services::MODEL, "complete", &payload)
        .await
        .map_err(|e| format!("the model failed: {e}"))?;
    let response: keel_protocol::ModelResponse =
        serde_json::from_str(&answer).map_err(|e| format!("a malformed answer: {e}"))?;
    Ok(response.message.text())
}

/// A kernel with the session's gates (no one to ask: what would need approval is refused) and
/// only the bundled plugins `names`, configured as a session would configure them.
pub async fn offline_kernel(ctx: &Context, names: &[&str]) -> anyhow::Result<Kernel> {
    let choice = ModelChoice::from(ctx);
    let runtime::Runtime { kernel, loader } = KernelBuilder::new(ctx)
        .approval(Some(ApprovalMode::Never))
        .build()?;
    let overrides = model_overrides(ctx, &choice)?;
    for name in names {
        let bundled = keel_bundled_plugins::get(name)
            .with_context(|| format!("no plugin `{name}` is bundled with keel"))?;
        let mut package = runtime::bundled_package(&loader, bundled)?;
        runtime::overlay_config(
            &mut package,
            overrides
                .iter()
                .filter(|(plugin, _, _)| plugin == name)
                .map(|(_, key, value)| (key.clone(), value.clone())),
        );
        runtime::apply_user_config(&ctx.config.config, &mut package)?;
        kernel.load(package).await?;
    }
    Ok(kernel)
}
