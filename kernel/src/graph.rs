//! The plugin dependency graph: manifests become a petgraph DAG with an edge from each
//! provider to every plugin that requires one of its services. It refuses cycles (spelling the
//! whole cycle out) and duplicate providers, and gives the start and stop orders.

use std::collections::{BTreeMap, BTreeSet};

use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::manifest::Manifest;

/// Why a set of manifests does not form a valid graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// Requirements form a cycle.
    #[error(
        "dependency cycle: {}; break it by making one of these requirements optional or moving the shared service into its own plugin",
        .path.join(" → ")
    )]
    Cycle {
        /// The plugins in the cycle, the first repeated at the end.
        path: Vec<String>,
    },
    /// Two plugins provide the same service.
    #[error(
        "service `{service}` is provided by both `{first}` and `{second}`; unload `{first}` first, or add `replaces = \"{first}\"` to `{second}`'s keel.toml"
    )]
    DuplicateProvider {
        /// The service.
        service: String,
        /// The plugin that provides it already.
        first: String,
        /// The plugin that also claims it.
        second: String,
    },
    /// Two manifests have the same name.
    #[error(
        "two plugins are named `{0}`; plugin names must be unique (use reload to replace a plugin)"
    )]
    DuplicateName(String),
}

/// A validated dependency graph over a set of manifests.
#[derive(Debug, Clone)]
pub struct PluginGraph {
    graph: DiGraph<String, String>,
    nodes: BTreeMap<String, NodeIndex>,
}

