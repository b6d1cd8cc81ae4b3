//! The call chain: which plugins a call has passed through, from the host or kernel inward.
//! The kernel refuses re-entrant calls against it and answers `keel.caller` from it.

use std::fmt;
use std::sync::Arc;

/// The plugins a call has passed through, outermost first. Used to refuse re-entrant calls
/// (a store is exclusive while a call runs, so A → B → A would otherwise deadlock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallChain(Vec<Arc<str>>);

impl CallChain {
    /// A chain that starts at `plugin`.
    pub fn starting_at(plugin: &str) -> Self {
        CallChain(vec![Arc::from(plugin)])
    }

    /// This chain extended by `plugin`.
    pub fn then(&self, plugin: &str) -> Self {
        let mut next = self.0.clone();
        next.push(Arc::from(plugin));
        CallChain(next)
    }

    /// Whether `plugin` is already inside this chain.
    pub fn contains(&self, plugin: &str) -> bool {
        self.0.iter().any(|p| &**p == plugin)
    }

    /// The plugins in the chain, outermost first.
    pub fn plugins(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|p| &**p)
    }
}

impl fmt::Display for CallChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.plugins().collect();
        f.write_str(&names.join(" → "))
    }
}
