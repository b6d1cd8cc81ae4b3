//! The kernel's doors as a property: for random manifests and random sequences of attempts, a
//! plugin's service call reaches a provider exactly when its manifest declares the service, and
//! its event is accepted exactly when its manifest declares the topic. Every refusal is a
//! `denied` error naming the declaration to add.

use keel_kernel::{Kernel, KernelError};
use proptest::prelude::*;

use crate::common::{Behaviour, manifest, package};

const SERVICES: [&str; 4] = ["s.alpha", "s.beta", "s.gamma", "s.delta"];
const TOPICS: [&str; 4] = ["t.one", "t.two", "u.three", "u.four"];
const PATTERNS: [&str; 5] = ["t.one", "t.two", "t.*", "u.three", "*"];

#[derive(Debug, Clone)]
struct Probe {
    required: Vec<usize>,
    used: Vec<usize>,
    emits: Vec<usize>,
    attempts: Vec<(bool, usize)>,
}

fn probe() -> impl Strategy<Value = Probe> {
    (
        proptest::sample::subsequence((0..SERVICES.len()).collect::<Vec<_>>(), 0..=SERVICES.len()),
        proptest::sample::subsequence((0..SERVICES.len()).collect::<Vec<_>>(), 0..=SERVICES.len()),
        proptest::sample::subsequence((0..PATTERNS.len()).collect::<Vec<_>>(), 0..=2),
        proptest::collection::vec((any::<bool>(), 0..SERVICES.len()), 1..12),
    )
        .prop_map(|(required, used, emits, attempts)| Probe {
            required,
            used,
            emits,
            attempts,
        })
}

fn matches(pattern: &str, topic: &str) -> bool {
    pattern == "*"
        || pattern == topic
        || pattern.strip_suffix(".*").is_some_and(|prefix| {
            topic
                .strip_prefix(prefix)
                .is_some_and(|r| r.starts_with('.'))
        })
}

async fn run(p: Probe) -> Result<(), TestCaseError> {
    let kernel = Kernel::default();
    for (i, service) in SERVICES.iter().enumerate() {
        let provider = manifest(
            &format!("provider-{i}"),
            "1.0.0",
            &[(service, "1.0.0")],
            &[],
        );
        kernel
            .load(package(provider, Behaviour::default()))
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    let requires: Vec<(&str, &str)> = p.required.iter().map(|&i| (SERVICES[i], "^1")).collect();
    let mut m = manifest("probe", "1.0.0", &[("s.probe", "1.0.0")], &requires);
    m.capabilities.services = p.used.iter().map(|&i| SERVICES[i].to_owned()).collect();
    m.capabilities.emits = p.emits.iter().map(|&i| PATTERNS[i].to_owned()).collect();
    kernel
        .load(package(m.clone(), Behaviour::default()))
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for (is_call, i) in p.attempts {
        if is_call {
            let service = SERVICES[i];
            let declared = p.required.contains(&i) || p.used.contains(&i);
            let answer = kernel.call_service("s.probe", "call", service).await;
            match answer {
                Ok(text) => {
                    prop_assert!(declared, "{service} reached undeclared: {text}");
                    prop_assert!(text.starts_with("provider-"), "{text}");
                }
                Err(KernelError::Failed(m)) => {
                    prop_assert!(!declared, "{service} refused though declared: {m}");
                    prop_assert!(m.contains("did not declare the service"), "{m}");
                }
                Err(other) => prop_assert!(false, "{other:?}"),
            }
        } else {
            let topic = TOPICS[i];
            let declared = m.capabilities.emits.iter().any(|p| matches(p, topic));
            match kernel.call_service("s.probe", "emit", topic).await {
                Ok(_) => prop_assert!(declared, "{topic} emitted undeclared"),
                Err(KernelError::Failed(m)) => {
                    prop_assert!(!declared, "{topic} refused though declared: {m}");
                    prop_assert!(m.contains("did not declare the event topic"), "{m}");
                }
                Err(other) => prop_assert!(false, "{other:?}"),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_plugin_reaches_exactly_what_it_declares(p in probe()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        rt.block_on(run(p))?;
    }
}
