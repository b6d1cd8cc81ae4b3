//! Hostile plugins, built like any plugin, each contained with a clear error while the rest of
//! the system keeps running.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_kernel::{Env, KernelError, PluginState};
use keel_tests::Harness;

type R = anyhow::Result<()>;

fn harness() -> anyhow::Result<(Harness, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    Ok((Harness::new(dir.path(), None)?, dir))
}

fn failed_message(e: Option<KernelError>) -> String {
    match e {
        Some(KernelError::Failed(m)) => m,
        other => panic!("expected a failed call, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_is_stopped_by_the_cpu_bound_and_everyone_keeps_serving() -> R {
    let (h, _dir) = harness()?;
    h.load_bundled("greeter").await?;
    h.load_fixture("spin-loop").await?;
    let kernel = h.kernel.clone();
    let started = Instant::now();
    let spin = tokio::spawn(async move { kernel.call_service("fixture.spin", "spin", "").await });
    // While the loop spins, another plugin answers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let greeting = tokio::time::timeout(
        Duration::from_secs(10),
        h.kernel.call_service("example.greeting", "greet", "Ada"),
    )
    .await??;
    assert_eq!(greeting, "Hello, Ada!");
    let e = tokio::time::timeout(Duration::from_secs(30), spin)
        .await??
        .err();
    let elapsed = started.elapsed();
    let m = failed_message(e);
    assert!(m.contains("spin-loop") && m.contains("cpu"), "{m}");
    // The manifest sets cpu-ms = 500: the loop ends after about that, not after the 30 s guard.
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    // Bounded, not broken: a fresh instance answers the next call.
    assert_eq!(
        h.kernel.call_service("fixture.spin", "ping", "").await?,
        "pong"
    );
    assert_eq!(
        h.kernel.status("spin-loop").map(|s| s.state),
        Some(PluginState::Active)
    );
    assert_eq!(
        h.kernel
            .call_service("example.greeting", "greet", "Bo")
            .await?,
        "Hello, Bo!"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gigabyte_allocation_is_stopped_by_the_memory_cap() -> R {
    let (h, _dir) = harness()?;
    h.load_bundled("greeter").await?;
    h.load_fixture("memory-bomb").await?;
    let outcome = h
        .kernel
        .call_service("fixture.bomb", "allocate", "1024")
        .await;
    match outcome {
        Err(KernelError::Failed(m)) => {
            assert!(m.contains("memory-bomb") && m.contains("memory"), "{m}")
        }
        other => panic!("a 1 GiB allocation under a 64 MiB cap must fail, got {other:?}"),
    }
    // The other plugin was never affected.
    assert_eq!(
        h.kernel
            .call_service("example.greeting", "greet", "Ada")
            .await?,
        "Hello, Ada!"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trap_in_activate_fails_that_plugin_only_and_undoes_its_effects() -> R {
    let (h, _dir) = harness()?;
    h.load_bundled("echo-tool").await?;
    let before = h.kernel.fingerprint();
    let status = h.load_fixture("trap-activate").await?;
    match &status.state {
        PluginState::Failed { reason } => assert!(
            reason.contains("activation") || reason.contains("trap"),
            "{reason}"
        ),
        other => panic!("expected failed, got {other:?}"),
    }
    assert_eq!(
        h.kernel.fingerprint(),
        before,
        "trap_tool and fixture.trap were undone"
    );
    assert!(!h.kernel.tools().iter().any(|t| t.name == "trap_tool"));
    assert_eq!(
        h.kernel
            .invoke_tool("echo", r#"{"text":"still here"}"#)
            .await?,
        "still here"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_outside_the_preopened_directory_are_refused() -> R {
    let root = tempfile::tempdir()?;
    let workspace = root.path().join("ws");
    std::fs::create_dir(&workspace)?;
    std::fs::write(workspace.join("inside.txt"), "inside")?;
    std::fs::write(root.path().join("secret.txt"), "secret")?;
    #[cfg(unix)]
    std::os::unix::fs::symlink(root.path().join("secret.txt"), workspace.join("link.txt"))?;
    let h = Harness::new(&workspace, None)?;
    h.load_fixture("path-escape").await?;
    assert_eq!(
        h.kernel
            .call_service("fixture.fs", "read", "/workspace/inside.txt")
            .await?,
        "inside"
    );
    let secret = root.path().join("secret.txt");
    let escapes = [
        "/workspace/../secret.txt".to_owned(),
        "../secret.txt".to_owned(),
        secret.display().to_string(),
        "/etc/passwd".to_owned(),
        "/workspace/link.txt".to_owned(),
    ];
    for path in &escapes {
        let r = h.kernel.call_service("fixture.fs", "read", path).await;
        assert!(r.is_err(), "{path} must be refused, got {r:?}");
        assert!(
            !format!("{r:?}").contains("secret\""),
            "{path} leaked: {r:?}"
        );
    }
    // The grant is read-only.
    let w = h
        .kernel
        .call_service("fixture.fs", "write", "/workspace/new.txt\nx")
        .await;
    assert!(w.is_err(), "{w:?}");
    assert!(!workspace.join("new.txt").exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_name_owned_by_another_plugin_is_refused_naming_both() -> R {
    let (h, _dir) = harness()?;
    h.load_bundled("echo-tool").await?;
    let status = h.load_fixture("tool-squatter").await?;
    match &status.state {
        PluginState::Failed { reason } => {
            assert!(
                reason.contains("`echo-tool`") && reason.contains("`tool-squatter`"),
                "{reason}"
            );
        }
        other => panic!("expected failed, got {other:?}"),
    }
    assert_eq!(
        h.kernel.invoke_tool("echo", r#"{"text":"mine"}"#).await?,
        "mine"
    );
    Ok(())
}

/// Collects formatted tracing output.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_effect_attempted_during_unload_is_refused() -> R {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let (h, _dir) = harness()?;
    let empty = h.kernel.fingerprint();
    h.load_fixture("unload-effect").await?;
    h.kernel.unload("unload-effect").await?;
    assert_eq!(h.kernel.fingerprint(), empty);
    assert_eq!(h.kernel.fingerprint(), Env::default().fingerprint());
    let log = String::from_utf8_lossy(&captured.0.lock().map(|v| v.clone()).unwrap_or_default())
        .into_owned();
    let line = log
        .lines()
        .find(|l| l.contains("tool:") || l.contains("late_tool"))
        .unwrap_or_else(|| panic!("the fixture reports its attempts; log was:\n{log}"));
    assert!(line.contains("unloading"), "{line}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_call_is_refused_naming_the_chain() -> R {
    let (h, _dir) = harness()?;
    h.load_fixture("reentrant").await?;
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        h.kernel.call_service("fixture.reentrant", "call-self", ""),
    )
    .await??;
    assert!(
        answer.starts_with("error:") && answer.contains("re-entrant"),
        "{answer}"
    );
    assert!(answer.contains("keel → reentrant → reentrant"), "{answer}");
    Ok(())
}

/// A manifest cannot raise its own limits: `spin-loop` asking for an hour of CPU per call is
/// still stopped at the default second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_asking_for_an_hour_of_cpu_gets_the_default() -> R {
    let (h, _dir) = harness()?;
    let (manifest, component) =
        keel_tests::fixtures::fixture("spin-loop").expect("the fixture is built");
    let greedy = manifest.replace("cpu-ms = 500", "cpu-ms = 3600000\nmemory-mib = 4096");
    assert_ne!(
        greedy, manifest,
        "the fixture's manifest changed; update this test"
    );
    let package = h
        .loader
        .from_embedded("fixture spin-loop", &greedy, component)?;
    h.kernel.load(package).await?;
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        h.kernel.call_service("fixture.spin", "spin", ""),
    )
    .await?;
    let m = failed_message(outcome.err());
    assert!(m.contains("cpu"), "{m}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    Ok(())
}
