//! Built-in knowledge for the exec policy: the arity table, the default rules, and the program
//! families (shells, interpreters, wrappers, network clients) the policy treats specially.
//!
//! The central invariant (from the seed's arity dictionary): `git status` is allowed as the
//! *action* `git status`, so it matches `git status -s` and `git status --porcelain` but never
//! `git push`. Flags never count toward a command key; positional words do, up to the
//! program's arity. Keeping this table in step with the ecosystem is the standing cost of the
//! approach; an unknown program or subcommand simply falls to Prompt.

use super::exec_policy::Decision;
use super::shell_split::Word;

/// Leading positional words forming the command key: `git` 2 means `git status`; a longer
/// entry refines a shorter one (`npm run` 3 means `npm run build`). Programs not listed have
/// arity 1.
pub(crate) const ARITY: &[(&str, usize)] = &[
    ("git", 2),
    ("git stash", 3),
    ("git remote", 3),
    ("git submodule", 3),
    ("git worktree", 3),
    ("git notes", 3),
    ("git lfs", 3),
    ("cargo", 2),
    ("npm", 2),
    ("npm run", 3),
    ("npm run-script", 3),
    ("pnpm", 2),
    ("pnpm run", 3),
    ("yarn", 2),
    ("yarn run", 3),
    ("bun", 2),
    ("bun run", 3),
    ("deno", 2),
    ("docker", 2),
    ("docker compose", 3),
    ("docker container", 3),
    ("docker image", 3),
    ("docker volume", 3),
    ("docker network", 3),
    ("docker system", 3),
    ("docker buildx", 3),
    ("docker-compose", 2),
    ("podman", 2),
    ("kubectl", 2),
    ("kubectl config", 3),
    ("kubectl rollout", 3),
    ("helm", 2),
    ("helm repo", 3),
    ("go", 2),
    ("go mod", 3),
    ("pip", 2),
    ("pip3", 2),
    ("uv", 2),
    ("uv pip", 3),
    ("uv tool", 3),
    ("poetry", 2),
    ("pipx", 2),
    ("conda", 2),
    ("rustup", 2),
    ("rustup target", 3),
    ("rustup component", 3),
    ("rustup toolchain", 3),
    ("apt", 2),
    ("apt-get", 2),
    ("dnf", 2),
    ("yum", 2),
    ("apk", 2),
    ("brew", 2),
    ("snap", 2),
    ("systemctl", 2),
    ("service", 3),
    ("gh", 3),
    ("glab", 3),
    ("aws", 3),
    ("gcloud", 3),
    ("az", 3),
    ("terraform", 2),
    ("make", 2),
    ("just", 2),
    ("gem", 2),
    ("bundle", 2),
    ("mix", 2),
    ("dotnet", 2),
    ("mvn", 2),
    ("gradle", 2),
    ("ip", 2),
    ("npx", 2),
    ("composer", 2),
    ("hg", 2),
    ("svn", 2),
    ("openssl", 2),
    ("tmux", 2),
    ("nix", 2),
    ("ruff", 2),
    ("flatpak", 2),
];

/// Flags that consume the next word when they appear before the subcommand (so the value is
/// not mistaken for the subcommand: `git -C dir status` is `git status`).
pub(crate) const VALUE_FLAGS: &[(&str, &[&str])] = &[
    (
        "git",
        &[
            "-C",
            "-c",
            "--git-dir",
            "--work-tree",
            "--namespace",
            "--super-prefix",
            "--config-env",
        ],
    ),
    (
        "cargo",
        &[
            "--manifest-path",
            "--config",
            "-Z",
            "-C",
            "--color",
            "--target-dir",
        ],
    ),
    (
        "npm",
        &[
            "--prefix",
            "-w",
            "--workspace",
            "--userconfig",
            "--registry",
            "--cache",
        ],
    ),
    ("pnpm", &["-C", "--dir", "--filter", "-F"]),
    ("yarn", &["--cwd"]),
    (
        "docker",
        &[
            "-H",
            "--host",
            "--context",
            "-c",
            "--config",
            "-l",
            "--log-level",
            "--tlscacert",
            "--tlscert",
            "--tlskey",
        ],
    ),
    ("podman", &["--connection", "-c", "--url", "--log-level"]),
    (
        "kubectl",
        &[
            "-n",
            "--namespace",
            "--context",
            "--kubeconfig",
            "--cluster",
            "--user",
            "-s",
            "--server",
            "--token",
        ],
    ),
    (
        "helm",
        &["-n", "--namespace", "--kube-context", "--kubeconfig"],
    ),
    ("go", &["-C"]),
    (
        "make",
        &[
            "-C",
            "-f",
            "--file",
            "--makefile",
            "-I",
            "-o",
            "-W",
            "--directory",
        ],
    ),
    ("just", &["-f", "--justfile", "-d", "--working-directory"]),
    (
        "systemctl",
        &[
            "-H",
            "--host",
            "-M",
            "--machine",
            "-t",
            "--type",
            "-p",
            "--property",
            "--state",
        ],
    ),
    ("apt", &["-o", "-t", "-c"]),
    ("apt-get", &["-o", "-t", "-c"]),
    ("gh", &["-R", "--repo"]),
    ("uv", &["--directory", "--project", "-p", "--python"]),
    ("pip", &["--proxy", "--log", "--cache-dir", "--python"]),
    ("pip3", &["--proxy", "--log", "--cache-dir", "--python"]),
    ("rustup", &["--toolchain"]),
];

/// Flags before the subcommand that can make a read-only subcommand run arbitrary programs
/// (`git -c core.pager='sh -c ...' log`); they raise the command to at least Prompt.
pub(crate) const RISKY_GLOBAL_FLAGS: &[(&str, &[&str], &str)] = &[(
    "git",
    &["-c", "--config-env", "--exec-path"],
    "can set config keys that name programs git runs (core.pager, core.sshCommand, core.fsmonitor)",
)];

/// Shell interpreters: a pipe into one is forbidden; `-c` scripts are judged recursively.
pub(crate) const SHELLS: &[&str] = &[
    "sh",
    "bash",
    "zsh",
    "dash",
    "ksh",
    "mksh",
    "pdksh",
    "fish",
    "csh",
    "tcsh",
    "ash",
    "rbash",
    "yash",
    "elvish",
    "nu",
    "xonsh",
    "pwsh",
    "powershell",
];

/// Language interpreters and the short options that take inline code (as cluster letters) and
/// long options that do.
pub(crate) const INTERPRETERS: &[Interpreter] = &[
    ("python", "c", &[]),
    ("python2", "c", &[]),
    ("python3", "c", &[]),
    ("pypy", "c", &[]),
    ("pypy3", "c", &[]),
    ("perl", "eE", &[]),
    ("ruby", "e", &[]),
    ("node", "ep", &["--eval", "--print"]),
    ("nodejs", "ep", &["--eval", "--print"]),
    ("php", "rR", &[]),
    ("lua", "e", &[]),
    ("luajit", "e", &[]),
    ("Rscript", "e", &["--expr"]),
    ("julia", "eE", &["--eval", "--print"]),
    ("osascript", "e", &[]),
    ("tclsh", "", &[]),
    ("expect", "c", &[]),
    ("groovy", "e", &[]),
    ("jshell", "", &[]),
];

