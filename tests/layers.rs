//! The module map holds: data flows one way (README "Layout"). Every
//! top-level module of the library has a layer; a module may use modules of
//! lower layers and its own, never a higher one, so there is no import
//! circle, and nothing below `plan` reaches `plan`, `apply`, `cli` or
//! `report`. A new module must be given a layer here and a line in the
//! README's layout, or this test fails and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Lowest first. Modules on one line are peers that never import each
/// other (the test checks that too).
const LAYERS: &[&[&str]] = &[
    &[
        "error",
        "value",
        "time",
        "reasons",
        "pool",
        "outfile",
        "junit",
        "sarif",
        "difference",
    ],
    &["row", "text"],
    &["store"],
    &["fingerprint"],
    &["jsonfile", "identity", "liveness"],
    &["evidence"],
    &["observe"],
    &["policy"],
    &["capability", "snapshot", "counterexample"],
    &["plan"],
    &["explain", "launcher", "worker", "copy"],
    &["apply"],
    &["fixture", "verify", "report"],
    &["export", "serve", "diff", "coverage", "capture"],
    &["mutate"],
    &["mutation_report", "signoff"],
    &["controller"],
    &["cli"],
];

/// The stages a lower module must never reach (the rule, stated on
/// its own so a reordering of LAYERS cannot quietly drop it).
const UPPER: &[&str] = &["plan", "apply", "cli", "report"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level module a source file belongs to.
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The crate modules a file's non-test code names, as `crate::NAME` or in
/// `use crate::{A, B::…}`.
fn uses(text: &str) -> BTreeSet<String> {
    let code = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let name = ident(part.trim());
                    if !name.is_empty() {
                        out.insert(name);
                    }
                }
            } else {
                let name = ident(rest);
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    // Multi-line `use crate::{…};` groups.
    let mut rest = code;
    while let Some(at) = rest.find("use crate::{") {
        rest = &rest[at + "use crate::{".len()..];
        let end = rest.find("};").unwrap_or(rest.len());
        let mut depth = 0;
        let mut item = String::new();
        for c in rest[..end].chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    let name = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect::<String>();
                    if !name.is_empty() {
                        out.insert(name);
                    }
                    item.clear();
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                item.push(c);
            }
        }
        let name = ident(item.trim());
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Module → the other top-level modules it uses.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let module = module_of(rel);
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let entry = g.entry(module.clone()).or_default();
        for used in uses(&text) {
            // `outln!`/`out!` are macros exported at the crate root.
            if used != module && used != "outln" && used != "out" {
                entry.insert(used);
            }
        }
    }
    g
}

