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
    &["pgurl"],
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
