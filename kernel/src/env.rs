//! The shared environment every plugin changes, and the effects that change it.
//!
//! Nothing else in the kernel mutates [`Env`]: a plugin's request becomes an [`Effect`], which
//! [`Env::apply`] validates and applies, returning the [`Inverse`] that the plugin's undo log
//! records. Replaying those inverses in reverse returns the environment to its earlier
//! fingerprint, which is how an unloaded plugin leaves nothing behind.

use std::collections::{BTreeMap, BTreeSet};

use semver::Version;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::gates::prompt_text;
use crate::manifest::{Manifest, is_valid_service_name, topic_matches};
use crate::quotas;
use crate::types::{KernelError, ToolSpec, reads_like_kernel};

/// A change a plugin asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    ProvideService {
        name: String,
        version: Version,
    },
    RegisterTool(ToolSpec),
    Subscribe {
        topic: String,
    },
    AddPromptFragment {
        id: String,
        text: String,
    },
    RegisterGuard {
        name: String,
    },
    /// Withdraw a tool the plugin registered (ABI 0.3.0 `tool-list`).
    WithdrawTool {
        name: String,
    },
    /// Record a process the plugin started (its inverse has the process killed).
    StartProcess {
        id: u32,
        entry: String,
    },
    /// Remove the record of a process, which has it killed.
    StopProcess {
        id: u32,
    },
}

/// What undoes one applied [`Effect`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Inverse {
    WithdrawService { name: String },
    UnregisterTool { name: String },
    Unsubscribe { topic: String },
    RemovePromptFragment { id: String },
    UnregisterGuard { name: String },
    StopProcess { id: u32 },
}

/// A process a plugin started, as the environment records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessRecord {
    /// The plugin that started it.
    pub owner: String,
    /// The entry of the person's config it runs.
    pub entry: String,
}

/// A service in the environment and who provides it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceEntry {
    /// The providing plugin.
    pub provider: String,
    /// The version it provides.
    pub version: Version,
}

/// A tool in the environment and who owns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolEntry {
    /// The plugin that registered it and runs it.
    pub owner: String,
    /// Its specification.
    pub spec: ToolSpec,
}

/// The shared environment: services, tools, event subscriptions and prompt fragments. Every
/// collection is ordered, so its serialization (and so its fingerprint) is canonical.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Env {
    services: BTreeMap<String, ServiceEntry>,
    tools: BTreeMap<String, ToolEntry>,
    /// (topic pattern, subscriber)
    subscriptions: BTreeSet<(String, String)>,
    /// (plugin, fragment id) → text
    prompt: BTreeMap<(String, String), String>,
    /// guard name → the plugin that answers for it
    guards: BTreeMap<String, String>,
    /// process handle → the process
    processes: BTreeMap<u32, ProcessRecord>,
    /// How many changes were applied or reverted (not part of the environment's value).
    #[serde(skip)]
    changes: Changes,
}

/// A count of the changes made to an [`Env`]: what a plugin caches from the environment
/// (the tool list, the prompt fragments) stays valid while it is unchanged. Equal for every
/// two environments, so it never makes equal environments differ.
#[derive(Debug, Clone, Copy, Default)]
struct Changes(u64);

impl PartialEq for Changes {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Changes {}

/// Largest prompt fragment a plugin may add.
const MAX_FRAGMENT_BYTES: usize = 64 * 1024;
/// Largest tool input schema.
const MAX_SCHEMA_BYTES: usize = 256 * 1024;

impl Env {
    /// Services, by name.
    pub fn services(&self) -> &BTreeMap<String, ServiceEntry> {
        &self.services
    }

    /// Tools, by name (so already sorted for a stable prompt prefix).
    pub fn tools(&self) -> &BTreeMap<String, ToolEntry> {
        &self.tools
    }

    /// Prompt fragments as (plugin, id, text), sorted by plugin then id.
    pub fn prompt_fragments(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.prompt
            .iter()
            .map(|((p, id), text)| (p.as_str(), id.as_str(), text.as_str()))
    }

    /// Guards as (name, plugin), sorted by name.
    pub fn guards(&self) -> impl Iterator<Item = (&str, &str)> {
        self.guards.iter().map(|(n, p)| (n.as_str(), p.as_str()))
    }

