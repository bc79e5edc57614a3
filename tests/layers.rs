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
    &["error", "value", "time", "reasons", "pool"],
    &["row", "text"],
    &["store"],
    &["fingerprint"],
    &["jsonfile", "identity", "liveness"],
    &["evidence"],
    &["observe"],
    &["policy"],
    &["capability", "snapshot"],
    &["plan"],
    &["explain", "launcher", "worker", "copy"],
    &["apply"],
    &["fixture", "verify", "report"],
    &["export", "serve", "diff", "coverage", "capture"],
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

// Import circles between files, at any depth: two files of one module
// folder that import each other are a circle as much as two top-level
// modules are. A file's imports are the paths its non-test code names from
// `crate::`, `super::`, `self::` or a child module it declares; a `mod`
// declaration alone is not an import (a parent declares its children).

/// A source file's module path: `src/a/b.rs` and `src/a/b/mod.rs` are
/// `a::b`; `src/lib.rs` is the crate root (empty).
fn module_path(rel: &Path) -> Vec<String> {
    let mut path: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// The code a file runs: the text before its tests, each line without its
/// `//` comment (a `//` right after `:` is a URL in a string, not one).
fn code_of(text: &str) -> String {
    let code = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let mut cut = line.len();
        let mut from = 0;
        while let Some(at) = line[from..].find("//") {
            let at = from + at;
            if !line[..at].ends_with(':') {
                cut = at;
                break;
            }
            from = at + 2;
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

fn skip_space(s: &str, at: usize) -> usize {
    at + (s[at..].len() - s[at..].trim_start().len())
}

/// The paths a use tree (or an expression path) names, read from `rest`,
/// the text right after `root::`: `a::b`, `a::{b, c::{d, e}}`, `a::*`,
/// `a::{self, B as C}`. Each path is pushed whole (`base` and its
/// segments); returns how many bytes of `rest` the tree took.
fn use_tree(rest: &str, base: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut at = skip_space(rest, 0);
    if rest[at..].starts_with('{') {
        at += 1;
        loop {
            at = skip_space(rest, at);
            if at >= rest.len() {
                return at;
            }
            if rest[at..].starts_with('}') {
                return at + 1;
            }
            at += use_tree(&rest[at..], base.clone(), out);
            // Past an `as NAME`, to the next item or the group's end.
            let next = rest[at..].find([',', '}']).unwrap_or(rest.len() - at);
            at += next;
            if rest[at..].starts_with(',') {
                at += 1;
            }
        }
    }
    let name = ident(&rest[at..]);
    let mut path = base;
    if name.is_empty() {
        out.push(path);
        return at;
    }
    at += name.len();
    if name != "self" {
        path.push(name.to_string());
    }
    if rest[at..].starts_with("::") {
        return at + 2 + use_tree(&rest[at + 2..], path, out);
    }
    out.push(path);
    at
}

/// The modules a file declares as its children (`mod x;` or an inline
/// `mod x {`).
fn children(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let l = l.strip_prefix("pub(super) ").unwrap_or(l);
            let name = ident(l.strip_prefix("mod ")?);
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// Every crate path a file at `module` names, made absolute (from the
/// crate root, `super` resolved).
fn paths_named(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let kids = children(code);
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let boundary = at == 0 || {
            let c = bytes[at - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
        };
        let name = ident(&code[at..]);
        if !boundary || name.is_empty() {
            at += code[at..].chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let after = at + name.len();
        let root: Option<Vec<String>> = match name {
            _ if !code[after..].starts_with("::") => None,
            "crate" => Some(Vec::new()),
            "self" | "super" => Some(module.to_vec()),
            kid if kids.contains(kid) => Some(module.to_vec()),
            _ => None,
        };
        let Some(root) = root else {
            at = after;
            continue;
        };
        // `super` and a child name are read as segments of the tree.
        let start = if name == "crate" || name == "self" {
            after + 2
        } else {
            at
        };
        let mut raw = Vec::new();
        let took = use_tree(&code[start..], Vec::new(), &mut raw);
        for segments in raw {
            let mut path = root.clone();
            for s in segments {
                if s == "super" {
                    path.pop();
                } else {
                    path.push(s);
                }
            }
            found.push(path);
        }
        at = start + took.max(1);
    }
    found
}

/// File → the other files of the crate its non-test code imports (paths
/// relative to `src/`). The crate root and the binary are left out: the
/// root only declares modules and exports macros.
fn file_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let by_module: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap();
            (module_path(rel), rel.to_string_lossy().to_string())
        })
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let name = rel.to_string_lossy().to_string();
        if name == "lib.rs" || name == "main.rs" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        let entry = g.entry(name.clone()).or_default();
        for path in paths_named(&code, &module_path(rel)) {
            // The file of the longest prefix that is a module.
            let target = (0..=path.len())
                .rev()
                .find_map(|n| by_module.get(&path[..n]))
                .filter(|t| *t != &name && *t != "lib.rs");
            if let Some(t) = target {
                entry.insert(t.clone());
            }
        }
    }
    g
}

/// A circle: the files that all reach each other (a strongly connected set
/// of two or more), and one cycle through them (`a -> b -> a`).
struct Circle {
    files: BTreeSet<String>,
    cycle: Vec<String>,
}

/// The circles of a graph.
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Circle> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in g.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for (n, r) in &reaches {
        if done.contains(*n) || !r.contains(*n) {
            continue;
        }
        let set: BTreeSet<&String> = r
            .iter()
            .filter(|m| reaches.get(m).is_some_and(|rm| rm.contains(*n)))
            .collect();
        done.extend(set.iter().map(|m| (*m).clone()));
        out.push(Circle {
            cycle: cycle_through(g, n, &set),
            files: set.into_iter().cloned().collect(),
        });
    }
    out
}

