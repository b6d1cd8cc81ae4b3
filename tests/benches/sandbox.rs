//! What the OS sandbox costs a command: `true` run the way the kernel runs a plugin's command,
//! unconfined and under bubblewrap (workspace-write), whole process start to exit.

use criterion::Criterion;
use keel_kernel::sandbox::{SandboxConfig, SandboxMode, run_command};

fn sandbox(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().canonicalize().expect("canonical");
    let mut group = c.benchmark_group("command");
    for (name, mode) in [
        ("true_unconfined", SandboxMode::Off),
        ("true_workspace_write", SandboxMode::WorkspaceWrite),
    ] {
        let config = SandboxConfig {
            mode,
            ..SandboxConfig::default()
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let out = rt
                    .block_on(run_command(&ws, "true", &config, None))
                    .expect("runs");
                assert_eq!(out.exit_code, Some(0));
            })
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    sandbox(&mut c);
    c.final_summary();
}