    /// Subscribers whose pattern matches `topic`, each once, sorted.
    pub fn subscribers(&self, topic: &str) -> BTreeSet<&str> {
        self.subscriptions
            .iter()
            .filter(|(pattern, _)| topic_matches(pattern, topic))
            .map(|(_, plugin)| plugin.as_str())
            .collect()
    }

    /// Whether nothing at all is registered.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.tools.is_empty()
            && self.subscriptions.is_empty()
            && self.prompt.is_empty()
            && self.guards.is_empty()
            && self.processes.is_empty()
    }

    /// A number that changes whenever anything in the environment may have (a plugin
    /// loaded, unloaded, reloaded or replaced, a tool registered or withdrawn, …).
    pub fn generation(&self) -> u64 {
        self.changes.0
    }

    /// Processes plugins started, by handle.
    pub fn processes(&self) -> &BTreeMap<u32, ProcessRecord> {
        &self.processes
    }

    /// SHA-256 over the canonical serialization: equal environments, equal fingerprints.
    pub fn fingerprint(&self) -> String {
        // Serializing maps with tuple keys is not JSON-representable, so hash a canonical
        // line-per-entry rendering instead; the orderings above make it canonical.
        let mut h = Sha256::new();
        for (name, s) in &self.services {
            h.update(format!("service\0{name}\0{}\0{}\n", s.provider, s.version));
        }
        for (name, t) in &self.tools {
            let spec = serde_json::to_string(&t.spec).unwrap_or_default();
            h.update(format!("tool\0{name}\0{}\0{spec}\n", t.owner));
        }
        for (topic, plugin) in &self.subscriptions {
            h.update(format!("subscription\0{topic}\0{plugin}\n"));
        }
        for ((plugin, id), text) in &self.prompt {
            h.update(format!("prompt\0{plugin}\0{id}\0{}\n", text.len()));
            h.update(text.as_bytes());
        }
        for (name, plugin) in &self.guards {
            h.update(format!("guard\0{name}\0{plugin}\n"));
        }
        for (id, p) in &self.processes {
            h.update(format!("process\0{id}\0{}\0{}\n", p.owner, p.entry));
        }
        hex::encode(h.finalize())
    }