/// A shortest cycle from `start` back to itself within `set`.
fn cycle_through(
    g: &BTreeMap<String, BTreeSet<String>>,
    start: &String,
    set: &BTreeSet<&String>,
) -> Vec<String> {
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(n) = queue.pop_front() {
        for m in g.get(&n).into_iter().flatten() {
            if m == start {
                // `prev` leads back to `start`, which has none.
                let mut path = vec![n.clone()];
                while let Some(p) = prev.get(path.last().unwrap()) {
                    path.push(p.clone());
                }
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if set.contains(m) && !prev.contains_key(m) && m != start {
                prev.insert(m.clone(), n.clone());
                queue.push_back(m.clone());
            }
        }
    }
    vec![start.clone()]
}

/// Circles found and left for now, each with the reason: the test fails
/// on any other circle, and on one of these once it is gone (so the list
/// only shrinks). Each is named by all the files in it.
const KNOWN_CIRCLES: &[(&[&str], &str)] = &[
    (
        &["apply/engine.rs", "apply/mod.rs"],
        "engine.rs calls super::open_for_writing and mod.rs uses engine's \
         Connected, RegistryTx and Mark; src/apply/ is being reworked with the \
         storage layer, which should move open_for_writing down into engine.rs \
         or store/",
    ),
    (
        &["store/audit.rs", "store/mod.rs"],
        "audit.rs uses super::table_columns and super::quote_ident while \
         mod.rs checks audit's TABLE, KEY and COLUMNS; src/store/ is being \
         reworked, and those two helpers belong in a file of their own below both",
    ),
    (
        &[
            "cli/apply.rs",
            "cli/demo.rs",
            "cli/explain.rs",
            "cli/fixture.rs",
            "cli/grants.rs",
            "cli/launch.rs",
            "cli/mod.rs",
            "cli/plan.rs",
            "cli/policy.rs",
            "cli/registry.rs",
            "cli/serve.rs",
            "cli/snapshot.rs",
            "cli/test.rs",
            "cli/worker.rs",
        ],
        "every subcommand reads Cli, Format and OperatorArgs from cli/mod.rs, \
         which dispatches to each subcommand's run; moving the shared argument \
         types into a file of their own (cli/args.rs) touches every subcommand",
    ),
];

#[test]
fn no_file_is_part_of_an_import_circle() {
    let found = circles(&file_graph());
    let known = |c: &Circle| {
        KNOWN_CIRCLES
            .iter()
            .any(|(files, _)| c.files.iter().eq(files.iter().copied()))
    };
    let new: Vec<String> = found
        .iter()
        .filter(|c| !known(c))
        .map(|c| c.cycle.join(" -> "))
        .collect();
    assert!(
        new.is_empty(),
        "import circles between files (data flows one way inside a module folder \
         too):\n{}",
        new.join("\n")
    );
    let gone: Vec<String> = KNOWN_CIRCLES
        .iter()
        .filter(|(files, _)| {
            !found
                .iter()
                .any(|c| c.files.iter().eq(files.iter().copied()))
        })
        .map(|(files, _)| files.join(", "))
        .collect();
    assert!(
        gone.is_empty(),
        "these circles are gone (or changed): take them off KNOWN_CIRCLES:\n{}",
        gone.join("\n")
    );
}

#[test]
fn the_path_reader_resolves_super_self_children_and_groups() {
    let code = code_of(
        "mod kid;\nuse super::{a::B, c::{self, D as E}};\nuse crate::x::y::*;\n\
         use kid::K; // crate::not_this\nfn f() { self::g(); super::super::h::i(); }\n\
         #[cfg(test)]\nmod tests { use crate::z; }",
    );
    let module: Vec<String> = vec!["m".into(), "n".into()];
    let got: BTreeSet<String> = paths_named(&code, &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    let want: BTreeSet<String> = [
        "m::a::B",
        "m::c",
        "m::c::D",
        "x::y",
        "m::n::kid::K",
        "m::n::g",
        "h::i",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
}

#[test]
fn a_circle_is_found_at_any_depth() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a/mod.rs", &["a/x.rs"][..]),
        ("a/x.rs", &["a/y.rs"][..]),
        ("a/y.rs", &["a/mod.rs", "b.rs"][..]),
        ("b.rs", &[][..]),
    ]
    .into_iter()
    .map(|(n, to)| (n.to_string(), to.iter().map(|t| t.to_string()).collect()))
    .collect();
    let found = circles(&g);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].cycle, ["a/mod.rs", "a/x.rs", "a/y.rs", "a/mod.rs"]);
    assert_eq!(found[0].files.len(), 3);
}
