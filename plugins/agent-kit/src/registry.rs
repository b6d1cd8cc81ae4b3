//! The tool registry's logic: validate registered tools, present them to the model sorted by
//! name, and resolve the names the model writes.
//!
//! An invalid definition never takes the others down: it is replaced by a fail-closed
//! placeholder (same name, a description saying it is disabled and why, a schema that accepts
//! nothing) that resolves to [`Resolution::Disabled`]. A tool whose *name* is invalid is left
//! out of the list (a provider would reject the whole request over it) but still resolves to
//! `Disabled`, so a call to it gets a clear answer.

use std::collections::BTreeMap;

use keel_protocol::{Resolution, ToolDef};
use serde_json::json;

use crate::text::levenshtein;
use crate::tools::ToolSpec;

/// The longest tool name.
pub const MAX_NAME_LEN: usize = 64;
/// The largest edit distance for a "did you mean" suggestion.
pub const MAX_SUGGESTION_DISTANCE: usize = 3;
/// The most suggestions given.
pub const MAX_SUGGESTIONS: usize = 3;

#[derive(Debug, Clone)]
struct Entry {
    spec: ToolSpec,
    def: ToolDef,
    disabled: Option<String>,
    listed: bool,
}

/// The registered tools, validated.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
    problems: Vec<String>,
}

impl Registry {
    /// Validates `specs`; invalid ones become placeholders, later duplicates of a name are
    /// dropped. Both are recorded in [`Registry::problems`].
    pub fn new(specs: impl IntoIterator<Item = ToolSpec>) -> Registry {
        let mut registry = Registry::default();
        for spec in specs {
            registry.register(spec);
        }
        registry
    }

    /// Adds one spec (see [`Registry::new`]); returns the reason when it was disabled.
    pub fn register(&mut self, spec: ToolSpec) -> Option<String> {
        if self.entries.contains_key(&spec.name) {
            let reason = format!(
                "tool `{}` is registered twice; the later definition was ignored",
                spec.name
            );
            self.problems.push(reason.clone());
            return Some(reason);
        }
        let name_problem = check_name(&spec.name).err();
        let problem = name_problem
            .clone()
            .or_else(|| check_description(&spec.description).err())
            .or_else(|| check_schema(&spec.input_schema).err());
        let entry = match &problem {
            None => Entry {
                def: spec.def(),
                spec,
                disabled: None,
                listed: true,
            },
            Some(reason) => {
                self.problems
                    .push(format!("tool `{}` is disabled: {reason}", spec.name));
                Entry {
                    def: placeholder(&spec.name, reason),
                    spec: ToolSpec {
                        input_schema: placeholder_schema().to_string(),
                        parallel_safe: false,
                        ..spec
                    },
                    disabled: Some(reason.clone()),
                    listed: name_problem.is_none(),
                }
            }
        };
        self.entries.insert(entry.spec.name.clone(), entry);
        problem
    }

    /// The tools presented to the model, sorted by name (placeholders included, invalid
    /// names left out).
    pub fn list(&self) -> Vec<ToolDef> {
        self.entries
            .values()
            .filter(|e| e.listed)
            .map(|e| e.def.clone())
            .collect()
    }