    /// Validate and apply `effect` for `plugin`; the returned inverse undoes it. `None` means
    /// the effect changed nothing (a repeated subscription), so there is nothing to undo.
    pub(crate) fn apply(
        &mut self,
        plugin: &str,
        manifest: &Manifest,
        effect: Effect,
    ) -> Result<Option<Inverse>, KernelError> {
        self.changes.0 = self.changes.0.wrapping_add(1);
        match effect {
            Effect::ProvideService { name, version } => {
                if reads_like_kernel(&name) {
                    return Err(KernelError::Denied(format!(
                        "service `{name}` is in the reserved `keel` namespace (`keel.…`, `keel-…`), which belongs to the kernel; \
                         choose a name in your own namespace"
                    )));
                }
                match manifest.provides.get(&name) {
                    Some(declared) if *declared == version => {}
                    Some(declared) => {
                        return Err(KernelError::Denied(format!(
                            "plugin `{plugin}` declares `{name}` {declared} in its manifest but tried to provide {version}; \
                             make the manifest and the code agree"
                        )));
                    }
                    None => {
                        return Err(KernelError::Denied(format!(
                            "plugin `{plugin}` tried to provide `{name}`, which its manifest does not declare; \
                             add `\"{name}\" = \"{version}\"` under [provides] in its keel.toml"
                        )));
                    }
                }
                if let Some(existing) = self.services.get(&name) {
                    return Err(KernelError::Conflict(format!(
                        "service `{name}` is already provided by plugin `{}` {}; plugin `{plugin}` cannot provide it too \
                         (unload `{}` first, or declare `replaces = \"{}\"` in `{plugin}`'s keel.toml)",
                        existing.provider, existing.version, existing.provider, existing.provider
                    )));
                }
                self.services.insert(
                    name.clone(),
                    ServiceEntry {
                        provider: plugin.to_owned(),
                        version,
                    },
                );
                Ok(Some(Inverse::WithdrawService { name }))
            }
            Effect::RegisterTool(spec) => {
                validate_tool(&spec)?;
                let spec = clean_tool_text(spec);
                self.check_tool_quota(plugin, &spec)?;
                if let Some(existing) = self.tools.get(&spec.name) {
                    return Err(KernelError::Conflict(format!(
                        "tool `{}` is already registered by plugin `{}`; plugin `{plugin}` cannot register it too \
                         (rename the tool, or unload `{}` first)",
                        spec.name, existing.owner, existing.owner
                    )));
                }
                let name = spec.name.clone();
                self.tools.insert(
                    name.clone(),
                    ToolEntry {
                        owner: plugin.to_owned(),
                        spec,
                    },
                );
                Ok(Some(Inverse::UnregisterTool { name }))
            }
            Effect::Subscribe { topic } => {
                validate_topic(&topic, true)?;
                let count = self
                    .subscriptions
                    .iter()
                    .filter(|(_, p)| p == plugin)
                    .count();
                if count >= quotas::MAX_SUBSCRIPTIONS_PER_PLUGIN
                    && !self
                        .subscriptions
                        .contains(&(topic.clone(), plugin.to_owned()))
                {
                    return Err(KernelError::Invalid(format!(
                        "plugin `{plugin}` has {count} subscriptions, the most one plugin may \
                         hold; subscribe to a pattern such as `{}` instead",
                        topic
                            .rsplit_once('.')
                            .map_or_else(|| "*".to_owned(), |(head, _)| format!("{head}.*"))
                    )));
                }
                if self
                    .subscriptions
                    .insert((topic.clone(), plugin.to_owned()))
                {
                    Ok(Some(Inverse::Unsubscribe { topic }))
                } else {
                    Ok(None)
                }
            }
            Effect::AddPromptFragment { id, text } => {
                // A fragment goes into every request: it is cleaned like tool output first
                // (kernel-made fences kept), whoever added it.
                let text = prompt_text::sanitize_prompt_text(&text).text;
                if id.is_empty() || id.len() > 64 || id.chars().any(char::is_control) {
                    return Err(KernelError::Invalid(format!(
                        "prompt fragment id `{}` must be 1-64 printable characters",
                        id.escape_debug()
                    )));
                }
                if text.len() > MAX_FRAGMENT_BYTES {
                    return Err(KernelError::Invalid(format!(
                        "prompt fragment `{id}` is {} bytes; the limit is {MAX_FRAGMENT_BYTES}; shorten it",
                        text.len()
                    )));
                }
                let (count, bytes) = self
                    .prompt
                    .iter()
                    .filter(|((owner, _), _)| owner == plugin)
                    .fold((0usize, 0usize), |(n, b), (_, t)| (n + 1, b + t.len()));
                let all: usize = self.prompt.values().map(String::len).sum();
                if all + text.len() > quotas::MAX_FRAGMENT_BYTES_TOTAL {
                    return Err(KernelError::Invalid(format!(
                        "the loaded plugins' prompt fragments already hold {all} bytes; at most \
                         {} bytes of them together go into every model request; ask the person \
                         running keel to unload a plugin that adds fragments",
                        quotas::MAX_FRAGMENT_BYTES_TOTAL
                    )));
                }
                if count >= quotas::MAX_FRAGMENTS_PER_PLUGIN
                    || bytes + text.len() > quotas::MAX_FRAGMENT_BYTES_PER_PLUGIN
                {
                    return Err(KernelError::Invalid(format!(
                        "plugin `{plugin}` has {count} prompt fragments of {bytes} bytes; at most \
                         {} fragments and {} bytes together go into every model request; remove \
                         one first",
                        quotas::MAX_FRAGMENTS_PER_PLUGIN,
                        quotas::MAX_FRAGMENT_BYTES_PER_PLUGIN
                    )));
                }
                let key = (plugin.to_owned(), id.clone());
                if self.prompt.contains_key(&key) {
                    return Err(KernelError::Conflict(format!(
                        "plugin `{plugin}` already added prompt fragment `{id}`; use another id"
                    )));
                }
                self.prompt.insert(key, text);
                Ok(Some(Inverse::RemovePromptFragment { id }))
            }
            Effect::WithdrawTool { name } => match self.tools.get(&name) {
                Some(t) if t.owner == plugin => {
                    self.tools.remove(&name);
                    Ok(None)
                }
                Some(t) => Err(KernelError::Denied(format!(
                    "tool `{name}` belongs to plugin `{}`; plugin `{plugin}` can withdraw only \
                     its own tools",
                    t.owner
                ))),
                None => Err(KernelError::Invalid(format!(
                    "there is no tool `{name}` to withdraw"
                ))),
            },
            Effect::StartProcess { id, entry } => {
                self.processes.insert(
                    id,
                    ProcessRecord {
                        owner: plugin.to_owned(),
                        entry,
                    },
                );
                Ok(Some(Inverse::StopProcess { id }))
            }
            Effect::StopProcess { id } => match self.processes.get(&id) {
                Some(p) if p.owner == plugin => {
                    self.processes.remove(&id);
                    Ok(None)
                }
                _ => Err(KernelError::Invalid(format!(
                    "plugin `{plugin}` has no process {id}"
                ))),
            },
            Effect::RegisterGuard { name } => {
                if !is_valid_service_name(&name) || reads_like_kernel(&name) {
                    return Err(KernelError::Invalid(format!(
                        "guard name `{}` must be a lowercase dotted name outside the reserved \
                         `keel` namespace (`keel.…`, `keel-…`), e.g. `{plugin}.no-force-push`",
                        name.escape_debug()
                    )));
                }
                if let Some(owner) = self.guards.get(&name) {
                    return Err(KernelError::Conflict(format!(
                        "guard `{name}` is already registered by plugin `{owner}`; use another name"
                    )));
                }
                let count = self.guards.values().filter(|p| *p == plugin).count();
                if count >= quotas::MAX_GUARDS_PER_PLUGIN {
                    return Err(KernelError::Invalid(format!(
                        "plugin `{plugin}` has {count} guards, the most one plugin may register; \
                         one guard can answer for every tool"
                    )));
                }
                self.guards.insert(name.clone(), plugin.to_owned());
                Ok(Some(Inverse::UnregisterGuard { name }))
            }
        }
    }

