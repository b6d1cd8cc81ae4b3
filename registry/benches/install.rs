//! Install benchmark: a 5 MiB plugin from a local registry into a fresh home — read and check
//! the signed index, resolve, read the blob, SHA-256 it, verify the signer, write the plugin
//! and the lockfile with fsync — and the load-time re-hash against the lockfile.

use std::hint::black_box;
use std::path::Path;

use criterion::Criterion;
use keel_kernel::{WasmHost, WasmHostConfig};
use keel_registry::{Home, KeyPair, Registry, Session, load_installed, publish, validate};

#[path = "support.rs"]
mod support;

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let host = WasmHost::new(WasmHostConfig::default()).expect("wasm host");
    let registry_dir = dir.path().join("registry");
    let registry = Registry::open(&registry_dir.display().to_string(), true).expect("registry");
    let key = KeyPair::from_seed("bench", Some("acme"), [5; 32]);
    let manifest = "name = \"big\"\nversion = \"0.1.0\"\nkind = \"wasm\"\n";
    let code = support::big_component();
    eprintln!("component: {} bytes", code.len());
    let package = validate(&host, Path::new("keel.toml"), manifest, code).expect("valid");
    let mut session =
        Session::new(Home::new(dir.path().join("publisher")), registry.clone()).expect("session");
    publish(
        &mut session,
        &"acme:big".parse().expect("name"),
        &package,
        Some(&key),
        &mut |_| {},
    )
    .expect("published");

    let homes = tempfile::tempdir().expect("homes");
    support::bench_install(
        c,
        "install a 5 MiB plugin from a local registry",
        &registry,
        &key,
        homes.path(),
    );

    let home = Home::new(homes.path().join("loaded"));
    support::trust_for(&registry, &key)
        .save(&home.trust_path())
        .expect("trust saved");
    support::install(&home, &registry);
    c.bench_function(
        "re-hash a 5 MiB installed plugin against the lockfile",
        |b| b.iter(|| load_installed(black_box(&home)).expect("verified")),
    );
}

fn main() {
    let mut c = Criterion::default().sample_size(20).configure_from_args();
    benches(&mut c);
    c.final_summary();
}
