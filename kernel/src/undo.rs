//! Per-plugin undo logs: the inverse of every effect a plugin applied, replayed in reverse on
//! unload so the environment returns to what it was before the plugin loaded.

use crate::env::{Env, Inverse};

/// The inverses of one plugin instance's effects, oldest first.
#[derive(Debug, Default)]
pub(crate) struct UndoLog {
    entries: Vec<Inverse>,
}

impl UndoLog {
    /// Record the inverse of an effect that was just applied.
    pub(crate) fn push(&mut self, inverse: Inverse) {
        self.entries.push(inverse);
    }

    /// Drop the newest record of `inverse`: the plugin itself undid what it stands for (a
    /// withdrawn tool, a killed process), so unloading has nothing left to undo there.
    pub(crate) fn forget(&mut self, inverse: &Inverse) {
        if let Some(at) = self.entries.iter().rposition(|e| e == inverse) {
            self.entries.remove(at);
        }
    }

    /// How many effects are recorded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Undo every recorded effect, newest first, leaving the log empty. A failing inverse is
    /// logged and reported but never stops the others; replaying an empty log does nothing,
    /// which is what makes disposal idempotent.
    pub(crate) fn replay(&mut self, plugin: &str, env: &mut Env) -> Vec<String> {
        let mut failures = Vec::new();
        while let Some(inverse) = self.entries.pop() {
            if let Err(why) = env.revert(plugin, &inverse) {
                tracing::warn!(plugin, ?inverse, "undo step failed: {why}");
                failures.push(why);
            }
        }
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Effect;
    use crate::manifest::Manifest;
    use crate::types::{KernelError, ToolCapabilities, ToolSpec};
    use std::path::Path;

    fn manifest() -> Manifest {
        let text =
            "name = \"p\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n[provides]\n\"s.a\" = \"1.0.0\"\n";
        match Manifest::parse(text, Path::new("t.toml")) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: "{}".into(),
            capabilities: ToolCapabilities::default(),
            parallel_safe: true,
        }
    }

    fn apply_all(env: &mut Env, log: &mut UndoLog) -> Result<(), KernelError> {
        let m = manifest();
        let effects = [
            Effect::ProvideService {
                name: "s.a".into(),
                version: semver::Version::new(1, 0, 0),
            },
            Effect::RegisterTool(tool("t")),
            Effect::Subscribe {
                topic: "x.*".into(),
            },
            Effect::AddPromptFragment {
                id: "f".into(),
                text: "hello".into(),
            },
        ];
        for e in effects {
            if let Some(inv) = env.apply("p", &m, e)? {
                log.push(inv);
            }
        }
        Ok(())
    }

    #[test]
    fn replay_restores_the_fingerprint_and_is_idempotent() -> Result<(), KernelError> {
        let mut env = Env::default();
        let empty = env.fingerprint();
        let mut log = UndoLog::default();
        apply_all(&mut env, &mut log)?;
        assert_eq!(log.len(), 4);
        assert_ne!(env.fingerprint(), empty);
        assert!(log.replay("p", &mut env).is_empty());
        assert_eq!(env.fingerprint(), empty);
        assert!(log.replay("p", &mut env).is_empty());
        assert_eq!(env.fingerprint(), empty);
        Ok(())
    }

    #[test]
    fn one_failing_inverse_does_not_stop_the_others() -> Result<(), KernelError> {
        let mut env = Env::default();
        let mut log = UndoLog::default();
        apply_all(&mut env, &mut log)?;
        env.remove_service_for_test("s.a");
        let failures = log.replay("p", &mut env);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("s.a"));
        assert!(env.is_empty(), "the other three inverses still ran");
        Ok(())
    }

    #[test]
    fn conflicting_tool_names_both_owners() -> Result<(), KernelError> {
        let mut env = Env::default();
        let m = manifest();
        env.apply("first", &m, Effect::RegisterTool(tool("echo")))?;
        let e = env.apply("second", &m, Effect::RegisterTool(tool("echo")));
        match e {
            Err(KernelError::Conflict(msg)) => {
                assert!(msg.contains("`first`") && msg.contains("`second`"), "{msg}");
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn undeclared_and_reserved_services_are_refused() {
        let mut env = Env::default();
        let m = manifest();
        let undeclared = env.apply(
            "p",
            &m,
            Effect::ProvideService {
                name: "s.b".into(),
                version: semver::Version::new(1, 0, 0),
            },
        );
        assert!(matches!(undeclared, Err(KernelError::Denied(m)) if m.contains("[provides]")));
        let reserved = env.apply(
            "p",
            &m,
            Effect::ProvideService {
                name: "keel.gates".into(),
                version: semver::Version::new(1, 0, 0),
            },
        );
        assert!(matches!(reserved, Err(KernelError::Denied(m)) if m.contains("reserved")));
        assert!(env.is_empty());
    }
}
