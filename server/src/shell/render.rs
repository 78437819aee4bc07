//! Readable output for a terminal: a tool's `structuredContent` as `key: value` lines, and
//! each list of objects as a table (one row per object, one column per key; the name or
//! project first). Generic over the JSON, so every tool, and any new one, reads well without
//! code of its own. `--json` (or a pipe) prints the JSON itself instead.

use std::fmt::Write;

use serde_json::Value;

/// The widest a table cell is shown; longer ones are cut with `…`.
const MAX_CELL: usize = 60;

/// `value` as lines for a terminal, ending with a newline.
pub(crate) fn render(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(_) => object(&mut out, value, ""),
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            table(&mut out, items, "")
        }
        v => {
            let _ = writeln!(out, "{}", cell(v));
        }
    }
    out
}

fn object(out: &mut String, value: &Value, indent: &str) {
    let Value::Object(map) = value else {
        return;
    };
    let tables: Vec<(&String, &Vec<Value>)> = map
        .iter()
        .filter_map(|(k, v)| match v {
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
                Some((k, items))
            }
            _ => None,
        })
        .collect();
    for (k, v) in map {
        if tables.iter().any(|(t, _)| *t == k) {
            continue;
        }
        match v {
            Value::Object(inner) if !inner.is_empty() => {
                let _ = writeln!(out, "{indent}{k}:");
                object(out, v, &format!("{indent}  "));
            }
            v => {
                let _ = writeln!(out, "{indent}{k}: {}", cell(v));
            }
        }
    }
    for (k, items) in tables {
        let _ = writeln!(out, "{indent}{k}:");
        table(out, items, &format!("{indent}  "));
    }
}

fn table(out: &mut String, rows: &[Value], indent: &str) {
    let mut columns: Vec<&str> = Vec::new();
    for row in rows {
        if let Value::Object(m) = row {
            for k in m.keys() {
                if !columns.contains(&k.as_str()) {
                    columns.push(k);
                }
            }
        }
    }
    // The row's name first, then its status.
    for first in ["status", "project", "name"] {
        if let Some(i) = columns.iter().position(|c| *c == first) {
            let c = columns.remove(i);
            columns.insert(0, c);
        }
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| cell(&r[*c])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([c.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |out: &mut String, items: &mut dyn Iterator<Item = String>| {
        let text: Vec<String> = items
            .zip(&widths)
            .map(|(s, w)| format!("{s:<w$}"))
            .collect();
        let _ = writeln!(out, "{indent}{}", text.join("  ").trim_end());
    };
    line(out, &mut columns.iter().map(|c| c.to_uppercase()));
    for row in cells {
        line(out, &mut row.into_iter());
    }
}

/// One value as a cell: strings bare, `-` for null, lists of plain values joined by commas,
/// anything else as compact JSON; at most [`MAX_CELL`] characters.
fn cell(v: &Value) -> String {
    let s = match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "-".to_owned(),
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            items.iter().map(cell).collect::<Vec<_>>().join(", ")
        }
        v => v.to_string(),
    };
    if s.chars().count() > MAX_CELL {
        let cut: String = s.chars().take(MAX_CELL - 1).collect();
        format!("{cut}…")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_of_objects_are_tables_and_the_rest_lines() {
        let v = json!({
            "active": null,
            "projects": [
                {"name": "alpha", "live": true, "url": "http://a"},
                {"name": "beta", "live": false, "url": "http://b"},
            ],
            "summary": {"up": ["alpha"], "down": ["beta"], "stale": []},
        });
        let text = render(&v);
        assert_eq!(
            text,
            "active: -\nsummary:\n  down: beta\n  stale: -\n  up: alpha\nprojects:\n  \
             NAME   LIVE   URL\n  alpha  true   http://a\n  beta   false  http://b\n"
        );
        assert_eq!(render(&json!("x")), "x\n");
        let long = "y".repeat(100);
        assert!(render(&json!({ "k": long })).contains('…'));
    }
}
