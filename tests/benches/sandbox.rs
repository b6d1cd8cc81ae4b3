//! What the OS sandbox costs a command: `true` run the way the kernel runs a plugin's command,
//! unconfined, under bubblewrap (workspace-write), and under bubblewrap with network through
//! keel's proxy (its own network namespace and the handed-over listener), whole process start
//! to exit (and under bubblewrap as a session configures it: a repository's control
//! directories read-only, the default deny-read list hidden); and what keel's proxy adds to a small HTTP request on loopback.

use criterion::Criterion;
use keel_kernel::gates::net_policy::{NetDecision, NetPolicy};
use keel_kernel::sandbox::{CommandNetwork, SandboxConfig, SandboxMode, run_command, serve_proxy};
use keel_kernel::{NetConfig, Secrets};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn network_allowing(endpoint: &str) -> NetConfig {
    NetConfig {
        policy: NetPolicy::new(NetDecision::Allow)
            .with_allow_private(endpoint)
            .expect("entry"),
        secrets: Secrets::new(),
        audit_log: None,
    }
}

fn commands(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().canonicalize().expect("canonical");
    let mut group = c.benchmark_group("command");
    for (name, mode, network) in [
        ("true_unconfined", SandboxMode::Off, None),
        ("true_workspace_write", SandboxMode::WorkspaceWrite, None),
        (
            "true_workspace_write_with_proxy",
            SandboxMode::WorkspaceWrite,
            Some(network_allowing("127.0.0.1:9")),
        ),
    ] {
        let config = SandboxConfig {
            mode,
            network: CommandNetwork::All,
            ..SandboxConfig::default()
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let out = rt
                    .block_on(run_command(&ws, "true", &config, network.clone()))
                    .expect("runs");
                assert_eq!(out.exit_code, Some(0));
            })
        });
    }
    // A command after the machine sat idle for a moment, as one does while the model thinks:
    // what moving a task into a cgroup costs (a grace period) shows only then, since back to
    // back commands find the kernel still in the state the last move left. Only the command
    // is timed.
    let config = SandboxConfig {
        mode: SandboxMode::WorkspaceWrite,
        ..SandboxConfig::default()
    };
    group.bench_function("true_workspace_write_after_200ms_idle", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            for _ in 0..iters {
                std::thread::sleep(std::time::Duration::from_millis(200));
                let start = std::time::Instant::now();
                let out = rt
                    .block_on(run_command(&ws, "true", &config, None))
                    .expect("runs");
                total += start.elapsed();
                assert_eq!(out.exit_code, Some(0));
            }
            total
        })
    });
    // A session's sandbox as the CLI configures it: a repository workspace (its control
    // directories bound read-only) and the default deny-read list under the real home.
    let repo_dir = tempfile::tempdir().expect("tempdir");
    let repo = repo_dir.path().canonicalize().expect("canonical");
    for control in [".git/hooks", ".keel", ".hg"] {
        std::fs::create_dir_all(repo.join(control)).expect("mkdir");
    }
    let home = std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let config = SandboxConfig {
        mode: SandboxMode::WorkspaceWrite,
        deny_read: keel_kernel::sandbox::DEFAULT_DENY_READ
            .iter()
            .map(|p| home.join(p))
            .collect(),
        ..SandboxConfig::default()
    };
    group.bench_function("true_workspace_write_repository_session_defaults", |b| {
        b.iter(|| {
            let out = rt
                .block_on(run_command(&repo, "true", &config, None))
                .expect("runs");
            assert_eq!(out.exit_code, Some(0));
        })
    });
    group.finish();
}

/// One small HTTP/1.1 exchange on a fresh connection, read to the end.
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> usize {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.expect("read");
    assert!(
        reply.ends_with(b"hello"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    reply.len()
}

fn proxy(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let (server, proxy) = rt.block_on(async {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server_addr = server.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = server.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                        )
                        .await;
                });
            }
        });
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy_addr = proxy.local_addr().expect("addr");
        tokio::spawn(serve_proxy(proxy, network_allowing(&server_addr.to_string())));
        (server_addr, proxy_addr)
    });
    let direct = format!("GET / HTTP/1.1\r\nHost: {server}\r\n\r\n");
    let proxied = format!("GET http://{server}/ HTTP/1.1\r\nHost: {server}\r\n\r\n");
    let mut group = c.benchmark_group("http_request");
    group.bench_function("direct", |b| {
        b.iter(|| rt.block_on(exchange(server, direct.as_bytes())))
    });
    group.bench_function("through_keels_proxy", |b| {
        b.iter(|| rt.block_on(exchange(proxy, proxied.as_bytes())))
    });
    group.finish();
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut c = Criterion::default().configure_from_args();
    commands(&mut c, &rt);
    proxy(&mut c, &rt);
    c.final_summary();
}
