//! The native host through the kernel's public API, with the `native-echo` fixture library
//! (tests/fixtures/native-echo), which this test builds with cargo on first use.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{Behaviour, manifest, package};
use keel_kernel::{
    Env, Kernel, KernelError, Manifest, NATIVE_ABI_VERSION, NativeError, PluginPackage,
    PluginSource, PluginState, open_native,
};

type R = Result<(), Box<dyn std::error::Error>>;

const PLUGIN: &str = "native-echo";

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the kernel crate sits inside the workspace")
}

/// Build the fixture library once per test binary, in its own target directory (so this never
/// waits on, or invalidates, the build of the tests themselves); its path.
fn fixture_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let target_dir = workspace().join("target").join("keel-native-fixtures");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let output = Command::new(&cargo)
            .current_dir(workspace())
            .args([
                "build",
                "--quiet",
                "-p",
                "keel-fixture-native-echo",
                "--target-dir",
            ])
            .arg(&target_dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.to_string_lossy()));
        assert!(
            output.status.success(),
            "building the native fixture failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let file = target_dir.join("debug").join(format!(
            "{}keel_fixture_native_echo{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ));
        assert!(
            file.is_file(),
            "the fixture build did not produce {}",
            file.display()
        );
        file
    })
}

fn fixture_manifest() -> Result<Manifest, keel_kernel::ManifestError> {
    Manifest::load(&workspace().join("tests/fixtures/native-echo/keel.toml"))
}

fn trusted() -> BTreeSet<String> {
    [PLUGIN.to_owned()].into()
}

fn native_package() -> Result<PluginPackage, Box<dyn std::error::Error>> {
    let manifest = fixture_manifest()?;
    let source: Arc<dyn PluginSource> = open_native(&manifest, fixture_library(), &trusted())?;
    Ok(PluginPackage { manifest, source })
}

#[test]
fn untrusted_library_is_refused_with_how_to_trust_it() -> R {
    let manifest = fixture_manifest()?;
    let trusted_others: BTreeSet<String> = ["something-else".to_owned()].into();
    for trust in [BTreeSet::new(), trusted_others] {
        let error = open_native(&manifest, Path::new("/nowhere/libnative_echo.so"), &trust).err();
        assert!(
            matches!(&error, Some(NativeError::Untrusted { plugin, .. }) if plugin == PLUGIN),
            "{error:?}"
        );
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains(
                "native plugin `native-echo` runs with your full user rights; to trust it add `native = [\"native-echo\"]` under [trust] in ~/.keel/config.toml"
            ),
            "{message}"
        );
        assert!(message.contains("/nowhere/libnative_echo.so"), "{message}");
    }
    Ok(())
}

