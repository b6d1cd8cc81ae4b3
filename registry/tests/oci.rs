//! keel's registry kept in a real OCI registry (the distribution registry on loopback): the
//! same guarantees as a directory, re-checked against storage keel does not control.

use keel_registry::{
    Credentials, IndexLog, InstallOptions, OciOptions, PluginName, RegistryError, apply_install,
    load_installed, sha256_hex, yank,
};
use keel_tests::oci_server::OciServer;

use crate::common::{Fixture, R, component, message};

fn plain() -> OciOptions {
    OciOptions {
        plain_http: true,
        ..OciOptions::default()
    }
}

#[test]
fn publish_browse_install_yank_and_every_refusal_against_a_distribution_registry() -> R {
    let server = OciServer::anonymous()?;
    let fx = Fixture::oci(&server.url("team/keel"), plain())?;
    fx.publish("echo", "0.1.0", "")?;
    let second = fx.publish("echo", "0.2.0", "")?;
    fx.publish("other", "0.1.0", "")?;

    // Browse: the catalog names both plugins; the index carries both signed releases.
    let registry = fx.registry()?;
    assert_eq!(registry.location(), server.url("team/keel"));
    let names: Vec<String> = registry.names()?.iter().map(|n| n.to_string()).collect();
    assert_eq!(names, ["acme:echo", "acme:other"]);
    let echo: PluginName = "acme:echo".parse()?;
    let log = IndexLog::parse(&echo, &registry.read_index(&echo)?)?;
    let versions: Vec<String> = log
        .versions()
        .iter()
        .map(|v| v.record.version.to_string())
        .collect();
    assert_eq!(versions, ["0.1.0", "0.2.0"]);
    assert!(
        log.versions()
            .iter()
            .all(|v| v.signer == Some(fx.key.public()))
    );

    // An unknown key is refused.
    let stranger = fx.home_trusting(
        &keel_registry::KeyPair::from_seed("x", Some("acme"), [7; 32]),
        "stranger",
    )?;
    let err = message(fx.plan(&stranger, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains("keel key trust"), "{err}");

    // Install: the newest, its bytes the component's, loaded back from the lockfile.
    let early = fx.home_trusting(&fx.key, "early")?;
    let plan = fx.plan(&early, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.2.0");
    assert!(plan.plugins[0].verified);
    apply_install(&early, &plan)?;
    let loaded = load_installed(&early)?;
    assert_eq!(
        loaded[0].component.as_deref(),
        Some(component("0.2.0").as_slice())
    );
    let lock = std::fs::read_to_string(early.lock_path())?;
    assert!(
        lock.contains(&format!("registry = \"{}\"", server.url("team/keel"))),
        "{lock}"
    );

    // Yank: new installs skip it, the early user's lockfile keeps it.
    let mut session = fx.session(&fx.publisher)?;
    yank(&mut session, &echo, &"0.2.0".parse()?, Some(&fx.key))?;
    let late = fx.home_trusting(&fx.key, "late")?;
    let plan = fx.plan(&late, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.1.0");
    let plan = fx.plan(&early, &["acme:echo"], InstallOptions::default())?;
    assert_eq!(plan.plugins[0].version.to_string(), "0.2.0");
    assert!(plan.plugins[0].yanked);

    // Rollback: the registry loses the yank (its tag removed from storage); the early user,
    // who saw it, refuses the older head.
    let repository = "team/keel/acme/echo";
    let yank_tag = server
        .tags(repository)?
        .into_iter()
        .find(|t| t.starts_with("keel-record-2-"))
        .ok_or("the yank's record tag")?;
    std::fs::remove_dir_all(server.tag_dir(repository, &yank_tag))?;
    let err = message(fx.plan(&early, &["acme:echo"], InstallOptions::default()));
    assert!(err.contains("rolled back or rewritten"), "{err}");
    // A user who never saw it takes the registry as it is.
    let fresh = fx.home_trusting(&fx.key, "fresh")?;
    assert_eq!(
        fx.plan(&fresh, &["acme:echo"], InstallOptions::default())?
            .plugins[0]
            .version
            .to_string(),
        "0.2.0"
    );

    // A tampered blob: the component's bytes overwritten in the server's storage.
    let sha = second
        .release
        .as_ref()
        .map(|r| r.sha256.clone())
        .ok_or("a release")?;
    let blob = server.blob_file(&sha);
    let mut evil = std::fs::read(&blob)?;
    let at = evil.len() / 2;
    evil[at] ^= 0xff;
    std::fs::write(&blob, &evil)?;
    let victim = fx.home_trusting(&fx.key, "victim")?;
    let err = message(fx.plan(&victim, &["acme:echo@=0.2.0"], InstallOptions::default()));
    assert!(err.contains("altered in the registry"), "{err}");
    assert!(err.contains(&sha), "{err}");
    assert!(!victim.lock_path().exists(), "nothing was installed");
    assert!(!victim.plugins_dir().exists(), "nothing was written");

    // A tampered record: the manifest carrying other's release edited in storage. Served
    // as is, its bytes no longer match their digest.
    let other_repo = "team/keel/acme/other";
    let tag = server
        .tags(other_repo)?
        .into_iter()
        .find(|t| t.starts_with("keel-record-0-"))
        .ok_or("other's record tag")?;
    let digest = server.tag_digest(other_repo, &tag)?;
    let original = std::fs::read_to_string(server.blob_file(&digest))?;
    assert!(original.contains("other for tests"), "{original}");
    let edited = original.replace("other for tests", "other for TESTS");
    std::fs::write(server.blob_file(&digest), &edited)?;
    let err = message(fx.plan(&victim, &["acme:other"], InstallOptions::default()));
    assert!(err.contains("altered in the registry"), "{err}");
    assert!(err.contains("acme/other:keel-record-0-"), "{err}");
    // Stored consistently (a new manifest, the tag pointed at it), the registry serves it
    // with a matching digest; the record no longer hashes to the tag that names it.
    std::fs::write(server.blob_file(&digest), &original)?;
    let forged = sha256_hex(edited.as_bytes());
    let forged_file = server.blob_file(&forged);
    std::fs::create_dir_all(forged_file.parent().ok_or("blob folder")?)?;
    std::fs::write(&forged_file, &edited)?;
    let revision = server
        .storage()
        .join("repositories")
        .join(other_repo)
        .join("_manifests/revisions/sha256")
        .join(&forged);
    std::fs::create_dir_all(&revision)?;
    std::fs::write(revision.join("link"), format!("sha256:{forged}"))?;
    std::fs::write(
        server.tag_dir(other_repo, &tag).join("current/link"),
        format!("sha256:{forged}"),
    )?;
    let err = message(fx.plan(&victim, &["acme:other"], InstallOptions::default()));
    assert!(err.contains("does not hash to its tag"), "{err}");
    assert!(!victim.lock_path().exists(), "nothing was installed");
    Ok(())
}

#[test]
fn behind_basic_authentication_only_the_credentials_get_in() -> R {
    let server = OciServer::with_user("ci", "s3cret-pass")?;
    let url = server.url("keel");
    let anonymous = Fixture::oci(&url, plain())?;
    let err = message(anonymous.publish("echo", "0.1.0", ""));
    assert!(err.contains("password-secret"), "{err}");

    let as_ci = |password: &str| OciOptions {
        plain_http: true,
        credentials: Some(Credentials {
            username: "ci".into(),
            password: password.into(),
        }),
        ..OciOptions::default()
    };
    let wrong = Fixture::oci(&url, as_ci("guess"))?;
    let err = message(wrong.publish("echo", "0.1.0", ""));
    assert!(err.contains("password-secret"), "{err}");

    let fx = Fixture::oci(&url, as_ci("s3cret-pass"))?;
    fx.publish("echo", "0.1.0", "")?;
    let home = fx.home_trusting(&fx.key, "user")?;
    let plan = fx.plan(&home, &["acme:echo"], InstallOptions::default())?;
    apply_install(&home, &plan)?;
    assert_eq!(load_installed(&home)?[0].entry.version.to_string(), "0.1.0");
    Ok(())
}

#[test]
fn ten_concurrent_publishers_each_land_or_are_told_to_retry() -> R {
    let server = OciServer::anonymous()?;
    let fx = Fixture::oci(&server.url("keel"), plain())?;
    let versions: Vec<String> = (0..10).map(|i| format!("0.1.{i}")).collect();
    let results: Vec<(String, Result<(), RegistryError>)> = std::thread::scope(|s| {
        let handles: Vec<_> = versions
            .iter()
            .map(|v| {
                let fx = &fx;
                s.spawn(move || (v.clone(), fx.publish("echo", v, "").map(|_| ())))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    ("?".into(), Err(RegistryError::Internal("panicked".into())))
                })
            })
            .collect()
    });
    let mut landed = Vec::new();
    for (version, result) in results {
        match result {
            Ok(()) => landed.push(version),
            Err(e @ RegistryError::Conflict { .. }) => {
                assert!(e.to_string().contains("run the command again"), "{e}");
            }
            Err(e) => return Err(format!("{version}: {e}").into()),
        }
    }
    landed.sort();
    let echo: PluginName = "acme:echo".parse()?;
    let log = IndexLog::parse(&echo, &fx.registry()?.read_index(&echo)?)?;
    let mut listed: Vec<String> = log
        .versions()
        .iter()
        .map(|v| v.record.version.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        listed, landed,
        "every publisher told it landed is listed, and only those"
    );
    assert_eq!(
        landed.len(),
        versions.len(),
        "under this contention all ten land"
    );
    for v in log.versions() {
        let bytes = fx.registry()?.read_blob(&echo, &v.release.sha256)?;
        assert_eq!(sha256_hex(&bytes), v.release.sha256);
    }
    Ok(())
}

#[test]
fn a_generic_oci_client_pulls_the_component_as_is() -> R {
    let server = OciServer::anonymous()?;
    let fx = Fixture::oci(&server.url("keel"), plain())?;
    fx.publish("echo", "0.1.0", "")?;
    let out = server.dir().join("pulled");
    let status = std::process::Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false", "--insecure-policy"])
        .arg(format!("docker://{}/keel/acme/echo:0.1.0", server.host()))
        .arg(format!("dir:{}", out.display()))
        .status()
        .map_err(|e| format!("skopeo (apt-get install skopeo, as .ci/setup does): {e}"))?;
    assert!(status.success(), "skopeo copy failed: {status}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json"))?)?;
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    assert_eq!(manifest["layers"].as_array().map(Vec::len), Some(1));
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    let digest = manifest["layers"][0]["digest"]
        .as_str()
        .ok_or("layer digest")?;
    let layer = std::fs::read(out.join(digest.trim_start_matches("sha256:")))?;
    assert!(
        layer == component("0.1.0"),
        "the pulled layer is the component, byte for byte"
    );
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(
        out.join(
            manifest["config"]["digest"]
                .as_str()
                .ok_or("config digest")?
                .trim_start_matches("sha256:"),
        ),
    )?)?;
    assert_eq!(config["architecture"], "wasm");
    assert_eq!(config["os"], "wasip2");
    assert_eq!(config["layerDigests"][0], digest);
    assert!(
        config["component"]["exports"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{config}"
    );
    Ok(())
}

