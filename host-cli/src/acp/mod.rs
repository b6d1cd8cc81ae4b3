//! `keel acp`: keel as an Agent Client Protocol agent on stdio, for editors (Zed, JetBrains,
//! Neovim …). Each ACP session is a keel session built by [`Session::start_asking`] — the
//! person's config, gates, sandbox and approvals exactly as `keel run` builds them — logged
//! where `keel sessions list` and `keel resume` find it. Approval questions go to the editor
//! as `session/request_permission`; `session/cancel` is Ctrl-C.
//!
//! The protocol is the `agent-client-protocol` crate's (its v1 agent side); keel's words are
//! put into its types in [`map`], and the approver bridging the kernel's blocking questions
//! to the client is [`asker`]. stdout carries only the protocol: keel's own output (a stray
//! print, a plugin's notice) goes to stderr, as fd 1 is pointed there before anything runs.

mod asker;
pub(crate) mod editor_mcp;
mod map;
mod workspace;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::{Agent as AgentRole, Client, Error, Lines};
use keel_kernel::gates::approvals::Answer;
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::sandbox::SandboxMode;

use crate::config::Context;
use crate::session::{ClientTurn, Display, Session, SessionOptions};

/// The largest message keel reads from the client; a longer line is dropped whole and
/// answered with a parse error, and keel goes on serving.
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;

/// How long a running turn may take to end once the editor has gone (it is cancelled: only
/// killing its commands and recording its end remain).
const TURN_END_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// The most sessions one `keel acp` keeps open at once (each is a kernel with its plugins).
const MAX_SESSIONS: usize = 16;

/// `keel acp`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct AcpArgs {
    /// How approvals are answered: `ask` puts each question to the editor, `never` refuses
    /// what needs approval, `auto` approves it (forbidden commands stay forbidden).
    #[arg(long, value_parser = crate::settings::approval_parser())]
    pub approval: Option<ApprovalMode>,
}

type Connection = agent_client_protocol::v1::ConnectionTo<Client>;

/// A session the editor drives.
struct Live {
    session: Session,
    asker: Arc<asker::EditorAsker>,
    /// The questions of this session's asker; held by the turn running.
    questions: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<asker::Question>>,
    /// Held while a prompt runs: one turn at a time.
    turn: tokio::sync::Mutex<()>,
    /// Set to cancel the turn running (`session/cancel`), `None` between turns.
    cancel: std::sync::Mutex<Option<tokio::sync::watch::Sender<bool>>>,
    workspace: PathBuf,
    /// The approval mode the session's kernel runs with; the editor may choose only among
    /// [`map::approval_modes`] of it.
    configured: ApprovalMode,
    /// The model's context window in tokens, as the agent loop compacts against it (0:
    /// unknown), for the usage updates.
    window: u64,
    /// The sandbox keel runs commands in (`[sandbox] mode`); the editor may choose only among
    /// [`map::sandbox_modes`] of it.
    sandbox_configured: SandboxMode,
    /// The sandbox sealed into this session's kernel.
    sandbox: SandboxMode,
    /// Whether a prompt ran: the sandbox is fixed from then on.
    prompted: AtomicBool,
    /// The MCP servers the editor passed, for a kernel built again with another sandbox.
    mcp_servers: Vec<acp::McpServer>,
    /// This session's place among the [`MAX_SESSIONS`], given back when it is dropped.
    _slot: SessionSlot,
    /// Set once the editor has gone: a turn starting from now on is cancelled at once.
    leaving: AtomicBool,
}

/// [`MAX_SESSIONS`], or in a debug build only (the tests), `KEEL_ACP_MAX_SESSIONS`.
fn max_sessions() -> usize {
    if cfg!(debug_assertions)
        && let Some(n) = std::env::var("KEEL_ACP_MAX_SESSIONS")
            .ok()
            .and_then(|v| v.parse().ok())
    {
        return n;
    }
    MAX_SESSIONS
}

/// In a debug build only (the tests): with `KEEL_ACP_HOLD_BEFORE_REGISTER=DIR`, a started session
/// waits before it is counted among the open ones — it marks `DIR/held` and waits (at most
/// 60 s) for `DIR/go` — so a test can send another `session/new` in that window, where a bound
/// counted from the open sessions would let it through.
async fn hold_before_registering() {
    let Some(dir) = std::env::var_os("KEEL_ACP_HOLD_BEFORE_REGISTER")
        .filter(|_| cfg!(debug_assertions))
        .map(std::path::PathBuf::from)
    else {
        return;
    };
    let _ = std::fs::write(dir.join("held"), b"");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !dir.join("go").exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// One of the [`MAX_SESSIONS`] places, taken before a session starts and given back when it
/// is dropped: taking one is a single atomic step, so concurrent `session/new`s cannot
/// together open more than the bound.
struct SessionSlot(Arc<std::sync::atomic::AtomicUsize>);

impl SessionSlot {
    /// A place, when fewer than [`MAX_SESSIONS`] are taken.
    fn take(taken: &Arc<std::sync::atomic::AtomicUsize>) -> Option<SessionSlot> {
        taken
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max_sessions()).then_some(n + 1)
            })
            .ok()
            .map(|_| SessionSlot(taken.clone()))
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Live {
    /// The approval mode the editor sees as current.
    fn approval(&self) -> &'static str {
        match self.configured {
            ApprovalMode::Ask if self.asker.is_never() => "never",
            ApprovalMode::Ask => "ask",
            ApprovalMode::Never => "never",
            ApprovalMode::Auto => "auto",
        }
    }

    /// The session mode the editor sees as current: plan mode while it is on, else the
    /// approval mode.
    fn mode(&self) -> &'static str {
        if self.session.kernel.plan_mode() {
            map::PLAN_MODE
        } else {
            self.approval()
        }
    }

    /// The session's modes as the editor is shown them.
    fn modes(&self) -> acp::SessionModeState {
        map::mode_state(self.configured, self.mode())
    }

    /// The session's config options as the editor is shown them.
    fn options(&self) -> Vec<acp::SessionConfigOption> {
        map::config_options(
            self.configured,
            self.approval(),
            self.session.kernel.plan_mode(),
            self.sandbox_configured,
            self.sandbox,
        )
    }

    /// Choose session mode `id`: plan mode, or one of [`map::approval_modes`] (which leaves
    /// plan mode).
    fn choose_mode(&self, id: &str) -> Result<(), Error> {
        if id == map::PLAN_MODE {
            self.session.kernel.set_plan_mode(true);
            return Ok(());
        }
        self.choose_approval(id)?;
        self.session.kernel.set_plan_mode(false);
        Ok(())
    }

    /// Choose approval mode `id` for this session: only one of [`map::approval_modes`].
    fn choose_approval(&self, id: &str) -> Result<(), Error> {
        if !map::approval_modes(self.configured)
            .iter()
            .any(|m| m.0 == id)
        {
            return Err(invalid_params(format!(
                "approval mode `{id}` is not offered for this session; keel runs with `{}`, \
                 and an editor may only choose a stricter mode",
                match self.configured {
                    ApprovalMode::Ask => "ask",
                    ApprovalMode::Never => "never",
                    ApprovalMode::Auto => "auto",
                }
            )));
        }
        self.asker
            .set_never(id == "never" && self.configured == ApprovalMode::Ask);
        Ok(())
    }

    /// Switch plan mode from keel's side (`/plan`, an accepted plan) and tell the editor: the
    /// current mode and the config options.
    fn set_plan(&self, cx: &Connection, on: bool) -> Result<(), Error> {
        self.session.kernel.set_plan_mode(on);
        let id = self.session.id();
        cx.send_notification(acp::SessionNotification::new(
            id.clone(),
            acp::SessionUpdate::CurrentModeUpdate(acp::CurrentModeUpdate::new(self.mode())),
        ))?;
        cx.send_notification(acp::SessionNotification::new(
            id,
            acp::SessionUpdate::ConfigOptionUpdate(acp::ConfigOptionUpdate::new(self.options())),
        ))
    }
}

