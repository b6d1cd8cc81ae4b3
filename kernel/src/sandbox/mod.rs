//! The OS sandbox every command keel starts runs in (Linux, bubblewrap). The exec policy decides
//! what to ask about; this is what contains a command once it runs.
//!
//! `workspace-write` (the default): the root file system read-only; the workspace read-write
//! except its control directories ([`PROTECTED_IN_WORKSPACE`]: `.git`, `.hg`, `.jj`, `.svn`,
//! `.keel`, `.claude/skills`), which stay read-only (a command must not plant a hook or a
//! `core.fsmonitor` that git runs outside the sandbox later, a skill keel offers the model, nor
//! rewrite keel's project config); a private `/tmp`; keel's home replaced by an empty
//! directory; every path of the deny-read list hidden (an empty directory over a directory,
//! `/dev/null` over a file); new user, PID, IPC, UTS, cgroup and network namespaces; the
//! sandbox dies with keel and runs in a new session (no terminal injection). `read-only` is the
//! same with the workspace read-only too.
//!
//! The environment a sandboxed process starts with is not keel's: only the variables of
//! [`PASSED_ENV`] (and `LC_*`), those the person names in `[sandbox] env`, and those the kernel
//! sets (a server entry's `env`, the proxy variables). Tokens keel was started with
//! (`GITHUB_TOKEN`, `AWS_SECRET_ACCESS_KEY`, …) stay with keel.
//! `off` runs commands unconfined; it must be named in the user's config and is shown as
//! dangerous wherever the mode is shown.
//!
//! Network ([`CommandNetwork`]): none by default. A command whose approval includes network
//! (the exec policy asked because it talks to the network, and the person said yes), or every
//! command when the user's config says `network = "all"`, gets no direct route either: it runs
//! in a network namespace of keel's making ([`netns`]) whose only way out is keel's proxy
//! ([`proxy`]), which applies the same network gate as plugins' requests.
//!
//! Fail closed: when the sandbox cannot start (bubblewrap missing, user namespaces off), the
//! confinement is [`Confinement::Unavailable`]; commands then still run, but every one needs the
//! person's approval, and [`Confinement::describe`] says so in the session header, in
//! `keel doctor` and in `keel exec --json`.
//!
//! Resource limits on the sandboxed tree, set in the child before bubblewrap starts and
//! inherited by everything it runs: processes ([`ProcessLimits::processes`], per user, so it
//! binds for every user but root; for root a `pids` cgroup, or where none can be made a
//! watchdog that kills the tree's PID namespace past the limit: [`pids`]),
//! file size and address space, so a fork bomb or a runaway writer ends with an error and keel
//! stays responsive.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

pub(crate) mod control;
pub(crate) mod guard;
pub(crate) mod netns;
pub(crate) mod pids;

pub use pids::release;
pub(crate) mod proxy;
pub(crate) mod runner;

/// How commands are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// Nothing may be written (except the private `/tmp`).
    ReadOnly,
    /// The workspace may be written (not its control directories, [`PROTECTED_IN_WORKSPACE`]).
    #[default]
    WorkspaceWrite,
    /// No confinement at all: the person chose it explicitly.
    Off,
}

impl SandboxMode {
    /// Parse `read-only`, `workspace-write` or `off`.
    pub fn parse(text: &str) -> Result<SandboxMode, String> {
        match text.trim() {
            "read-only" => Ok(SandboxMode::ReadOnly),
            "workspace-write" => Ok(SandboxMode::WorkspaceWrite),
            "off" => Ok(SandboxMode::Off),
            other => Err(format!(
                "unknown sandbox mode `{other}`; use `workspace-write` (the default), \
                 `read-only` or `off`"
            )),
        }
    }

    /// The mode's name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::Off => "off",
        }
    }
}

/// Which sandboxed commands may reach the network, always through keel's proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommandNetwork {
    /// No command, even an approved one.
    None,
    /// Commands whose approval includes network (the default).
    #[default]
    Approved,
    /// Every command (the user's config says so).
    All,
}