/// An interpreter: its base name, the short options that take inline code (as cluster
/// letters), and the long options that do.
pub(crate) type Interpreter = (&'static str, &'static str, &'static [&'static str]);

/// The interpreter entry for `name` (`python3.12` counts as `python3`).
pub(crate) fn interpreter(name: &str) -> Option<Interpreter> {
    let base = if name.starts_with("python") {
        let v = name.trim_start_matches("python");
        if v.is_empty() || v.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
            if v.starts_with('2') {
                "python2"
            } else if v.is_empty() {
                "python"
            } else {
                "python3"
            }
        } else {
            name
        }
    } else {
        name
    };
    INTERPRETERS.iter().find(|(n, _, _)| *n == base).copied()
}

/// `python -m MODULE` modules that map onto a program with its own rules.
pub(crate) const PYTHON_MODULES: &[&str] = &[
    "pytest",
    "pip",
    "pip3",
    "mypy",
    "ruff",
    "black",
    "flake8",
    "pylint",
    "isort",
    "unittest",
    "json.tool",
    "venv",
    "http.server",
    "build",
    "twine",
    "tox",
    "coverage",
];

/// Programs that make network connections whatever their arguments: at least Prompt.
pub(crate) const NETWORK_PROGRAMS: &[&str] = &[
    "curl",
    "wget",
    "ssh",
    "scp",
    "sftp",
    "rsync",
    "nc",
    "ncat",
    "netcat",
    "telnet",
    "ftp",
    "tftp",
    "socat",
    "nmap",
    "ping",
    "ping6",
    "dig",
    "nslookup",
    "host",
    "whois",
    "aria2c",
    "http",
    "https",
    "xh",
    "httpie",
    "curlie",
    "lftp",
    "mosh",
    "sshpass",
    "gh",
    "glab",
    "aws",
    "gcloud",
    "gsutil",
    "az",
    "kubectl",
    "helm",
    "npx",
    "pnpx",
    "bunx",
    "uvx",
    "ngrok",
    "cloudflared",
    "heroku",
    "vercel",
    "netlify",
    "fly",
    "flyctl",
    "doctl",
    "s3cmd",
    "rclone",
    "wscat",
    "websocat",
    "ssh-copy-id",
    "traceroute",
    "tracepath",
    "mtr",
];

/// Subcommands (command-key prefixes) that talk to the network: at least Prompt.
pub(crate) const NETWORK_SUBCOMMANDS: &[&str] = &[
    "git push",
    "git pull",
    "git fetch",
    "git clone",
    "git ls-remote",
    "git remote update",
    "git remote show",
    "git remote prune",
    "git submodule update",
    "git send-email",
    "git lfs pull",
    "git lfs push",
    "git lfs fetch",
    "cargo install",
    "cargo publish",
    "cargo login",
    "cargo logout",
    "cargo owner",
    "cargo yank",
    "cargo search",
    "cargo fetch",
    "cargo update",
    "cargo add",
    "cargo vendor",
    "cargo generate-lockfile",
    "cargo info",
    "npm install",
    "npm i",
    "npm ci",
    "npm add",
    "npm publish",
    "npm update",
    "npm up",
    "npm audit",
    "npm outdated",
    "npm view",
    "npm info",
    "npm show",
    "npm login",
    "npm adduser",
    "npm exec",
    "npm x",
    "npm search",
    "npm unpublish",
    "npm deprecate",
    "npm dist-tag",
    "pnpm install",
    "pnpm i",
    "pnpm add",
    "pnpm update",
    "pnpm up",
    "pnpm publish",
    "pnpm dlx",
    "pnpm outdated",
    "pnpm audit",
    "yarn install",
    "yarn add",
    "yarn upgrade",
    "yarn up",
    "yarn publish",
    "yarn dlx",
    "yarn npm",
    "bun install",
    "bun i",
    "bun add",
    "bun update",
    "bun publish",
    "bun x",
    "pip install",
    "pip download",
    "pip search",
    "pip3 install",
    "pip3 download",
    "uv pip install",
    "uv pip compile",
    "uv sync",
    "uv add",
    "uv lock",
    "uv tool install",
    "uv tool run",
    "poetry install",
    "poetry add",
    "poetry update",
    "poetry lock",
    "poetry publish",
    "pipx install",
    "pipx run",
    "conda install",
    "conda create",
    "conda update",
    "go get",
    "go install",
    "go mod download",
    "go mod tidy",
    "gem install",
    "gem push",
    "gem update",
    "bundle install",
    "bundle update",
    "brew install",
    "brew update",
    "brew upgrade",
    "brew tap",
    "apt install",
    "apt update",
    "apt upgrade",
    "apt-get install",
    "apt-get update",
    "apt-get upgrade",
    "apt-get dist-upgrade",
    "dnf install",
    "dnf update",
    "dnf upgrade",
    "yum install",
    "yum update",
    "apk add",
    "apk update",
    "docker pull",
    "docker push",
    "docker login",
    "docker search",
    "docker image pull",
    "docker image push",
    "podman pull",
    "podman push",
    "podman login",
    "rustup update",
    "rustup install",
    "rustup toolchain install",
    "rustup target add",
    "rustup component add",
    "deno install",
    "deno add",
    "snap install",
    "flatpak install",
];

/// Programs after `xargs` whose result does not depend on which arguments it appends.
pub(crate) const XARGS_SAFE: &[&str] = &[
    "grep",
    "egrep",
    "fgrep",
    "rg",
    "wc",
    "cat",
    "head",
    "tail",
    "ls",
    "file",
    "stat",
    "echo",
    "printf",
    "basename",
    "dirname",
    "realpath",
    "readlink",
    "sha256sum",
    "sha1sum",
    "md5sum",
    "b2sum",
    "du",
    "jq",
];

/// Directories whose programs count as the program itself (`/usr/bin/git` is `git`); a program
/// named by any other path might be anything and is judged as unknown.
pub(crate) const TRUSTED_BIN_DIRS: &[&str] = &[
    "/bin",
    "/usr/bin",
    "/usr/local/bin",
    "/sbin",
    "/usr/sbin",
    "/usr/local/sbin",
    "/opt/homebrew/bin",
];