#[test]
fn kept_records_are_used_only_while_they_hash_to_their_tag() -> R {
    let server = OciServer::anonymous()?;
    let cache = server.dir().join("records");
    let options = OciOptions {
        plain_http: true,
        cache: Some(cache.clone()),
        ..OciOptions::default()
    };
    let fx = Fixture::oci(&server.url("keel"), options)?;
    fx.publish("echo", "0.1.0", "")?;
    fx.publish("other", "0.1.0", "")?;
    let registry = fx.registry()?;
    let echo: PluginName = "acme:echo".parse()?;
    let other: PluginName = "acme:other".parse()?;
    let first = registry.read_index(&echo)?;
    let other_line = String::from_utf8(registry.read_index(&other)?)?;
    let hash = sha256_hex(first.trim_ascii_end());
    let kept = cache.join(&hash[..2]).join(&hash);
    assert_eq!(
        std::fs::read(&kept)?,
        first.trim_ascii_end(),
        "the record was kept"
    );

    // A kept record swapped for another (validly signed) one is not used: it is read again.
    std::fs::write(&kept, other_line.trim_end())?;
    assert_eq!(registry.read_index(&echo)?, first);
    assert_eq!(
        std::fs::read(&kept)?,
        first.trim_ascii_end(),
        "and kept again"
    );
    Ok(())
}