impl PluginGraph {
    /// Build and validate the graph of `manifests`.
    pub fn build<'a>(
        manifests: impl IntoIterator<Item = &'a Manifest>,
    ) -> Result<Self, GraphError> {
        let manifests: Vec<&Manifest> = manifests.into_iter().collect();
        let mut graph = DiGraph::new();
        let mut nodes = BTreeMap::new();
        let mut sorted = manifests.clone();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        for m in &sorted {
            if nodes.contains_key(&m.name) {
                return Err(GraphError::DuplicateName(m.name.clone()));
            }
            nodes.insert(m.name.clone(), graph.add_node(m.name.clone()));
        }
        let mut providers: BTreeMap<&str, &str> = BTreeMap::new();
        for m in &sorted {
            for service in m.provides.keys() {
                if let Some(first) = providers.insert(service, &m.name) {
                    return Err(GraphError::DuplicateProvider {
                        service: service.clone(),
                        first: first.to_owned(),
                        second: m.name.clone(),
                    });
                }
            }
        }
        for m in &sorted {
            for service in m.requires.keys() {
                if let Some(provider) = providers.get(service.as_str())
                    && let (Some(&from), Some(&to)) = (nodes.get(*provider), nodes.get(&m.name))
                {
                    graph.add_edge(from, to, service.clone());
                }
            }
        }
        let built = PluginGraph { graph, nodes };
        if let Some(path) = built.find_cycle() {
            return Err(GraphError::Cycle { path });
        }
        Ok(built)
    }

    /// A cycle, as the requiring order `a → b → … → a` (a requires something of b), if any.
    fn find_cycle(&self) -> Option<Vec<String>> {
        // Edges point provider → dependent; walk them backwards so the path reads
        // "a requires b requires c requires a".
        for scc in petgraph::algo::tarjan_scc(&self.graph) {
            let is_cycle = scc.len() > 1
                || scc
                    .first()
                    .is_some_and(|&n| self.graph.find_edge(n, n).is_some());
            if !is_cycle {
                continue;
            }
            let members: BTreeSet<NodeIndex> = scc.iter().copied().collect();
            let start = *members
                .iter()
                .min_by_key(|n| &self.graph[**n])
                .unwrap_or(&scc[0]);
            let mut path = vec![start];
            let mut seen = BTreeSet::from([start]);
            let mut current = start;
            loop {
                let mut providers: Vec<NodeIndex> = self
                    .graph
                    .neighbors_directed(current, Direction::Incoming)
                    .filter(|n| members.contains(n))
                    .collect();
                providers.sort_by_key(|n| &self.graph[*n]);
                // Inside a strongly connected component every node has a provider in it.
                let next = providers
                    .iter()
                    .copied()
                    .find(|n| *n == start)
                    .or_else(|| providers.iter().copied().find(|n| !seen.contains(n)))
                    .or_else(|| providers.first().copied())?;
                path.push(next);
                if next == start || !seen.insert(next) {
                    // Trim to the repeated node so the path is a proper cycle.
                    let first = path.iter().position(|n| *n == next).unwrap_or(0);
                    return Some(
                        path[first..]
                            .iter()
                            .map(|n| self.graph[*n].clone())
                            .collect(),
                    );
                }
                current = next;
            }
        }
        None
    }

    /// Plugin names, providers before the plugins that require them; ties broken by name so
    /// the order is deterministic.
    pub fn start_order(&self) -> Vec<String> {
        let mut indegree: BTreeMap<NodeIndex, usize> = self
            .nodes
            .values()
            .map(|&n| {
                (
                    n,
                    self.graph
                        .neighbors_directed(n, Direction::Incoming)
                        .count(),
                )
            })
            .collect();
        let mut ready: BTreeSet<(&str, NodeIndex)> = indegree
            .iter()
            .filter(|(_, d)| **d == 0)
            .map(|(&n, _)| (self.graph[n].as_str(), n))
            .collect();
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some((name, n)) = ready.pop_first() {
            order.push(name.to_owned());
            for dependent in self.graph.neighbors_directed(n, Direction::Outgoing) {
                if let Some(d) = indegree.get_mut(&dependent) {
                    *d = d.saturating_sub(1);
                    if *d == 0 {
                        ready.insert((self.graph[dependent].as_str(), dependent));
                    }
                }
            }
        }
        order
    }

    /// The reverse of [`start_order`](Self::start_order): dependents stop before providers.
    pub fn stop_order(&self) -> Vec<String> {
        let mut order = self.start_order();
        order.reverse();
        order
    }

    /// Every plugin that depends on `name`, directly or transitively, in stop order.
    pub fn dependents_of(&self, name: &str) -> Vec<String> {
        let Some(&start) = self.nodes.get(name) else {
            return Vec::new();
        };
        let mut found = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(n) = stack.pop() {
            for d in self.graph.neighbors_directed(n, Direction::Outgoing) {
                if found.insert(self.graph[d].clone()) {
                    stack.push(d);
                }
            }
        }
        self.stop_order()
            .into_iter()
            .filter(|n| found.contains(n))
            .collect()
    }

    /// Graphviz `dot` text; `label` gives extra text per plugin (its state, say).
    pub fn to_dot(&self, label: impl Fn(&str) -> String) -> String {
        let mut out = String::from("digraph keel {\n  rankdir=LR;\n  node [shape=box];\n");
        for name in self.nodes.keys() {
            let extra = label(name);
            let text = if extra.is_empty() {
                name.clone()
            } else {
                format!("{name}\\n{extra}")
            };
            out.push_str(&format!(
                "  \"{name}\" [label=\"{}\"];\n",
                text.replace('"', "'")
            ));
        }
        for (dependent, provider, service) in self.edges() {
            out.push_str(&format!(
                "  \"{dependent}\" -> \"{provider}\" [label=\"{service}\"];\n"
            ));
        }
        out.push_str("}\n");
        out
    }

    /// Edges as (dependent, provider, service), sorted.
    pub fn edges(&self) -> Vec<(String, String, String)> {
        let mut edges: Vec<_> = self
            .graph
            .edge_indices()
            .filter_map(|e| {
                let (p, d) = self.graph.edge_endpoints(e)?;
                Some((
                    self.graph[d].clone(),
                    self.graph[p].clone(),
                    self.graph[e].clone(),
                ))
            })
            .collect();
        edges.sort();
        edges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    pub(crate) fn manifest(name: &str, provides: &[&str], requires: &[&str]) -> Manifest {
        let mut text =
            format!("name = \"{name}\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n[provides]\n");
        for p in provides {
            text.push_str(&format!("\"{p}\" = \"1.0.0\"\n"));
        }
        text.push_str("[requires]\n");
        for r in requires {
            text.push_str(&format!("\"{r}\" = \"^1\"\n"));
        }
        match Manifest::parse(&text, Path::new("test.toml")) {
            Ok(m) => m,
            Err(e) => panic!("test manifest: {e}"),
        }
    }

    #[test]
    fn cycle_is_spelled_out() {
        let a = manifest("a", &["s.a"], &["s.b"]);
        let b = manifest("b", &["s.b"], &["s.c"]);
        let c = manifest("c", &["s.c"], &["s.a"]);
        let d = manifest("d", &["s.d"], &[]);
        match PluginGraph::build([&a, &b, &c, &d]) {
            Err(GraphError::Cycle { path }) => assert_eq!(path, ["a", "b", "c", "a"]),
            other => panic!("expected a cycle, got {other:?}"),
        }
        let e = PluginGraph::build([&a, &b, &c])
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("a → b → c → a")));
    }

    #[test]
    fn self_cycle() {
        let a = manifest("a", &["s.a"], &["s.a"]);
        assert!(matches!(
            PluginGraph::build([&a]),
            Err(GraphError::Cycle { path }) if path == ["a", "a"]
        ));
    }

    #[test]
    fn duplicate_provider_names_both() {
        let a = manifest("a", &["s"], &[]);
        let b = manifest("b", &["s"], &[]);
        let e = PluginGraph::build([&a, &b])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("`a`") && e.contains("`b`") && e.contains("replaces"),
            "{e}"
        );
    }

    #[test]
    fn orders_respect_dependencies() -> Result<(), GraphError> {
        let base = manifest("base", &["s.base"], &[]);
        let mid = manifest("mid", &["s.mid"], &["s.base"]);
        let top = manifest("a-top", &[], &["s.mid", "s.base"]);
        let lone = manifest("lone", &[], &["s.missing"]);
        let g = PluginGraph::build([&top, &mid, &base, &lone])?;
        assert_eq!(g.start_order(), ["base", "lone", "mid", "a-top"]);
        let order = g.start_order();
        let pos = |n: &str| order.iter().position(|x| x == n).unwrap_or(usize::MAX);
        assert!(pos("base") < pos("mid") && pos("mid") < pos("a-top"));
        assert_eq!(g.stop_order(), ["a-top", "mid", "lone", "base"]);
        assert_eq!(g.dependents_of("base"), ["a-top", "mid"]);
        assert!(
            g.to_dot(|_| String::new())
                .contains("\"mid\" -> \"base\" [label=\"s.base\"]")
        );
        Ok(())
    }
}
