//! Property tests for temporal and spatial composability: whatever sequence of loads, unloads
//! and reloads runs over whatever dependency DAG, the environment equals that of a fresh kernel
//! holding the same plugins, is empty when everything is unloaded, and does not depend on the
//! order of loads.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Behaviour, manifest, package};
use keel_kernel::{Env, Kernel, PluginPackage, PluginState};
use proptest::prelude::*;

/// Plugin `i` provides `s.p{i}` and requires some services of plugins `j < i`, so the graph is
/// a DAG by construction.
#[derive(Debug, Clone)]
struct Dag {
    requires: Vec<BTreeSet<usize>>,
}

#[derive(Debug, Clone)]
enum Op {
    Load(usize),
    Unload(usize),
    /// Reload with a new version; `true` keeps it compatible (1.x), `false` breaks it (2.0).
    Reload(usize, bool),
}

fn dag(max: usize) -> impl Strategy<Value = Dag> {
    (1..=max).prop_flat_map(|n| {
        (0..n)
            .map(|i| {
                proptest::collection::btree_set(0..i.max(1), 0..=i.min(3))
                    .prop_map(move |s| if i == 0 { BTreeSet::new() } else { s })
            })
            .collect::<Vec<_>>()
            .prop_map(|requires| Dag { requires })
    })
}

fn ops(n: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            3 => (0..n).prop_map(Op::Load),
            2 => (0..n).prop_map(Op::Unload),
            1 => (0..n, any::<bool>()).prop_map(|(i, c)| Op::Reload(i, c)),
        ],
        1..24,
    )
}

fn pkg(dag: &Dag, i: usize, version: &str) -> PluginPackage {
    let service = format!("s.p{i}");
    let requires: Vec<(String, &str)> = dag.requires[i]
        .iter()
        .map(|j| (format!("s.p{j}"), "^1"))
        .collect();
    let requires: Vec<(&str, &str)> = requires.iter().map(|(s, r)| (s.as_str(), *r)).collect();
    package(
        manifest(&format!("p{i}"), version, &[(&service, version)], &requires),
        Behaviour {
            tool: i.is_multiple_of(2),
            ..Behaviour::default()
        },
    )
}

/// Which loaded plugins must be active: all requirements loaded, compatible and active.
fn expected_active(dag: &Dag, loaded: &BTreeMap<usize, String>) -> BTreeSet<usize> {
    let mut active = BTreeSet::new();
    for i in 0..dag.requires.len() {
        if loaded.contains_key(&i)
            && dag.requires[i]
                .iter()
                .all(|j| active.contains(j) && loaded.get(j).is_some_and(|v| v.starts_with("1.")))
        {
            active.insert(i);
        }
    }
    active
}

async fn fresh_fingerprint(dag: &Dag, loaded: &BTreeMap<usize, String>, order: &[usize]) -> String {
    let kernel = Kernel::default();
    for i in order {
        if let Some(v) = loaded.get(i) {
            kernel
                .load(pkg(dag, *i, v))
                .await
                .map_err(|e| e.to_string())
                .ok();
        }
    }
    kernel.fingerprint()
}

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("tokio runtime: {e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn environment_always_matches_a_fresh_kernel((dag, ops) in dag(6).prop_flat_map(|d| {
        let n = d.requires.len();
        (Just(d), ops(n))
    })) {
        runtime().block_on(async {
            let kernel = Kernel::default();
            let mut loaded: BTreeMap<usize, String> = BTreeMap::new();
            let mut minor = 0u32;
            for op in &ops {
                match *op {
                    Op::Load(i) => {
                        let r = kernel.load(pkg(&dag, i, "1.0.0")).await;
                        prop_assert_eq!(r.is_ok(), !loaded.contains_key(&i), "load {}: {:?}", i, r);
                        loaded.entry(i).or_insert_with(|| "1.0.0".into());
                    }
                    Op::Unload(i) => {
                        let r = kernel.unload(&format!("p{i}")).await;
                        prop_assert_eq!(r.is_ok(), loaded.remove(&i).is_some(), "unload {}: {:?}", i, r);
                    }
                    Op::Reload(i, compatible) => {
                        minor += 1;
                        let v = if compatible { format!("1.{minor}.0") } else { "2.0.0".to_owned() };
                        let r = kernel.reload(pkg(&dag, i, &v)).await;
                        if let Some(current) = loaded.get_mut(&i) {
                            prop_assert!(r.is_ok(), "reload {}: {:?}", i, r);
                            *current = v;
                        } else {
                            prop_assert!(r.is_err());
                        }
                    }
                }
                let active = expected_active(&dag, &loaded);
                for status in kernel.list() {
                    let i: usize = status.name[1..].parse().unwrap_or(usize::MAX);
                    let is_active = status.state == PluginState::Active;
                    prop_assert_eq!(is_active, active.contains(&i), "{} is {:?} after {:?}", status.name, status.state, op);
                }
                let order: Vec<usize> = loaded.keys().copied().collect();
                prop_assert_eq!(kernel.fingerprint(), fresh_fingerprint(&dag, &loaded, &order).await, "after {:?}", op);
            }
            let names: Vec<usize> = loaded.keys().copied().collect();
            for i in names {
                let name = format!("p{i}");
                prop_assert!(kernel.unload(&name).await.is_ok());
            }
            prop_assert!(kernel.env().is_empty());
            prop_assert_eq!(kernel.fingerprint(), Env::default().fingerprint());
            Ok(())
        })?;
    }

    #[test]
    fn settled_state_does_not_depend_on_load_order(
        (dag, perm) in dag(7).prop_flat_map(|d| {
            let n = d.requires.len();
            (Just(d), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
        })
    ) {
        runtime().block_on(async {
            let loaded: BTreeMap<usize, String> = (0..dag.requires.len()).map(|i| (i, "1.0.0".to_owned())).collect();
            let ascending: Vec<usize> = loaded.keys().copied().collect();
            let a = fresh_fingerprint(&dag, &loaded, &ascending).await;
            let b = fresh_fingerprint(&dag, &loaded, &perm).await;
            prop_assert_eq!(a, b);
            Ok(())
        })?;
    }
}
