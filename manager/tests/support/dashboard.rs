//! Reading a Grafana dashboard and the PromQL of its panels (for
//! `deploy_grafana.rs`): each panel's expressions and description, Grafana's
//! variables as a user with "All" selected sees them, the metric names an
//! expression reads, and the names a Prometheus text exposition exports.

use std::collections::BTreeSet;

use serde_json::Value;

/// The PromQL of every panel target, with its panel title.
pub fn panel_exprs(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dash["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = stack.pop() {
        if let Some(inner) = p["panels"].as_array() {
            stack.extend(inner);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            out.push((title, t["expr"].as_str().expect("target expr").to_owned()));
        }
    }
    out.sort();
    out
}

/// Grafana's variables as a dashboard user with "All" selected sees them.
pub fn substitute(expr: &str) -> String {
    let e = expr
        .replace("$__rate_interval", "10s")
        .replace("$instance", ".*")
        .replace("$app", ".*")
        .replace("$job", ".*");
    assert!(!e.contains('$'), "unknown Grafana variable in {expr}");
    e
}

/// Operators and aggregations (these may be followed by `by (...)`
/// rather than by their parenthesis).
const KEYWORDS: [&str; 21] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "limitk",
    "limit_ratio",
];

/// The metric names in a PromQL expression: identifiers outside label
/// matchers `{}`, ranges `[]`, strings and label lists of by/on/...,
/// that are not a function or aggregation (followed by `(`) or keyword.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let c: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let skip_group = |i: &mut usize, open: char, close: char| {
        let mut depth = 0;
        while *i < c.len() {
            if c[*i] == '"' {
                *i += 1;
                while *i < c.len() && c[*i] != '"' {
                    *i += if c[*i] == '\\' { 2 } else { 1 };
                }
            } else if c[*i] == open {
                depth += 1;
            } else if c[*i] == close {
                depth -= 1;
                if depth == 0 {
                    *i += 1;
                    return;
                }
            }
            *i += 1;
        }
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '{' {
            skip_group(&mut i, '{', '}');
        } else if ch == '[' {
            skip_group(&mut i, '[', ']');
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                i += 1;
            }
        } else if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' {
            let start = i;
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_' || c[i] == ':') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let mut j = i;
            while j < c.len() && c[j] == ' ' {
                j += 1;
            }
            let call = j < c.len() && c[j] == '(';
            let lower = word.to_ascii_lowercase();
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&lower.as_str())
            {
                i = j;
                if call {
                    skip_group(&mut i, '(', ')');
                }
            } else if !call && !KEYWORDS.contains(&lower.as_str()) {
                out.insert(word);
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The metric families of a Prometheus text exposition, as sample names
/// (histogram/summary suffixes included).
pub fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

/// The description of the panel titled `title` (empty if it has none).
pub fn panel_description(dash: &Value, title: &str) -> String {
    let mut stack: Vec<&Value> = dash["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = stack.pop() {
        if let Some(inner) = p["panels"].as_array() {
            stack.extend(inner);
        }
        if p["title"] == title && p["targets"].is_array() {
            return p["description"].as_str().unwrap_or("").to_owned();
        }
    }
    String::new()
}