/// Environment variables whose assignment changes which code a command loads or runs.
pub(crate) fn suspicious_variable(name: &str) -> Option<&'static str> {
    Some(match name {
        "PATH" => "changes which programs the command names resolve to",
        "LD_PRELOAD" | "LD_LIBRARY_PATH" | "LD_AUDIT" => {
            "makes every program load a chosen library"
        }
        n if n.starts_with("DYLD_") => "makes every program load a chosen library",
        "BASH_ENV" | "ENV" | "PROMPT_COMMAND" | "PS4" | "SHELLOPTS" | "BASHOPTS" => {
            "makes the shell run extra code"
        }
        "IFS" => "changes how the shell splits words",
        "PYTHONPATH" | "PYTHONSTARTUP" | "PYTHONHOME" => "changes which Python code is imported",
        "NODE_OPTIONS" => "can make node preload arbitrary code (--require)",
        "PERL5OPT" | "PERL5LIB" | "RUBYOPT" | "RUBYLIB" => {
            "changes which interpreter code is loaded"
        }
        "GIT_SSH" | "GIT_SSH_COMMAND" | "GIT_EXTERNAL_DIFF" | "GIT_PAGER" | "GIT_EDITOR"
        | "GIT_EXEC_PATH" | "GIT_ASKPASS" | "GIT_PROXY_COMMAND" => "names a program git runs",
        "PAGER" | "EDITOR" | "VISUAL" | "MANPAGER" | "LESSOPEN" | "SSH_ASKPASS" => {
            "names a program other tools run"
        }
        "RUSTC_WRAPPER" | "RUSTC" | "CARGO_BUILD_RUSTC_WRAPPER" | "RUSTC_WORKSPACE_WRAPPER" => {
            "names a program cargo runs"
        }
        n if n.starts_with("GIT_CONFIG") => "sets git config, which can name programs git runs",
        _ => return None,
    })
}

/// Where the words of an invocation stand, for refiners.
pub(crate) struct Inv<'a> {
    /// Every word after the key (flags and arguments of the subcommand).
    pub rest: &'a [Word],
}

/// A refiner inspects arguments beyond the key and may raise a built-in rule's decision.
pub(crate) type Refiner = fn(&Inv<'_>) -> Option<(Decision, &'static str)>;

/// One built-in rule.
pub(crate) struct Builtin {
    /// The command key prefix, space separated.
    pub prefix: &'static str,
    /// The decision when it matches.
    pub decision: Decision,
    /// Matches only this exact key (not longer keys).
    pub exact: bool,
    /// Why.
    pub reason: &'static str,
    /// Argument check that may raise the decision.
    pub refine: Option<Refiner>,
}

const fn allow(prefix: &'static str, reason: &'static str) -> Builtin {
    Builtin {
        prefix,
        decision: Decision::Allow,
        exact: false,
        reason,
        refine: None,
    }
}

const fn prompt(prefix: &'static str, reason: &'static str) -> Builtin {
    Builtin {
        prefix,
        decision: Decision::Prompt,
        exact: false,
        reason,
        refine: None,
    }
}

impl Builtin {
    const fn exact(mut self) -> Self {
        self.exact = true;
        self
    }

    const fn refine(mut self, f: Refiner) -> Self {
        self.refine = Some(f);
        self
    }
}

const READ: &str = "read-only: prints information without changing anything";
const WRITES: &str = "writes, moves or changes files";
const DELETES: &str = "deletes files";
const BUILD: &str = "builds or tests the project in the workspace";
const NET: &str = "talks to the network";
const PKG: &str = "changes installed packages or talks to a package registry";

