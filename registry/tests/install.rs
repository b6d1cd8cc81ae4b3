//! Publish and install through the library: verification before anything is written,
//! trust, yanks, conflicts, rollback, capabilities, and the re-check on load.

use crate::common;

use common::{Fixture, R, component, manifest, message};
use keel_registry::{
    InstallOptions, KeyPair, Lockfile, PluginName, RegistryError, apply_install, load_installed,
    sha256_hex, yank,
};

#[test]
fn publish_then_install_then_load_round_trips() -> R {
    let fx = Fixture::new()?;
    let record = fx.publish("echo", "0.1.0", "")?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let plan = fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins.len(), 1);
    let p = &plan.plugins[0];
    assert!(p.verified && p.changes() && !p.yanked);
    assert_eq!(p.signer, Some(fx.key.public()));
    apply_install(&home, &plan)?;

    let lock = Lockfile::load(&home.lock_path())?;
    let entry = &lock.plugins[0];
    assert_eq!(entry.name.to_string(), "acme:echo");
    assert_eq!(entry.version.to_string(), "0.1.0");
    assert_eq!(
        Some(entry.sha256.as_str()),
        record.release.as_ref().map(|r| r.sha256.as_str())
    );
    assert_eq!(
        entry.key.as_deref(),
        Some(fx.key.public().to_string().as_str())
    );
    assert!(!entry.unverified);

    let loaded = load_installed(&home)?;
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].manifest.name, "echo");
    assert_eq!(
        loaded[0].component.as_deref(),
        Some(component("0.1.0").as_slice())
    );
    Ok(())
}