    /// Undo one effect of `plugin`. Fails (changing nothing) when the entry is gone or now
    /// belongs to someone else, which only a kernel bug or a test's tampering can cause.
    pub(crate) fn revert(&mut self, plugin: &str, inverse: &Inverse) -> Result<(), String> {
        self.changes.0 = self.changes.0.wrapping_add(1);
        match inverse {
            Inverse::WithdrawService { name } => match self.services.get(name) {
                Some(e) if e.provider == plugin => {
                    self.services.remove(name);
                    Ok(())
                }
                Some(e) => Err(format!(
                    "service `{name}` now belongs to `{}`, not `{plugin}`",
                    e.provider
                )),
                None => Err(format!("service `{name}` was already gone")),
            },
            Inverse::UnregisterTool { name } => match self.tools.get(name) {
                Some(e) if e.owner == plugin => {
                    self.tools.remove(name);
                    Ok(())
                }
                Some(e) => Err(format!(
                    "tool `{name}` now belongs to `{}`, not `{plugin}`",
                    e.owner
                )),
                None => Err(format!("tool `{name}` was already gone")),
            },
            Inverse::Unsubscribe { topic } => {
                if self
                    .subscriptions
                    .remove(&(topic.clone(), plugin.to_owned()))
                {
                    Ok(())
                } else {
                    Err(format!("subscription to `{topic}` was already gone"))
                }
            }
            Inverse::RemovePromptFragment { id } => {
                if self
                    .prompt
                    .remove(&(plugin.to_owned(), id.clone()))
                    .is_some()
                {
                    Ok(())
                } else {
                    Err(format!("prompt fragment `{id}` was already gone"))
                }
            }
            Inverse::UnregisterGuard { name } => match self.guards.get(name) {
                Some(owner) if owner == plugin => {
                    self.guards.remove(name);
                    Ok(())
                }
                Some(owner) => Err(format!("guard `{name}` now belongs to `{owner}`")),
                None => Err(format!("guard `{name}` was already gone")),
            },
            Inverse::StopProcess { id } => match self.processes.get(id) {
                Some(p) if p.owner == plugin => {
                    self.processes.remove(id);
                    Ok(())
                }
                Some(p) => Err(format!("process {id} now belongs to `{}`", p.owner)),
                None => Err(format!("process {id} was already gone")),
            },
        }
    }

    /// Test-only tampering, to prove that a failing inverse does not stop the others.
    #[cfg(test)]
    pub(crate) fn remove_service_for_test(&mut self, name: &str) {
        self.services.remove(name);
    }
}

