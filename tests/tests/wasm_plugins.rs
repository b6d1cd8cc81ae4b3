//! The bundled example plugins through the kernel: mediated calls, tools, state handover on
//! reload, unload leaving nothing behind, and clear refusals of bad components.

use std::path::Path;

use keel_kernel::{Env, LoadError, Manifest, PluginState};
use keel_tests::Harness;

type R = anyhow::Result<()>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_calls_the_greeter_through_the_kernel() -> R {
    let dir = tempfile::tempdir()?;
    let h = Harness::new(dir.path(), None)?;
    let status = h.load_bundled("greeter-client").await?;
    assert!(
        matches!(status.state, PluginState::Pending { .. }),
        "{status:?}"
    );
    h.load_bundled("greeter").await?;
    assert_eq!(
        h.kernel.status("greeter-client").map(|s| s.state),
        Some(PluginState::Active)
    );
    assert_eq!(
        h.kernel.invoke_tool("greet", r#"{"name":"Ada"}"#).await?,
        "Hello, Ada!"
    );
    assert_eq!(
        h.kernel
            .call_service("example.greeting", "calls", "")
            .await?,
        "1"
    );

    // Reload hands kernel-held state to the new instance.
    h.kernel.reload(h.bundled("greeter")?).await?;
    h.kernel.invoke_tool("greet", r#"{"name":"Bo"}"#).await?;
    assert_eq!(
        h.kernel
            .call_service("example.greeting", "calls", "")
            .await?,
        "2"
    );

    // Unloading the provider stops the client; its tool vanishes.
    h.kernel.unload("greeter").await?;
    assert!(matches!(
        h.kernel.status("greeter-client").map(|s| s.state),
        Some(PluginState::Pending { .. })
    ));
    assert!(h.kernel.tools().iter().all(|t| t.name != "greet"));

    h.kernel.shutdown().await?;
    assert_eq!(h.kernel.fingerprint(), Env::default().fingerprint());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_component_bytes_are_refused_naming_the_plugin() -> R {
    let dir = tempfile::tempdir()?;
    let h = Harness::new(dir.path(), None)?;
    let manifest = Manifest::parse(
        "name = \"broken\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n",
        Path::new("broken/keel.toml"),
    )?;
    for bytes in [&b""[..], b"not wasm at all", b"\0asm\x01\0\0\0"] {
        match h.loader.from_component(manifest.clone(), bytes) {
            Err(LoadError::Wasm(e)) => assert!(e.to_string().contains("broken"), "{e}"),
            Err(other) => panic!("expected a wasm error, got {other}"),
            Ok(_) => panic!("{bytes:?} must be refused"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_component_file_names_the_file() -> R {
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("keel.toml"),
        "name = \"ghost\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n",
    )?;
    let h = Harness::new(dir.path(), None)?;
    match h.loader.from_path(dir.path()) {
        Err(e @ LoadError::Read { .. }) => assert!(e.to_string().contains("ghost.wasm"), "{e}"),
        Err(other) => panic!("expected a read error, got {other}"),
        Ok(_) => panic!("there is no component"),
    }
    Ok(())
}