impl CommandNetwork {
    /// Parse `none`, `approved` or `all`.
    pub fn parse(text: &str) -> Result<CommandNetwork, String> {
        match text.trim() {
            "none" => Ok(CommandNetwork::None),
            "approved" => Ok(CommandNetwork::Approved),
            "all" => Ok(CommandNetwork::All),
            other => Err(format!(
                "unknown sandbox network setting `{other}`; use `approved` (the default: \
                 commands approved as network commands reach the network through keel's gate), \
                 `none` or `all`"
            )),
        }
    }

    /// The setting as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandNetwork::None => "none",
            CommandNetwork::Approved => "approved",
            CommandNetwork::All => "all",
        }
    }
}

/// Limits on the sandboxed process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// Processes and threads (`RLIMIT_NPROC`, or a `pids` cgroup for root).
    pub processes: u64,
    /// Largest file a command may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size: u64,
    /// Address space per process, in bytes (`RLIMIT_AS`).
    pub address_space: u64,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        ProcessLimits {
            processes: 2048,
            file_size: 4 << 30,
            address_space: 16 << 30,
        }
    }
}

/// The sandbox settings of a session.
#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {
    /// The mode.
    pub mode: SandboxMode,
    /// Which commands may reach the network through keel's proxy.
    pub network: CommandNetwork,
    /// Paths hidden from commands entirely (`~` expanded by the host).
    pub deny_read: Vec<PathBuf>,
    /// keel's home, replaced by an empty directory.
    pub keel_home: Option<PathBuf>,
    /// Resource limits.
    pub limits: ProcessLimits,
    /// Environment variables passed to commands and servers besides [`PASSED_ENV`] (the
    /// person's `[sandbox] env`).
    pub pass_env: Vec<String>,
}

/// The workspace's control directories, relative to its root: read-only to every sandboxed
/// command and server whatever the mode or a grant says, and refused to the file tools by the
/// dispatch gate ([`crate::dispatch`]). Each holds files that make a program run later outside
/// the sandbox (`.git/config`'s `core.fsmonitor`, `core.hooksPath` and hooks; Mercurial's
/// `.hg/hgrc` hooks; `jj`'s repo config; Subversion's hooks) or that keel itself reads as
/// configuration and instructions (`.keel/`, with its memory and skills; `.claude/skills`).
pub const PROTECTED_IN_WORKSPACE: &[&str] = &[
    ".git",
    ".hg",
    ".jj",
    ".svn",
    ".keel",
    ".claude/skills",
    // The scripts an approved `.claude/settings.json` hook runs: approval covers its command
    // line, so what the line runs must not change under it.
    ".claude/hooks",
];

/// Environment variables a sandboxed command or server inherits from keel (with every `LC_*`):
/// where things are and how to print, never credentials. Anything else, tokens included,
/// reaches it only when the person names it (`[sandbox] env`, a server's `env`).
pub const PASSED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "CLICOLOR",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "LD_LIBRARY_PATH",
    "PKG_CONFIG_PATH",
    "CC",
    "CXX",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "CARGO_TARGET_DIR",
    "RUST_BACKTRACE",
    "GOPATH",
    "GOROOT",
    "GOCACHE",
    "GOMODCACHE",
    "JAVA_HOME",
    "NVM_DIR",
    "PNPM_HOME",
    "PYENV_ROOT",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "GEM_HOME",
    "GEM_PATH",
    "NODE_PATH",
    "DENO_DIR",
    "BUN_INSTALL",
    // Where trusted certificates are (a TLS connection through keel's proxy is the command's
    // own, end to end).
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

/// The variables of keel's own environment a sandboxed process inherits: [`PASSED_ENV`],
/// `LC_*`, and the names in `extra`.
pub(crate) fn passed_env(extra: &[String]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os()
        .filter(|(name, _)| {
            name.to_str().is_some_and(|name| {
                PASSED_ENV.contains(&name)
                    || name.starts_with("LC_")
                    || extra.iter().any(|e| e == name)
            })
        })
        .collect()
}

/// The deny-read list every session starts with, relative to the user's home.
pub const DEFAULT_DENY_READ: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".config/glab-cli",
    ".npmrc",
    ".yarnrc.yml",
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".pypirc",
    ".config/pip/pip.conf",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".password-store",
    ".local/share/keyrings",
    ".config/op",
    ".pgpass",
    ".my.cnf",
];