#[test]
fn a_claim_left_by_an_interrupted_publish_is_passed_over_once_abandoned() -> R {
    let server = OciServer::anonymous()?;
    let fx = Fixture::oci(&server.url("keel"), plain())?;
    let first = fx.publish("echo", "0.1.0", "")?;
    let echo: PluginName = "acme:echo".parse()?;
    let registry = fx.registry()?;

    // A publisher signs 0.2.0 an hour ago (by its clock), claims position 1, and dies there.
    let code = component("0.2.0");
    let mut release = first.release.clone().ok_or("a release")?;
    release.sha256 = sha256_hex(&code);
    release.size = code.len() as u64;
    release.manifest = release.manifest.replace("0.1.0", "0.2.0");
    let mut build = |log: &IndexLog| {
        let mut record = keel_registry::Record {
            seq: log.len() as u64,
            prev: log.head_hash().to_owned(),
            version: "0.2.0".parse().map_err(RegistryError::internal)?,
            time: first.time.saturating_sub(3600),
            release: Some(release.clone()),
            ..first.clone()
        };
        record.sign(&fx.key)?;
        Ok(record)
    };
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        registry.append(&echo, Some(&code), &mut build, &mut |step| {
            if step == keel_registry::Step::Claimed {
                panic!("the publisher dies after its claim");
            }
        })
    }));
    assert!(died.is_err(), "the publisher died at its claim");
    let tags = server.tags("keel/acme/echo")?;
    assert!(
        tags.iter().any(|t| t.starts_with("keel-record-1-")),
        "{tags:?}"
    );
    assert!(!tags.iter().any(|t| t.contains("withdrawn")), "{tags:?}");

    // Nobody sees the claim, and the next publish passes over it.
    let log = IndexLog::parse(&echo, &fx.registry()?.read_index(&echo)?)?;
    assert_eq!(log.len(), 1);
    fx.publish("echo", "0.3.0", "")?;
    let log = IndexLog::parse(&echo, &fx.registry()?.read_index(&echo)?)?;
    let versions: Vec<String> = log
        .versions()
        .iter()
        .map(|v| v.record.version.to_string())
        .collect();
    assert_eq!(versions, ["0.1.0", "0.3.0"]);
    Ok(())
}

