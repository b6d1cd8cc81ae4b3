//! Unit tests of `kernel/src/loader.rs`.

use super::*;
use crate::wasm_host::WasmHostConfig;

fn loader(workspace: &Path, data_dir: Option<PathBuf>) -> PluginLoader {
    let wasm = WasmHost::new(WasmHostConfig::default()).expect("wasm host");
    PluginLoader::new(
        wasm,
        LoaderConfig {
            workspace: workspace.to_owned(),
            data_dir,
            ..LoaderConfig::default()
        },
    )
}

fn manifest(path: &str) -> Manifest {
    let text = format!(
        "name = \"p\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n[capabilities]\n\
         dirs = [{{ path = \"{path}\", guest = \"/data\", access = \"read-write\" }}]\n"
    );
    Manifest::parse(&text, Path::new("p/keel.toml")).expect("manifest parses")
}

/// A manifest can lower its limits; raising them takes the user's grant.
#[test]
fn a_manifest_cannot_raise_its_own_limits() {
    let ws = tempfile::tempdir().expect("workspace");
    let l = loader(ws.path(), None);
    let greedy = Manifest::parse(
        "name = \"greedy\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n[limits]\n\
         memory-mib = 4096\ncpu-ms = 3600000\n",
        Path::new("keel.toml"),
    )
    .expect("manifest");
    let modest = Manifest::parse(
        "name = \"modest\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n[limits]\n\
         memory-mib = 16\ncpu-ms = 200\n",
        Path::new("keel.toml"),
    )
    .expect("manifest");
    let default = WasmLimits::default();
    assert_eq!(l.limits_for(&greedy), default);
    let lowered = l.limits_for(&modest);
    assert_eq!(lowered.memory_bytes, 16 << 20);
    assert_eq!(lowered.cpu, std::time::Duration::from_millis(200));
    // The user grants more: the manifest gets what it asks up to the grant.
    let granting = PluginLoader::new(
        WasmHost::new(WasmHostConfig::default()).expect("wasm host"),
        LoaderConfig {
            workspace: ws.path().to_owned(),
            granted_limits: [(
                "greedy".to_owned(),
                crate::manifest::Limits {
                    memory_mib: Some(256),
                    cpu_ms: Some(5_000),
                    instances: None,
                },
            )]
            .into(),
            ..LoaderConfig::default()
        },
    );
    let granted = granting.limits_for(&greedy);
    assert_eq!(granted.memory_bytes, 256 << 20);
    assert_eq!(granted.cpu, std::time::Duration::from_secs(5));
}

#[test]
fn a_grant_that_would_expose_a_sealed_file_is_refused() {
    let ws = tempfile::tempdir().expect("workspace");
    let home = ws.path().join("home");
    std::fs::create_dir_all(home.join("sub")).expect("mkdir");
    let wasm = WasmHost::new(WasmHostConfig::default()).expect("wasm host");
    let l = PluginLoader::new(
        wasm,
        LoaderConfig {
            workspace: ws.path().to_owned(),
            sealed: vec![home.join("audit.log"), home.join("approvals.json")],
            ..LoaderConfig::default()
        },
    );
    for path in [".", "home"] {
        let err = l.grants(&manifest(path)).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("audit.log") && text.contains("sealed"),
            "{text}"
        );
    }
    assert!(l.grants(&manifest("home/sub")).is_ok());
}

