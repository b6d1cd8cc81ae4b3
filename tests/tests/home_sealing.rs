//! keel's home is sealed and a manifest grants only what is its own: the hostile fixture
//! `path-escape`, its manifest rewritten to ask for keel's compiled-component cache (absolute,
//! through `..`, through a link in the workspace), another plugin's data and the home itself,
//! is refused at load each time; its own data directory, and what the user grants, load.

use std::path::PathBuf;

use keel_kernel::{LoaderConfig, PluginLoader, WasmHost, WasmHostConfig};

struct Home {
    _dir: tempfile::TempDir,
    home: PathBuf,
    ws: PathBuf,
}

fn home() -> Home {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().canonicalize().expect("canonical");
    let home = base.join("keel-home");
    let ws = base.join("project");
    for d in [
        home.join("cache/components"),
        home.join("data/sessions"),
        ws.clone(),
    ] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::os::unix::fs::symlink(home.join("cache"), ws.join("cache-link")).expect("symlink");
    Home {
        _dir: dir,
        home,
        ws,
    }
}

fn loader(h: &Home, granted: &[(&str, &str)]) -> PluginLoader {
    let wasm = WasmHost::new(WasmHostConfig::default()).expect("wasm host");
    PluginLoader::new(
        wasm,
        LoaderConfig {
            workspace: h.ws.clone(),
            data_dir: Some(h.home.join("data")),
            home: Some(h.home.clone()),
            granted_dirs: granted
                .iter()
                .map(|(plugin, dir)| ((*plugin).to_owned(), vec![PathBuf::from(dir)]))
                .collect(),
            ..LoaderConfig::default()
        },
    )
}

/// The fixture asking for `path` (read-write) instead of the workspace.
fn load(loader: &PluginLoader, path: &str) -> Result<(), String> {
    let (manifest, component) =
        keel_tests::fixtures::fixture("path-escape").expect("the fixture is built");
    let asked = manifest.replace(
        r#"dirs = [{ path = ".", guest = "/workspace", access = "read" }]"#,
        &format!(r#"dirs = [{{ path = "{path}", guest = "/grant", access = "read-write" }}]"#),
    );
    assert_ne!(
        asked, manifest,
        "the fixture's manifest changed; update this test"
    );
    loader
        .from_embedded("fixture path-escape", &asked, component)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn a_manifest_cannot_grant_keel_home_or_anything_outside_its_own() {
    let h = home();
    let l = loader(&h, &[]);
    let cache = h.home.join("cache/components");
    for (path, why) in [
        (cache.display().to_string(), "absolute path"),
        ("../keel-home/cache".to_owned(), "outside the workspace"),
        ("cache-link".to_owned(), "outside the workspace"),
        ("$KEEL_DATA/sessions".to_owned(), "another plugin's data"),
        ("/".to_owned(), "absolute path"),
    ] {
        let refused = load(&l, &path).expect_err(&path);
        assert!(refused.contains(why), "{path}: {refused}");
        assert!(
            refused.contains("[grants.path-escape]"),
            "{path}: {refused}"
        );
    }
    // Its own data directory, and the workspace, are its to ask for.
    load(&l, "$KEEL_DATA/path-escape").expect("own data");
    load(&l, ".").expect("the workspace");
}

#[test]
fn the_home_stays_sealed_even_when_the_user_grants_a_path_into_it_by_mistake() {
    let h = home();
    let outside = h.ws.parent().expect("parent").join("shared");
    std::fs::create_dir_all(&outside).expect("mkdir");
    let shared = outside.display().to_string();
    let l = loader(&h, &[("path-escape", &shared)]);
    // A directory the user named loads.
    load(&l, &shared).expect("granted by the user");
    // A workspace that contains the home cannot be granted by the manifest either.
    let inside = loader(
        &Home {
            _dir: tempfile::tempdir().expect("tempdir"),
            home: h.home.clone(),
            ws: h.home.clone(),
        },
        &[],
    );
    let refused = load(&inside, ".").expect_err("the home itself");
    assert!(refused.contains("sealed"), "{refused}");
}