/// Topics are dot-separated lowercase words; subscriptions may end in `.*` or be `*`.
pub(crate) fn validate_topic(topic: &str, pattern_allowed: bool) -> Result<(), KernelError> {
    let body = if pattern_allowed && topic == "*" {
        return Ok(());
    } else if pattern_allowed {
        topic.strip_suffix(".*").unwrap_or(topic)
    } else {
        topic
    };
    if is_valid_service_name(body) {
        Ok(())
    } else {
        Err(KernelError::Invalid(format!(
            "topic `{}` must be dot-separated lowercase words like `session.turn-ended`{}",
            topic.escape_debug(),
            if pattern_allowed {
                ", optionally ending in `.*`, or `*`"
            } else {
                ""
            }
        )))
    }
}

impl Env {
    /// One plugin's tools stay within [`quotas`]: in number, in description length, and in
    /// bytes together, since every tool goes into every model request.
    fn check_tool_quota(&self, plugin: &str, spec: &ToolSpec) -> Result<(), KernelError> {
        if spec.description.len() > quotas::MAX_TOOL_DESCRIPTION {
            return Err(KernelError::Invalid(format!(
                "tool `{}`: the description is {} bytes; the limit is {}; shorten it",
                spec.name,
                spec.description.len(),
                quotas::MAX_TOOL_DESCRIPTION
            )));
        }
        let size = |t: &ToolSpec| t.name.len() + t.description.len() + t.input_schema.len();
        let (count, bytes) = self
            .tools
            .values()
            .filter(|t| t.owner == plugin)
            .fold((0usize, 0usize), |(n, b), t| (n + 1, b + size(&t.spec)));
        let all: usize = self.tools.values().map(|t| size(&t.spec)).sum();
        if all + size(spec) > quotas::MAX_TOOL_BYTES_TOTAL {
            return Err(KernelError::Invalid(format!(
                "the loaded plugins' tools already hold {all} bytes; at most {} bytes of tools \
                 together go into every model request; ask the person running keel to unload a \
                 plugin with many tools",
                quotas::MAX_TOOL_BYTES_TOTAL
            )));
        }
        if count >= quotas::MAX_TOOLS_PER_PLUGIN
            || bytes + size(spec) > quotas::MAX_TOOL_BYTES_PER_PLUGIN
        {
            return Err(KernelError::Invalid(format!(
                "plugin `{plugin}` has {count} tools of {bytes} bytes; at most {} tools and {} \
                 bytes together go into every model request; register fewer or shorter tools",
                quotas::MAX_TOOLS_PER_PLUGIN,
                quotas::MAX_TOOL_BYTES_PER_PLUGIN
            )));
        }
        Ok(())
    }
}

/// `spec` with the text it puts into every model request — its description and the strings
/// of its input schema — cleaned like tool output (`keel_gates::prompt_text`), so no plugin or
/// MCP server can put a role turn, a tool call or a fence into the prompt. The name's grammar
/// ([`validate_tool`]) already leaves no room for one.
fn clean_tool_text(mut spec: ToolSpec) -> ToolSpec {
    spec.description = prompt_text::sanitize_prompt_text(&spec.description).text;
    if let Some(schema) = prompt_text::sanitize_schema(&spec.input_schema) {
        spec.input_schema = schema;
    }
    spec
}

fn validate_tool(spec: &ToolSpec) -> Result<(), KernelError> {
    let name = &spec.name;
    let mut chars = name.chars();
    let ok = name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok {
        return Err(KernelError::Invalid(format!(
            "tool name `{}` must match [a-z][a-z0-9_]* and be at most 64 bytes",
            name.escape_debug()
        )));
    }
    if reads_like_kernel(name) {
        return Err(KernelError::Invalid(format!(
            "tool name `{name}` reads like the kernel's own (`keel`, `keel_…`), so its refusals \
             could pass for the kernel's; choose another name"
        )));
    }
    if spec.input_schema.len() > MAX_SCHEMA_BYTES {
        return Err(KernelError::Invalid(format!(
            "tool `{name}`: input schema is {} bytes; the limit is {MAX_SCHEMA_BYTES}",
            spec.input_schema.len()
        )));
    }
    match serde_json::from_str::<serde_json::Value>(&spec.input_schema) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(KernelError::Invalid(format!(
            "tool `{name}`: input schema must be a JSON object, e.g. {{\"type\":\"object\"}}"
        ))),
        Err(e) => Err(KernelError::Invalid(format!(
            "tool `{name}`: input schema is not valid JSON ({e})"
        ))),
    }
}

#[cfg(test)]
#[path = "env_tests.rs"]
mod tests;