/// The built-in rules. User rules take precedence over these; floors apply to both.
/// (Kept as a compact table: one line per family reads better than one line per rule.)
#[rustfmt::skip]
pub(crate) static BUILTIN_RULES: &[Builtin] = &[
    // Read-only tools.
    allow("ls", READ), allow("dir", READ), allow("vdir", READ), allow("cat", READ), allow("bat", READ),
    allow("head", READ), allow("tail", READ), allow("wc", READ), allow("grep", READ), allow("egrep", READ),
    allow("fgrep", READ), allow("rg", READ).refine(refine_rg), allow("ag", READ), allow("ack", READ), allow("fd", READ).refine(refine_fd),
    allow("fdfind", READ).refine(refine_fd), allow("pwd", READ), allow("echo", READ), allow("printf", READ),
    allow("true", READ), allow("false", READ), allow(":", READ), allow("which", READ),
    allow("whereis", READ), allow("type", READ), allow("command", READ), allow("file", READ), allow("stat", READ),
    allow("du", READ), allow("df", READ), allow("tree", READ).refine(refine_tree), allow("cut", READ), allow("tr", READ),
    allow("diff", READ), allow("cmp", READ), allow("comm", READ), allow("basename", READ),
    allow("dirname", READ), allow("realpath", READ), allow("readlink", READ), allow("whoami", READ),
    allow("id", READ), allow("uname", READ), allow("groups", READ), allow("nproc", READ),
    allow("free", READ), allow("uptime", READ), allow("ps", READ), allow("pgrep", READ), allow("jq", READ),
    allow("sha1sum", READ), allow("sha224sum", READ), allow("sha256sum", READ), allow("sha384sum", READ),
    allow("sha512sum", READ), allow("md5sum", READ), allow("b2sum", READ), allow("cksum", READ),
    allow("sum", READ), allow("hexdump", READ), allow("od", READ), allow("strings", READ),
    allow("less", READ).refine(refine_pager), allow("more", READ).refine(refine_pager), allow("column", READ), allow("nl", READ),
    allow("paste", READ), allow("join", READ), allow("fold", READ), allow("expand", READ),
    allow("unexpand", READ), allow("fmt", READ), allow("rev", READ), allow("tac", READ),
    allow("seq", READ), allow("sleep", "waits"), allow("test", READ), allow("[", READ), allow("[[", READ),
    allow("locale", READ), allow("tput", READ), allow("clear", READ), allow("yes", READ),
    allow("base64", READ), allow("base32", READ), allow("numfmt", READ), allow("cal", READ),
    allow("expr", READ), allow("getconf", READ), allow("nm", READ), allow("objdump", READ),
    allow("readelf", READ), allow("size", READ), allow("man", READ).refine(refine_man), allow("info", READ),
    allow("zcat", READ), allow("zgrep", READ), allow("zless", READ), allow("bzcat", READ),
    allow("xzcat", READ), allow("lscpu", READ), allow("lsblk", READ), allow("apt-cache", READ),
    allow("tldr", READ),
    // Shell builtins that only change the shell's own state.
    allow("cd", "changes the shell's directory"), allow("pushd", "changes the shell's directory"),
    allow("popd", "changes the shell's directory"), allow("dirs", READ), allow("history", READ),
    allow("jobs", READ), allow("wait", "waits for background jobs"), allow("read", "reads input into a variable"),
    allow("shift", "shell state"), allow("getopts", "shell state"), allow("let", "shell arithmetic"),
    allow("exit", "shell state"), allow("return", "shell state"), allow("break", "shell state"),
    allow("continue", "shell state"), allow("umask", "shell state"), allow("ulimit", "shell state"),
    allow("set", "shell options"), allow("shopt", "shell options"), allow("unset", "shell state"),
    allow("export", "sets shell variables"), allow("declare", "sets shell variables"),
    allow("local", "sets shell variables"), allow("readonly", "sets shell variables"),
    allow("typeset", "sets shell variables"), allow("hash", "shell state"),
    prompt("env", "prints the environment, which often holds API keys and tokens"),
    prompt("printenv", "prints the environment, which often holds API keys and tokens"),
    prompt("alias", "defines an alias that changes what later commands mean"),
    prompt("source", "runs a script in the current shell; its contents were not checked"),
    prompt(".", "runs a script in the current shell; its contents were not checked"),
    // Read-only unless certain arguments are present.
    allow("find", "searches files").refine(refine_find),
    allow("sed", "prints transformed text").refine(refine_sed),
    allow("awk", "prints transformed text").refine(refine_awk),
    allow("gawk", "prints transformed text").refine(refine_awk),
    allow("mawk", "prints transformed text").refine(refine_awk),
    allow("nawk", "prints transformed text").refine(refine_awk),
    allow("sort", READ).refine(refine_sort),
    allow("uniq", READ).refine(refine_uniq),
    allow("xxd", READ).refine(refine_xxd),
    allow("date", READ).refine(refine_date),
    allow("hostname", READ).refine(refine_hostname),
    allow("yq", READ).refine(refine_yq),
    allow("tar", "lists an archive").refine(refine_tar),
    allow("crontab", "lists scheduled jobs").refine(refine_crontab),
    allow("dpkg", "queries installed packages").refine(refine_dpkg),
    allow("sysctl", "reads kernel settings").refine(refine_sysctl),
    allow("ip", "shows network configuration").refine(refine_ip),
    // Writing and deleting.
    prompt("rm", DELETES), prompt("rmdir", DELETES), prompt("unlink", DELETES), prompt("shred", DELETES),
    prompt("cp", WRITES), prompt("mv", WRITES), prompt("ln", WRITES), prompt("install", WRITES),
    prompt("mkdir", WRITES), prompt("touch", WRITES), prompt("chmod", WRITES), prompt("chown", WRITES),
    prompt("chgrp", WRITES), prompt("chattr", WRITES), prompt("truncate", WRITES), prompt("dd", WRITES),
    prompt("tee", WRITES), prompt("patch", WRITES), prompt("zip", WRITES), prompt("unzip", WRITES),
    prompt("gzip", WRITES), prompt("gunzip", WRITES), prompt("bzip2", WRITES), prompt("bunzip2", WRITES),
    prompt("xz", WRITES), prompt("unxz", WRITES), prompt("7z", WRITES), prompt("mkfifo", WRITES),
    prompt("mknod", WRITES), prompt("split", WRITES),
    // Processes and the machine.
    prompt("kill", "signals other processes"), prompt("pkill", "signals other processes"),
    prompt("killall", "signals other processes"),
    prompt("shutdown", "stops or restarts the machine"), prompt("reboot", "stops or restarts the machine"),
    prompt("halt", "stops or restarts the machine"), prompt("poweroff", "stops or restarts the machine"),
    prompt("mount", "changes mounted filesystems"), prompt("umount", "changes mounted filesystems"),
    prompt("fdisk", "edits disk partitions"), prompt("parted", "edits disk partitions"),
    prompt("useradd", "changes user accounts"), prompt("userdel", "changes user accounts"),
    prompt("usermod", "changes user accounts"), prompt("passwd", "changes user accounts"),
    prompt("iptables", "changes the firewall"), prompt("ufw", "changes the firewall"),
    prompt("systemctl", "changes system services"),
    allow("systemctl status", READ), allow("systemctl list-units", READ),
    allow("systemctl list-unit-files", READ), allow("systemctl is-active", READ),
    allow("systemctl is-enabled", READ), allow("systemctl is-failed", READ),
    allow("systemctl show", READ), allow("systemctl cat", READ),
    allow("journalctl", "reads system logs"),
    // git
    prompt("git", "no built-in rule covers this git subcommand"),
    allow("git status", READ), allow("git diff", READ).refine(refine_git_output),
    allow("git log", READ).refine(refine_git_output), allow("git show", READ).refine(refine_git_output),
    allow("git blame", READ), allow("git annotate", READ), allow("git rev-parse", READ),
    allow("git rev-list", READ), allow("git ls-files", READ), allow("git ls-tree", READ),
    allow("git cat-file", READ), allow("git describe", READ), allow("git shortlog", READ),
    allow("git grep", READ).refine(refine_git_grep), allow("git reflog", READ).refine(refine_git_reflog),
    allow("git branch", "lists branches").refine(refine_git_branch),
    allow("git tag", "lists tags").refine(refine_git_tag),
    allow("git config", "reads git config").refine(refine_git_config),
    allow("git remote", "lists remotes").exact(), prompt("git remote", "changes the configured remotes"),
    allow("git remote get-url", READ),
    prompt("git stash", "changes the stash and the working tree"),
    allow("git stash list", READ), allow("git stash show", READ),
    prompt("git worktree", "adds or removes worktrees"), allow("git worktree list", READ),
    prompt("git submodule", "changes submodules"), allow("git submodule", "shows submodules").exact(),
    allow("git submodule status", READ),
    allow("git help", READ), allow("git version", READ), allow("git check-ignore", READ),
    allow("git check-attr", READ), allow("git merge-base", READ), allow("git name-rev", READ),
    allow("git whatchanged", READ), allow("git count-objects", READ), allow("git var", READ),
    allow("git for-each-ref", READ), allow("git show-ref", READ), allow("git show-branch", READ),
    allow("git symbolic-ref", READ).refine(refine_git_symbolic_ref), allow("git diff-tree", READ),
    allow("git diff-files", READ), allow("git diff-index", READ), allow("git verify-commit", READ),
    allow("git verify-tag", READ), allow("git fsck", READ), allow("git range-diff", READ),
    allow("git cherry", READ), allow("git lfs ls-files", READ),
    prompt("git add", "stages changes"), prompt("git commit", "records a commit"),
    prompt("git checkout", "switches branches or overwrites files in the working tree"),
    prompt("git switch", "switches branches"), prompt("git restore", "overwrites files in the working tree"),
    prompt("git reset", "moves the branch and may discard changes"), prompt("git merge", "merges history"),
    prompt("git rebase", "rewrites history"), prompt("git cherry-pick", "applies commits"),
    prompt("git revert", "records reverting commits"), prompt("git clean", "deletes untracked files"),
    prompt("git mv", WRITES), prompt("git rm", DELETES), prompt("git init", "creates a repository"),
    prompt("git apply", "applies a patch to files"), prompt("git am", "applies patches as commits"),
    prompt("git format-patch", WRITES), prompt("git archive", WRITES),
    prompt("git gc", "rewrites the object store"), prompt("git prune", "deletes unreachable objects"),
    prompt("git bisect", "checks out commits"), prompt("git notes", "changes notes"),
    prompt("git filter-branch", "rewrites history"), prompt("git update-ref", "moves references"),
    prompt("git update-index", "changes the index"),
    prompt("git push", NET), prompt("git pull", NET), prompt("git fetch", NET), prompt("git clone", NET),
    prompt("git ls-remote", NET),
    // cargo
    prompt("cargo", "no built-in rule covers this cargo subcommand"),
    allow("cargo build", BUILD), allow("cargo b", BUILD), allow("cargo check", BUILD), allow("cargo c", BUILD),
    allow("cargo test", BUILD), allow("cargo t", BUILD), allow("cargo bench", BUILD),
    allow("cargo clippy", "lints the project").refine(refine_cargo_clippy),
    allow("cargo fmt", "checks formatting").refine(refine_cargo_fmt),
    allow("cargo doc", BUILD), allow("cargo d", BUILD), allow("cargo tree", READ), allow("cargo metadata", READ),
    allow("cargo version", READ), allow("cargo help", READ), allow("cargo locate-project", READ),
    allow("cargo pkgid", READ), allow("cargo verify-project", READ), allow("cargo read-manifest", READ),
    allow("cargo nextest", BUILD),
    prompt("cargo run", "runs the project's program"), prompt("cargo r", "runs the project's program"),
    prompt("cargo clean", DELETES), prompt("cargo fix", "rewrites source files"),
    prompt("cargo new", WRITES), prompt("cargo init", WRITES), prompt("cargo package", WRITES),
    prompt("cargo remove", "edits Cargo.toml"), prompt("cargo rm", "edits Cargo.toml"),
    prompt("cargo uninstall", PKG),
    prompt("cargo install", PKG), prompt("cargo publish", NET), prompt("cargo add", PKG), prompt("cargo update", PKG),
    // rust tools
    allow("rustfmt", "checks formatting").refine(refine_rustfmt),
    allow("rustup show", READ), allow("rustup which", READ), allow("rustup toolchain list", READ),
    allow("rustup target list", READ), allow("rustup component list", READ),
    prompt("rustup", "changes installed toolchains"),
    // JavaScript
    prompt("npm", "no built-in rule covers this npm command"),
    allow("npm test", BUILD), allow("npm t", BUILD), allow("npm ls", READ), allow("npm list", READ),
    allow("npm help", READ), allow("npm root", READ), allow("npm prefix", READ),
    prompt("npm run", "runs a package.json script that is not a known build/test/lint script"),
    prompt("npm run-script", "runs a package.json script that is not a known build/test/lint script"),
    allow("npm run test", BUILD), allow("npm run lint", BUILD), allow("npm run build", BUILD),
    allow("npm run check", BUILD), allow("npm run typecheck", BUILD),
    prompt("npm install", PKG), prompt("npm i", PKG), prompt("npm ci", PKG),
    prompt("pnpm", "no built-in rule covers this pnpm command"), allow("pnpm test", BUILD),
    allow("pnpm lint", BUILD), allow("pnpm build", BUILD), allow("pnpm run test", BUILD),
    allow("pnpm run lint", BUILD), allow("pnpm run build", BUILD), allow("pnpm ls", READ), allow("pnpm list", READ),
    prompt("yarn", "no built-in rule covers this yarn command"), allow("yarn test", BUILD),
    allow("yarn lint", BUILD), allow("yarn build", BUILD), allow("yarn run test", BUILD),
    allow("yarn run lint", BUILD), allow("yarn run build", BUILD),
    prompt("bun", "no built-in rule covers this bun command"), allow("bun test", BUILD),
    allow("bun run test", BUILD), allow("bun run lint", BUILD), allow("bun run build", BUILD),
    allow("tsc", BUILD), allow("jest", BUILD), allow("vitest", BUILD), allow("mocha", BUILD),
    allow("eslint", "lints files").refine(refine_eslint),
    allow("prettier", "checks formatting").refine(refine_prettier),
    // Python
    allow("pytest", BUILD), allow("py.test", BUILD), allow("unittest", BUILD), allow("json.tool", READ),
    allow("mypy", "type-checks the project"), allow("flake8", "lints files"), allow("pylint", "lints files"),
    allow("coverage", BUILD),
    allow("ruff check", "lints files").refine(refine_fix_flag), allow("ruff format", "checks formatting").refine(refine_check_flag),
    prompt("ruff", "no built-in rule covers this ruff command"),
    allow("black", "checks formatting").refine(refine_check_flag),
    allow("isort", "checks import order").refine(refine_check_flag),
    prompt("pip", PKG), allow("pip list", READ), allow("pip show", READ), allow("pip freeze", READ),
    allow("pip check", READ), prompt("pip3", PKG), allow("pip3 list", READ), allow("pip3 show", READ),
    allow("pip3 freeze", READ), allow("uv pip list", READ), allow("uv pip show", READ),
    allow("uv pip freeze", READ), prompt("uv", "no built-in rule covers this uv command"),
    prompt("venv", WRITES), prompt("http.server", "serves files over the network"),
    prompt("tox", "creates environments and runs commands"), prompt("poetry", PKG), allow("poetry show", READ),
    prompt("poetry run", "runs a program in the project environment"),
    // Go
    prompt("go", "no built-in rule covers this go command"), allow("go build", BUILD).refine(refine_go_exec), allow("go test", BUILD).refine(refine_go_exec),
    allow("go vet", BUILD).refine(refine_go_exec), allow("go version", READ), allow("go env", READ).refine(refine_go_env),
    allow("go list", READ), allow("go doc", READ), allow("go mod graph", READ), allow("go mod why", READ),
    allow("go mod verify", READ), prompt("go fmt", "rewrites source files"), prompt("go run", "runs a program"),
    prompt("go generate", "runs the commands named in go:generate comments"),
    allow("gofmt", "prints formatted source").refine(refine_gofmt),
    // make and friends
    prompt("make", "runs a Makefile target; its recipe was not checked"),
    allow("make test", BUILD), allow("make check", BUILD), allow("make lint", BUILD),
    prompt("just", "runs a justfile recipe; its recipe was not checked"),
    // containers and clusters
    prompt("docker", "changes containers, images or volumes"),
    allow("docker ps", READ), allow("docker images", READ), allow("docker logs", READ),
    allow("docker inspect", READ), allow("docker version", READ), allow("docker info", READ),
    allow("docker compose ps", READ), allow("docker compose logs", READ),
    allow("docker compose config", READ), allow("docker container ls", READ),
    allow("docker image ls", READ), allow("docker volume ls", READ), allow("docker network ls", READ),
    prompt("podman", "changes containers, images or volumes"), allow("podman ps", READ),
    allow("podman images", READ), allow("podman logs", READ), allow("podman inspect", READ),
    allow("podman version", READ), allow("podman info", READ),
    prompt("kubectl", "talks to a Kubernetes cluster"), prompt("helm", "talks to a Kubernetes cluster"),
    prompt("terraform", "reads or changes infrastructure"), allow("terraform validate", READ),
    allow("terraform version", READ), allow("terraform fmt", "checks formatting").refine(refine_terraform_fmt),
    // packages
    prompt("apt", PKG), allow("apt list", READ), allow("apt show", READ), allow("apt search", READ),
    allow("apt policy", READ), prompt("apt-get", PKG), prompt("dnf", PKG), prompt("yum", PKG),
    prompt("apk", PKG), prompt("brew", PKG), allow("brew list", READ), allow("brew info", READ),
    prompt("gem", PKG), prompt("bundle", PKG), prompt("conda", PKG), prompt("pipx", PKG),
    allow("pipx list", READ), prompt("snap", PKG), prompt("flatpak", PKG),
];