#[test]
fn a_tampered_blob_is_refused_with_both_hashes() -> R {
    let fx = Fixture::new()?;
    let record = fx.publish("echo", "0.1.0", "")?;
    let expected = record.release.map(|r| r.sha256).unwrap_or_default();
    // Someone with write access to the registry swaps the artifact's bytes.
    let blob = fx
        .registry_path()
        .join("blobs/sha256")
        .join(&expected[..2])
        .join(&expected);
    let evil = component("0.6.6");
    std::fs::write(&blob, &evil)?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let err = message(fx.plan(&home, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains(&expected), "{err}");
    assert!(err.contains(&sha256_hex(&evil)), "{err}");
    assert!(err.contains("refused acme:echo@0.1.0"), "{err}");
    assert!(!home.lock_path().exists(), "nothing was installed");
    assert!(!home.plugins_dir().exists(), "nothing was written");
    Ok(())
}

#[test]
fn a_record_signed_by_an_unknown_key_is_refused() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    // This user trusts a different key for `acme`.
    let other = KeyPair::from_seed("other", None, [9; 32]);
    let home = fx.home_trusting(&other, "user")?;
    let err = message(fx.plan(&home, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains(&fx.key.public().short()), "{err}");
    assert!(err.contains("not trusted for namespace `acme`"), "{err}");
    assert!(
        err.contains(&format!(
            "keel key trust {} --namespace acme",
            fx.key.public()
        )),
        "{err}"
    );

    // --allow-unverified installs it, and the lockfile says so.
    let plan = fx.plan(
        &home,
        &["acme:echo"],
        InstallOptions {
            allow_unverified: true,
            ..InstallOptions::default()
        },
    )?;
    apply_install(&home, &plan)?;
    let lock = Lockfile::load(&home.lock_path())?;
    assert!(lock.plugins[0].unverified);
    assert_eq!(lock.plugins[0].key, None);
    Ok(())
}

#[test]
fn unsigned_releases_need_allow_unverified() -> R {
    let fx = Fixture::new()?;
    fx.publish_with("echo", "0.1.0", "", None)?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let err = message(fx.plan(&home, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains("not signed"), "{err}");
    assert!(err.contains("--allow-unverified"), "{err}");
    let plan = fx.plan(
        &home,
        &["acme:echo"],
        InstallOptions {
            allow_unverified: true,
            ..InstallOptions::default()
        },
    )?;
    assert!(!plan.plugins[0].verified);
    Ok(())
}

#[test]
fn a_namespace_comes_from_its_registry_only() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    let home = keel_registry::Home::new(fx.dir.path().join("user"));
    let mut trust = keel_registry::TrustConfig::default();
    trust.trust("acme", fx.key.public(), "http://127.0.0.1:1")?;
    trust.save(&home.trust_path())?;
    let err = message(fx.plan(&home, &["acme:echo"], InstallOptions::default()));
    assert!(
        err.contains("bound to registry http://127.0.0.1:1"),
        "{err}"
    );
    assert!(err.contains("--registry http://127.0.0.1:1"), "{err}");
    Ok(())
}

#[test]
fn a_yanked_version_is_skipped_for_new_installs_and_kept_by_a_lockfile() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    fx.publish("echo", "0.2.0", "")?;
    let early = fx.home_trusting(&fx.key, "early")?;
    let plan = fx.plan(&early, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.2.0");
    apply_install(&early, &plan)?;

    let mut session = fx.session(&fx.publisher)?;
    let name: PluginName = "acme:echo".parse()?;
    yank(&mut session, &name, &"0.2.0".parse()?, Some(&fx.key))?;
    let again = message(yank(&mut session, &name, &"0.2.0".parse()?, Some(&fx.key)));
    assert!(again.contains("already yanked"), "{again}");

    // A new user gets 0.1.0.
    let late = fx.home_trusting(&fx.key, "late")?;
    let plan = fx.plan(&late, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.1.0");
    // Asking for the yanked version explicitly still does not choose it.
    let err = message(fx.plan(&late, &["acme:echo@=0.2.0"], InstallOptions::default()));
    assert!(err.contains("0.2.0 (yanked)"), "{err}");

    // The early user's lockfile pins 0.2.0: it is honoured, and still loads.
    let plan = fx.plan(&early, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.2.0");
    assert!(plan.plugins[0].yanked);
    assert!(!plan.plugins[0].changes());
    apply_install(&early, &plan)?;
    assert_eq!(
        load_installed(&early)?[0].entry.version.to_string(),
        "0.2.0"
    );
    Ok(())
}

#[test]
fn a_missing_provider_is_explained_naming_who_needs_what() -> R {
    let fx = Fixture::new()?;
    fx.publish(
        "greeter",
        "0.1.0",
        "[provides]\n\"example.greeting\" = \"1.0.0\"\n",
    )?;
    fx.publish(
        "app",
        "0.1.0",
        "[requires]\n\"example.greeting\" = \"^2\"\n",
    )?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let err = message(fx.plan(&home, &["acme:app"], InstallOptions::default()));
    assert!(err.contains("cannot resolve"), "{err}");
    assert!(err.contains("you asked for acme:app *"), "{err}");
    assert!(
        err.contains("acme:app 0.1.0 requires service `example.greeting` ^2"),
        "{err}"
    );
    assert!(
        err.contains("available: 1.0.0 by acme:greeter 0.1.0"),
        "{err}"
    );
    Ok(())
}

#[test]
fn two_plugins_needing_incompatible_versions_are_explained() -> R {
    let fx = Fixture::new()?;
    fx.publish(
        "greeter",
        "0.1.0",
        "[provides]\n\"example.greeting\" = \"1.0.0\"\n",
    )?;
    fx.publish(
        "greeter",
        "0.2.0",
        "[provides]\n\"example.greeting\" = \"2.0.0\"\n",
    )?;
    fx.publish(
        "old-app",
        "0.1.0",
        "[requires]\n\"example.greeting\" = \"^1\"\n",
    )?;
    fx.publish(
        "new-app",
        "0.1.0",
        "[requires]\n\"example.greeting\" = \"^2\"\n",
    )?;
    let home = fx.home_trusting(&fx.key, "user")?;
    // Each alone resolves, pulling in the provider.
    let plan = fx.plan(&home, &["acme:new-app"], InstallOptions::default())?;
    let names: Vec<String> = plan
        .plugins
        .iter()
        .map(|p| format!("{}@{}", p.name, p.version))
        .collect();
    assert_eq!(names, ["acme:greeter@0.2.0", "acme:new-app@0.1.0"]);
    // Together they conflict over acme:greeter.
    let err = message(fx.plan(
        &home,
        &["acme:old-app", "acme:new-app"],
        InstallOptions::default(),
    ));
    for needle in [
        "acme:old-app 0.1.0 requires service `example.greeting` ^1",
        "acme:new-app 0.1.0 requires service `example.greeting` ^2",
        "only one plugin can provide service `example.greeting`, at one version, at a time",
    ] {
        assert!(err.contains(needle), "missing `{needle}` in:\n{err}");
    }
    Ok(())
}

#[test]
fn a_rolled_back_index_is_refused() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    fx.publish("echo", "0.2.0", "")?;
    let home = fx.home_trusting(&fx.key, "user")?;
    fx.plan(&home, &["acme:echo"], InstallOptions::default())?;

    // The registry's index is put back to an older state (one record).
    let index = fx.registry_path().join("index/acme/echo.jsonl");
    let text = std::fs::read_to_string(&index)?;
    let first = text.lines().next().ok_or("one line")?;
    std::fs::write(&index, format!("{first}\n"))?;
    let err = message(fx.plan(&home, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains("rolled back or rewritten"), "{err}");
    assert!(err.contains("2 records"), "{err}");
    assert!(err.contains("keel registry forget-head acme:echo"), "{err}");

    // A different history of the same length is refused too.
    fx.publish("echo", "0.3.0", "")?;
    let err = message(fx.plan(&home, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains("rolled back or rewritten"), "{err}");

    // Another user who never saw the old state accepts the registry as it is.
    let fresh = fx.home_trusting(&fx.key, "fresh")?;
    let plan = fx.plan(&fresh, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.3.0");

    // Forgetting the head is the deliberate way out.
    let mut session = fx.session(&home)?;
    assert!(session.forget_head(&"acme:echo".parse()?));
    session.finish()?;
    fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    Ok(())
}

#[test]
fn an_edited_record_is_refused() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    let index = fx.registry_path().join("index/acme/echo.jsonl");
    let text = std::fs::read_to_string(&index)?;
    // Drop the network request... rather, add one: the signature no longer matches.
    let edited = text.replace("\"exec\":false", "\"exec\":true");
    assert_ne!(edited, text);
    std::fs::write(&index, edited)?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let err = message(fx.plan(&home, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains("bad signature"), "{err}");
    Ok(())
}

#[test]
fn an_install_shows_a_network_request() -> R {
    let fx = Fixture::new()?;
    fx.publish(
        "fetcher",
        "0.1.0",
        "[capabilities]\nnetwork = [\"api.example.com\"]\nexec = true\n",
    )?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let plan = fx.plan(&home, &["acme:fetcher"], InstallOptions::default())?;
    let lines = plan.plugins[0].capability_lines();
    assert_eq!(lines[0], "NETWORK: may send requests to api.example.com");
    assert!(lines.iter().any(|l| l.starts_with("EXEC")), "{lines:?}");
    Ok(())
}

#[test]
fn native_plugins_need_explicit_consent() -> R {
    let fx = Fixture::new()?;
    let text = "name = \"native-thing\"\nversion = \"0.1.0\"\nkind = \"native\"\n";
    let package = fx.package(text, b"\x7fELF not really".to_vec())?;
    let mut session = fx.session(&fx.publisher)?;
    keel_registry::publish(
        &mut session,
        &"acme:native-thing".parse()?,
        &package,
        Some(&fx.key),
        &mut |_| {},
    )?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let err = message(fx.plan(&home, &["acme:native-thing"], InstallOptions::default()));
    assert!(err.contains("native plugin"), "{err}");
    assert!(err.contains("--allow-native"), "{err}");
    let plan = fx.plan(
        &home,
        &["acme:native-thing"],
        InstallOptions {
            allow_native: true,
            ..InstallOptions::default()
        },
    )?;
    assert!(plan.plugins[0].capability_lines()[0].starts_with("FULL TRUST"));
    Ok(())
}

#[test]
fn loading_re_hashes_against_the_lockfile() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let plan = fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    apply_install(&home, &plan)?;
    let wasm = home.plugins_dir().join("acme/echo/0.1.0/plugin.wasm");
    let swapped = component("0.6.6");
    std::fs::write(&wasm, &swapped)?;
    let err = message(load_installed(&home));
    assert!(err.contains(&plan.plugins[0].release.sha256), "{err}");
    assert!(err.contains(&sha256_hex(&swapped)), "{err}");
    assert!(err.contains("keel install acme:echo@=0.1.0"), "{err}");

    // Widening the installed manifest's capabilities is caught as well.
    std::fs::write(&wasm, component("0.1.0"))?;
    let toml_path = home.plugins_dir().join("acme/echo/0.1.0/keel.toml");
    let text = std::fs::read_to_string(&toml_path)?;
    std::fs::write(&toml_path, format!("{text}\n[capabilities]\nexec = true\n"))?;
    let err = message(load_installed(&home));
    assert!(
        err.contains("keel.toml does not match the lockfile"),
        "{err}"
    );
    Ok(())
}

#[test]
fn publish_validates_the_package() -> R {
    let fx = Fixture::new()?;
    // The component was built as 0.1.0 but the manifest says 0.2.0.
    let err = message(fx.package(&manifest("echo", "0.2.0", ""), component("0.1.0")));
    assert!(err.contains("built as version 0.1.0"), "{err}");
    // A core module is not a component.
    let err = message(fx.package(&manifest("echo", "0.1.0", ""), b"\0asm\x01\0\0\0".to_vec()));
    assert!(err.contains("core WebAssembly module"), "{err}");
    // An existing version is never replaced.
    fx.publish("echo", "0.1.0", "")?;
    let err = message(fx.publish("echo", "0.1.0", ""));
    assert!(err.contains("already published"), "{err}");
    assert!(err.contains("raise `version`"), "{err}");
    // The registry name must match the manifest.
    let package = fx.package(&manifest("echo", "0.2.0", ""), component("0.2.0"))?;
    let mut session = fx.session(&fx.publisher)?;
    let err = message(keel_registry::publish(
        &mut session,
        &"acme:other".parse()?,
        &package,
        Some(&fx.key),
        &mut |_| {},
    ));
    assert!(err.contains("publish it as `acme:echo`"), "{err}");
    Ok(())
}

#[test]
fn a_cut_off_line_is_invisible_and_dropped_by_the_next_append() -> R {
    let fx = Fixture::new()?;
    fx.publish("echo", "0.1.0", "")?;
    let index = fx.registry_path().join("index/acme/echo.jsonl");
    let mut text = std::fs::read(&index)?;
    text.extend_from_slice(b"{\"seq\":1,\"prev\":\"trunc");
    std::fs::write(&index, &text)?;
    let home = fx.home_trusting(&fx.key, "user")?;
    fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    fx.publish("echo", "0.2.0", "")?;
    let text = std::fs::read_to_string(&index)?;
    assert_eq!(text.lines().count(), 2);
    assert!(text.ends_with('\n') && !text.contains("trunc"));
    let plan = fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.2.0");
    Ok(())
}

#[test]
fn errors_are_typed() {
    // The library's errors are a thiserror enum the CLI can match on.
    let e = RegistryError::Conflict {
        name: "acme:x".into(),
    };
    assert!(e.to_string().contains("run the command again"));
}