/// The agent's state: the process's context and the sessions open.
struct State {
    base: Context,
    approval: Option<ApprovalMode>,
    initialized: AtomicBool,
    sessions: tokio::sync::Mutex<HashMap<String, Arc<Live>>>,
    /// The places taken among [`MAX_SESSIONS`]: sessions open and being started.
    slots: Arc<std::sync::atomic::AtomicUsize>,
    /// The client, when it offered `fs/read_text_file` at `initialize`: the file tools then
    /// read a workspace file as the editor holds it.
    files: std::sync::Mutex<Option<Connection>>,
}

/// A workspace file as the client holds it (`fs/read_text_file`), for `keel.editor`.
struct ClientFiles {
    client: Connection,
    session: String,
}

impl keel_kernel::EditorFiles for ClientFiles {
    fn read_text_file(
        &self,
        path: PathBuf,
    ) -> futures::future::BoxFuture<'static, Result<Option<String>, String>> {
        let client = self.client.clone();
        let request = acp::ReadTextFileRequest::new(self.session.clone(), path);
        Box::pin(async move {
            client
                .send_request(request)
                .block_task()
                .await
                .map(|read| Some(read.content))
                .map_err(|e| e.to_string())
        })
    }
}

/// `keel acp`: serve the client on stdin/stdout until it closes stdin.
pub async fn serve(ctx: &Context, args: AcpArgs) -> anyhow::Result<ExitCode> {
    let protocol_out = claim_stdout()?;
    let state = Arc::new(State {
        base: Context::new(Some(ctx.home.clone()), ctx.workspace.clone())?,
        approval: args.approval,
        initialized: AtomicBool::new(false),
        sessions: tokio::sync::Mutex::new(HashMap::new()),
        slots: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        files: std::sync::Mutex::new(None),
    });
    stderrln!("keel acp: serving the Agent Client Protocol on stdio");
    let transport = Lines::new(line_sink(protocol_out), line_stream(std::io::stdin()));
    let result = agent(state.clone()).connect_to(transport).await;
    // The client went away (its stdin closed, or the connection broke), perhaps in the middle
    // of turns: each running turn ends as `session/cancel` ends it — its commands killed, its
    // end recorded in the session's log — and then every session closes, so its log is
    // flushed. The turns run on tasks of their own, so the connection's end does not drop them.
    let sessions: Vec<Arc<Live>> = state
        .sessions
        .lock()
        .await
        .drain()
        .map(|(_, l)| l)
        .collect();
    for live in &sessions {
        live.leaving.store(true, Ordering::SeqCst);
        live.cancel_turn();
    }
    for live in &sessions {
        if tokio::time::timeout(TURN_END_BOUND, live.turn.lock())
            .await
            .is_err()
        {
            stderrln!(
                "keel acp: the turn of session {} did not end within {} s of the editor \
                 leaving; `keel resume {}` repairs its log",
                live.session.id(),
                TURN_END_BOUND.as_secs(),
                live.session.id()
            );
        }
    }
    for live in sessions {
        live.session.close().await;
    }
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => anyhow::bail!("the ACP connection failed: {e}"),
    }
}

/// The protocol's own copy of stdout; fd 1 then points at stderr, so nothing else keel
/// prints can corrupt the protocol stream.
fn claim_stdout() -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsFd as _;
    let stdout = std::io::stdout();
    let _locked = stdout.lock();
    let protocol = nix::unistd::dup(stdout.as_fd())
        .map_err(|e| anyhow::anyhow!("cannot duplicate stdout for the protocol: {e}"))?;
    nix::unistd::dup2_stdout(std::io::stderr().as_fd())
        .map_err(|e| anyhow::anyhow!("cannot point stdout at stderr: {e}"))?;
    Ok(std::fs::File::from(protocol))
}

