//! Secrets are bound to their hosts: the hostile fixture `secret-thief` may use the OpenAI key
//! and may reach a second loopback host, yet the key never leaves for that host — not directly
//! and not through a redirect from the key's own host.

use keel_kernel::gates::net_policy::{NetDecision, NetPolicy};
use keel_kernel::{GateConfig, KernelError, NetConfig, Secrets};
use keel_tests::Harness;
use keel_tests::model_server::{ModelServer, Step, json_response};

const KEY: &str = "sk-test-0123456789abcdef0123456789";

fn ok() -> Vec<Step> {
    vec![json_response("200 OK", &[], "{}")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_goes_only_to_the_host_it_is_bound_to() -> anyhow::Result<()> {
    let thief = ModelServer::start(|_, _| ok()).await?;
    let to_thief = thief.url("/collect");
    let api = ModelServer::start(move |_, request| {
        if request.path.starts_with("/bounce") {
            vec![json_response("302 Found", &[("location", &to_thief)], "")]
        } else {
            ok()
        }
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let audit = dir.path().join("net-audit.jsonl");
    let mut secrets = Secrets::new();
    secrets.insert("OPENAI_API_KEY", KEY, &[api.endpoint()]);
    let gates = GateConfig {
        network: NetConfig {
            policy: NetPolicy::new(NetDecision::Forbid)
                .with_rule("127.0.0.1", NetDecision::Allow)?
                .with_allow_private(&api.endpoint())?
                .with_allow_private(&thief.endpoint())?,
            secrets,
            audit_log: Some(audit.clone()),
        },
        ..GateConfig::locked_down()
    };
    let h = Harness::with_gates(dir.path(), None, None, gates)?;
    h.load_fixture("secret-thief").await?;

    // The key's own host gets it.
    let sent = h
        .kernel
        .call_service("fixture.thief", "send", &api.url("/v1/models"))
        .await?;
    assert_eq!(sent, "status 200");
    assert_eq!(
        api.received()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );

    // Another host the plugin declares and the policy allows: refused, nothing sent.
    match h
        .kernel
        .call_service("fixture.thief", "send", &thief.url("/direct"))
        .await
    {
        Err(KernelError::Failed(m)) | Err(KernelError::Denied(m)) => {
            assert!(
                m.contains("may not send the secret `OPENAI_API_KEY`"),
                "{m}"
            );
            assert!(!m.contains(KEY), "{m}");
        }
        other => panic!("the key must not go to a second host, got {other:?}"),
    }
    assert!(thief.received().is_empty(), "nothing reached the thief");

    // A redirect from the key's host to the thief: followed, without the key.
    let sent = h
        .kernel
        .call_service("fixture.thief", "send", &api.url("/bounce"))
        .await?;
    assert_eq!(sent, "status 200");
    let stolen = thief.received();
    assert_eq!(stolen.len(), 1, "{stolen:?}");
    assert_eq!(stolen[0].header("authorization"), None, "{stolen:?}");
    assert!(stolen.iter().all(|r| !format!("{r:?}").contains(KEY)));

    let log = std::fs::read_to_string(&audit)?;
    assert!(log.contains("is not bound to this host"), "{log}");
    assert!(!log.contains(KEY), "{log}");
    Ok(())
}
