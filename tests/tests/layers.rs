//! The gateway's files call down (issue 23): every call from one file of
//! `core/src/gateway/` to a `Gateway` method defined in another goes to a file on a lower
//! floor of the list in ARCHITECTURE.md ("Which file may call which"), so the files form
//! layers a reader can name instead of one cycle.
//!
//! The scan is textual, as a reader would do it: the methods defined in each file's
//! `impl Gateway` blocks, and every `self.name(` call outside `#[cfg(test)]` code. A name
//! defined in two files counts as a call to both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, by its path relative to `core/src/gateway/`.
fn sources(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).expect("read core/src/gateway") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, base, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path
                .strip_prefix(base)
                .expect("under the base")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&path).expect("read a source file");
            // Test modules call freely; they are not the gateway's layers.
            let text = match text.find("#[cfg(test)]\nmod tests {") {
                Some(at) => text[..at].to_owned(),
                None => text,
            };
            out.insert(name, text);
        }
    }
}

/// The floors, top first: the fenced `text floors` block of ARCHITECTURE.md, one floor per
/// line, its files separated by spaces (a name after `#` is the floor's, for readers).
fn floors() -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let start = doc
        .find("```text floors\n")
        .expect("ARCHITECTURE.md has a ```text floors block");
    let block = &doc[start + "```text floors\n".len()..];
    let block = &block[..block.find("```").expect("the block ends")];
    let mut floors = BTreeMap::new();
    for (n, line) in block.lines().enumerate() {
        let files = line.split('#').next().unwrap_or("");
        for file in files.split_whitespace() {
            assert!(
                floors.insert(file.to_owned(), n).is_none(),
                "{file} is on two floors of ARCHITECTURE.md"
            );
        }
    }
    floors
}

/// Calls between files: caller → callee → the method names.
fn calls(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let impl_start = Regex::new(r"(?m)^impl(?:<[^>]*>)? Gateway \{\n").expect("regex");
    let method = Regex::new(r"fn ([a-z_0-9]+)(?:<[^>]*>)?\(\s*&(?:mut )?self").expect("regex");
    let call = Regex::new(r"self\s*\.\s*([a-z_0-9]+)\s*\(").expect("regex");
    let mut defined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in files {
        for m in impl_start.find_iter(text) {
            let body = &text[m.end()..];
            let body = &body[..body.find("\n}\n").unwrap_or(body.len())];
            for c in method.captures_iter(body) {
                defined
                    .entry(c[1].to_owned())
                    .or_default()
                    .insert(file.clone());
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (file, text) in files {
        for c in call.captures_iter(text) {
            for callee in defined.get(&c[1]).into_iter().flatten() {
                if callee != file {
                    edges
                        .entry(file.clone())
                        .or_default()
                        .entry(callee.clone())
                        .or_default()
                        .insert(c[1].to_owned());
                }
            }
        }
    }
    edges
}

#[test]
fn each_file_of_the_gateway_calls_only_files_on_lower_floors() {
    let base = root().join("core/src/gateway");
    let mut files = BTreeMap::new();
    sources(&base, &base, &mut files);
    let floors = floors();
    let on_disk: BTreeSet<&String> = files.keys().collect();
    let listed: BTreeSet<&String> = floors.keys().collect();
    assert_eq!(
        on_disk, listed,
        "ARCHITECTURE.md's floors must list every file of core/src/gateway/, and only those"
    );
    let edges = calls(&files);
    // The scan sees calls: the request path's first hop is one.
    assert!(
        edges
            .get("tool_call.rs")
            .and_then(|e| e.get("proxy.rs"))
            .is_some_and(|names| names.contains("forward")),
        "the scan found no call from tool_call.rs to proxy.rs's forward: it is broken"
    );
    let mut upward = Vec::new();
    for (caller, callees) in &edges {
        for (callee, names) in callees {
            if floors[callee] <= floors[caller] {
                upward.push(format!(
                    "{caller} (floor {}) calls {callee} (floor {}): {}",
                    floors[caller] + 1,
                    floors[callee] + 1,
                    names.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "calls that do not go down a floor (move the code, or the file, and say so in \
         ARCHITECTURE.md):\n{}",
        upward.join("\n")
    );
}
