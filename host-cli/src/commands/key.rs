//! `keel key …`: signing keys and the namespaces whose records you trust them for.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use keel_registry::{Home, KeyPair, PublicKey, TrustConfig};

use super::registry::{RegistryArg, open_registry};
use crate::config::Context;

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Create an ed25519 signing key in `<home>/keys/NAME.key` (mode 0600) and print its
    /// public key.
    New {
        /// The key's name.
        #[arg(long, default_value = "default")]
        name: String,
        /// The namespace it publishes to when `keel publish` is given none.
        #[arg(long, value_name = "NS")]
        namespace: Option<String>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// List your signing keys and the keys you trust.
    List {
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Trust PUBKEY to sign plugins of namespace NS, and bind NS to the registry (--registry,
    /// default `<home>/registry`): NS is then only ever installed from that registry.
    Trust {
        /// The publisher's public key (64 hex digits, as `keel key new` prints it).
        pubkey: String,
        /// The namespace.
        #[arg(long, value_name = "NS")]
        namespace: String,
        #[command(flatten)]
        registry: RegistryArg,
    },
    /// Stop trusting PUBKEY for namespace NS (the binding goes with the last key).
    Untrust {
        /// The public key.
        pubkey: String,
        /// The namespace.
        #[arg(long, value_name = "NS")]
        namespace: String,
    },
}

pub fn run(ctx: &Context, cmd: KeyCommand) -> anyhow::Result<ExitCode> {
    let home = Home::new(ctx.home.clone());
    match cmd {
        KeyCommand::New {
            name,
            namespace,
            json,
        } => {
            let key = KeyPair::generate(&name, namespace.as_deref())?;
            let path = key.save(&home.keys_dir())?;
            if json {
                stdoutln!(
                    "{}",
                    serde_json::json!({
                        "name": key.name(),
                        "namespace": key.namespace(),
                        "public": key.public().to_string(),
                        "file": path,
                    })
                );
            } else {
                stdoutln!("{}", key.public());
                stderrln!("created signing key `{}` ({})", key.name(), path.display());
                match key.namespace() {
                    Some(ns) => stderrln!(
                        "publish with it: keel publish --key {} (namespace `{ns}`)\nothers install what you publish after: keel key trust {} --namespace {ns} --registry REGISTRY",
                        key.name(),
                        key.public()
                    ),
                    None => stderrln!(
                        "publish with it: keel publish --key {} --namespace NS",
                        key.name()
                    ),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        KeyCommand::List { json } => {
            let keys = KeyPair::list(&home.keys_dir())?;
            let trust = home.trust()?;
            if json {
                let keys: Vec<_> = keys
                    .iter()
                    .map(|(name, ns, public)| {
                        serde_json::json!({ "name": name, "namespace": ns, "public": public.to_string() })
                    })
                    .collect();
                stdoutln!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "keys": keys, "trust": trust })
                    )?
                );
            } else {
                stdoutln!("signing keys ({}):", home.keys_dir().display());
                for (name, ns, public) in &keys {
                    stdoutln!(
                        "  {name}  {public}{}",
                        ns.as_deref()
                            .map(|n| format!("  (namespace {n})"))
                            .unwrap_or_default()
                    );
                }
                stdoutln!("trusted ({}):", home.trust_path().display());
                for (ns, entry) in &trust.namespaces {
                    stdoutln!("  namespace {ns} from {}", entry.registry);
                    for k in &entry.keys {
                        stdoutln!("    {k}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        KeyCommand::Trust {
            pubkey,
            namespace,
            registry,
        } => {
            let key: PublicKey = pubkey.parse()?;
            let registry = open_registry(ctx, &registry, false)?;
            // Read, change and write trust.toml under its lock: `keel key trust` run several
            // times at once keeps every key.
            let _lock = lock_trust(&home)?;
            let mut trust = TrustConfig::load(&home.trust_path())?;
            let changed = trust.trust(&namespace, key, registry.location())?;
            trust
                .save(&home.trust_path())
                .context("cannot save the trust configuration")?;
            stdoutln!(
                "{} key {} for namespace `{namespace}` from {}",
                if changed {
                    "trusted"
                } else {
                    "already trusted"
                },
                key.short(),
                registry.location()
            );
            Ok(ExitCode::SUCCESS)
        }
        KeyCommand::Untrust { pubkey, namespace } => {
            let key: PublicKey = pubkey.parse()?;
            let _lock = lock_trust(&home)?;
            let mut trust = TrustConfig::load(&home.trust_path())?;
            if trust.untrust(&namespace, &key) {
                trust.save(&home.trust_path())?;
                stdoutln!("no longer trusting key {} for `{namespace}`", key.short());
                Ok(ExitCode::SUCCESS)
            } else {
                stderrln!(
                    "key {} was not trusted for `{namespace}`; `keel key list` shows what is",
                    key.short()
                );
                Ok(ExitCode::from(1))
            }
        }
    }
}

/// The lock every change of `trust.toml` holds.
fn lock_trust(home: &Home) -> anyhow::Result<keel_registry::UpdateLock> {
    let path = home.trust_path();
    keel_registry::lock_for_update(&path)
        .with_context(|| format!("cannot lock {} for the change", path.display()))
}