// ---------------------------------------------------------------------------------------------
// Argument helpers shared by refiners and the policy.

/// The texts of `ws`.
pub(crate) fn texts(ws: &[Word]) -> impl Iterator<Item = &str> {
    ws.iter().map(|w| w.text.as_str())
}

/// Whether a word is a short option cluster (`-la`), not `-`, `--` or a long option.
pub(crate) fn is_short_cluster(a: &str) -> bool {
    a.len() > 1 && a.starts_with('-') && !a.starts_with("--")
}

/// Whether any word is one of the long options `names` (also in `--name=value` form) or an
/// exact short option in `names`.
pub(crate) fn has_opt(ws: &[Word], names: &[&str]) -> bool {
    texts(ws).take_while(|a| *a != "--").any(|a| {
        names.iter().any(|n| {
            a == *n
                || (n.starts_with("--") && a.strip_prefix(n).is_some_and(|r| r.starts_with('=')))
        })
    })
}

/// Whether any short option cluster contains one of `letters`.
pub(crate) fn short_has(ws: &[Word], letters: &str) -> bool {
    texts(ws)
        .take_while(|a| *a != "--")
        .filter(|a| is_short_cluster(a))
        .any(|a| a[1..].chars().any(|c| letters.contains(c)))
}

/// Positional words (not options; everything after `--`).
pub(crate) fn positionals(ws: &[Word]) -> Vec<&str> {
    let mut out = Vec::new();
    let mut dashes = false;
    for a in texts(ws) {
        if !dashes && a == "--" {
            dashes = true;
        } else if dashes || !a.starts_with('-') || a == "-" {
            out.push(a);
        }
    }
    out
}

