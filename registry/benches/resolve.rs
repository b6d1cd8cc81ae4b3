//! Resolution benchmarks: PubGrub over a registry of 500 plugins × 20 versions, each version
//! requiring services of up to three other plugins; and building that catalog from 500
//! signed index files (parse, chain and signature checks), which an install does first.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::Criterion;
use keel_kernel::{Capabilities, PluginKind};
use keel_registry::{
    Action, Candidate, Catalog, GENESIS, IndexLog, KeyPair, PluginName, Record, Release, Request,
    ServiceReq, resolve,
};
use semver::{Version, VersionReq};

const PLUGINS: usize = 500;
const VERSIONS: u64 = 20;

fn name(i: usize) -> PluginName {
    PluginName::new("bench", &format!("p{i}")).expect("valid name")
}

/// The plugins plugin `i` requires at version `1.m.0`, with the minimum minor version.
fn requirements(i: usize, m: u64) -> Vec<(usize, u64)> {
    let mut deps: Vec<usize> = [i.wrapping_sub(1), i / 2, i / 3]
        .into_iter()
        .filter(|&j| j < i)
        .collect();
    deps.dedup();
    deps.into_iter()
        .map(|j| (j, (i as u64 * 7 + m * 3 + j as u64) % 10))
        .collect()
}

fn catalog() -> Catalog {
    let mut catalog = Catalog::new();
    for i in 0..PLUGINS {
        for m in 0..VERSIONS {
            let version = Version::new(1, m, 0);
            catalog.add(
                name(i),
                Candidate {
                    requires: requirements(i, m)
                        .into_iter()
                        .map(|(j, min)| {
                            (
                                format!("svc.p{j}"),
                                VersionReq::parse(&format!("^1.{min}")).expect("valid range"),
                            )
                        })
                        .collect(),
                    provides: BTreeMap::from([(format!("svc.p{i}"), version.clone())]),
                    version,
                    yanked: m == VERSIONS - 1 && i % 5 == 0,
                },
            );
        }
    }
    catalog.finish();
    catalog
}

fn signed_logs() -> Vec<(PluginName, Vec<u8>)> {
    let key = KeyPair::from_seed("bench", Some("bench"), [3; 32]);
    (0..PLUGINS)
        .map(|i| {
            let mut text = String::new();
            let mut prev = GENESIS.to_owned();
            for m in 0..VERSIONS {
                let mut record = Record {
                    seq: m,
                    prev: prev.clone(),
                    action: Action::Release,
                    name: name(i).to_string(),
                    version: Version::new(1, m, 0),
                    time: 0,
                    release: Some(Release {
                        sha256: "ab".repeat(32),
                        size: 1,
                        kind: PluginKind::Wasm,
                        description: String::new(),
                        provides: BTreeMap::from([(format!("svc.p{i}"), Version::new(1, m, 0))]),
                        requires: requirements(i, m)
                            .into_iter()
                            .map(|(j, min)| {
                                (
                                    format!("svc.p{j}"),
                                    ServiceReq {
                                        range: format!("^1.{min}"),
                                        optional: false,
                                    },
                                )
                            })
                            .collect(),
                        capabilities: Capabilities::default(),
                        manifest: String::new(),
                    }),
                    key: String::new(),
                    signature: String::new(),
                };
                record.sign(&key).expect("signs");
                let line = record.line().expect("serializes");
                prev = Record::hash_line(&line);
                text.push_str(&line);
                text.push('\n');
            }
            (name(i), text.into_bytes())
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let catalog = catalog();
    // The ten top plugins pull in most of the graph.
    let request = Request {
        wanted: (PLUGINS - 10..PLUGINS)
            .map(|i| (name(i), VersionReq::STAR))
            .collect(),
        locked: BTreeMap::new(),
    };
    let solution = resolve(&catalog, &request).expect("the benchmark graph resolves");
    eprintln!(
        "resolution picks {} of {PLUGINS} plugins ({} versions in the registry)",
        solution.len(),
        PLUGINS as u64 * VERSIONS
    );
    c.bench_function("resolve 500 plugins x 20 versions", |b| {
        b.iter(|| resolve(black_box(&catalog), black_box(&request)))
    });

    let logs = signed_logs();
    // What `keel install` does first: chain checks of every index (signatures are checked
    // only for the releases it chooses).
    c.bench_function(
        "catalog from 500 indexes (10,000 records), chain checks",
        |b| {
            b.iter(|| {
                let mut catalog = Catalog::new();
                for (name, text) in &logs {
                    let log = IndexLog::parse_unsigned_checks(name, text).expect("valid log");
                    catalog.add_log(&log);
                }
                catalog.finish();
                catalog
            })
        },
    );
    // For comparison: every signature checked too (what `keel info` does for one plugin).
    c.bench_function(
        "catalog from 500 indexes (10,000 records), chain and signatures",
        |b| {
            b.iter(|| {
                let mut catalog = Catalog::new();
                for (name, text) in &logs {
                    let log = IndexLog::parse(name, text).expect("valid log");
                    catalog.add_log(&log);
                }
                catalog.finish();
                catalog
            })
        },
    );
}

fn main() {
    let mut c = Criterion::default().sample_size(20).configure_from_args();
    benches(&mut c);
    c.final_summary();
}