/// Which confinement is in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confinement {
    /// bubblewrap, in this mode, with this network.
    Bubblewrap(SandboxMode, CommandNetwork),
    /// The person turned the sandbox off.
    Off,
    /// The sandbox cannot start; every command needs approval.
    Unavailable(String),
}

impl Confinement {
    /// One line for the session header, `keel doctor` and `--json` output.
    pub fn describe(&self) -> String {
        match self {
            Confinement::Bubblewrap(mode, network) => {
                let network = match network {
                    CommandNetwork::None => "no network",
                    CommandNetwork::Approved => {
                        "network only via keel's gate, for commands approved with it"
                    }
                    CommandNetwork::All => "network via keel's gate",
                };
                format!("commands: bubblewrap, {}, {network}", mode.as_str())
            }
            Confinement::Off => "commands: NOT sandboxed (sandbox mode `off` in config.toml): \
                                 DANGEROUS, commands run with your full rights"
                .to_owned(),
            Confinement::Unavailable(reason) => {
                format!("commands: NOT sandboxed: {reason}; every command needs approval")
            }
        }
    }

    /// Whether commands run confined.
    pub fn is_confined(&self) -> bool {
        matches!(self, Confinement::Bubblewrap(..))
    }
}

/// The bubblewrap binary, found once.
fn bwrap() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|dir| dir.join("bwrap"))
                .find(|candidate| candidate.is_file())
        })
        .as_deref()
}

/// When a confined command failed the way the sandbox makes commands fail, words the model can
/// act on: what the sandbox refuses and what to do instead. `None` when the output shows no
/// sign of it.
///
/// `proxied`: the command had network through keel's proxy, so a connection that failed was
/// one made around it.
pub fn refusal_hint(mode: SandboxMode, output: &str, proxied: bool) -> Option<String> {
    let wrote = output.contains("Read-only file system");
    let network = [
        "Network is unreachable",
        "Temporary failure in name resolution",
        "Could not resolve host",
        "Name or service not known",
        "No address associated with hostname",
    ]
    .iter()
    .any(|sign| output.contains(sign));
    let writable = match mode {
        SandboxMode::ReadOnly => "nothing but /tmp is writable",
        _ => {
            "only the workspace and /tmp are writable, not the workspace's control directories \
             (.git, .hg, .jj, .svn, .keel, .claude/skills: so no commit, staging, checkout or \
             config change from inside it; ask the person to run those)"
        }
    };
    if proxied && network {
        return Some(format!(
            "the command runs in keel's sandbox ({}), whose only way out is keel's proxy at {} \
             (HTTP_PROXY and HTTPS_PROXY are set): a program that ignores those variables, or \
             resolves names itself, cannot connect; use one that honours the proxy variables",
            mode.as_str(),
            netns::proxy_url()
        ));
    }
    match (wrote, network) {
        (false, false) => None,
        (true, false) => Some(format!(
            "the command runs in keel's sandbox ({}), where {writable}: the write was refused \
             by the sandbox, not by a bug; write inside the workspace instead, or ask the person \
             to run it outside the sandbox",
            mode.as_str()
        )),
        (false, true) => Some(format!(
            "the command runs in keel's sandbox ({}), which has no network: the connection was \
             refused by the sandbox, not by the host; work offline (vendored or cached \
             dependencies), or ask the person to run it outside the sandbox",
            mode.as_str()
        )),
        (true, true) => Some(format!(
            "the command runs in keel's sandbox ({}), where {writable} and there is no \
             network: both were refused by the sandbox; ask the person to run it outside the \
             sandbox if it must",
            mode.as_str()
        )),
    }
}

