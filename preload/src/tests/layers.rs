//! The shim's top-level modules form one-way layers: each names only
//! modules below it, so a reader follows every call downwards. This test
//! reads `src/` and fails on any path that names a module at its own level
//! or above (`crate::x`, `$crate::x`, or a `super::` chain that climbs out
//! of its top-level module), and on a module that has no layer.

use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// Top-level modules from the top down: each may name only those after it.
/// The crate root (`lib.rs`, the constructor) may name any.
const LAYERS: &[&str] = &[
    // The shim's own tests, driving the hooks over a mock ring.
    "tests",
    // The C ABI: the exported functions.
    "hooks",
    // Semantics: which sockets are tracked, connect/accept decisions.
    "lifecycle",
    // Semantics: blocking, readiness, poll/select/epoll over rings.
    "dispatch",
    // State: which fds are tracked, and their shared state.
    "fdtable",
    // The ring connections (see SEALED).
    "ring",
    // The interface to the ring connections.
    "attached",
    // Support, each over the ones after it.
    "sockaddr",
    "real",
    "interpose",
    "config",
    "log",
    "fdspace",
    "signals",
    "plock",
    "process",
    "sys",
    "keymap",
];

/// Modules only the crate root names: the constructor installs the ring
/// layer, and everything else reaches it through `attached`.
const SEALED: &[&str] = &["ring"];

/// One path from a file to a top-level module.
#[derive(Debug, PartialEq)]
struct Edge {
    to: String,
    line: usize,
}

/// Top-level modules named by paths in `src`, a file at module depth
/// `depth` (0 for `lib.rs`, 1 for `src/x.rs` and `src/x/mod.rs`, ...).
fn edges(src: &str, depth: usize) -> Vec<Edge> {
    let tokens = TokenStream::from_str(src).expect("the source tokenizes");
    let mut out = Vec::new();
    walk(tokens, depth, &mut out);
    out
}

fn is_ident(t: Option<&TokenTree>, name: &str) -> bool {
    matches!(t, Some(TokenTree::Ident(i)) if i == name)
}

/// True if `ts[i..]` starts with `::`.
fn is_path_sep(ts: &[TokenTree], i: usize) -> bool {
    matches!(
        (ts.get(i), ts.get(i + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
    )
}

fn walk(tokens: TokenStream, depth: usize, out: &mut Vec<Edge>) {
    let ts: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < ts.len() {
        // `mod name { ... }` (or `mod $name { ... }` in a macro): one level
        // deeper for the `super::` chains inside.
        if is_ident(ts.get(i), "mod") {
            let mut j = i + 1;
            if matches!(ts.get(j), Some(TokenTree::Punct(p)) if p.as_char() == '$') {
                j += 1;
            }
            if let (Some(TokenTree::Ident(_)), Some(TokenTree::Group(g))) =
                (ts.get(j), ts.get(j + 1))
            {
                if g.delimiter() == Delimiter::Brace {
                    walk(g.stream(), depth + 1, out);
                    i = j + 2;
                    continue;
                }
            }
        }
        // `crate::` (also `$crate::`), or `super::` as often as the
        // module is deep: the next segment is a top-level item.
        let mut at_root = None;
        if is_ident(ts.get(i), "crate") && is_path_sep(&ts, i + 1) {
            at_root = Some(i + 3);
        } else if is_ident(ts.get(i), "super") {
            let mut j = i;
            let mut supers = 0;
            while is_ident(ts.get(j), "super") && is_path_sep(&ts, j + 1) {
                supers += 1;
                j += 3;
            }
            if supers >= depth {
                at_root = Some(j);
            } else {
                i = j.max(i + 1);
                continue;
            }
        }
        if let Some(j) = at_root {
            match ts.get(j) {
                Some(TokenTree::Ident(name)) => out.push(Edge {
                    to: name.to_string(),
                    line: name.span().start().line,
                }),
                Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                    group_heads(g.stream(), out)
                }
                _ => {}
            }
            i = j + 1;
            continue;
        }
        if let TokenTree::Group(g) = &ts[i] {
            walk(g.stream(), depth, out);
        }
        i += 1;
    }
}

/// The first segment of each path in a `use crate::{a, b::c}` group.
fn group_heads(tokens: TokenStream, out: &mut Vec<Edge>) {
    let mut head = true;
    for t in tokens {
        match &t {
            TokenTree::Punct(p) if p.as_char() == ',' => head = true,
            TokenTree::Ident(name) if head => {
                if name != "self" {
                    out.push(Edge {
                        to: name.to_string(),
                        line: name.span().start().line,
                    });
                }
                head = false;
            }
            _ => head = false,
        }
    }
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source tree") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module of a file under `src` ("" for the crate root) and
/// the file's module depth.
fn module_of(rel: &Path) -> (String, usize) {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts == ["lib.rs"] {
        return (String::new(), 0);
    }
    let last = parts.last().expect("a file name");
    let depth = if last == "mod.rs" {
        parts.len() - 1
    } else {
        parts.len()
    };
    (parts[0].trim_end_matches(".rs").to_string(), depth)
}

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|m| *m == module)
}

/// What is wrong with a path from top-level module `from` to `to`, if
/// anything.
fn violation(from: &str, to: &str) -> Option<String> {
    if from == to {
        return None;
    }
    let Some(below) = rank(to) else {
        return Some(format!(
            "`{to}` is not a module with a layer: name the module that defines it"
        ));
    };
    if from.is_empty() {
        return None;
    }
    if SEALED.contains(&to) {
        return Some(format!(
            "`{to}` is named only by the crate root; use the `attached` interface"
        ));
    }
    let above = rank(from).expect("every module has a layer (checked first)");
    (below <= above).then(|| format!("`{from}` may not name `{to}`: it is not below it"))
}

#[test]
fn top_level_modules_form_one_way_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let (from, depth) = module_of(rel);
        if !from.is_empty() && rank(&from).is_none() {
            problems.push(format!("{}: module `{from}` has no layer", rel.display()));
            continue;
        }
        seen.push(from.clone());
        let text = fs::read_to_string(file).expect("readable source file");
        for e in edges(&text, depth) {
            if let Some(why) = violation(&from, &e.to) {
                problems.push(format!("{}:{}: {why}", rel.display(), e.line));
            }
        }
    }
    for m in LAYERS {
        if !seen.iter().any(|s| s == m) {
            problems.push(format!("LAYERS names `{m}`, which is not a module of src/"));
        }
    }
    assert!(
        problems.is_empty(),
        "paths against the layers:\n{}",
        problems.join("\n")
    );
}

#[test]
fn finds_every_form_of_path() {
    let src = r#"
        use crate::{alpha, beta::{x, y}, self};
        use crate::gamma::Thing;
        // crate::commented_out
        fn f() { let s = "crate::in_a_string"; $crate::delta::g(); crate::epsilon(); }
        mod inner { use super::super::zeta::Z; use super::sibling; }
        macro_rules! m { () => { mod $n { use super::super::eta; } } }
    "#;
    let got: Vec<String> = edges(src, 1).into_iter().map(|e| e.to).collect();
    assert_eq!(
        got,
        ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    );
}

#[test]
fn rules_reject_upward_sideways_and_sealed_paths() {
    assert_eq!(violation("hooks", "dispatch"), None);
    assert_eq!(violation("", "ring"), None);
    assert_eq!(violation("fdtable", "fdtable"), None);
    assert!(violation("fdtable", "lifecycle").is_some());
    assert!(violation("dispatch", "hooks").is_some());
    assert!(violation("hooks", "ring").is_some());
    assert!(violation("dispatch", "Errno").is_some());
}