#[test]
fn tls_is_verified_and_a_private_authority_is_trusted_only_when_named() -> R {
    let server = OciServer::with_tls()?;
    let url = server.url("keel");
    // TLS by default: a certificate no trusted authority signed is refused.
    let unnamed = Fixture::oci(&url, OciOptions::default())?;
    let err = message(unnamed.publish("echo", "0.1.0", ""));
    assert!(err.contains("ca-file"), "{err}");
    assert!(
        std::fs::read_dir(server.storage().join("repositories")).is_err(),
        "nothing reached the registry"
    );
    // Plain HTTP to it fails too (it speaks TLS only).
    assert!(
        Fixture::oci(&url, plain())?
            .publish("echo", "0.1.0", "")
            .is_err()
    );
    // Its authority named: published and installed over verified TLS.
    let named = OciOptions {
        ca_file: Some(server.authority()),
        ..OciOptions::default()
    };
    let fx = Fixture::oci(&url, named)?;
    fx.publish("echo", "0.1.0", "")?;
    let home = fx.home_trusting(&fx.key, "user")?;
    apply_install(
        &home,
        &fx.plan(&home, &["acme:echo"], InstallOptions::default())?,
    )?;
    assert_eq!(load_installed(&home)?[0].entry.version.to_string(), "0.1.0");
    // A file that is no certificate is refused before anything is sent.
    let junk = server.dir().join("junk.pem");
    std::fs::write(&junk, "not a certificate")?;
    let err = message(keel_registry::Registry::open_oci(
        &url,
        OciOptions {
            ca_file: Some(junk),
            ..OciOptions::default()
        },
    ));
    assert!(err.contains("not a PEM certificate"), "{err}");
    Ok(())
}