/// Whether bubblewrap can start a sandbox on this machine: found, and able to create the
/// namespaces a command gets; and, when commands may have network, whether keel can make their
/// network namespace (if not, they get none, and the description says so). Checked once per
/// process.
pub fn probe(config: &SandboxConfig) -> Confinement {
    if config.mode == SandboxMode::Off {
        return Confinement::Off;
    }
    static PROBED: OnceLock<Result<(), String>> = OnceLock::new();
    let probed = PROBED.get_or_init(|| {
        let Some(bwrap) = bwrap() else {
            return Err(
                "bubblewrap (`bwrap`) is not installed; install the `bubblewrap` \
                        package"
                    .to_owned(),
            );
        };
        let out = std::process::Command::new(bwrap)
            .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
            .args([
                "--unshare-all",
                "--die-with-parent",
                "--new-session",
                "true",
            ])
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!(
                "bubblewrap cannot create a sandbox here ({}); enable unprivileged user \
                 namespaces (sysctl kernel.unprivileged_userns_clone=1) or run keel where they \
                 are allowed",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("bubblewrap cannot start: {e}")),
        }
    });
    match probed {
        Ok(()) => {
            // For root, the first command's cgroup is made while keel starts.
            pids::prepare(config.limits.processes);
            let network = match (config.network, netns::probe()) {
                (CommandNetwork::None, _) => CommandNetwork::None,
                (network, Ok(())) => network,
                (_, Err(reason)) => {
                    tracing::warn!(
                        "commands get no network at all: keel cannot give them its proxy \
                         ({reason})"
                    );
                    CommandNetwork::None
                }
            };
            Confinement::Bubblewrap(config.mode, network)
        }
        Err(reason) => Confinement::Unavailable(reason.clone()),
    }
}

/// Run `line` in `workspace` (canonical) the way the kernel runs a plugin's command, confined by
/// `config` (for `keel doctor`, the benchmarks and tests; plugins reach this only through the
/// exec gate). With `network`, the command may use the network through keel's proxy under that
/// network gate; a host the policy would ask about is refused (nobody is asked here).
pub async fn run_command(
    workspace: &Path,
    line: &str,
    config: &SandboxConfig,
    network: Option<crate::NetConfig>,
) -> Result<crate::ExecOutcome, String> {
    let containment = runner::Containment {
        config: config.clone(),
        confinement: probe(config),
    };
    let cmd = crate::ExecCommand {
        line: line.to_owned(),
        cwd: ".".to_owned(),
        timeout: std::time::Duration::from_secs(60),
    };
    let client = network.map(crate::net_client::NetClient::new);
    let gate = client.as_ref().map(|client| {
        proxy::CommandNet::new(
            client,
            "keel",
            std::sync::Arc::new(crate::gates::approvals::DenyAll),
        )
    });
    runner::run(
        workspace,
        &cmd,
        &[],
        &containment,
        gate.as_ref(),
        std::future::pending(),
    )
    .await
    .map_err(|e| e.to_string())
}

