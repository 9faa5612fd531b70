//! The layering rules in `layers.txt` (at the workspace root) hold: which
//! workspace crate depends on which, which top-level module of the server
//! reaches which (`crate::<module>` outside tests), and which module
//! folders have no cycle among their files (`super::<sibling>`). A broken
//! rule fails here, naming the file and the path that breaks it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

struct Rules {
    crates: BTreeMap<String, BTreeSet<String>>,
    modules: BTreeMap<String, BTreeSet<String>>,
    acyclic: Vec<String>,
    /// (module, paths its code must not name).
    avoid: Vec<(String, Vec<String>)>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rules() -> Rules {
    let text = std::fs::read_to_string(workspace().join("layers.txt")).expect("layers.txt");
    let mut r = Rules {
        crates: BTreeMap::new(),
        modules: BTreeMap::new(),
        acyclic: Vec::new(),
        avoid: Vec::new(),
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (kind, rest) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("layers.txt:{}: '{line}'", n + 1));
        if kind == "acyclic" {
            r.acyclic.push(rest.trim().to_string());
            continue;
        }
        if kind == "avoid" {
            let (name, paths) = rest
                .split_once(':')
                .unwrap_or_else(|| panic!("layers.txt:{}: no ':'", n + 1));
            r.avoid.push((
                name.trim().to_string(),
                paths.split_whitespace().map(str::to_string).collect(),
            ));
            continue;
        }
        let (name, allowed) = rest
            .split_once(':')
            .unwrap_or_else(|| panic!("layers.txt:{}: no ':'", n + 1));
        let allowed = allowed.split_whitespace().map(str::to_string).collect();
        let table = match kind {
            "crate" => &mut r.crates,
            "module" => &mut r.modules,
            other => panic!("layers.txt:{}: unknown rule '{other}'", n + 1),
        };
        table.insert(name.trim().to_string(), allowed);
    }
    r
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The first component of `rel` without `.rs`: the module a file belongs to.
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.trim_end_matches(".rs").to_string()
}

/// The file's code without its `#[cfg(test)]` module (tests may reach anywhere).
fn code(path: &Path) -> String {
    let src = std::fs::read_to_string(path).unwrap();
    match src.find("#[cfg(test)]\nmod tests") {
        Some(i) => src[..i].to_string(),
        None => src,
    }
}

/// The identifiers that follow `prefix` in `src` (`crate::repository::x` → `repository`).
fn paths_after<'a>(src: &'a str, prefix: &'a str) -> impl Iterator<Item = String> + 'a {
    src.match_indices(prefix).filter_map(move |(i, _)| {
        let before = src[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let rest = &src[i + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    })
}

#[test]
fn crates_depend_only_as_layers_txt_allows() {
    let r = rules();
    let root = workspace();
    let mut manifests = vec![
        root.join("host/Cargo.toml"),
        root.join("guest-sdk/rust/Cargo.toml"),
    ];
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        if e.path().join("Cargo.toml").is_file() {
            manifests.push(e.path().join("Cargo.toml"));
        }
    }
    let mut broken = Vec::new();
    for m in manifests {
        let text = std::fs::read_to_string(&m).unwrap();
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .unwrap_or_else(|| panic!("{}: no package name", m.display()))
            .to_string();
        let Some(allowed) = r.crates.get(&name) else {
            broken.push(format!(
                "{}: crate '{name}' is not in layers.txt",
                m.display()
            ));
            continue;
        };
        let mut section = "";
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                section = line;
                continue;
            }
            if section != "[dependencies]" {
                continue;
            }
            let dep = line.split(['=', ' ', '.']).next().unwrap_or("");
            if dep.starts_with("tern") && !allowed.contains(dep) {
                broken.push(format!("{}: '{name}' depends on '{dep}'", m.display()));
            }
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn server_modules_reach_only_what_layers_txt_allows() {
    let r = rules();
    let src = workspace().join("host/src");
    let mut broken = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        let top = module_of(rel);
        let Some(allowed) = r.modules.get(&top) else {
            broken.push(format!(
                "host/src/{}: module '{top}' is not in layers.txt",
                rel.display()
            ));
            continue;
        };
        let code = code(&file);
        for used in paths_after(&code, "crate::").collect::<BTreeSet<_>>() {
            if used != top && !allowed.contains(&used) {
                broken.push(format!(
                    "host/src/{}: '{top}' uses crate::{used}",
                    rel.display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn module_folders_have_no_cycles() {
    let r = rules();
    let src = workspace().join("host/src");
    let mut broken = Vec::new();
    for folder in &r.acyclic {
        let dir = src.join(folder);
        let siblings: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_str()?.to_string();
                let n = n.strip_suffix(".rs").map(str::to_string).unwrap_or(n);
                (n != "mod").then_some(n)
            })
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in rust_files(&dir) {
            let rel = file.strip_prefix(&dir).unwrap();
            let me = module_of(rel);
            if me == "mod" {
                continue;
            }
            let code = code(&file);
            let prefix = format!("crate::{folder}::");
            let used = paths_after(&code, "super::").chain(paths_after(&code, &prefix));
            for u in used.filter(|u| *u != me && siblings.contains(u)) {
                edges.entry(me.clone()).or_default().insert(u);
            }
        }
        // Depth-first search for a cycle.
        fn visit(
            n: &str,
            edges: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == n) {
                let mut cycle = path[i..].to_vec();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            if done.contains(n) {
                return None;
            }
            path.push(n.to_string());
            for next in edges.get(n).into_iter().flatten() {
                if let Some(c) = visit(next, edges, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(n.to_string());
            None
        }
        let mut done = BTreeSet::new();
        for n in edges.keys() {
            if let Some(cycle) = visit(n, &edges, &mut Vec::new(), &mut done) {
                broken.push(format!("host/src/{folder}: {}", cycle.join(" -> ")));
                break;
            }
        }
    }
    assert!(broken.is_empty(), "cycles:\n{}", broken.join("\n"));
}

#[test]
fn server_modules_avoid_what_layers_txt_forbids() {
    let r = rules();
    let src = workspace().join("host/src");
    let mut broken = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        let top = module_of(rel);
        let code = code(&file);
        for (module, paths) in &r.avoid {
            if *module != top {
                continue;
            }
            for path in paths.iter().filter(|p| code.contains(p.as_str())) {
                broken.push(format!("host/src/{}: '{top}' names {path}", rel.display()));
            }
        }
    }
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn a_broken_rule_is_caught() {
    // The checks above find what they look for: a made-up use and cycle.
    let uses: Vec<String> =
        paths_after("use crate::frontend::x; let y = my_crate::z;", "crate::").collect();
    assert_eq!(uses, ["frontend"]);
    let r = rules();
    assert!(
        !r.modules["scheduler"].contains("repository"),
        "the schedulers must not reach the repository"
    );
    assert!(r.acyclic.iter().any(|a| a == "repository"));
}
