//! Install benchmark: a 5 MiB plugin from a local registry into a fresh home — read and check
//! the signed index, resolve, read the blob, SHA-256 it, verify the signer, write the plugin
//! and the lockfile with fsync under the lockfile's lock — and the load-time re-hash against the
//! lockfile; and the lock and the durable lockfile write on their own.

use std::hint::black_box;
use std::path::Path;

use criterion::Criterion;
use keel_kernel::{WasmHost, WasmHostConfig};
use keel_registry::{
    Home, KeyPair, Registry, Session, atomic_write, load_installed, lock_for_update, publish,
    validate,
};

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

    // What an install pays for not losing a concurrent install's update: the lock around the
    // lockfile's read-modify-write (with its sweep for a killed install's temp files), next to
    // the durable write of the lockfile it guards.
    let lock_dir = tempfile::tempdir().expect("lock dir");
    let target = lock_dir.path().join("keel.lock");
    let text = "[[plugin]]\nname = \"acme:big\"\n".repeat(8);
    c.bench_function("take and release the keel.lock update lock", |b| {
        b.iter(|| drop(lock_for_update(black_box(&target)).expect("locked")))
    });
    c.bench_function(
        "write a lockfile durably (temp, fsync, rename, fsync dir)",
        |b| b.iter(|| atomic_write(black_box(&target), text.as_bytes(), false).expect("written")),
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