/// Lines written to the protocol's stdout, each flushed.
fn line_sink(
    out: std::fs::File,
) -> std::pin::Pin<Box<dyn futures::Sink<String, Error = std::io::Error> + Send>> {
    let out = tokio::fs::File::from_std(out);
    Box::pin(futures::sink::unfold(out, async |mut out, line: String| {
        use tokio::io::AsyncWriteExt as _;
        out.write_all(line.as_bytes()).await?;
        out.write_all(b"\n").await?;
        out.flush().await?;
        Ok::<_, std::io::Error>(out)
    }))
}

/// The client's lines, read on a thread of their own, each at most [`MAX_MESSAGE_BYTES`]: a
/// longer one is skipped to its end and stands as a line that is not JSON, so the client is
/// answered with a parse error saying why, and the next message is read as usual.
fn line_stream(
    input: impl std::io::Read + Send + 'static,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = std::io::Result<String>> + Send>> {
    let (lines, received) = futures::channel::mpsc::channel::<std::io::Result<String>>(16);
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::with_capacity(64 << 10, input);
        let mut lines = lines;
        loop {
            let line = match read_bounded_line(&mut reader, MAX_MESSAGE_BYTES) {
                Ok(Some(line)) => Ok(line),
                Ok(None) => break,
                Err(e) => Err(e),
            };
            let failed = line.is_err();
            if futures::executor::block_on(futures::SinkExt::send(&mut lines, line)).is_err()
                || failed
            {
                break;
            }
        }
    });
    Box::pin(received)
}