#[test]
fn every_module_has_a_layer_and_imports_only_downward() {
    let g = graph();
    let mut problems = Vec::new();
    for (module, used) in &g {
        let Some(mine) = layer_of(module) else {
            problems.push(format!(
                "module `{module}` has no layer: add it to LAYERS in tests/layers.rs \
                 and to README.md's Layout"
            ));
            continue;
        };
        for u in used {
            match layer_of(u) {
                None => problems.push(format!("`{module}` uses `{u}`, which has no layer")),
                Some(theirs) if theirs >= mine => problems.push(format!(
                    "`{module}` (layer {mine}) uses `{u}` (layer {theirs}): data flows one way"
                )),
                Some(_) => {}
            }
        }
        if layer_of("plan").is_some_and(|p| mine < p) {
            for u in used.iter().filter(|u| UPPER.contains(&u.as_str())) {
                problems.push(format!("`{module}` is below plan but uses `{u}`"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_layout_names_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let layout = readme
        .split("## Layout")
        .nth(1)
        .expect("README.md has a Layout section")
        .split("\n## ")
        .next()
        .unwrap();
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert!(modules.len() > 10, "read the module list of src/lib.rs");
    let missing: Vec<&&str> = modules
        .iter()
        .filter(|m| {
            !layout.contains(&format!("`src/{m}.rs`")) && !layout.contains(&format!("`src/{m}/`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "README.md's Layout does not name {missing:?}"
    );
    for m in &modules {
        assert!(layer_of(m).is_some(), "module `{m}` has no layer");
    }
}

#[test]
fn the_import_reader_sees_grouped_and_nested_uses() {
    let text = "use crate::{a::X, b};\nuse crate::{\n    c::{D, E},\n    f,\n};\nfn g() { crate::h::i(); }\n#[cfg(test)]\nmod tests { use crate::z; }";
    let got: Vec<String> = uses(text).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "f", "h"]);
}

/// Every source file as its module path (`snapshot::detect`; a folder's
/// `mod.rs` is the folder's own path), with its non-test code.
fn file_modules() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
        out.insert(parts.join("::"), code);
    }
    out
}

/// The longest module path among `known` that `path` starts with.
fn resolve(path: &[&str], known: &BTreeMap<String, String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|c| known.contains_key(c))
}

/// The files a file names (`crate::a::b`, `super::c`), by module path.
fn file_uses(module: &str, code: &str, known: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mine: Vec<&str> = module.split("::").collect();
    let parent = &mine[..mine.len() - 1];
    let path_after = |rest: &str| -> Vec<String> {
        rest.split("::")
            .map(|s| {
                s.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|s| !s.is_empty())
            .collect()
    };
    let mut out = BTreeSet::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (prefix, base) in [("crate::", &[][..]), ("super::", parent)] {
            for (at, _) in line.match_indices(prefix) {
                let mut path: Vec<&str> = base.to_vec();
                let named = path_after(&line[at + prefix.len()..]);
                path.extend(named.iter().map(String::as_str));
                if let Some(target) = resolve(&path, known).filter(|t| t != module) {
                    out.insert(target);
                }
            }
        }
    }
    out
}

/// Whether `a` is the folder module (`mod.rs`) directly holding `b`.
fn holds(a: &str, b: &str) -> bool {
    b.strip_prefix(a)
        .and_then(|rest| rest.strip_prefix("::"))
        .is_some_and(|rest| !rest.contains("::"))
}

/// No import circle at any depth: between files of one folder as between
/// top-level modules. A folder's `mod.rs` and the files it directly holds
/// are one unit for this (the folder's interface and its parts, as Rust
/// lays a module out), so only their edges to each other are not counted.
#[test]
fn no_import_circle_between_files_at_any_depth() {
    let known = file_modules();
    let graph: BTreeMap<String, BTreeSet<String>> = known
        .iter()
        .map(|(m, code)| {
            let uses = file_uses(m, code, &known)
                .into_iter()
                .filter(|u| !holds(m, u) && !holds(u, m))
                .collect();
            (m.clone(), uses)
        })
        .collect();
    let mut circles = Vec::new();
    for start in graph.keys() {
        // Depth-first from `start`, looking for a way back to it.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in &graph[&at] {
                if next == start && start == path.iter().min().unwrap() {
                    circles.push(path.join(" -> ") + " -> " + start);
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles between files:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_file_graph_sees_sibling_and_crate_paths() {
    let mut known = BTreeMap::new();
    for m in [
        "snapshot",
        "snapshot::detect",
        "snapshot::findings",
        "value",
    ] {
        known.insert(m.to_string(), String::new());
    }
    let uses = file_uses(
        "snapshot::findings",
        "use super::detect::ids;\nfn f() { crate::value::Value::Null; }",
        &known,
    );
    assert_eq!(
        uses.into_iter().collect::<Vec<_>>(),
        ["snapshot::detect", "value"]
    );
    assert!(holds("snapshot", "snapshot::detect"));
    assert!(!holds("snapshot", "snapshot::detect::deep"));
}

/// What names an engine: the URL test, a match on the location's engine,
/// a call into one engine's folder, SQL run through a driver.
const ENGINE_MARKS: &[&str] = &[
    "is_postgres(",
    "Location::Postgres",
    "Location::Sqlite",
    "store::postgres::",
    "\"SELECT ",
    "\"INSERT ",
    "\"UPDATE ",
    "\"DELETE ",
    "\"CREATE ",
    "execute_batch(",
    "query_row(",
    "rusqlite::Connection",
    "postgres::Client",
];

/// Engines are chosen and spoken to only in `src/store/` (issue 44 §3):
/// outside it, non-test code asks the store.
#[test]
fn no_engine_is_named_outside_the_store() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap();
        if rel.starts_with("store") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if let Some(mark) = ENGINE_MARKS.iter().find(|m| line.contains(**m)) {
                found.push(format!("src/{}:{}: {mark}", rel.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "engine-specific code outside src/store/ (move it into the store and ask it):\n{}",
        found.join("\n")
    );
}