/// A build keel runs itself (`keel dev`'s rebuild of a plugin crate, whose `build.rs`, proc
/// macros and `.cargo/config.toml` the model may have written): the program and arguments
/// that run `argv` in `dir` confined as a command is, with only `dir` and the build's `target`
/// directory writable (`dir`'s control directories not; a `target` that is or holds the
/// person's home or keel's home is refused), no network, keel's home and the deny-read list hidden; and the
/// environment to give it ([`PASSED_ENV`] and the person's `[sandbox] env` only). The caller
/// starts it with that environment alone. An error says why the sandbox cannot start here (or
/// that the person turned it off); the caller then decides (refuses, or runs it as the person
/// chose).
pub fn confined_build(
    config: &SandboxConfig,
    dir: &Path,
    target: &Path,
    argv: &[String],
) -> Result<ConfinedBuild, String> {
    match probe(config) {
        Confinement::Bubblewrap(..) => {}
        Confinement::Off => {
            return Err("the sandbox is off in your config ([sandbox] mode = \"off\")".into());
        }
        Confinement::Unavailable(why) => return Err(why),
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let keel_home = config.keel_home.as_deref();
    let reserved = home
        .as_deref()
        .filter(|home| home.starts_with(target))
        .or(keel_home.filter(|k| k.starts_with(target) || target.starts_with(k)));
    if let Some(reserved) = reserved {
        return Err(format!(
            "the build's target directory {} is or holds {} (or lies in keel's home), which a \
             build may not write; set CARGO_TARGET_DIR to a directory of its own",
            target.display(),
            reserved.display()
        ));
    }
    let config = SandboxConfig {
        mode: SandboxMode::ReadOnly,
        ..config.clone()
    };
    let launch = runner::Launch {
        workspace: dir,
        dir,
        program: Program::Argv(argv),
        writable: &[dir, target],
        readable: &[],
        shared: &[],
        env: &[],
        hidden: &[],
        network: false,
        pinned: &[],
        protected: None,
        stdio: [
            std::process::Stdio::null(),
            std::process::Stdio::null(),
            std::process::Stdio::null(),
        ],
    };
    let (program, args) = command_line(&config, &launch, false)
        .ok_or_else(|| "bubblewrap (`bwrap`) is not installed".to_owned())?;
    Ok(ConfinedBuild {
        program,
        args,
        env: passed_env(&config.pass_env),
    })
}

/// What [`confined_build`] gives: the program (bubblewrap) and its arguments, and the whole
/// environment to start it with.
#[derive(Debug, Clone)]
pub struct ConfinedBuild {
    /// bubblewrap.
    pub program: PathBuf,
    /// Its arguments, the build's program and arguments last.
    pub args: Vec<String>,
    /// The environment (start from an empty one).
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

/// keel's proxy for sandboxed commands, serving `listener` under `network` (a host the policy
/// would ask about is refused; nobody is asked) until the future is dropped. For the
/// benchmarks; commands get it only through the exec gate, inside their own namespace.
pub async fn serve_proxy(listener: tokio::net::TcpListener, network: crate::NetConfig) {
    let client = crate::net_client::NetClient::new(network);
    let gate = proxy::CommandNet::new(
        &client,
        "keel",
        std::sync::Arc::new(crate::gates::approvals::DenyAll),
    );
    proxy::serve(listener, &gate).await;
}

/// The program and arguments that run `launch` (its program in its directory, its granted
/// directories, and the files in `shared` — absolute paths the kernel reads back afterwards —
/// writable inside) under `config`. With `keel_network` the process keeps the network
/// namespace its parent made ([`netns`]) instead of an empty one.
pub(crate) fn command_line(
    config: &SandboxConfig,
    launch: &runner::Launch<'_>,
    keel_network: bool,
) -> Option<(PathBuf, Vec<String>)> {
    let runner::Launch {
        workspace,
        dir,
        program,
        ..
    } = launch;
    let (writable, readable, shared) = (launch.writable, launch.readable, launch.shared);
    let bwrap = bwrap()?;
    let mut args: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(|s| (*s).to_owned()));
    let path = |p: &Path| p.to_string_lossy().into_owned();
    push(&["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]);
    // A private /tmp first: the workspace (a temporary directory, say) is bound over it.
    push(&["--tmpfs", "/tmp"]);
    let ws = path(workspace);
    match config.mode {
        SandboxMode::WorkspaceWrite => push(&["--bind", &ws, &ws]),
        SandboxMode::ReadOnly | SandboxMode::Off => push(&["--ro-bind", &ws, &ws]),
    }
    // Directories a long-lived process was granted, before the protections below so a grant
    // of the workspace itself cannot reopen a control directory.
    for dir in writable {
        let d = path(dir);
        push(&["--bind", &d, &d]);
    }
    // Directories it may read where the sandbox would hide them (a server installed under
    // `/tmp`); keel's home and the deny-read list below still hide what they cover.
    for dir in readable {
        let d = path(dir);
        push(&["--ro-bind", &d, &d]);
    }
    // Over the workspace and every grant: a control directory (or a `.git` file naming the
    // repository elsewhere, as in a worktree) is bound read-only onto itself; a symlink as
    // what it points to (bubblewrap resolves it), a dangling one not at all (it would stop
    // every command from starting). With them those of repositories nested in a writable
    // workspace (several clones side by side, a vendored repository), as far as a bounded
    // walk finds them. The caller may have found them already, to check them afterwards.
    let workspace_writable =
        config.mode == SandboxMode::WorkspaceWrite || writable.iter().any(|w| w == workspace);
    let found;
    let protected = match launch.protected {
        Some(protected) => protected,
        None => {
            found = guard::Protected::find(workspace, workspace_writable);
            &found
        }
    };
    // First every real directory between the workspace and a control entry, bound onto itself
    // (writable as it was): a mount point cannot be renamed or removed, so no command can move
    // a control directory's parent away and put a writable copy in its place.
    if workspace_writable {
        for dir in protected.ancestors() {
            let d = path(dir);
            push(&["--bind", &d, &d]);
        }
    }
    for entry in protected.entries() {
        if entry.exists() {
            let p = path(entry);
            push(&["--ro-bind", &p, &p]);
        }
    }
    // Files whose content was approved (a hook's script): the approved copy, read-only, in
    // place of whatever the workspace holds there now.
    for (inside, copy) in launch.pinned {
        push(&["--ro-bind", &path(copy), &path(inside)]);
    }
    if let Some(home) = &config.keel_home
        && home.exists()
        && !workspace.starts_with(home)
    {
        push(&["--tmpfs", &path(home)]);
    }
    for hidden in &config.deny_read {
        match std::fs::symlink_metadata(hidden) {
            Ok(meta) if meta.is_dir() => push(&["--tmpfs", &path(hidden)]),
            Ok(_) => push(&["--ro-bind", "/dev/null", &path(hidden)]),
            Err(_) => {}
        }
    }
    for file in shared {
        let f = path(file);
        push(&["--bind", &f, &f]);
    }
    push(&["--unshare-all", "--die-with-parent", "--new-session"]);
    if keel_network {
        push(&["--share-net"]);
    }
    push(&["--chdir", &path(dir)]);
    push(&["--"]);
    match program {
        Program::Script(script) => push(&["sh", "-c", script]),
        Program::Argv(argv) => args.extend(argv.iter().cloned()),
    }
    Some((bwrap.to_owned(), args))
}

/// What a sandboxed process runs.
pub(crate) enum Program<'a> {
    /// `sh -c script` (a command the exec gate judged).
    Script(&'a str),
    /// A program and its arguments, run as they are (a long-lived process's entry).
    Argv(&'a [String]),
}

/// The entries of `dir` named `PREFIX<pid>-…` by a keel process that no longer runs and last
/// changed more than `age` ago: what keel leaves in shared places (command markers, cgroups)
/// when it is killed before it can clean up. The age keeps what a keel in another PID
/// namespace, whose pid means nothing here, has just made.
pub(crate) fn left_by_gone_keels(dir: &Path, prefix: &str, age: Duration) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let gone = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(prefix))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<i32>().ok())
                .is_some_and(|pid| {
                    pid > 0
                        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                            == Err(nix::errno::Errno::ESRCH)
                });
            gone && entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|elapsed| elapsed > age)
        })
        .map(|entry| entry.path())
        .collect()
}

