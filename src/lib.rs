//! drain-gate: an Istio ingress-gateway drain controller inside istio-proxy.
//!
//! Each concern is one place: its pure part (no proxy-wasm types, unit-tested on
//! the host) beside its host part, in two kinds of rooms:
//!
//! - [`gate`]: count every stream, the state machine, the flip, the answers —
//!   everything drain-gate decides on;
//! - [`instruments`]: what it measures and shows about a drain (the receipt,
//!   stream durations, in-flight ages, the SIGTERM watch, the status document),
//!   hanging off the gate's events.
//!
//! Shared, pure: [`api`], the HTTP surface of the health listener (routing,
//! query parameters, replies); [`config`], plugin configuration →
//! validated [`config::Config`]; [`duration`], durations as the configuration and
//! queries spell them; [`json`], drain-gate's own records as JSON, each field
//! name declared once; [`net`], IP networks (`admin_allow`); [`metric_names`],
//! every metric name (the host defines them).
//!
//! Host shell ([`host`]): the root context and its roles, the health role,
//! the `Host` trait and its stand-in, shared data and its keys, the metrics and
//! the logs.

pub mod api;
pub mod config;
pub mod duration;
pub mod gate;
pub mod host;
pub mod instruments;
pub mod json;
pub mod metric_names;
pub mod net;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(host::root::Root::default())
    });
}}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;
    /// The `pub mod` names of a source file, in order.
    fn modules(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub mod "))
            .filter_map(|rest| rest.strip_suffix(';'))
            .collect()
    }

    /// The fixture crates (the trap filter, the bench bisection) build this
    /// crate's own files with another entry point; a module missing from their
    /// list breaks their build, and with it every failure-direction test.
    #[test]
    fn the_fixture_crates_build_every_module() {
        let ours = modules(include_str!("lib.rs"));
        let fixtures = modules(include_str!("../tests/fixtures/src_modules.rs"));
        assert!(!ours.is_empty());
        assert_eq!(
            ours, fixtures,
            "tests/fixtures/src_modules.rs must list every module of src/lib.rs"
        );
    }

    /// One production module: its name (from its file's path), its file, and
    /// its production text (comments and test-only code left out).
    struct Module {
        file: String,
        text: Vec<String>,
    }

    /// A file's module, from its path under src/: `a/b.rs` is `a::b`, a
    /// folder's `mod.rs` is the folder, `lib.rs` is the crate.
    fn module_name(relative: &Path) -> String {
        let mut parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
            parts.pop();
        }
        if parts.is_empty() {
            "crate".into()
        } else {
            parts.join("::")
        }
    }

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The attribute of a declaration that leaves it out of the module:
    /// test-only, or only off wasm (the stand-in host).
    fn test_only(attribute: &str) -> bool {
        attribute.starts_with("#[cfg(test)]")
            || attribute.starts_with("#[cfg(not(target_arch = \"wasm32\"))]")
    }

    /// The production lines of a source file, comments stripped: a
    /// test-only attribute leaves out the one-line item after it (`mod
    /// tests;`), or else everything after it (the test module ends the file).
    fn production(source: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut lines = source.lines().map(|l| match l.find("//") {
            Some(at) => l.get(..at).unwrap_or(l).trim(),
            None => l.trim(),
        });
        while let Some(line) = lines.next() {
            if !test_only(line) {
                out.push(line.to_string());
                continue;
            }
            match lines.find(|l| !l.starts_with("#[")) {
                Some(item) if item.ends_with(';') && !item.contains('{') => {}
                _ => break,
            }
        }
        out
    }

    /// What follows `keyword` (`"use "`, `"mod "`) on a line that declares
    /// such an item, of any visibility.
    fn item<'a>(line: &'a str, keyword: &str) -> Option<&'a str> {
        let (vis, rest) = line.split_once(keyword)?;
        let pub_in = vis.starts_with("pub(") && vis.ends_with(") ");
        (vis.is_empty() || vis == "pub " || pub_in).then_some(rest)
    }

    /// The paths a `use` tree names: `a::{b, c::{self, d}}` is `a::b`,
    /// `a::c`, `a::c::d`.
    fn expand(tree: &str) -> Vec<String> {
        let tree = tree.trim();
        let Some(open) = tree.find('{') else {
            let path = tree.split(" as ").next().unwrap_or(tree).trim();
            let path = path.trim_end_matches("::*").trim_end_matches("::self");
            return vec![path.to_string()];
        };
        let (prefix, rest) = tree.split_at(open);
        let inner = rest
            .get(1..rest.rfind('}').unwrap_or(rest.len()))
            .unwrap_or("");
        let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&inner[start..]);
        parts
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .flat_map(|p| expand(&format!("{prefix}{}", p.trim())))
            .collect()
    }

    /// Every `crate::`, `super::` or `self::` path in production text, the
    /// trees of `use` declarations expanded.
    fn paths(text: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        let mut lines = text.iter();
        while let Some(line) = lines.next() {
            if let Some(tree) = item(line, "use ") {
                let mut tree = tree.to_string();
                while !tree.contains(';') {
                    let Some(more) = lines.next() else { break };
                    tree.push_str(more);
                }
                out.extend(expand(tree.split(';').next().unwrap_or("")));
                continue;
            }
            for start in ["crate::", "super::", "self::"] {
                for (at, _) in line.match_indices(start) {
                    let before = line[..at].chars().last();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    let path = line[at..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':');
                    out.push(path.collect());
                }
            }
        }
        out
    }

    /// The module a path names, seen from `from`: the longest prefix that is
    /// a module of the graph.
    fn target(from: &str, path: &str, modules: &BTreeMap<String, Module>) -> Option<String> {
        let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let mut base: Vec<&str> = if from == "crate" {
            Vec::new()
        } else {
            from.split("::").collect()
        };
        match segments.first() {
            Some(&"crate") => base.clear(),
            Some(&"self") => {}
            Some(&"super") => {
                while segments.first() == Some(&"super") {
                    base.pop();
                    segments.remove(0);
                }
                segments.insert(0, "super");
            }
            _ => return None,
        }
        segments.remove(0);
        base.extend(segments);
        (0..=base.len()).rev().find_map(|n| {
            let name = if n == 0 {
                "crate".to_string()
            } else {
                base[..n].join("::")
            };
            modules.contains_key(&name).then_some(name)
        })
    }

    /// Whether `ancestor` contains `module` (the crate contains every module).
    fn contains(ancestor: &str, module: &str) -> bool {
        ancestor == "crate" || module.starts_with(&format!("{ancestor}::"))
    }

    /// The production modules of src/ and the edges between them, each with
    /// the reference that makes it: a module uses another (`use crate::x`,
    /// `crate::x::f()`, `super::x`, a child by its name). A module's use of an
    /// ancestor's items (`super::Health` in `host/health/requests.rs`) is no
    /// edge: a child using its parent's items is one module split in files.
    /// Nor is declaring a child (`mod host;`): a concern's pure part declares
    /// its host part beside it without using it (the host part uses the pure
    /// part); a parent that does use its child has the edge by that use.
    fn module_graph(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut all = BTreeMap::new();
        for path in files {
            let relative = path.strip_prefix(src).unwrap();
            let text = production(&std::fs::read_to_string(&path).unwrap());
            let file = format!("src/{}", relative.display());
            all.insert(module_name(relative), Module { file, text });
        }
        // The modules the crate builds into the filter: declared in production text.
        let mut modules = BTreeMap::new();
        let mut next = vec!["crate".to_string()];
        while let Some(name) = next.pop() {
            let Some(m) = all.remove(&name) else { continue };
            for line in &m.text {
                if let Some(child) = item(line, "mod ").and_then(|d| d.strip_suffix(';')) {
                    next.push(if name == "crate" {
                        child.to_string()
                    } else {
                        format!("{name}::{child}")
                    });
                }
            }
            modules.insert(name, m);
        }
        let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (name, m) in &modules {
            let edges = graph.entry(name.clone()).or_default();
            for path in paths(&m.text) {
                if let Some(to) = target(name, &path, &modules) {
                    if to != *name && !contains(&to, name) {
                        edges
                            .entry(to)
                            .or_insert_with(|| format!("{}: `{path}`", m.file));
                    }
                }
            }
        }
        graph
    }

    /// Every circle a depth-first walk of `graph` closes, each as its modules
    /// in order with the reference that makes each step.
    fn circles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<String> {
        fn walk<'a>(
            node: &'a str,
            graph: &'a BTreeMap<String, BTreeMap<String, String>>,
            stack: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
            found: &mut Vec<String>,
        ) {
            stack.push(node);
            for (to, why) in graph.get(node).into_iter().flatten() {
                if let Some(at) = stack.iter().position(|s| s == to) {
                    let mut circle = String::new();
                    let steps = &stack[at..];
                    for (i, from) in steps.iter().enumerate() {
                        let (next, why) = match steps.get(i + 1) {
                            Some(next) => (*next, graph[*from][*next].as_str()),
                            None => (to.as_str(), why.as_str()),
                        };
                        circle.push_str(&format!("\n  {from} -> {next}  ({why})"));
                    }
                    found.push(circle);
                } else if !done.contains(to.as_str()) {
                    walk(to, graph, stack, done, found);
                }
            }
            stack.pop();
            done.insert(node);
        }
        let (mut stack, mut done, mut found) = (Vec::new(), BTreeSet::new(), Vec::new());
        for node in graph.keys() {
            if !done.contains(node.as_str()) {
                walk(node, graph, &mut stack, &mut done, &mut found);
            }
        }
        found
    }

    /// No module of src/ imports, through others, a module that imports it:
    /// each type belongs to one side.
    #[test]
    fn no_module_imports_itself_in_a_circle() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let graph = module_graph(&src);
        for module in ["crate", "config", "host::root", "host::health::requests"] {
            assert!(graph.contains_key(module), "{module} not found");
        }
        assert!(
            !graph.contains_key("host::sim"),
            "the stand-in host is test-only"
        );
        for (m, e) in &graph {
            eprintln!("{m}: {:?}", e.keys().collect::<Vec<_>>());
        }
        let found = circles(&graph);
        assert!(found.is_empty(), "import circles:{}", found.join("\n"));
    }

    /// The gate decides nothing on what an instrument measures: no module of
    /// `gate` uses one of `instruments` (the roles' shells feed them the
    /// gate's events: `host::traffic`, `host::health`, `Store::raising`).
    #[test]
    fn the_gate_uses_no_instrument() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let graph = module_graph(&src);
        assert!(graph.contains_key("gate::fsm::host") && graph.contains_key("gate::count"));
        let uses: Vec<String> = graph
            .iter()
            .filter(|(from, _)| *from == "gate" || contains("gate", from))
            .flat_map(|(from, edges)| {
                edges
                    .iter()
                    .filter(|(to, _)| contains("instruments", to))
                    .map(move |(to, why)| format!("\n  {from} -> {to}  ({why})"))
            })
            .collect();
        assert!(
            uses.is_empty(),
            "the gate uses instruments:{}",
            uses.concat()
        );
    }
}