    /// What went wrong while registering, one sentence each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// The spec registered under exactly `name` (a placeholder's spec for a disabled tool).
    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.entries.get(name).map(|e| &e.spec)
    }

    /// Whether calls to the tool registered as `name` may run in a concurrent batch; `false`
    /// for unknown and disabled tools.
    pub fn parallel_safe(&self, name: &str) -> bool {
        self.entries
            .get(name)
            .is_some_and(|e| e.disabled.is_none() && e.spec.parallel_safe)
    }

    /// Resolves a tool name as the model wrote it: exact → case-insensitive →
    /// hyphen/underscore → CamelCase/camelCase to snake_case → `_tool` suffix removed or
    /// added; otherwise `Unknown` with up to 3 suggestions within edit distance 3.
    pub fn resolve(&self, written: &str) -> Resolution {
        let found = self.find(written);
        match found {
            Some(entry) => match &entry.disabled {
                Some(reason) => Resolution::Disabled {
                    name: entry.spec.name.clone(),
                    reason: reason.clone(),
                },
                None => Resolution::Found {
                    name: entry.spec.name.clone(),
                },
            },
            None => Resolution::Unknown {
                did_you_mean: self.suggestions(written),
            },
        }
    }

    fn find(&self, written: &str) -> Option<&Entry> {
        if let Some(e) = self.entries.get(written) {
            return Some(e);
        }
        let lower = written.to_lowercase();
        let dashed = lower.replace(['-', ' ', '.'], "_");
        let snake = to_snake(written);
        let steps: [&dyn Fn(&str) -> bool; 4] = [
            &|name| name.to_lowercase() == lower,
            &|name| name == dashed,
            &|name| name == snake,
            &|name| {
                snake.strip_suffix("_tool") == Some(name)
                    || name.strip_suffix("_tool") == Some(snake.as_str())
            },
        ];
        steps
            .iter()
            .find_map(|step| self.entries.values().find(|e| step(&e.spec.name)))
    }

    fn suggestions(&self, written: &str) -> Vec<String> {
        let snake = to_snake(written);
        let lower = written.to_lowercase();
        let mut scored: Vec<(usize, &str)> = self
            .entries
            .values()
            .filter(|e| e.listed)
            .filter_map(|e| {
                let name = e.spec.name.as_str();
                let d = levenshtein(&snake, name).min(levenshtein(&lower, name));
                (d <= MAX_SUGGESTION_DISTANCE).then_some((d, name))
            })
            .collect();
        scored.sort();
        scored
            .into_iter()
            .take(MAX_SUGGESTIONS)
            .map(|(_, n)| n.to_string())
            .collect()
    }

    /// The tool result the model reads when a call named a tool that did not resolve.
    pub fn refusal_message(&self, written: &str, resolution: &Resolution) -> Option<String> {
        match resolution {
            Resolution::Found { .. } => None,
            Resolution::Disabled { name, reason } => Some(format!(
                "tool `{name}` is disabled because its definition is invalid ({reason}); it cannot be called in this session. Use another tool or tell the person the tool needs fixing."
            )),
            Resolution::Unknown { did_you_mean } => {
                let available: Vec<&str> = self
                    .entries
                    .values()
                    .filter(|e| e.listed && e.disabled.is_none())
                    .map(|e| e.spec.name.as_str())
                    .collect();
                let hint = if did_you_mean.is_empty() {
                    String::new()
                } else {
                    format!(" Did you mean: {}?", did_you_mean.join(", "))
                };
                Some(format!(
                    "there is no tool named `{written}`.{hint} Call one of the available tools by its exact name: {}.",
                    available.join(", ")
                ))
            }
        }
    }
}

/// Checks the `[a-z][a-z0-9_]*`, at most 64 chars rule.
pub fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let ok_start = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let ok_rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok_start || !ok_rest {
        return Err(format!(
            "the name {name:?} does not match [a-z][a-z0-9_]* (lowercase letters, digits and underscores, starting with a letter)"
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "the name is {} chars long; at most {MAX_NAME_LEN} are allowed",
            name.len()
        ));
    }
    Ok(())
}

fn check_description(description: &str) -> Result<(), String> {
    if description.trim().is_empty() {
        return Err(
            "the description is empty; the model needs one to know when to use the tool".into(),
        );
    }
    Ok(())
}

/// Checks that `schema` is JSON text of an object schema (`"type": "object"`).
pub fn check_schema(schema: &str) -> Result<(), String> {
    let value: serde_json::Value = serde_json::from_str(schema)
        .map_err(|e| format!("the input schema is not valid JSON ({e})"))?;
    let Some(object) = value.as_object() else {
        return Err("the input schema is not a JSON object".into());
    };
    if object.get("type").and_then(|t| t.as_str()) != Some("object") {
        return Err("the input schema must have \"type\": \"object\" at the top level".into());
    }
    if object.get("properties").is_some_and(|p| !p.is_object()) {
        return Err("the input schema's \"properties\" is not an object".into());
    }
    if let Some(required) = object.get("required") {
        let ok = required
            .as_array()
            .is_some_and(|r| r.iter().all(|v| v.is_string()));
        if !ok {
            return Err("the input schema's \"required\" is not an array of strings".into());
        }
    }
    Ok(())
}

/// A schema no input satisfies.
fn placeholder_schema() -> serde_json::Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false, "not": {}})
}

fn placeholder(name: &str, reason: &str) -> ToolDef {
    ToolDef {
        name: name.to_string(),
        description: format!(
            "DISABLED: this tool's definition is invalid ({reason}). Do not call it."
        ),
        input_schema: placeholder_schema(),
    }
}

/// `CamelCase`, `camelCase`, `kebab-case` and `Mixed_Case` to `snake_case`.
pub fn to_snake(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if matches!(c, '-' | ' ' | '.' | '_') {
            if !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            continue;
        }
        if c.is_uppercase() {
            let prev = i.checked_sub(1).map(|p| chars[p]);
            let next = chars.get(i + 1);
            let boundary = prev.is_some_and(|p| p.is_lowercase() || p.is_ascii_digit())
                || (prev.is_some_and(char::is_uppercase) && next.is_some_and(|n| n.is_lowercase()));
            if boundary && !out.ends_with('_') {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