/// Set the resource limits in the child, just before bubblewrap starts (inherited by the
/// whole sandboxed tree), move it into the `pids` cgroup whose `cgroup.procs` is `procs` if
/// there is one, and with `network` give it keel's network namespace ([`netns::enter`]) after
/// the cgroup (which needs the outer namespace's rights).
#[cfg(unix)]
pub(crate) fn apply_limits(
    command: &mut tokio::process::Command,
    limits: ProcessLimits,
    procs: Option<&std::fs::File>,
    network: Option<netns::ChildSide>,
) {
    use nix::sys::resource::{Resource, setrlimit};
    let procs = procs.map(std::os::fd::AsRawFd::as_raw_fd);
    // SAFETY: the closure runs in the forked child before exec and only makes system calls
    // (setrlimit, write(2) on a descriptor opened by the parent, and those of `netns::enter`),
    // all async-signal-safe; it allocates nothing and touches no lock. The descriptors are
    // close-on-exec.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            if let Some(fd) = procs {
                // "0" moves the writing process; its children are born inside.
                let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                nix::unistd::write(fd, b"0").map_err(std::io::Error::from)?;
            }
            for (resource, value) in [
                (Resource::RLIMIT_NPROC, limits.processes),
                (Resource::RLIMIT_FSIZE, limits.file_size),
                (Resource::RLIMIT_AS, limits.address_space),
            ] {
                setrlimit(resource, value, value).map_err(std::io::Error::from)?;
            }
            if let Some(side) = &network {
                netns::enter(side)?;
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests;