/// The values given to an option: `-o V`, `-oV`, `-abo V` (when `o` ends a cluster of
/// `short_with_value` letters), `--output V`, `--output=V`.
pub(crate) fn opt_values<'a>(
    ws: &'a [Word],
    shorts: &str,
    longs: &[&str],
    short_with_value: &str,
) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ws.len() {
        let a = ws[i].text.as_str();
        if a == "--" {
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            for l in longs {
                let l = l.trim_start_matches('-');
                if long == l {
                    if let Some(v) = ws.get(i + 1) {
                        out.push(v.text.as_str());
                    }
                } else if let Some(v) = long.strip_prefix(l).and_then(|r| r.strip_prefix('=')) {
                    out.push(v);
                }
            }
        } else if is_short_cluster(a) {
            let body = &a[1..];
            for (k, c) in body.char_indices() {
                if shorts.contains(c) {
                    let tail = &body[k + c.len_utf8()..];
                    if tail.is_empty() {
                        if let Some(v) = ws.get(i + 1) {
                            out.push(v.text.as_str());
                        }
                    } else {
                        out.push(tail);
                    }
                    break;
                }
                if short_with_value.contains(c) {
                    break;
                }
            }
        }
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Refiners.

fn refine_find(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    let args: Vec<&str> = texts(inv.rest).collect();
    if args.contains(&"-delete") {
        return Some((Decision::Prompt, "`find -delete` deletes every match"));
    }
    if args
        .iter()
        .any(|a| matches!(*a, "-fprint" | "-fprint0" | "-fprintf" | "-fls"))
    {
        return Some((Decision::Prompt, "`find -fprint` writes to a file"));
    }
    None
}

fn refine_sed(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    if short_has(inv.rest, "i") || has_opt(inv.rest, &["--in-place"]) {
        return Some((Decision::Prompt, "`sed -i` edits files in place"));
    }
    if has_opt(inv.rest, &["-f", "--file"]) || short_has(inv.rest, "f") {
        return Some((
            Decision::Prompt,
            "runs a sed script file whose contents were not checked",
        ));
    }
    let mut scripts = opt_values(inv.rest, "e", &["--expression"], "lf");
    if scripts.is_empty()
        && let Some(first) = positionals(inv.rest).first()
    {
        scripts.push(first);
    }
    if scripts.iter().all(|s| sed_script_is_read_only(s)) {
        None
    } else {
        Some((
            Decision::Prompt,
            "the sed script may write files or run programs (w, W, r, R, e commands or s///e, s///w)",
        ))
    }
}

/// Whether a sed script only prints/transforms its input (no `w`, `r`, `e` commands or flags).
pub(crate) fn sed_script_is_read_only(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && matches!(b[*i], b' ' | b'\t' | b'\n' | b';') {
            *i += 1;
        }
    };
    // Skips a delimited part (`/re/`), returning false if unterminated.
    let delimited = |i: &mut usize, d: u8| -> bool {
        while *i < b.len() {
            match b[*i] {
                b'\\' => *i += 2,
                c if c == d => {
                    *i += 1;
                    return true;
                }
                b'\n' => return false,
                _ => *i += 1,
            }
        }
        false
    };
    let address = |i: &mut usize| -> bool {
        match b.get(*i) {
            Some(c) if c.is_ascii_digit() => {
                while *i < b.len() && (b[*i].is_ascii_digit() || b[*i] == b'~') {
                    *i += 1;
                }
                true
            }
            Some(b'$') => {
                *i += 1;
                true
            }
            Some(b'/') => {
                *i += 1;
                if !delimited(i, b'/') {
                    return false;
                }
                while *i < b.len() && matches!(b[*i], b'I' | b'M') {
                    *i += 1;
                }
                true
            }
            Some(b'\\') => {
                let Some(&d) = b.get(*i + 1) else {
                    return false;
                };
                *i += 2;
                delimited(i, d)
            }
            _ => true,
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            return true;
        }
        if !address(&mut i) {
            return false;
        }
        if b.get(i) == Some(&b',') {
            i += 1;
            if b.get(i) == Some(&b'+') || b.get(i) == Some(&b'~') {
                i += 1;
            }
            if !address(&mut i) {
                return false;
            }
        }
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'!') {
            i += 1;
        }
        let Some(&cmd) = b.get(i) else { return true };
        i += 1;
        match cmd {
            b'p' | b'P' | b'd' | b'D' | b'q' | b'Q' | b'=' | b'l' | b'n' | b'N' | b'g' | b'G'
            | b'h' | b'H' | b'x' | b'z' | b'F' | b'{' | b'}' => {
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            b'b' | b't' | b'T' | b':' | b'#' | b'a' | b'i' | b'c' => {
                while i < b.len() && !matches!(b[i], b'\n' | b';') {
                    i += 1;
                }
            }
            b'y' => {
                let Some(&d) = b.get(i) else { return false };
                i += 1;
                if !delimited(&mut i, d) || !delimited(&mut i, d) {
                    return false;
                }
            }
            b's' => {
                let Some(&d) = b.get(i) else { return false };
                if d == b'\\' || d == b'\n' {
                    return false;
                }
                i += 1;
                if !delimited(&mut i, d) || !delimited(&mut i, d) {
                    return false;
                }
                while i < b.len()
                    && (b[i].is_ascii_digit()
                        || matches!(b[i], b'g' | b'p' | b'i' | b'I' | b'm' | b'M'))
                {
                    i += 1;
                }
                if matches!(b.get(i), Some(b'e' | b'w' | b'W')) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

fn refine_awk(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    if has_opt(inv.rest, &["-f", "--file"]) {
        return Some((
            Decision::Prompt,
            "runs an awk program file whose contents were not checked",
        ));
    }
    // The program is the first word that is neither an option nor an option's value.
    let mut i = 0;
    let program = loop {
        let Some(w) = inv.rest.get(i) else { break None };
        let a = w.text.as_str();
        if matches!(a, "-F" | "-v" | "--field-separator" | "--assign") {
            i += 2;
        } else if a.starts_with('-') && a != "-" {
            i += 1;
        } else {
            break Some(a);
        }
    };
    let program = program.unwrap_or("");
    if ["system", "getline", "close(", "fflush", "|", ">"]
        .iter()
        .any(|p| program.contains(p))
    {
        Some((
            Decision::Prompt,
            "the awk program can run commands or write files (system, getline, |, >)",
        ))
    } else {
        None
    }
}

fn refine_sort(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    if has_opt(inv.rest, &["--compress-program"]) {
        return Some((Decision::Prompt, "`sort --compress-program` runs a program"));
    }
    (!opt_values(inv.rest, "o", &["--output"], "kt").is_empty())
        .then_some((Decision::Prompt, "`sort -o` writes to a file"))
}

fn refine_pager(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    // `less '+!cmd'` runs its initial commands, which include shell escapes.
    texts(inv.rest).any(|a| a.starts_with('+')).then_some((
        Decision::Prompt,
        "`+` runs pager commands, which can include shell escapes",
    ))
}

fn refine_rg(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["--pre"]).then_some((
        Decision::Prompt,
        "`rg --pre` runs a preprocessor program on every file",
    ))
}

fn refine_fd(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["-x", "--exec", "-X", "--exec-batch"]).then_some((
        Decision::Prompt,
        "`fd --exec` runs a command on every match",
    ))
}

fn refine_tree(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["-o"]).then_some((Decision::Prompt, "`tree -o` writes to a file"))
}

fn refine_man(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (has_opt(
        inv.rest,
        &["-P", "--pager", "-H", "--html", "-p", "--preprocessor"],
    ) || texts(inv.rest).any(|a| a.starts_with("-P") || a.starts_with("-H")))
    .then_some((Decision::Prompt, "`man -P`/`-H` runs the named program"))
}

fn refine_go_exec(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    texts(inv.rest)
        .any(|a| {
            let a = a.trim_start_matches('-');
            a == "exec" || a.starts_with("exec=") || a == "toolexec" || a.starts_with("toolexec=")
        })
        .then_some((
            Decision::Prompt,
            "`-exec`/`-toolexec` runs the named program",
        ))
}

fn refine_uniq(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (positionals(inv.rest).len() >= 2)
        .then_some((Decision::Prompt, "`uniq IN OUT` writes its output file"))
}

fn refine_xxd(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (positionals(inv.rest).len() >= 2)
        .then_some((Decision::Prompt, "`xxd IN OUT` writes its output file"))
}

fn refine_date(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (has_opt(inv.rest, &["-s", "--set"])).then_some((Decision::Prompt, "sets the system clock"))
}

fn refine_hostname(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (!positionals(inv.rest).is_empty()).then_some((Decision::Prompt, "sets the hostname"))
}

fn refine_yq(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (short_has(inv.rest, "i") || has_opt(inv.rest, &["--inplace"]))
        .then_some((Decision::Prompt, "`yq -i` edits files in place"))
}

fn refine_tar(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    const RUNS: &[&str] = &[
        "--to-command",
        "--checkpoint-action",
        "--use-compress-program",
        "--info-script",
        "--new-volume-script",
        "--rsh-command",
        "-I",
        "-F",
    ];
    if has_opt(inv.rest, RUNS) || texts(inv.rest).any(|a| a.starts_with("--checkpoint-action")) {
        return Some((Decision::Prompt, "this tar option runs a program"));
    }
    let mut listing = has_opt(inv.rest, &["--list"]);
    let mut writing = has_opt(
        inv.rest,
        &[
            "--extract",
            "--get",
            "--create",
            "--append",
            "--update",
            "--delete",
            "--concatenate",
        ],
    );
    for (k, a) in texts(inv.rest).enumerate() {
        let letters = if k == 0 && !a.starts_with('-') {
            a
        } else if is_short_cluster(a) {
            &a[1..]
        } else {
            continue;
        };
        if letters.contains('t') {
            listing = true;
        }
        if letters
            .chars()
            .any(|c| matches!(c, 'x' | 'c' | 'r' | 'u' | 'A'))
        {
            writing = true;
        }
    }
    (writing || !listing).then_some((
        Decision::Prompt,
        "creates or extracts an archive (writes files)",
    ))
}

fn refine_crontab(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    let only_list = !inv.rest.is_empty()
        && texts(inv.rest).all(|a| a == "-l" || a == "-u" || !a.starts_with('-'))
        && has_opt(inv.rest, &["-l"]);
    (!only_list).then_some((Decision::Prompt, "edits scheduled jobs"))
}

fn refine_dpkg(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    let read = has_opt(
        inv.rest,
        &[
            "-l",
            "-L",
            "-s",
            "-S",
            "-p",
            "--list",
            "--listfiles",
            "--status",
            "--search",
            "--print-avail",
            "--get-selections",
            "--print-architecture",
        ],
    );
    (!read).then_some((Decision::Prompt, PKG))
}

fn refine_sysctl(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (short_has(inv.rest, "wp")
        || has_opt(inv.rest, &["--write", "--load", "--system"])
        || texts(inv.rest).any(|a| a.contains('=')))
    .then_some((Decision::Prompt, "changes kernel settings"))
}

fn refine_ip(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    let p = positionals(inv.rest);
    p.iter()
        .any(|a| {
            matches!(
                *a,
                "add"
                    | "del"
                    | "delete"
                    | "set"
                    | "change"
                    | "replace"
                    | "flush"
                    | "append"
                    | "exec"
            )
        })
        .then_some((Decision::Prompt, "changes network configuration"))
}

fn refine_git_output(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    if has_opt(inv.rest, &["--output"]) {
        return Some((Decision::Prompt, "`--output` writes to a file"));
    }
    if has_opt(inv.rest, &["--ext-diff"]) {
        return Some((
            Decision::Prompt,
            "`--ext-diff` runs the configured external diff program",
        ));
    }
    None
}

fn refine_git_grep(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (texts(inv.rest).any(|a| a.starts_with("-O") || a.starts_with("--open-files-in-pager")))
        .then_some((Decision::Prompt, "`git grep -O` runs a pager program"))
}

fn refine_git_reflog(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    positionals(inv.rest)
        .first()
        .is_some_and(|a| matches!(*a, "expire" | "delete"))
        .then_some((Decision::Prompt, "deletes reflog entries"))
}

fn refine_git_branch(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    let modifying = has_opt(
        inv.rest,
        &[
            "--delete",
            "--move",
            "--copy",
            "--force",
            "--set-upstream-to",
            "--unset-upstream",
            "--edit-description",
            "--track",
            "--no-track",
            "-u",
            "-t",
        ],
    ) || short_has(inv.rest, "dDmMcCfu");
    if modifying {
        return Some((Decision::Prompt, "deletes, renames or creates branches"));
    }
    let listing = has_opt(
        inv.rest,
        &[
            "--list",
            "-l",
            "-a",
            "--all",
            "-r",
            "--remotes",
            "--contains",
            "--no-contains",
            "--merged",
            "--no-merged",
            "--points-at",
            "--show-current",
            "--sort",
            "--format",
        ],
    );
    (!positionals(inv.rest).is_empty() && !listing)
        .then_some((Decision::Prompt, "creates a branch"))
}

fn refine_git_tag(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    let modifying = has_opt(
        inv.rest,
        &[
            "--delete",
            "--annotate",
            "--sign",
            "--local-user",
            "--message",
            "--file",
            "--force",
            "--edit",
        ],
    ) || short_has(inv.rest, "dasumFfe");
    if modifying {
        return Some((Decision::Prompt, "creates or deletes tags"));
    }
    let listing = has_opt(
        inv.rest,
        &[
            "--list",
            "-l",
            "-n",
            "--contains",
            "--no-contains",
            "--points-at",
            "--merged",
            "--no-merged",
            "--sort",
            "--format",
        ],
    );
    (!positionals(inv.rest).is_empty() && !listing).then_some((Decision::Prompt, "creates a tag"))
}

pub(crate) fn refine_git_config(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    let write = has_opt(
        inv.rest,
        &[
            "--unset",
            "--unset-all",
            "--add",
            "--replace-all",
            "--rename-section",
            "--remove-section",
            "--edit",
            "-e",
        ],
    );
    let read = has_opt(
        inv.rest,
        &[
            "--get",
            "--get-all",
            "--get-regexp",
            "--get-urlmatch",
            "--list",
            "-l",
            "--get-color",
            "--get-colorbool",
        ],
    );
    let p = positionals(inv.rest);
    if write
        || p.first().is_some_and(|a| {
            matches!(
                *a,
                "set" | "unset" | "rename-section" | "remove-section" | "edit"
            )
        })
    {
        return Some((Decision::Prompt, "changes git config"));
    }
    if read || p.first().is_some_and(|a| matches!(*a, "get" | "list")) || p.len() <= 1 {
        return None;
    }
    Some((
        Decision::Prompt,
        "sets a git config value, which can name programs git runs",
    ))
}

fn refine_git_symbolic_ref(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (positionals(inv.rest).len() >= 2 || has_opt(inv.rest, &["-d", "--delete"]))
        .then_some((Decision::Prompt, "moves a symbolic reference"))
}

fn refine_cargo_fmt(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    // `--check` may also come after `--` (it is then passed on to rustfmt).
    (!texts(inv.rest).any(|a| a == "--check")).then_some((
        Decision::Prompt,
        "rewrites source files (use `cargo fmt --check` to only check)",
    ))
}

fn refine_cargo_clippy(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["--fix"]).then_some((Decision::Prompt, "`--fix` rewrites source files"))
}

