//! Lifecycle and mediation through the kernel's public API, with in-process plugins.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Behaviour, manifest, package};
use keel_kernel::{Env, Kernel, KernelConfig, KernelError, LifecycleError, PluginState};

fn provider(version: &str) -> keel_kernel::PluginPackage {
    package(
        manifest("prov", version, &[("s.greet", version)], &[]),
        Behaviour {
            tool: true,
            ..Behaviour::default()
        },
    )
}

fn consumer() -> keel_kernel::PluginPackage {
    package(
        manifest(
            "cons",
            "1.0.0",
            &[("s.cons", "1.0.0")],
            &[("s.greet", "^1")],
        ),
        Behaviour {
            forward_to: Some("s.greet".into()),
            ..Behaviour::default()
        },
    )
}

fn state(kernel: &Kernel, name: &str) -> PluginState {
    kernel
        .status(name)
        .map(|s| s.state)
        .unwrap_or(PluginState::Disposed)
}

type R = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn consumer_waits_for_its_provider_and_follows_it() -> R {
    let kernel = Kernel::default();
    kernel.load(consumer()).await?;
    match state(&kernel, "cons") {
        PluginState::Pending { waiting_for } => {
            assert!(
                waiting_for[0].contains("s.greet")
                    && waiting_for[0].contains("no loaded plugin provides it"),
                "{waiting_for:?}"
            );
        }
        other => panic!("consumer should wait, is {other:?}"),
    }
    kernel.load(provider("1.0.0")).await?;
    assert_eq!(state(&kernel, "cons"), PluginState::Active);
    assert_eq!(
        kernel.call_service("s.cons", "forward", "hi").await?,
        "prov@1.0.0 s.greet.echo(hi)"
    );

    kernel.unload("prov").await?;
    assert!(matches!(
        state(&kernel, "cons"),
        PluginState::Pending { .. }
    ));
    let e = kernel.call_service("s.cons", "forward", "hi").await.err();
    assert!(
        matches!(&e, Some(KernelError::Unavailable(m)) if m.contains("waiting for")),
        "{e:?}"
    );

    kernel.load(provider("1.3.0")).await?;
    assert_eq!(state(&kernel, "cons"), PluginState::Active);
    assert_eq!(
        kernel.call_service("s.cons", "forward", "x").await?,
        "prov@1.3.0 s.greet.echo(x)"
    );
    Ok(())
}