#[test]
fn a_wasm_manifest_is_not_loaded_natively() -> R {
    let wasm = manifest(PLUGIN, "0.1.0", &[], &[]);
    let error = open_native(&wasm, Path::new("/nowhere/libnative_echo.so"), &trusted()).err();
    assert!(
        matches!(&error, Some(NativeError::NotNative { .. })),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn a_missing_library_is_named() -> R {
    let error = open_native(
        &fixture_manifest()?,
        Path::new("/nowhere/libnative_echo.so"),
        &trusted(),
    )
    .err();
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("`native-echo`") && message.contains("/nowhere/libnative_echo.so"),
        "{message}"
    );
    Ok(())
}

#[test]
fn this_kernel_hosts_native_abi_version_one() {
    // The mismatch refusal itself is unit-tested beside the check (native_host/tests.rs); the
    // fixture implements version 1, so opening it passing the check is the positive case.
    assert_eq!(NATIVE_ABI_VERSION, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_library_serves_calls_tools_and_state_and_unload_undoes_everything() -> R {
    let kernel = Kernel::default();
    let empty = Env::default().fingerprint();
    assert_eq!(kernel.fingerprint(), empty);

    let status = kernel.load(native_package()?).await?;
    assert_eq!(status.state, PluginState::Active, "{status:?}");

    // What activate registered through the callback table is in the environment.
    let env = kernel.env();
    assert_eq!(env.services()["fixture.native"].provider, PLUGIN);
    assert_eq!(env.tools()["native_echo"].owner, PLUGIN);
    assert!(env.subscribers("fixture.ping").contains(PLUGIN));
    let fragments: Vec<_> = env.prompt_fragments().collect();
    assert_eq!(fragments, vec![(PLUGIN, "intro", "hello from native-echo")]);

    assert_eq!(
        kernel
            .call_service("fixture.native", "echo", "hi there")
            .await?,
        "hi there"
    );
    assert_eq!(
        kernel.call_service("fixture.native", "config", "").await?,
        r#"{"greeting":"hello from native-echo"}"#
    );
    assert_eq!(
        kernel
            .call_service("fixture.native", "state", "kept ✓")
            .await?,
        "kept ✓"
    );
    assert_eq!(
        kernel.call_service("fixture.native", "keys", "").await?,
        r#"["echo"]"#
    );
    assert_eq!(
        kernel.invoke_tool("native_echo", r#"{"x":1}"#).await?,
        r#"{"x":1}"#
    );

    // The plugin's own errors come back as the plugin's words.
    let error = kernel
        .call_service("fixture.native", "nope", "")
        .await
        .err();
    assert!(
        matches!(&error, Some(KernelError::Failed(m)) if m.contains("native-echo has no method `nope`")),
        "{error:?}"
    );
    // Malformed host requests are refused by the kernel, with the documented error form.
    let answer = kernel
        .call_service("fixture.native", "raw", r#"{"op":"explode"}"#)
        .await?;
    assert!(
        answer.starts_with(r#"{"err":{"kind":"invalid","message":"#),
        "{answer}"
    );
    // A request outside what the manifest declares is refused like a wasm plugin's would be.
    let answer = kernel
        .call_service(
            "fixture.native",
            "raw",
            r#"{"op":"provide","name":"fixture.undeclared","version":"1.0.0"}"#,
        )
        .await?;
    assert!(answer.starts_with(r#"{"err":{"kind":"#), "{answer}");

    kernel.unload(PLUGIN).await?;
    assert!(kernel.status(PLUGIN).is_none());
    assert_eq!(
        kernel.fingerprint(),
        empty,
        "unload must leave the environment as it was"
    );
    assert!(kernel.env().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_through_the_kernel_both_ways_and_reentry_is_refused() -> R {
    let kernel = Kernel::default();
    kernel.load(native_package()?).await?;
    let mut target = manifest("target", "1.0.0", &[("fixture.target", "1.0.0")], &[]);
    target.capabilities.services.push("fixture.native".into());
    kernel
        .load(package(
            target,
            Behaviour {
                forward_to: Some("fixture.native".into()),
                ..Behaviour::default()
            },
        ))
        .await?;

    // native → kernel → in-process plugin.
    let forward = r#"{"service":"fixture.target","method":"greet","payload":"p"}"#;
    assert_eq!(
        kernel
            .call_service("fixture.native", "forward", forward)
            .await?,
        "target@1.0.0 fixture.target.greet(p)"
    );
    // in-process plugin → kernel → native (`forward` calls fixture.native's `echo`).
    assert_eq!(
        kernel
            .call_service("fixture.target", "forward", "back")
            .await?,
        "back"
    );
    // native → target → native: the chain the native host set is seen, the call refused.
    let reentrant = r#"{"service":"fixture.target","method":"forward","payload":"loop"}"#;
    let error = kernel
        .call_service("fixture.native", "forward", reentrant)
        .await
        .err();
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("re-entrant")
            && message.contains("keel → native-echo → target → native-echo"),
        "{message}"
    );
    kernel.shutdown().await?;
    assert_eq!(kernel.fingerprint(), Env::default().fingerprint());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_native_code_and_native_code_emits() -> R {
    let kernel = Kernel::default();
    let mut events = kernel.events();
    kernel.load(native_package()?).await?;

    kernel.emit("fixture.ping", "ping 1")?;
    let mut seen = String::new();
    for _ in 0..200 {
        seen = kernel
            .call_service("fixture.native", "last_event", "")
            .await?;
        if seen == "ping 1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, "ping 1");

    kernel
        .call_service("fixture.native", "emit", "pong 1")
        .await?;
    let event = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await {
                Ok(e) if e.topic == "fixture.pong" => return Some(e),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    })
    .await?
    .expect("the event bus stays open");
    assert_eq!(
        (event.source.as_str(), event.payload.as_str()),
        (PLUGIN, "pong 1")
    );
    kernel.unload(PLUGIN).await?;
    assert_eq!(kernel.fingerprint(), Env::default().fingerprint());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_reload_of_the_native_plugin() -> R {
    let kernel = Kernel::default();
    kernel.load(native_package()?).await?;
    kernel
        .call_service("fixture.native", "state", "before reload")
        .await?;
    kernel.reload(native_package()?).await?;
    assert_eq!(
        kernel.call_service("fixture.native", "keys", "").await?,
        r#"["echo"]"#
    );
    assert_eq!(
        kernel
            .call_service("fixture.native", "state", "after")
            .await?,
        "after"
    );
    kernel.unload(PLUGIN).await?;
    assert_eq!(kernel.fingerprint(), Env::default().fingerprint());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_answers_are_clear_host_errors_and_the_plugin_keeps_running() -> R {
    let kernel = Kernel::default();
    kernel.load(native_package()?).await?;
    for (mode, expected) in [
        ("null", "returned a null buffer"),
        ("garbage", "returned an invalid answer"),
        ("ok_null", "must be answered with a string"),
    ] {
        kernel
            .call_service("fixture.native", "misbehave", mode)
            .await?;
        let error = kernel
            .call_service("fixture.native", "echo", "x")
            .await
            .err();
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("native plugin `native-echo`")
                && message.contains("libkeel_fixture_native_echo")
                && message.contains("`handle_call`")
                && message.contains(expected),
            "{mode}: {message}"
        );
        assert_eq!(
            kernel.status(PLUGIN).map(|s| s.state),
            Some(PluginState::Active)
        );
        assert_eq!(
            kernel
                .call_service("fixture.native", "echo", "still here")
                .await?,
            "still here"
        );
    }
    kernel.unload(PLUGIN).await?;
    assert_eq!(kernel.fingerprint(), Env::default().fingerprint());
    Ok(())
}