fn refine_rustfmt(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (!has_opt(inv.rest, &["--check"])).then_some((
        Decision::Prompt,
        "rewrites source files (use `--check` to only check)",
    ))
}

fn refine_fix_flag(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["--fix", "--unsafe-fixes"])
        .then_some((Decision::Prompt, "`--fix` rewrites source files"))
}

fn refine_check_flag(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (!has_opt(inv.rest, &["--check", "--diff", "--check-only", "-c"])).then_some((
        Decision::Prompt,
        "rewrites source files (use `--check` to only check)",
    ))
}

fn refine_eslint(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["--fix"]).then_some((Decision::Prompt, "`--fix` rewrites source files"))
}

fn refine_prettier(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["--write", "-w"])
        .then_some((Decision::Prompt, "`--write` rewrites source files"))
}

fn refine_go_env(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    has_opt(inv.rest, &["-w", "-u"])
        .then_some((Decision::Prompt, "changes the go environment file"))
}

fn refine_gofmt(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    short_has(inv.rest, "w").then_some((Decision::Prompt, "`gofmt -w` rewrites source files"))
}

fn refine_terraform_fmt(inv: &Inv<'_>) -> Option<(Decision, &'static str)> {
    (!has_opt(inv.rest, &["-check", "--check"])).then_some((
        Decision::Prompt,
        "rewrites configuration files (use `-check`)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sed_scripts() {
        for s in [
            "s/a/b/g",
            "1,20p",
            "/foo/d",
            "$p",
            "10q",
            "s|x|y|",
            "1d;2d",
            "y/abc/xyz/",
            "/a/,/b/p",
            "",
        ] {
            assert!(sed_script_is_read_only(s), "{s}");
        }
        for s in [
            "w out",
            "s/a/b/w out",
            "s/a/b/e",
            "1e id",
            "r /etc/passwd",
            "s/a/b",
            "k",
        ] {
            assert!(!sed_script_is_read_only(s), "{s}");
        }
    }

    #[test]
    fn rule_prefixes_are_unique_or_exact_pairs() {
        let mut seen = std::collections::HashSet::new();
        for r in BUILTIN_RULES {
            assert!(
                seen.insert((r.prefix, r.exact)),
                "duplicate builtin rule {}",
                r.prefix
            );
            assert!(
                !r.prefix.split(' ').any(|w| w.starts_with('-')),
                "{}",
                r.prefix
            );
        }
    }

    #[test]
    fn interpreter_names() {
        assert_eq!(interpreter("python3.12").map(|i| i.0), Some("python3"));
        assert_eq!(interpreter("python").map(|i| i.0), Some("python"));
        assert_eq!(interpreter("pythonista"), None);
        assert_eq!(interpreter("perl").map(|i| i.1), Some("eE"));
    }
}