#[test]
fn keel_data_paths_resolve_under_the_data_directory() {
    let ws = tempfile::tempdir().expect("workspace");
    let data = tempfile::tempdir().expect("data dir");
    let l = loader(ws.path(), Some(data.path().to_owned()));
    let grants = l
        .grants(&manifest("$KEEL_DATA/p/sessions"))
        .expect("granted");
    let expected = data
        .path()
        .join("p/sessions")
        .canonicalize()
        .expect("created");
    assert_eq!(grants.dirs[0].host, expected);
    assert_eq!(grants.dirs[0].guest, "/data");
    assert!(!grants.dirs[0].read_only);
    // The data directory itself, and another plugin's part of it, are not its own.
    for other in ["$KEEL_DATA", "$KEEL_DATA/sessions"] {
        let e = l.grants(&manifest(other)).expect_err("not its own");
        assert!(e.to_string().contains("[grants.p]"), "{e}");
    }
    // Workspace-relative paths are unchanged.
    let grants = l.grants(&manifest(".")).expect("granted");
    assert_eq!(
        grants.dirs[0].host,
        ws.path().canonicalize().expect("canonical")
    );
}

#[test]
fn keel_data_paths_are_refused_without_a_data_directory_or_with_escapes() {
    let ws = tempfile::tempdir().expect("workspace");
    let data = tempfile::tempdir().expect("data dir");
    let e = loader(ws.path(), None)
        .grants(&manifest("$KEEL_DATA/p"))
        .expect_err("no data dir");
    assert!(e.to_string().contains("no data directory"), "{e}");
    let e = loader(ws.path(), Some(data.path().to_owned()))
        .grants(&manifest("$KEEL_DATA/p/../../escape"))
        .expect_err("escape");
    assert!(e.to_string().contains("without `..`"), "{e}");
}

/// For random manifests and user grants: a plugin gets a directory only if its manifest
/// may grant it alone (inside the workspace, or its own data directory) or the user's
/// config names it; and what a manifest may grant alone it always gets.
#[test]
fn no_grant_reaches_a_directory_the_manifest_and_the_user_did_not_grant() {
    use proptest::sample::subsequence;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};

    let root = tempfile::tempdir().expect("root");
    let root = root.path().canonicalize().expect("canonical");
    let ws = root.join("ws");
    let outside = root.join("outside");
    let home = root.join("home");
    let data = home.join("data");
    for dir in [ws.join("src"), outside.clone(), data.join("other")] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    std::os::unix::fs::symlink(&outside, ws.join("link-out")).expect("link");
    let candidates: Vec<String> = vec![
        ".".into(),
        "src".into(),
        "$KEEL_DATA/p".into(),
        "..".into(),
        "../outside".into(),
        "link-out".into(),
        outside.display().to_string(),
        ws.join("src").display().to_string(),
        "$KEEL_DATA/other".into(),
        home.display().to_string(),
        "$KEEL_DATA".into(),
    ];
    // The ones a manifest may grant without the user.
    let alone = 3;
    let own_data = data.join("p");
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let strategy = (
        subsequence((0..candidates.len()).collect::<Vec<_>>(), 1..=3),
        subsequence((0..candidates.len()).collect::<Vec<_>>(), 0..=3),
    );
    runner
        .run(&strategy, |(asked, granted)| {
            let wasm = WasmHost::new(WasmHostConfig::default()).expect("wasm host");
            let l = PluginLoader::new(
                wasm,
                LoaderConfig {
                    workspace: ws.clone(),
                    data_dir: Some(data.clone()),
                    home: Some(home.clone()),
                    granted_dirs: [(
                        "p".to_owned(),
                        granted
                            .iter()
                            .map(|&i| PathBuf::from(&candidates[i]))
                            .collect(),
                    )]
                    .into(),
                    ..LoaderConfig::default()
                },
            );
            let entries: Vec<String> = asked
                .iter()
                .enumerate()
                .map(|(n, &i)| {
                    format!(
                        "{{ path = \"{}\", guest = \"/d{n}\", access = \"read\" }}",
                        candidates[i]
                    )
                })
                .collect();
            let text = format!(
                "name = \"p\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n[capabilities]\n\
                 dirs = [{}]\n",
                entries.join(", ")
            );
            let Ok(m) = Manifest::parse(&text, Path::new("p/keel.toml")) else {
                return Ok(());
            };
            let result = l.grants(&m);
            if asked.iter().all(|&i| i < alone) {
                proptest::prop_assert!(result.is_ok(), "{:?}: {:?}", asked, result.err());
            }
            let Ok(grants) = result else { return Ok(()) };
            // A grant holding keel's home has it carved out.
            let holds_home = grants
                .dirs
                .iter()
                .any(|d| home.starts_with(&d.host) && d.host != home);
            proptest::prop_assert_eq!(holds_home, grants.hidden.contains(&home));
            for (dir, &i) in grants.dirs.iter().zip(&asked) {
                let by_user = granted.contains(&i);
                let inside = dir.host.starts_with(&ws) || dir.host.starts_with(&own_data);
                if !by_user && !inside {
                    return Err(TestCaseError::fail(format!(
                        "`{}` reached {} without the user's grant",
                        candidates[i],
                        dir.host.display()
                    )));
                }
                if !by_user && i >= alone {
                    return Err(TestCaseError::fail(format!(
                        "`{}` was granted by the manifest alone",
                        candidates[i]
                    )));
                }
            }
            Ok(())
        })
        .expect("property");
}