/// One line of `reader` without its end, `None` at the end of input. A line longer than
/// `max` bytes is read past and replaced by a note that is not JSON.
fn read_bounded_line(
    reader: &mut impl std::io::BufRead,
    max: usize,
) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    let mut too_long = false;
    let mut any = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        any = true;
        let (taken, done) = match memchr_newline(buf) {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        if !too_long {
            let body = &buf[..if done { taken - 1 } else { taken }];
            if line.len() + body.len() > max {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(body);
            }
        }
        reader.consume(taken);
        if done {
            break;
        }
    }
    if !any {
        return Ok(None);
    }
    if too_long {
        return Ok(Some(format!(
            "keel: a message over {} MiB was dropped unread",
            max >> 20
        )));
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

fn memchr_newline(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

/// An error for the client, in words that say what to do.
fn error(code: agent_client_protocol::ErrorCode, message: impl Into<String>) -> Error {
    Error::new(code, message)
}

fn invalid_params(message: impl Into<String>) -> Error {
    error(agent_client_protocol::ErrorCode::INVALID_PARAMS, message)
}

fn internal(message: impl Into<String>) -> Error {
    error(agent_client_protocol::ErrorCode::INTERNAL_ERROR, message)
}

impl State {
    /// Refuse a call before `initialize`.
    fn check_initialized(&self) -> Result<(), Error> {
        if self.initialized.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(error(
                agent_client_protocol::ErrorCode::INVALID_REQUEST,
                "call `initialize` first",
            ))
        }
    }

    async fn live(&self, id: &acp::SessionId) -> Result<Arc<Live>, Error> {
        self.check_initialized()?;
        self.sessions
            .lock()
            .await
            .get(id.0.as_ref())
            .cloned()
            .ok_or_else(|| {
                invalid_params(format!(
                    "there is no open session `{}`; start one with `session/new` or open a \
                     logged one with `session/load`",
                    id.0
                ))
            })
    }

    /// The context of a session in `cwd`: the person's home and config, the project config
    /// of that workspace.
    fn context_for(&self, cwd: &Path) -> Result<Context, Error> {
        if !cwd.is_absolute() {
            return Err(invalid_params("`cwd` must be an absolute path"));
        }
        if !cwd.is_dir() {
            return Err(invalid_params(format!(
                "`cwd` {} is not a directory",
                cwd.display()
            )));
        }
        if let Some(refusal) =
            workspace::refusal(cwd, workspace::person_home().as_deref(), &self.base.home)
        {
            return Err(invalid_params(refusal));
        }
        Context::new(Some(self.base.home.clone()), cwd.to_owned())
            .map_err(|e| invalid_params(format!("cannot use {}: {e:#}", cwd.display())))
    }

    /// Start (or, with `resume`, reopen) a keel session in `cwd` for the client, with the
    /// MCP servers it passed that the person approved ([`editor_mcp`]); the session, and what
    /// to tell the person about the servers not started.
    /// `sandbox`, one of [`map::sandbox_modes`], replaces the configured one for this session.
    async fn open(
        &self,
        cwd: &Path,
        resume: Option<String>,
        mcp_servers: &[acp::McpServer],
        sandbox: Option<SandboxMode>,
    ) -> Result<(Arc<Live>, Vec<String>), Error> {
        self.check_initialized()?;
        let mut ctx = self.context_for(cwd)?;
        let sandbox_configured = match &ctx.config.sandbox.mode {
            Some(mode) => SandboxMode::parse(mode).map_err(|e| {
                internal(format!(
                    "{}: [sandbox] mode: {e}",
                    ctx.home.join("config.toml").display()
                ))
            })?,
            None => SandboxMode::default(),
        };
        if let Some(chosen) = sandbox {
            ctx.config.sandbox.mode = Some(chosen.as_str().to_owned());
        }
        let notices =
            editor_mcp::add_approved(&ctx.home, &ctx.workspace, mcp_servers, &mut ctx.config);
        // The servers' names, commands and arguments came from the client.
        for notice in &notices {
            stderrln!(
                "keel acp: MCP server {}",
                crate::session::terminal_safe(notice)
            );
        }
        let configured = match self.approval {
            Some(mode) => mode,
            None => crate::settings::load_policy(&ctx)
                .map_err(|e| internal(format!("{e:#}")))?
                .approval(),
        };
        let Some(slot) = SessionSlot::take(&self.slots) else {
            return Err(internal(format!(
                "{} sessions are open in this agent (the most it keeps); close one first",
                max_sessions()
            )));
        };
        let (editor, questions) = asker::EditorAsker::new();
        let editor = Arc::new(editor);
        let started = Session::start_asking(
            &ctx,
            SessionOptions {
                approval: self.approval,
                extra_plugins: Vec::new(),
                display: Display::Answer,
                resume,
                overrides: Vec::new(),
            },
            Some(editor.clone()),
        )
        .await;
        let session = started.map_err(|e| internal(format!("{e:#}")))?;
        hold_before_registering().await;
        let client = self
            .files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(client) = client {
            session.kernel.attach_editor(Some(Arc::new(ClientFiles {
                client,
                session: session.id(),
            })));
        }
        let live = Arc::new(Live {
            session,
            asker: editor,
            questions: tokio::sync::Mutex::new(questions),
            turn: tokio::sync::Mutex::new(()),
            cancel: std::sync::Mutex::new(None),
            workspace: ctx.workspace.clone(),
            configured,
            window: context_window(&ctx),
            sandbox_configured,
            sandbox: sandbox.unwrap_or(sandbox_configured),
            prompted: AtomicBool::new(false),
            mcp_servers: mcp_servers.to_vec(),
            _slot: slot,
            leaving: AtomicBool::new(false),
        });
        self.sessions
            .lock()
            .await
            .insert(live.session.id(), live.clone());
        Ok((live, notices))
    }
}

/// The context window the session's agent loop compacts against: `[model] context-window`,
/// or the model's as keel knows it by name; 0 when unknown.
fn context_window(ctx: &Context) -> u64 {
    ctx.config
        .model
        .context_window
        .or_else(|| {
            crate::settings::ModelChoice::from(ctx)
                .model
                .as_deref()
                .and_then(keel_agent_kit::compaction::known_context_window)
        })
        .unwrap_or(0)
}

/// Tell the person, in the editor's thread, what became of the MCP servers the editor passed
/// that keel did not start, and how to approve them.
fn tell_mcp_notices(cx: &Connection, session: &str, notices: &[String]) -> Result<(), Error> {
    if notices.is_empty() {
        return Ok(());
    }
    let text = notices
        .iter()
        .map(|n| format!("keel: MCP server {n}\n"))
        .collect::<String>();
    cx.send_notification(acp::SessionNotification::new(
        session.to_owned(),
        acp::SessionUpdate::AgentMessageChunk(acp::ContentChunk::new(acp::ContentBlock::Text(
            acp::TextContent::new(text),
        ))),
    ))
}

/// The slash commands that make sense from an editor: `/compact [focus]` and
/// `/plan [request]`. The terminal's others manage the terminal session (`/load`, `/reload`,
/// `/expand`, `/exit` …) or have the editor's own controls (`/sessions`, `/clear`: its session
/// list and new thread).
fn available_commands() -> Vec<acp::AvailableCommand> {
    vec![
        acp::AvailableCommand::new(
            "compact",
            "compact the conversation now: its oldest turns replaced by a summary",
        )
        .input(acp::AvailableCommandInput::Unstructured(
            acp::UnstructuredCommandInput::new("what the summary should keep in focus (optional)"),
        )),
        acp::AvailableCommand::new(
            "plan",
            "plan mode on or off; with a request, plan mode on and the request asked at once",
        )
        .input(acp::AvailableCommandInput::Unstructured(
            acp::UnstructuredCommandInput::new("what to plan (optional)"),
        )),
    ]
}

/// A prompt that is one of [`available_commands`].
#[derive(Debug, PartialEq, Eq)]
enum Command<'a> {
    /// `/compact [focus]`.
    Compact(&'a str),
    /// `/plan [request]`.
    Plan(&'a str),
}

fn command(input: &str) -> Option<Command<'_>> {
    let input = input.trim_start();
    let argument = |name: &str| {
        let rest = input.strip_prefix(name)?;
        (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| rest.trim())
    };
    argument("/compact")
        .map(Command::Compact)
        .or_else(|| argument("/plan").map(Command::Plan))
}

fn agent(
    state: Arc<State>,
) -> agent_client_protocol::v1::Builder<
    AgentRole,
    impl agent_client_protocol::HandleDispatchFrom<Client> + 'static,
> {
    let s_init = state.clone();
    let s_auth = state.clone();
    let s_new = state.clone();
    let s_load = state.clone();
    let s_resume = state.clone();
    let s_list = state.clone();
    let s_prompt = state.clone();
    let s_cancel = state.clone();
    let s_mode = state.clone();
    let s_option = state.clone();
    AgentRole
        .v1()
        .name("keel")
        .on_receive_request(
            async move |request: acp::InitializeRequest, responder, cx: Connection| {
                s_init.initialized.store(true, Ordering::SeqCst);
                *s_init
                    .files
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    request.client_capabilities.fs.read_text_file.then_some(cx);
                responder.respond(initialize(&s_init.base, &request))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::AuthenticateRequest, responder, _cx| {
                responder.respond_with_result(
                    s_auth
                        .check_initialized()
                        .and_then(|()| authenticate(&s_auth.base, &request)),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::NewSessionRequest, responder, cx: Connection| {
                let state = s_new.clone();
                // Loading a session's plugins takes a moment: not on the dispatch loop.
                cx.clone().spawn(async move {
                    let (live, notices) = match state
                        .open(&request.cwd, None, &request.mcp_servers, None)
                        .await
                    {
                        Ok(opened) => opened,
                        Err(e) => return responder.respond_with_error(e),
                    };
                    let id = live.session.id();
                    responder.respond(
                        acp::NewSessionResponse::new(id.clone())
                            .modes(live.modes())
                            .config_options(live.options()),
                    )?;
                    opened(&cx, &id, &notices)
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::LoadSessionRequest, responder, cx: Connection| {
                let state = s_load.clone();
                cx.clone().spawn(async move {
                    let id = request.session_id.0.to_string();
                    match load(&state, &cx, &request.cwd, &id, &request.mcp_servers, true).await {
                        Ok((live, notices)) => {
                            responder.respond(
                                acp::LoadSessionResponse::new()
                                    .modes(live.modes())
                                    .config_options(live.options()),
                            )?;
                            opened(&cx, &id, &notices)
                        }
                        Err(e) => responder.respond_with_error(e),
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::ResumeSessionRequest, responder, cx: Connection| {
                let state = s_resume.clone();
                // `session/load` without the replay: the editor still shows the thread.
                cx.clone().spawn(async move {
                    let id = request.session_id.0.to_string();
                    match load(&state, &cx, &request.cwd, &id, &request.mcp_servers, false).await {
                        Ok((live, notices)) => {
                            responder.respond(
                                acp::ResumeSessionResponse::new()
                                    .modes(live.modes())
                                    .config_options(live.options()),
                            )?;
                            opened(&cx, &id, &notices)
                        }
                        Err(e) => responder.respond_with_error(e),
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::ListSessionsRequest, responder, cx: Connection| {
                let state = s_list.clone();
                cx.spawn(async move { responder.respond_with_result(list(&state, &request).await) })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::PromptRequest, responder, cx: Connection| {
                let state = s_prompt.clone();
                cx.clone().spawn(async move {
                    let live = match state.live(&request.session_id).await {
                        Ok(live) => live,
                        Err(e) => return responder.respond_with_error(e),
                    };
                    // On a task of its own: when the editor goes away the connection's tasks
                    // are dropped, and the turn must still end as a cancel ends it (`serve`).
                    let turn = tokio::spawn(async move { prompt(&live, &cx, &request).await });
                    responder.respond_with_result(
                        turn.await
                            .unwrap_or_else(|e| Err(internal(format!("the turn stopped: {e}")))),
                    )
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::SetSessionModeRequest, responder, _cx| {
                let chosen = match s_mode.live(&request.session_id).await {
                    Ok(live) => live.choose_mode(&request.mode_id.0),
                    Err(e) => Err(e),
                };
                responder.respond_with_result(chosen.map(|()| acp::SetSessionModeResponse::new()))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: acp::SetSessionConfigOptionRequest, responder, cx: Connection| {
                let state = s_option.clone();
                // A sandbox chosen builds the session's kernel again: not on the dispatch loop.
                cx.spawn(async move {
                    let chosen = async {
                        let live = state.live(&request.session_id).await?;
                        let acp::SessionConfigOptionValue::ValueId { value } = &request.value
                        else {
                            return Err(invalid_params(format!(
                                "`{}` takes one of its values",
                                request.config_id.0
                            )));
                        };
                        let live = match request.config_id.0.as_ref() {
                            map::APPROVAL_OPTION => {
                                live.choose_approval(&value.0)?;
                                live
                            }
                            map::PLAN_OPTION => {
                                match value.0.as_ref() {
                                    "on" => live.session.kernel.set_plan_mode(true),
                                    "off" => live.session.kernel.set_plan_mode(false),
                                    other => {
                                        return Err(invalid_params(format!(
                                            "`plan` is `on` or `off`, not `{other}`"
                                        )));
                                    }
                                }
                                live
                            }
                            map::SANDBOX_OPTION => choose_sandbox(&state, live, &value.0).await?,
                            other => {
                                return Err(invalid_params(format!(
                                    "keel has no config option `{other}`"
                                )));
                            }
                        };
                        Ok(acp::SetSessionConfigOptionResponse::new(live.options()))
                    };
                    responder.respond_with_result(chosen.await)
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: acp::CancelNotification, _cx| {
                if let Ok(live) = s_cancel.live(&notification.session_id).await {
                    live.cancel_turn();
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
}

fn initialize(ctx: &Context, request: &acp::InitializeRequest) -> acp::InitializeResponse {
    let _ = request;
    let capabilities = acp::AgentCapabilities::new()
        .load_session(true)
        .prompt_capabilities(
            acp::PromptCapabilities::new()
                .image(false)
                .audio(false)
                .embedded_context(true),
        )
        .mcp_capabilities(acp::McpCapabilities::new().http(true).sse(false))
        .session_capabilities(
            acp::SessionCapabilities::new()
                .list(acp::SessionListCapabilities::new())
                .resume(acp::SessionResumeCapabilities::new()),
        );
    acp::InitializeResponse::new(agent_client_protocol::schema::ProtocolVersion::V1)
        .agent_capabilities(capabilities)
        .auth_methods(auth_methods(ctx))
        .agent_info(acp::Implementation::new("keel", env!("CARGO_PKG_VERSION")).title("keel"))
}

/// The way to give keel the configured provider's key: the environment variable, or the
/// `[secrets]` entry of the same name in keel's config.
fn auth_methods(ctx: &Context) -> Vec<acp::AuthMethod> {
    let choice = crate::settings::ModelChoice::from(ctx);
    let Some(name) = choice.secret_name() else {
        return Vec::new();
    };
    vec![acp::AuthMethod::Agent(
        acp::AuthMethodAgent::new(name.to_owned(), format!("Set {name}")).description(format!(
            "keel reads the key of the model provider `{}` from the environment variable \
                 {name}, or from the entry {name} under [secrets] in {}; set one, then start \
                 the agent again",
            choice.provider,
            ctx.home.join("config.toml").display()
        )),
    )]
}

/// `authenticate`: keel never takes a key over the protocol; this says whether the key of
/// the configured provider is set, and where to set it when it is not.
fn authenticate(
    ctx: &Context,
    request: &acp::AuthenticateRequest,
) -> Result<acp::AuthenticateResponse, Error> {
    let choice = crate::settings::ModelChoice::from(ctx);
    let Some(name) = choice.secret_name() else {
        return Ok(acp::AuthenticateResponse::new());
    };
    if request.method_id.0.as_ref() != name {
        return Err(invalid_params(format!(
            "keel offers the method `{name}` only (see `authMethods`)"
        )));
    }
    if choice.base_url.is_some() || crate::settings::secrets(ctx).contains(name) {
        return Ok(acp::AuthenticateResponse::new());
    }
    Err(Error::auth_required().data(serde_json::json!({
        "message": format!(
            "no API key for the model provider `{}`: set {name} in the environment keel is \
             started with, or add {name} under [secrets] in {}, then start the agent again",
            choice.provider,
            ctx.home.join("config.toml").display()
        )
    })))
}

/// After a session was opened (new, loaded or resumed) and answered: its commands, and what
/// became of the MCP servers the editor passed.
fn opened(cx: &Connection, session: &str, notices: &[String]) -> Result<(), Error> {
    announce_commands(cx, session)?;
    tell_mcp_notices(cx, session, notices)
}

fn announce_commands(cx: &Connection, session: &str) -> Result<(), Error> {
    cx.send_notification(acp::SessionNotification::new(
        session.to_owned(),
        acp::SessionUpdate::AvailableCommandsUpdate(acp::AvailableCommandsUpdate::new(
            available_commands(),
        )),
    ))
}

impl Live {
    fn cancel_turn(&self) {
        self.asker.set_cancelled(true);
        if let Some(cancel) = self
            .cancel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            let _ = cancel.send(true);
        }
    }
}

/// `session/prompt`: one turn, its events streamed as updates, its approval questions put to
/// the client; the answer once every update is sent. In plan mode a turn that ends with a
/// plan is offered to the client to accept, which leaves plan mode and carries it out.
async fn prompt(
    live: &Arc<Live>,
    cx: &Connection,
    request: &acp::PromptRequest,
) -> Result<acp::PromptResponse, Error> {
    let mut input = prompt_input(live, &request.prompt).await?;
    let Ok(_turn) = live.turn.try_lock() else {
        return Err(error(
            agent_client_protocol::ErrorCode::INVALID_REQUEST,
            "a prompt is already running in this session; wait for it or cancel it",
        ));
    };
    live.prompted.store(true, Ordering::SeqCst);
    match command(&input) {
        Some(Command::Compact(focus)) => {
            let said = live
                .session
                .compact(focus)
                .await
                .unwrap_or_else(|e| format!("compaction failed: {e:#}"));
            say(cx, live, said)?;
            return Ok(acp::PromptResponse::new(acp::StopReason::EndTurn));
        }
        Some(Command::Plan("")) => {
            let on = !live.session.kernel.plan_mode();
            live.set_plan(cx, on)?;
            say(
                cx,
                live,
                if on {
                    "plan mode: on — the model only reads and ends with a plan for you to accept"
                } else {
                    "plan mode: off — tools and commands as the session allows"
                },
            )?;
            return Ok(acp::PromptResponse::new(acp::StopReason::EndTurn));
        }
        Some(Command::Plan(request)) => {
            let request = request.to_owned();
            if !live.session.kernel.plan_mode() {
                live.set_plan(cx, true)?;
            }
            input = request;
        }
        None => {}
    }
    let Turned::Ended(report, stop) = one_turn(live, cx, &input).await? else {
        return Ok(acp::PromptResponse::new(acp::StopReason::Refusal));
    };
    if live.session.kernel.plan_mode()
        && report.end == keel_protocol::TurnEnd::Completed
        && !report.text.trim().is_empty()
        && offer_plan(live, cx, &report.text).await?
    {
        live.set_plan(cx, false)?;
        let carry_out = crate::commands::run::carry_out(&report.text);
        return Ok(acp::PromptResponse::new(
            match one_turn(live, cx, &carry_out).await? {
                Turned::Ended(_, stop) => stop,
                Turned::HeldBack => acp::StopReason::Refusal,
            },
        ));
    }
    Ok(acp::PromptResponse::new(stop))
}

/// The prompt's blocks as the text of keel's turn: the person's words as they are, and what
/// the editor attached cleaned and fenced as data by the kernel's own fence (`keel.prompt`
/// `fence`, the cleaning `read_file`'s output gets), so a file's text cannot close its
/// wrapper and pass for the person's request.
async fn prompt_input(live: &Live, blocks: &[acp::ContentBlock]) -> Result<String, Error> {
    let mut text = Vec::new();
    for part in map::prompt_parts(blocks).map_err(invalid_params)? {
        match part {
            map::PromptPart::Said(said) => text.push(said),
            map::PromptPart::Attached { source, text: body } => {
                let request = serde_json::json!({ "source": source, "text": body }).to_string();
                let fenced = live
                    .session
                    .kernel
                    .call_service(keel_protocol::services::PROMPT, "fence", &request)
                    .await
                    .map_err(|e| internal(format!("cannot fence what the editor attached: {e}")))?;
                text.push(fenced);
            }
        }
    }
    Ok(text.join("\n"))
}

/// Words of keel's to the client, as the agent's message.
fn say(cx: &Connection, live: &Live, text: impl Into<String>) -> Result<(), Error> {
    cx.send_notification(acp::SessionNotification::new(
        live.session.id(),
        acp::SessionUpdate::AgentMessageChunk(acp::ContentChunk::new(acp::ContentBlock::Text(
            acp::TextContent::new(text.into()),
        ))),
    ))
}

/// How one turn for the client went.
enum Turned {
    /// It ran: its report and the stop reason the client is told.
    Ended(keel_protocol::TurnReport, acp::StopReason),
    /// A `user-prompt-submit` hook held the prompt back (the client was told why).
    HeldBack,
}

/// Run one turn of `input`, streaming its events and putting its questions to the client;
/// `session/cancel` cancels it.
async fn one_turn(live: &Arc<Live>, cx: &Connection, input: &str) -> Result<Turned, Error> {
    let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
    *live
        .cancel
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cancel);
    live.asker.set_cancelled(false);
    if live.leaving.load(Ordering::SeqCst) {
        // The editor went away as this turn was starting: it ends as a cancelled one.
        live.cancel_turn();
    }
    let events = live.session.kernel.events();
    let mut questions = live.questions.lock().await;
    let (over, turn_over) = tokio::sync::oneshot::channel::<()>();
    let session_id = live.session.id();
    let pump = pump(
        cx,
        &session_id,
        &live.workspace,
        live.window,
        events,
        &mut questions,
        &live.asker,
        cancelled.clone(),
        turn_over,
    );
    let turn = async {
        let cancel = async move {
            if cancelled.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let report = live.session.turn_for_client(input, cancel).await;
        let _ = over.send(());
        report
    };
    let (view, report) = tokio::join!(pump, turn);
    *live
        .cancel
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    let report = match report.map_err(|e| internal(format!("{e:#}")))? {
        ClientTurn::Ran(report) => report,
        ClientTurn::HeldBack(reason) => {
            // The person's own rule refused the prompt: said as the agent's answer.
            say(
                cx,
                live,
                format!("a user-prompt-submit hook held the prompt back: {reason}"),
            )?;
            return Ok(Turned::HeldBack);
        }
    };
    match map::stop_reason(&report, view.last_stop) {
        Some(stop) => Ok(Turned::Ended(report, stop)),
        None => Err(internal(format!(
            "the model call failed: {}",
            if report.detail.is_empty() {
                "no detail"
            } else {
                &report.detail
            }
        ))),
    }
}

/// After a plan-mode turn that ended with `plan`: show it as the client's plan and ask
/// whether to leave plan mode and carry it out. `session/cancel` while it waits is a no.
async fn offer_plan(live: &Arc<Live>, cx: &Connection, plan: &str) -> Result<bool, Error> {
    let id = live.session.id();
    cx.send_notification(acp::SessionNotification::new(
        id.clone(),
        acp::SessionUpdate::Plan(acp::Plan::new(map::plan_entries(plan))),
    ))?;
    let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
    *live
        .cancel
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cancel);
    let call_id = format!("keel-plan-{}", crate::session::now_ms());
    let (call, options) = map::plan_question(call_id.clone(), plan);
    let asked = cx
        .send_request(acp::RequestPermissionRequest::new(
            id.clone(),
            call,
            options,
        ))
        .block_task();
    let accepted = tokio::select! {
        outcome = asked => matches!(
            outcome,
            Ok(acp::RequestPermissionResponse {
                outcome: acp::RequestPermissionOutcome::Selected(ref chosen),
                ..
            }) if chosen.option_id.0.as_ref() == map::PLAN_ACCEPT
        ),
        _ = cancelled.wait_for(|c| *c) => false,
    };
    *live
        .cancel
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    cx.send_notification(acp::SessionNotification::new(
        id,
        acp::SessionUpdate::ToolCallUpdate(acp::ToolCallUpdate::new(
            call_id,
            acp::ToolCallUpdateFields::new().status(if accepted {
                acp::ToolCallStatus::Completed
            } else {
                acp::ToolCallStatus::Failed
            }),
        )),
    ))?;
    Ok(accepted)
}

/// Choose sandbox `value` for a session that has not prompted yet. The sandbox is sealed into
/// a kernel when it is built, so the session's kernel is built again with it, the same session
/// resumed (its log, its id); after the first prompt a change is refused, plainly.
async fn choose_sandbox(state: &State, live: Arc<Live>, value: &str) -> Result<Arc<Live>, Error> {
    let Some(mode) = map::sandbox_modes(live.sandbox_configured)
        .into_iter()
        .map(|(mode, _, _)| mode)
        .find(|mode| mode.as_str() == value)
    else {
        return Err(invalid_params(format!(
            "sandbox `{value}` is not offered for this session; keel runs commands in `{}`, and \
             an editor may only choose a stricter one",
            live.sandbox_configured.as_str()
        )));
    };
    if mode == live.sandbox {
        return Ok(live);
    }
    let (id, workspace, servers, never) = {
        let Ok(_turn) = live.turn.try_lock() else {
            return Err(error(
                agent_client_protocol::ErrorCode::INVALID_REQUEST,
                "a prompt is running in this session; its sandbox cannot change",
            ));
        };
        if live.prompted.load(Ordering::SeqCst) {
            return Err(invalid_params(
                "a session's sandbox is fixed once a prompt ran in it (it is sealed into the \
                 session's kernel); start a new session and choose the sandbox before its first \
                 prompt",
            ));
        }
        let id = live.session.id();
        state.sessions.lock().await.remove(&id);
        live.session.close().await;
        (
            id,
            live.workspace.clone(),
            live.mcp_servers.clone(),
            live.asker.is_never(),
        )
    };
    // The session ends here (its kernel, its mark as running) before it is opened again.
    drop(live);
    let (live, _) = state
        .open(&workspace, Some(id), &servers, Some(mode))
        .await?;
    live.asker.set_never(never);
    Ok(live)
}

/// Forward the turn's events as updates and put its questions to the client until the turn
/// is over, then send what it emitted last. What it showed, for the stop reason.
#[allow(clippy::too_many_arguments)]
async fn pump(
    cx: &Connection,
    session: &str,
    workspace: &Path,
    window: u64,
    mut events: tokio::sync::broadcast::Receiver<keel_kernel::Event>,
    questions: &mut tokio::sync::mpsc::UnboundedReceiver<asker::Question>,
    editor: &asker::EditorAsker,
    mut cancelled: tokio::sync::watch::Receiver<bool>,
    mut turn_over: tokio::sync::oneshot::Receiver<()>,
) -> map::TurnView {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    let mut view = map::TurnView::default();
    view.window = window;
    let send = |view: &mut map::TurnView, event: &keel_kernel::Event| {
        for update in view.updates(workspace, &event.topic, &event.payload) {
            let _ = cx.send_notification(acp::SessionNotification::new(session.to_owned(), update));
        }
    };
    loop {
        tokio::select! {
            next = events.recv() => match next {
                Ok(event) => send(&mut view, &event),
                Err(RecvError::Lagged(n)) => stderrln!("keel acp: {n} events skipped"),
                Err(RecvError::Closed) => break,
            },
            Some(question) = questions.recv() => {
                // What the turn emitted before it asked reaches the client first.
                while let Ok(event) = events.try_recv() {
                    send(&mut view, &event);
                }
                let answer = ask(cx, session, workspace, &mut view, &question.request, editor, &mut cancelled).await;
                let _ = question.answer.send(answer);
            }
            _ = &mut turn_over => break,
        }
    }
    loop {
        match events.try_recv() {
            Ok(event) => send(&mut view, &event),
            Err(TryRecvError::Lagged(_)) => {}
            Err(_) => break,
        }
    }
    // A question asked as the turn ended (none should be) is a no.
    while let Ok(question) = questions.try_recv() {
        let _ = question.answer.send(Answer::Deny);
    }
    view
}

/// Put one approval question to the client; a cancel while it waits is a no at once.
#[allow(clippy::too_many_arguments)]
async fn ask(
    cx: &Connection,
    session: &str,
    workspace: &Path,
    view: &mut map::TurnView,
    request: &keel_kernel::gates::approvals::ApprovalRequest,
    editor: &asker::EditorAsker,
    cancelled: &mut tokio::sync::watch::Receiver<bool>,
) -> Answer {
    if *cancelled.borrow() {
        return Answer::Deny;
    }
    let call_id = view.call_asked_about(request);
    let call = map::permission_call(workspace, call_id.clone(), request);
    let sent = cx
        .send_request(acp::RequestPermissionRequest::new(
            session.to_owned(),
            call,
            map::permission_options(request),
        ))
        .block_task();
    let outcome = tokio::select! {
        outcome = sent => outcome,
        _ = cancelled.wait_for(|c| *c) => return Answer::Deny,
    };
    let Ok(response) = outcome else {
        return Answer::Deny;
    };
    let (answer, refuse_key) = map::answer(request, &response.outcome);
    if refuse_key && let Some(key) = &request.key {
        editor.refuse(key);
    }
    // A yes starts the call: the editor shows it running from now on.
    if answer != Answer::Deny
        && let Some(id) = call_id
    {
        let _ = cx.send_notification(acp::SessionNotification::new(
            session.to_owned(),
            acp::SessionUpdate::ToolCallUpdate(acp::ToolCallUpdate::new(
                id,
                acp::ToolCallUpdateFields::new().status(acp::ToolCallStatus::InProgress),
            )),
        ));
    }
    answer
}

/// `session/load` (`replay`) and `session/resume`: open the logged session `id` (its
/// conversation given back to the agent, as `keel resume` does); for a load, replay its whole
/// history to the client.
async fn load(
    state: &State,
    cx: &Connection,
    cwd: &Path,
    id: &str,
    mcp_servers: &[acp::McpServer],
    replay: bool,
) -> Result<(Arc<Live>, Vec<String>), Error> {
    if state.sessions.lock().await.contains_key(id) {
        return Err(invalid_params(format!("session `{id}` is already open")));
    }
    let (live, notices) = state
        .open(cwd, Some(id.to_owned()), mcp_servers, None)
        .await?;
    if !replay {
        return Ok((live, notices));
    }
    let conversation = crate::commands::sessions::conversation(&live.session.kernel, id, true)
        .await
        .map_err(|e| internal(format!("cannot read session `{id}`: {e:#}")))?;
    for update in map::replay(&live.workspace, &conversation.messages) {
        cx.send_notification(acp::SessionNotification::new(id.to_owned(), update))?;
    }
    Ok((live, notices))
}

/// `session/list`: the sessions of keel's log, those begun in `cwd` when it is given.
async fn list(
    state: &State,
    request: &acp::ListSessionsRequest,
) -> Result<acp::ListSessionsResponse, Error> {
    state.check_initialized()?;
    let kernel = crate::commands::sessions::session_log_kernel(&state.base)
        .await
        .map_err(|e| internal(format!("{e:#}")))?;
    let listed = crate::commands::sessions::list(&kernel)
        .await
        .map_err(|e| internal(format!("cannot list the sessions: {e:#}")));
    let _ = kernel.shutdown().await;
    let listed = listed?;
    let wanted = request
        .cwd
        .as_ref()
        .map(|c| c.canonicalize().unwrap_or(c.clone()));
    let sessions = listed
        .into_iter()
        .filter_map(|s| {
            let workspace = PathBuf::from(s.workspace?);
            if wanted.as_ref().is_some_and(|w| *w != workspace) {
                return None;
            }
            Some(
                acp::SessionInfo::new(s.id, workspace)
                    .title(s.preview)
                    .updated_at(s.last_time_ms.map(rfc3339)),
            )
        })
        .collect();
    Ok(acp::ListSessionsResponse::new(sessions))
}

/// Milliseconds since the epoch as an RFC 3339 UTC time.
fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_over_the_bound_is_dropped_and_the_next_read() -> std::io::Result<()> {
        let input = format!("{}\n{{\"ok\":1}}\r\nlast", "x".repeat(100));
        let mut reader = std::io::BufReader::with_capacity(8, input.as_bytes());
        let first = read_bounded_line(&mut reader, 50)?.unwrap_or_default();
        assert!(first.starts_with("keel: a message over"), "{first}");
        assert_eq!(
            read_bounded_line(&mut reader, 50)?.as_deref(),
            Some("{\"ok\":1}")
        );
        assert_eq!(read_bounded_line(&mut reader, 50)?.as_deref(), Some("last"));
        assert_eq!(read_bounded_line(&mut reader, 50)?, None);
        Ok(())
    }

    #[test]
    fn only_compact_and_plan_are_commands() {
        assert_eq!(command("/compact"), Some(Command::Compact("")));
        assert_eq!(
            command(" /compact the API design "),
            Some(Command::Compact("the API design"))
        );
        assert_eq!(command("/compaction is what?"), None);
        assert_eq!(command("please /compact"), None);
        assert_eq!(command("/clear"), None);
        assert_eq!(command("/plan"), Some(Command::Plan("")));
        assert_eq!(
            command("/plan the migration"),
            Some(Command::Plan("the migration"))
        );
        assert_eq!(command("/planet"), None);
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_892_800_000), "2025-12-05T00:00:00Z");
    }
}
