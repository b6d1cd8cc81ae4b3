//! Writers that race or die: concurrent publishers serialize on the registry lock, and a
//! publisher killed between writing the blob and appending the record leaves nothing visible.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{Fixture, R, component, manifest};
use keel_registry::{
    Home, IndexLog, InstallOptions, KeyPair, LocalRegistry, PluginName, Registry, Session, Step,
    publish, sha256_hex, validate,
};

#[test]
fn twenty_concurrent_publishes_leave_a_consistent_index_with_all_twenty() -> R {
    let fx = Arc::new(Fixture::new()?);
    let versions: Vec<String> = (1..=2)
        .flat_map(|minor| (0..10).map(move |patch| format!("0.{minor}.{patch}")))
        .collect();
    assert_eq!(versions.len(), 20);
    // Validation (compiling the component) happens before the lock; do it up front so the
    // threads contend on the append itself.
    let packages = versions
        .iter()
        .map(|v| fx.package(&manifest("echo", v, ""), component(v)))
        .collect::<Result<Vec<_>, _>>()?;
    let barrier = Arc::new(Barrier::new(packages.len()));
    let threads: Vec<_> = packages
        .into_iter()
        .enumerate()
        .map(|(i, package)| {
            let fx = Arc::clone(&fx);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || -> Result<(), String> {
                // Each publisher is its own client with its own home.
                let home = Home::new(fx.dir.path().join(format!("publisher-{i}")));
                let mut session = Session::new(home, fx.registry().map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
                let name: PluginName = "acme:echo"
                    .parse()
                    .map_err(|e: keel_registry::RegistryError| e.to_string())?;
                barrier.wait();
                publish(&mut session, &name, &package, Some(&fx.key), &mut |_| {})
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a publisher panicked")??;
    }

    let registry = fx.registry()?;
    let name: PluginName = "acme:echo".parse()?;
    let log = IndexLog::parse(&name, &registry.read_index(&name)?)?;
    assert_eq!(log.len(), 20, "one record per publish");
    assert_eq!(log.torn_tail(), 0);
    let mut published: Vec<String> = log
        .versions()
        .iter()
        .map(|v| v.record.version.to_string())
        .collect();
    published.sort();
    let mut expected = versions.clone();
    expected.sort();
    assert_eq!(published, expected);
    for v in log.versions() {
        let bytes = registry.read_blob(log.name(), &v.release.sha256)?;
        assert_eq!(sha256_hex(&bytes), v.release.sha256);
        assert_eq!(v.signer, Some(fx.key.public()));
    }
    // And an installer agrees.
    let home = fx.home_trusting(&fx.key, "user")?;
    let plan = fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.2.9");
    Ok(())
}

/// Environment variable that turns [`killed_publisher_child`] into a real publisher.
const CHILD_ENV: &str = "KEEL_REGISTRY_TEST_KILLED_PUBLISHER";

/// Not a test of its own: the child process of
/// [`a_publisher_killed_after_the_blob_leaves_no_version_and_the_next_publish_works`]. It
/// publishes and, once the blob is durably written but before the record is appended,
/// announces it and waits to be killed.
#[test]
fn killed_publisher_child() -> R {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return Ok(());
    };
    let dir = Path::new(&dir);
    let host = keel_kernel::WasmHost::new(keel_kernel::WasmHostConfig::default())?;
    let package = validate(
        &host,
        Path::new("keel.toml"),
        &manifest("echo", "0.3.0", ""),
        component("0.3.0"),
    )?;
    let registry = Registry::Local(LocalRegistry::open(&dir.join("registry"), false)?);
    let mut session = Session::new(Home::new(dir.join("child-home")), registry)?;
    let key = KeyPair::from_seed("acme", Some("acme"), [42; 32]);
    let marker = dir.join("blob-written");
    publish(
        &mut session,
        &"acme:echo".parse()?,
        &package,
        Some(&key),
        &mut |step| {
            if step == Step::BlobWritten {
                let _ = std::fs::write(&marker, b"");
                // Hold the lock, blob on disk, record not appended: wait for SIGKILL.
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        },
    )?;
    Err("the child was not killed".into())
}

#[test]
fn a_publisher_killed_after_the_blob_leaves_no_version_and_the_next_publish_works() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    // The child's test name is its path inside the test binary, whichever crate root holds it.
    let child_test = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::killed_publisher_child"),
        None => String::from("killed_publisher_child"),
    };
    let mut child = Command::new(std::env::current_exe()?)
        .args([child_test.as_str(), "--exact", "--test-threads=1"])
        .env(CHILD_ENV, fx.dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let marker = fx.dir.path().join("blob-written");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !marker.exists() {
        if let Some(status) = child.try_wait()? {
            return Err(format!("the child publisher exited early: {status}").into());
        }
        if Instant::now() > deadline {
            child.kill()?;
            return Err("the child publisher never wrote its blob".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?; // SIGKILL: no destructor, no cleanup
    child.wait()?;

    // The blob is on disk...
    let orphan = sha256_hex(&component("0.3.0"));
    let blob = fx
        .registry_path()
        .join("blobs/sha256")
        .join(&orphan[..2])
        .join(&orphan);
    assert!(blob.exists(), "the child died after writing the blob");
    // ...but no record names it: 0.3.0 is not visible to anyone.
    let registry = fx.registry()?;
    let name: PluginName = "acme:echo".parse()?;
    let log = IndexLog::parse(&name, &registry.read_index(&name)?)?;
    assert_eq!(log.len(), 1);
    assert!(log.version(&"0.3.0".parse()?).is_none());
    let home = fx.home_trusting(&fx.key, "user")?;
    let err = common::message(fx.plan(&home, &["acme:echo@=0.3.0"], InstallOptions::default()));
    assert!(err.contains("published: 0.1.0"), "{err}");

    // The lock died with the child: the next publish (the same version, even) goes through.
    fx.publish("echo", "0.3.0", "")?;
    let plan = fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.3.0");
    Ok(())
}