/// keel's own plugins get a missing workspace folder made for them (the project's memory), but
/// never through a link a cloned repository planted, and they get only that folder.
#[test]
fn a_shipped_plugins_workspace_folder_is_made_inside_the_workspace_only() {
    let ws = tempfile::tempdir().expect("workspace");
    let outside = tempfile::tempdir().expect("outside");
    let l = loader(ws.path(), None);
    let memory = manifest(".keel/memory");
    let grants = l.grants_for(&memory, true).expect("made and granted");
    let made = ws.path().join(".keel/memory");
    assert!(made.is_dir());
    assert_eq!(grants.dirs[0].host, made.canonicalize().expect("canonical"));
    // A third party's manifest gets nothing made for it.
    assert!(l.grants_for(&manifest(".keel/other"), false).is_err());
    assert!(!ws.path().join(".keel/other").exists());

    // A repository whose `.keel` is a link out of the workspace.
    let planted = tempfile::tempdir().expect("workspace");
    #[cfg(unix)]
    std::os::unix::fs::symlink(outside.path(), planted.path().join(".keel")).expect("link");
    let l = loader(planted.path(), None);
    let err = l
        .grants_for(&memory, true)
        .expect_err("a link out is refused");
    assert!(err.to_string().contains("outside the workspace"), "{err}");
    assert!(
        !outside.path().join("memory").exists(),
        "nothing is made through the link"
    );
    // Nor is an existing folder behind such a link granted.
    std::fs::create_dir_all(outside.path().join("memory")).expect("dir");
    assert!(l.grants_for(&memory, true).is_err());
}

/// A third party's manifest gets more than one instance only with the person's grant; keel's
/// own plugins keep what they ship with.
#[test]
fn a_manifest_cannot_give_itself_more_instances() {
    let ws = tempfile::tempdir().expect("workspace");
    let many = |name: &str| {
        Manifest::parse(
            &format!(
                "name = \"{name}\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n[limits]\ninstances = 8\n"
            ),
            Path::new("keel.toml"),
        )
        .expect("manifest")
    };
    let l = loader(ws.path(), None);
    assert_eq!(
        l.with_granted_instances(many("greedy")).limits.instances,
        Some(1)
    );
    let granting = PluginLoader::new(
        WasmHost::new(WasmHostConfig::default()).expect("wasm host"),
        LoaderConfig {
            workspace: ws.path().to_owned(),
            granted_limits: [(
                "greedy".to_owned(),
                crate::manifest::Limits {
                    instances: Some(2),
                    ..crate::manifest::Limits::default()
                },
            )]
            .into(),
            ..LoaderConfig::default()
        },
    );
    assert_eq!(
        granting
            .with_granted_instances(many("greedy"))
            .limits
            .instances,
        Some(2)
    );
    assert_eq!(
        granting
            .with_granted_instances(many("other"))
            .limits
            .instances,
        Some(1)
    );
}
