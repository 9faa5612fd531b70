//! The dependency graph between ensembles and the models their steps call:
//! the order a set of models loads in (callees before callers, cycles
//! refused) and which models depend on a model that changes or goes away.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::scheduler::ensemble::composing_models;
use tern_core::config::ModelConfig;

/// Which models each model calls (only ensembles call any).
#[derive(Debug, Default, Clone)]
pub(super) struct DependencyGraph {
    calls: BTreeMap<String, BTreeSet<String>>,
}

impl DependencyGraph {
    /// The graph of a set of model configs.
    pub fn of<'a>(configs: impl IntoIterator<Item = (&'a str, &'a ModelConfig)>) -> Self {
        let mut g = DependencyGraph::default();
        for (name, config) in configs {
            g.insert(name, composing_models(config));
        }
        g
    }

    /// Adds a model and the models it calls.
    pub fn insert(&mut self, name: &str, calls: impl IntoIterator<Item = String>) {
        self.calls
            .entry(name.to_string())
            .or_default()
            .extend(calls);
    }

    /// The models in the graph.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.calls.keys()
    }

    /// The models `name` calls (empty for a model that is not in the graph).
    pub fn calls(&self, name: &str) -> impl Iterator<Item = &str> {
        self.calls
            .get(name)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// The models in the graph that call `name` directly.
    pub fn callers(&self, name: &str) -> Vec<String> {
        self.calls
            .iter()
            .filter(|(_, calls)| calls.contains(name))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Every model that calls `name`, directly or through other ensembles,
    /// nearest first; `name` itself is not among them.
    pub fn dependents(&self, name: &str) -> Vec<String> {
        let mut seen = BTreeSet::from([name.to_string()]);
        let mut out = Vec::new();
        let mut queue = VecDeque::from([name.to_string()]);
        while let Some(next) = queue.pop_front() {
            for caller in self.callers(&next) {
                if seen.insert(caller.clone()) {
                    out.push(caller.clone());
                    queue.push_back(caller);
                }
            }
        }
        out
    }

    /// Orders the models of the graph in waves: a model comes in a later wave
    /// than every model of the graph it calls, and the models of one wave do
    /// not depend on each other (they can load in parallel). Calls to models
    /// outside the graph do not order anything. The models in a cycle, or
    /// calling into one, are returned apart: they can never load.
    pub fn waves(&self) -> (Vec<Vec<String>>, Vec<String>) {
        let mut waiting: BTreeMap<&str, BTreeSet<&str>> = self
            .calls
            .iter()
            .map(|(n, calls)| {
                let inside = calls
                    .iter()
                    .map(String::as_str)
                    .filter(|c| self.calls.contains_key(*c))
                    .collect();
                (n.as_str(), inside)
            })
            .collect();
        let mut waves = Vec::new();
        loop {
            let wave: Vec<&str> = waiting
                .iter()
                .filter(|(_, calls)| calls.is_empty())
                .map(|(n, _)| *n)
                .collect();
            if wave.is_empty() {
                break;
            }
            for n in &wave {
                waiting.remove(n);
            }
            for calls in waiting.values_mut() {
                for n in &wave {
                    calls.remove(n);
                }
            }
            waves.push(wave.into_iter().map(str::to_string).collect());
        }
        (waves, waiting.into_keys().map(str::to_string).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> DependencyGraph {
        let mut g = DependencyGraph::default();
        for (n, calls) in edges {
            g.insert(n, calls.iter().map(|c| c.to_string()));
        }
        g
    }

    #[test]
    fn waves_put_callees_first_and_set_cycles_apart() {
        let g = graph(&[
            ("a", &[]),
            ("b", &[]),
            ("ens", &["a", "b", "outside"]),
            ("nested", &["ens", "a"]),
            ("cycle_x", &["cycle_y"]),
            ("cycle_y", &["cycle_x", "a"]),
            ("behind_cycle", &["cycle_x"]),
        ]);
        let (waves, stuck) = g.waves();
        assert_eq!(
            waves,
            [vec!["a", "b"], vec!["ens"], vec!["nested"]]
                .map(|w| w.into_iter().map(String::from).collect::<Vec<_>>())
        );
        assert_eq!(stuck, ["behind_cycle", "cycle_x", "cycle_y"]);
        assert_eq!(g.calls("ens").collect::<Vec<_>>(), ["a", "b", "outside"]);
    }

    #[test]
    fn dependents_are_transitive_and_nearest_first() {
        let g = graph(&[
            ("a", &[]),
            ("ens", &["a"]),
            ("nested", &["ens"]),
            ("other", &["b"]),
        ]);
        assert_eq!(g.callers("a"), ["ens"]);
        assert_eq!(g.dependents("a"), ["ens", "nested"]);
        assert!(g.dependents("other").is_empty());
        let cyclic = graph(&[("x", &["y"]), ("y", &["x"])]);
        assert_eq!(cyclic.dependents("x"), ["y"]);
    }
}