#[tokio::test]
async fn incompatible_provider_names_both_sides_and_versions() -> R {
    let kernel = Kernel::default();
    kernel.load(provider("2.0.0")).await?;
    kernel.load(consumer()).await?;
    match state(&kernel, "cons") {
        PluginState::Pending { waiting_for } => {
            let w = &waiting_for[0];
            assert!(
                w.contains("s.greet") && w.contains("^1") && w.contains("`prov` 2.0.0"),
                "{w}"
            );
        }
        other => panic!("expected pending, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn failed_activation_undoes_its_effects_and_spares_the_others() -> R {
    let kernel = Kernel::default();
    kernel.load(provider("1.0.0")).await?;
    let before = kernel.fingerprint();
    let bad = package(
        manifest("bad", "1.0.0", &[("s.bad", "1.0.0")], &[]),
        Behaviour {
            tool: true,
            fail_activate: true,
            ..Behaviour::default()
        },
    );
    let status = kernel.load(bad).await?;
    assert!(
        matches!(&status.state, PluginState::Failed { reason } if reason.contains("configured to fail")),
        "{status:?}"
    );
    assert_eq!(
        kernel.fingerprint(),
        before,
        "a failed plugin leaves nothing behind"
    );
    assert_eq!(state(&kernel, "prov"), PluginState::Active);
    assert_eq!(
        kernel.call_service("s.greet", "m", "").await?,
        "prov@1.0.0 s.greet.m()"
    );
    Ok(())
}

#[tokio::test]
async fn effects_during_unload_are_refused() -> R {
    let kernel = Kernel::default();
    let log = Arc::new(Mutex::new(Vec::new()));
    let p = package(
        manifest("late", "1.0.0", &[], &[]),
        Behaviour {
            effect_in_deactivate: Some(log.clone()),
            ..Behaviour::default()
        },
    );
    kernel.load(p).await?;
    kernel.unload("late").await?;
    let answers = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(answers.len(), 1);
    assert!(answers[0].contains("unloading"), "{answers:?}");
    assert!(kernel.env().is_empty());
    assert_eq!(kernel.fingerprint(), Env::default().fingerprint());
    Ok(())
}

#[tokio::test]
async fn reentrant_call_is_refused_with_the_chain() -> R {
    let kernel = Kernel::default();
    let p = package(
        manifest("loop", "1.0.0", &[("s.loop", "1.0.0")], &[]),
        Behaviour {
            forward_to: Some("s.loop".into()),
            ..Behaviour::default()
        },
    );
    kernel.load(p).await?;
    let e = kernel.call_service("s.loop", "forward", "").await.err();
    match e {
        Some(KernelError::Failed(m)) => assert!(
            m.contains("re-entrant") && m.contains("keel → loop → loop"),
            "{m}"
        ),
        other => panic!("expected a refused re-entrant call, got {other:?}"),
    }
    Ok(())
}

/// A typed service call (ABI 0.6.0) reaches a provider without the typed door through its
/// JSON one, and its answer is read back as the method's; through the same declaration check
/// and routing as `services.call`.
#[tokio::test]
async fn a_typed_call_reaches_a_json_provider_through_the_same_checks() -> R {
    use keel_kernel::{ServiceAnswer, ServiceCall};
    use keel_protocol::{RecallRequest, RecalledEntry, SummarizeRequest};

    let kernel = Kernel::default();
    let recall = |input: &str| {
        ServiceCall::Recall(RecallRequest {
            session: "s".into(),
            input: input.into(),
        })
    };
    // Nobody provides it: said as `services.call` says it.
    match kernel.call_service_typed(&recall("x")).await {
        Err(KernelError::Unavailable(m)) => assert!(m.contains("`memory`"), "{m}"),
        other => panic!("expected an unavailable service, got {other:?}"),
    }
    kernel
        .load(package(
            manifest("notes", "1.0.0", &[("memory", "1.0.0")], &[]),
            Behaviour::default(),
        ))
        .await?;
    assert_eq!(
        kernel
            .call_service_typed(&recall("how do we build"))
            .await?,
        ServiceAnswer::Recalled(vec![RecalledEntry {
            source: "notes@1.0.0".into(),
            text: "how do we build".into(),
        }])
    );
    // A provider whose JSON answer is not the method's is a failure naming the door.
    kernel
        .load(package(
            manifest("squash", "1.0.0", &[("compaction", "1.0.0")], &[]),
            Behaviour::default(),
        ))
        .await?;
    let summarize = ServiceCall::Summarize(SummarizeRequest {
        messages: vec![keel_protocol::Message::user_text("read every file")],
        focus: String::new(),
        budget_chars: 1000,
    });
    match kernel.call_service_typed(&summarize).await {
        Err(KernelError::Failed(m)) => assert!(
            m.contains("`compaction` provider's answer to `summarize`"),
            "{m}"
        ),
        other => panic!("expected a malformed answer, got {other:?}"),
    }
    // A plugin calls a typed service only when it declared it, as through `services.call`.
    kernel
        .load(package(
            manifest("nosy", "1.0.0", &[("s.nosy", "1.0.0")], &[]),
            Behaviour::default(),
        ))
        .await?;
    let refused = kernel
        .call_service("s.nosy", "recall-typed", "secrets")
        .await?;
    assert!(
        refused.starts_with("error: denied: plugin `nosy` did not declare the service `memory`"),
        "{refused}"
    );
    kernel
        .load(package(
            manifest(
                "asker",
                "1.0.0",
                &[("s.asker", "1.0.0")],
                &[("memory", "^1")],
            ),
            Behaviour::default(),
        ))
        .await?;
    assert_eq!(
        kernel
            .call_service("s.asker", "recall-typed", "tests")
            .await?,
        format!(
            "{:?}",
            ServiceAnswer::Recalled(vec![RecalledEntry {
                source: "notes@1.0.0".into(),
                text: "tests".into(),
            }])
        )
    );
    Ok(())
}

#[tokio::test]
async fn missing_service_is_named() {
    let kernel = Kernel::default();
    let e = kernel.call_service("s.none", "m", "").await.err();
    assert!(matches!(e, Some(KernelError::Unavailable(m)) if m.contains("`s.none`")));
}

#[tokio::test]
async fn cycle_is_refused_at_load_naming_it() -> R {
    let kernel = Kernel::default();
    kernel
        .load(package(
            manifest("a", "1.0.0", &[("s.a", "1.0.0")], &[("s.b", "^1")]),
            Behaviour::default(),
        ))
        .await?;
    let e = kernel
        .load(package(
            manifest("b", "1.0.0", &[("s.b", "1.0.0")], &[("s.a", "^1")]),
            Behaviour::default(),
        ))
        .await
        .err();
    assert!(matches!(&e, Some(LifecycleError::Graph(_))), "{e:?}");
    assert!(
        e.map(|e| e.to_string())
            .unwrap_or_default()
            .contains("a → b → a")
    );
    assert!(kernel.status("b").is_none());
    Ok(())
}

#[tokio::test]
async fn reload_waits_for_the_call_in_flight_and_routes_new_calls_to_the_new_version() -> R {
    let kernel = Kernel::default();
    let slow = |v: &str| {
        package(
            manifest("prov", v, &[("s.greet", "1.0.0")], &[]),
            Behaviour {
                call_delay: Duration::from_millis(300),
                ..Behaviour::default()
            },
        )
    };
    kernel.load(slow("1.0.0")).await?;
    let k = kernel.clone();
    let in_flight = tokio::spawn(async move { k.call_service("s.greet", "m", "first").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let k = kernel.clone();
    let reload = tokio::spawn(async move { k.reload(slow("1.1.0")).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let during = kernel.call_service("s.greet", "m", "second").await?;
    assert_eq!(in_flight.await??, "prov@1.0.0 s.greet.m(first)");
    reload.await??;
    assert_eq!(during, "prov@1.1.0 s.greet.m(second)");
    Ok(())
}

#[tokio::test]
async fn reload_hands_state_over_and_unload_discards_it() -> R {
    let kernel = Kernel::default();
    kernel.load(provider("1.0.0")).await?;
    kernel.call_service("s.greet", "count", "").await?;
    kernel.call_service("s.greet", "count", "").await?;
    kernel.reload(provider("1.1.0")).await?;
    assert_eq!(kernel.call_service("s.greet", "count", "").await?, "3");
    kernel.unload("prov").await?;
    kernel.load(provider("1.0.0")).await?;
    assert_eq!(kernel.call_service("s.greet", "count", "").await?, "1");
    Ok(())
}

#[tokio::test]
async fn failed_reload_rolls_back() -> R {
    let kernel = Kernel::default();
    kernel.load(provider("1.0.0")).await?;
    kernel.load(consumer()).await?;
    let before = kernel.fingerprint();
    let broken = package(
        manifest("prov", "1.1.0", &[("s.greet", "1.1.0")], &[]),
        Behaviour {
            fail_activate: true,
            ..Behaviour::default()
        },
    );
    let e = kernel.reload(broken).await.err();
    assert!(
        matches!(
            &e,
            Some(LifecycleError::ReloadFailed {
                rolled_back: true,
                ..
            })
        ),
        "{e:?}"
    );
    assert_eq!(state(&kernel, "prov"), PluginState::Active);
    assert_eq!(
        kernel.status("prov").map(|s| s.version.to_string()),
        Some("1.0.0".into())
    );
    assert_eq!(state(&kernel, "cons"), PluginState::Active);
    assert_eq!(kernel.fingerprint(), before);
    Ok(())
}

#[tokio::test]
async fn incompatible_reload_stops_dependents_and_compatible_one_restarts_them() -> R {
    let kernel = Kernel::default();
    kernel.load(provider("1.0.0")).await?;
    kernel.load(consumer()).await?;
    kernel.reload(provider("2.0.0")).await?;
    assert!(matches!(
        state(&kernel, "cons"),
        PluginState::Pending { .. }
    ));
    kernel.reload(provider("1.2.0")).await?;
    assert_eq!(state(&kernel, "cons"), PluginState::Active);
    Ok(())
}

#[tokio::test]
async fn unload_of_a_busy_plugin_times_out_and_changes_nothing() -> R {
    let kernel = Kernel::new(KernelConfig {
        quiesce_timeout: Duration::from_millis(100),
        ..KernelConfig::default()
    });
    kernel
        .load(package(
            manifest("busy", "1.0.0", &[("s.busy", "1.0.0")], &[]),
            Behaviour {
                call_delay: Duration::from_millis(800),
                ..Behaviour::default()
            },
        ))
        .await?;
    let k = kernel.clone();
    let call = tokio::spawn(async move { k.call_service("s.busy", "m", "").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = kernel.fingerprint();
    let e = kernel.unload("busy").await.err();
    assert!(matches!(&e, Some(LifecycleError::Busy { .. })), "{e:?}");
    assert!(
        e.map(|e| e.to_string())
            .unwrap_or_default()
            .contains("busy in a call")
    );
    assert_eq!(state(&kernel, "busy"), PluginState::Active);
    assert_eq!(kernel.fingerprint(), before);
    call.await??;
    kernel.unload("busy").await?;
    Ok(())
}

#[tokio::test]
async fn events_reach_subscribers_in_order() -> R {
    let kernel = Kernel::default();
    kernel.load(provider("1.0.0")).await?;
    for i in 0..20 {
        kernel.emit("test.ping", &i.to_string())?;
    }
    let mut last = String::new();
    for _ in 0..100 {
        last = kernel.call_service("s.greet", "last-event", "").await?;
        if last == "19" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(last, "19");
    Ok(())
}

/// The kernel holds a bounded amount of a plugin's events: one payload at most
/// `MAX_EVENT_PAYLOAD`, and at most `MAX_QUEUED_EVENT_BYTES` queued for a subscriber that has
/// not handled them yet; past either the emitter gets an error, and the queue drains after.
#[tokio::test]
async fn queued_event_bytes_are_bounded_per_subscriber() -> R {
    use keel_kernel::quotas::{MAX_EVENT_PAYLOAD, MAX_QUEUED_EVENT_BYTES};
    let kernel = Kernel::default();
    kernel.load(provider("1.0.0")).await?;
    let mut emitter = manifest("emitter", "1.0.0", &[("s.emit", "1.0.0")], &[]);
    emitter.capabilities.emits = vec!["test.*".into()];
    kernel.load(package(emitter, Behaviour::default())).await?;

    let too_big = format!("test.big {}", MAX_EVENT_PAYLOAD + 1);
    let refused = kernel.call_service("s.emit", "emit-sized", &too_big).await;
    assert!(
        matches!(&refused, Err(KernelError::Failed(m)) if m.contains("at most")),
        "{refused:?}"
    );

    // The subscriber's delivery task cannot run while this single-threaded test emits
    // without yielding, so the queue only fills.
    let payload = "x".repeat(MAX_EVENT_PAYLOAD);
    let mut accepted = 0usize;
    let full = loop {
        match kernel.emit("test.flood", &payload) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted <= 64, "the queue never filled");
    };
    assert!(full.to_string().contains("MiB is full"), "{full}");
    assert!(accepted * MAX_EVENT_PAYLOAD <= MAX_QUEUED_EVENT_BYTES);
    assert!(
        accepted >= MAX_QUEUED_EVENT_BYTES / MAX_EVENT_PAYLOAD - 1,
        "{accepted}"
    );
    // Handled, the queue takes events again.
    kernel.settle_events().await;
    kernel.emit("test.after", "ok")?;
    Ok(())
}

/// An agent that does not end a cancelled turn itself (stuck, or hostile) has its turn call
/// stopped too, a grace after Ctrl-C, and is replaced before its next call.
#[tokio::test]
async fn ctrl_c_stops_an_agent_that_does_not_end_the_turn() -> R {
    let kernel = Kernel::default();
    let stuck = Behaviour {
        call_delay: Duration::from_secs(3600),
        ..Behaviour::default()
    };
    kernel
        .load(package(
            manifest("stuck-agent", "1.0.0", &[("agent", "1.0.0")], &[]),
            stuck,
        ))
        .await?;
    kernel.begin_turn();
    let turn = {
        let kernel = kernel.clone();
        tokio::spawn(async move { kernel.call_service("agent", "turn", "{}").await })
    };
    kernel.cancel_turn();
    let outcome = tokio::time::timeout(Duration::from_secs(60), turn).await??;
    match outcome {
        Err(KernelError::Denied(m)) => assert!(m.contains("cancelled the turn"), "{m}"),
        other => panic!("the turn must be stopped, got {other:?}"),
    }
    assert_eq!(
        kernel.status("stuck-agent").map(|s| s.state),
        Some(PluginState::Active)
    );
    Ok(())
}

/// What an observer (the web page, the trace exporter) sees: each change as the kernel makes
/// it, in order, and the calls counted per plugin.
#[tokio::test]
async fn observers_see_every_plugin_change_as_it_happens_and_the_calls_counted() -> R {
    use keel_kernel::PluginChangeKind as K;
    let kernel = Kernel::default();
    let mut changes = kernel.plugin_changes();
    kernel.load(consumer()).await?;
    kernel.load(provider("1.0.0")).await?;
    kernel.call_service("s.cons", "forward", "x").await?;
    kernel.reload(provider("1.1.0")).await?;
    kernel.unload("prov").await?;
    let mut seen = Vec::new();
    while let Ok(c) = changes.try_recv() {
        let state = c.status.as_ref().map(|s| s.state.name()).unwrap_or("-");
        let what = match &c.kind {
            K::Loaded => "loaded".to_owned(),
            K::Reloaded { from } => format!("reloaded from {from}"),
            K::Restarted => "restarted".to_owned(),
            K::State { from } => format!("{from} →"),
            K::Unloaded => "unloaded".to_owned(),
        };
        seen.push(format!("{} {what} {state}", c.plugin));
    }
    assert_eq!(
        seen,
        [
            "cons loaded pending",
            "cons pending → active",
            "prov loaded active",
            "prov reloaded from 1.0.0 active",
            "cons active → pending",
            "prov unloaded -",
            // Still pending, for another reason: no provider at all now.
            "cons pending → pending",
        ]
    );
    let figures = kernel.call_figures();
    assert_eq!(
        figures.get("cons").map(|f| (f.calls, f.failed)),
        Some((1, 0))
    );
    // The consumer's call went on to the provider: counted there too, as its own call.
    assert!(
        figures.get("prov").is_some_and(|f| f.calls >= 1),
        "{figures:?}"
    );
    Ok(())
}
