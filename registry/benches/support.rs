//! What the install benchmarks share: the plugin they move (the bundled echo-tool component
//! grown to 5 MiB) and the measured install into a fresh home.

use criterion::{BatchSize, Criterion};
use keel_registry::{
    Home, InstallOptions, KeyPair, Registry, Session, TrustConfig, apply_install, parse_spec,
    plan_install,
};

const SIZE: usize = 5 * 1024 * 1024;

/// The bundled echo-tool component grown to 5 MiB with a trailing custom section.
pub fn big_component() -> Vec<u8> {
    let mut bytes = keel_bundled_plugins::get("echo-tool")
        .map(|b| b.component())
        .expect("echo-tool is bundled");
    let name = b"padding";
    let payload = SIZE - bytes.len() - 16;
    let mut section = Vec::new();
    let mut size = (1 + name.len() + payload) as u64;
    bytes.push(0); // custom section id
    loop {
        let byte = (size & 0x7f) as u8;
        size >>= 7;
        if size == 0 {
            section.push(byte);
            break;
        }
        section.push(byte | 0x80);
    }
    bytes.extend(section);
    bytes.push(name.len() as u8);
    bytes.extend(name);
    bytes.resize(bytes.len() + payload, 0xa5);
    bytes
}

/// A trust file trusting `key` for `acme` on `registry`.
pub fn trust_for(registry: &Registry, key: &KeyPair) -> TrustConfig {
    let mut trust = TrustConfig::default();
    trust
        .trust("acme", key.public(), registry.location())
        .expect("trust");
    trust
}

/// Install `acme:big` from `registry` into `home` (whose trust file is written).
pub fn install(home: &Home, registry: &Registry) {
    let wanted = vec![parse_spec("acme:big").expect("spec")];
    let mut session = Session::new(home.clone(), registry.clone()).expect("session");
    let plan = plan_install(&mut session, &wanted, InstallOptions::default()).expect("plan");
    apply_install(home, &plan).expect("installed");
    session.finish().expect("heads saved");
}

/// Measure, as `label`, installing `acme:big` from `registry` (where `key` signed it) into a
/// fresh home under `homes` each time: index, resolve, download, SHA-256, signature, fsynced
/// writes, lockfile.
pub fn bench_install(
    c: &mut Criterion,
    label: &str,
    registry: &Registry,
    key: &KeyPair,
    homes: &std::path::Path,
) {
    let trust = trust_for(registry, key);
    let mut n = 0u64;
    c.bench_function(label, |b| {
        b.iter_batched(
            || {
                n += 1;
                let home = Home::new(homes.join(format!("{n}-{}", label.len())));
                trust.save(&home.trust_path()).expect("trust saved");
                home
            },
            |home| {
                install(&home, registry);
                home
            },
            BatchSize::PerIteration,
        )
    });
}
