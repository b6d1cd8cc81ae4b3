//! keel's registry in an OCI registry (the distribution registry on loopback, as the tests
//! start it): publishing and installing a 5 MiB plugin, and resolving against a registry of
//! 100 plugins × 10 versions (every index read, its records fetched and chained, the chosen
//! release's signature checked and its blob downloaded and re-hashed).

use std::path::Path;

use criterion::{BatchSize, Criterion};
use keel_kernel::{Capabilities, PluginKind, WasmHost, WasmHostConfig};
use keel_registry::{
    Action, Home, InstallOptions, KeyPair, OciOptions, PluginName, Record, Registry, Release,
    Session, TrustConfig, parse_spec, plan_install, publish, sha256_hex, validate,
};
use keel_tests::oci_server::OciServer;

#[path = "support.rs"]
mod support;

const PLUGINS: usize = 100;
const VERSIONS: u64 = 10;

fn open(server: &OciServer, path: &str, cache: Option<&Path>) -> Registry {
    Registry::open_oci(
        &server.url(path),
        OciOptions {
            plain_http: true,
            cache: cache.map(Path::to_path_buf),
            ..OciOptions::default()
        },
    )
    .expect("registry")
}

/// Fill `registry` with PLUGINS × VERSIONS signed releases of small distinct blobs, eight
/// publishers at a time.
fn fill(registry: &Registry, key: &KeyPair) {
    std::thread::scope(|s| {
        for worker in 0..8 {
            s.spawn(move || {
                for i in (worker..PLUGINS).step_by(8) {
                    let name = PluginName::new("acme", &format!("p{i}")).expect("name");
                    for m in 0..VERSIONS {
                        let blob = format!("plugin {i} version {m}").into_bytes();
                        let version = semver::Version::new(0, 1, m);
                        let manifest = format!(
                            "name = \"p{i}\"\nversion = \"{version}\"\nkind = \"wasm\"\ncomponent = \"plugin.wasm\"\n"
                        );
                        let mut build = |log: &keel_registry::IndexLog| {
                            let mut record = Record {
                                seq: log.len() as u64,
                                prev: log.head_hash().to_owned(),
                                action: Action::Release,
                                name: name.to_string(),
                                version: version.clone(),
                                time: std::time::SystemTime::now()
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .map(|d| d.as_secs())
                                    .unwrap_or(0),
                                release: Some(Release {
                                    sha256: sha256_hex(&blob),
                                    size: blob.len() as u64,
                                    kind: PluginKind::Wasm,
                                    description: String::new(),
                                    provides: Default::default(),
                                    requires: Default::default(),
                                    capabilities: Capabilities::default(),
                                    manifest: manifest.clone(),
                                }),
                                key: String::new(),
                                signature: String::new(),
                            };
                            record.sign(key)?;
                            Ok(record)
                        };
                        registry
                            .append(&name, Some(&blob), &mut build, &mut |_| {})
                            .expect("appended");
                    }
                }
            });
        }
    });
}

fn benches(c: &mut Criterion) {
    let server = OciServer::anonymous().expect("docker-registry (apt-get install docker-registry)");
    let dir = tempfile::tempdir().expect("temp dir");
    let host = WasmHost::new(WasmHostConfig::default()).expect("wasm host");
    let key = KeyPair::from_seed("bench", Some("acme"), [5; 32]);
    let manifest = "name = \"big\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n";
    let package = validate(
        &host,
        Path::new("keel.toml"),
        manifest,
        support::big_component(),
    )
    .expect("valid");
    let big: PluginName = "acme:big".parse().expect("name");
    let publisher = Home::new(dir.path().join("publisher"));

    // Each publish goes to a registry path of its own, so every one is a first release.
    let mut n = 0u64;
    c.bench_function("publish a 5 MiB plugin to a loopback OCI registry", |b| {
        b.iter_batched(
            || {
                n += 1;
                open(&server, &format!("publish{n}"), None)
            },
            |registry| {
                let mut session = Session::new(publisher.clone(), registry).expect("session");
                publish(&mut session, &big, &package, Some(&key), &mut |_| {}).expect("published");
            },
            BatchSize::PerIteration,
        )
    });

    let registry = open(&server, "install", None);
    let mut session = Session::new(publisher.clone(), registry.clone()).expect("session");
    publish(&mut session, &big, &package, Some(&key), &mut |_| {}).expect("published");
    let homes = tempfile::tempdir().expect("homes");
    support::bench_install(
        c,
        "install a 5 MiB plugin from a loopback OCI registry",
        &registry,
        &key,
        homes.path(),
    );

    let catalog = open(&server, "catalog", None);
    let started = std::time::Instant::now();
    fill(&catalog, &key);
    eprintln!(
        "filled {PLUGINS} plugins × {VERSIONS} versions in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut trust = TrustConfig::default();
    trust
        .trust("acme", key.public(), catalog.location())
        .expect("trust");
    let wanted = vec![parse_spec("acme:p7").expect("spec")];
    // Without kept records every record is fetched; with them (after the first read) each
    // index is one listing of its tags.
    let records = dir.path().join("records");
    let kept = open(&server, "catalog", Some(&records));
    for (label, catalog) in [("", &catalog), (", records kept", &kept)] {
        c.bench_function(
            &format!("resolve against an OCI registry of 100 plugins × 10 versions{label}"),
            |b| {
                b.iter_batched(
                    || {
                        n += 1;
                        let home = Home::new(homes.path().join(format!("r{n}")));
                        trust.save(&home.trust_path()).expect("trust saved");
                        home
                    },
                    |home| {
                        let mut session = Session::new(home, catalog.clone()).expect("session");
                        let plan = plan_install(&mut session, &wanted, InstallOptions::default())
                            .expect("plan");
                        assert_eq!(plan.plugins[0].version.to_string(), "0.1.9");
                    },
                    BatchSize::PerIteration,
                )
            },
        );
    }
}

fn main() {
    let mut c = Criterion::default().sample_size(10).configure_from_args();
    benches(&mut c);
    c.final_summary();
}
