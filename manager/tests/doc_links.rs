//! Every relative link in README.md, BENCHMARKS.md, scenarios/README.md and
//! docs/*.md resolves: the file exists and its `#anchor` is a heading of
//! the target page (GitHub's slug rule: lower case, punctuation dropped,
//! spaces to `-`, `-1`, `-2` for repeated headings).

mod support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use support::repo;

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    let text = heading.replace('`', "");
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of one markdown page (headings outside fenced code).
fn anchors(page: &str) -> HashSet<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut out = HashSet::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let n = seen.iter().filter(|s| **s == base).count();
        out.insert(if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        seen.push(base);
    }
    out
}

/// The targets of `](target)` links outside fenced code and inline code.
fn links(page: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in page.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

fn pages(root: &Path) -> Vec<PathBuf> {
    let mut v = vec![
        root.join("README.md"),
        root.join("BENCHMARKS.md"),
        root.join("scenarios/README.md"),
    ];
    let docs = root.join("docs");
    let mut d: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap_or_else(|e| panic!("{}: {e}", docs.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    d.sort();
    v.extend(d);
    v
}

/// The broken links of every page, as `page:line: target (why)`.
fn broken(root: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{e}"));
        let name = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("page dir").join(file)
            };
            if !dest.exists() {
                bad.push(format!("{name}:{line}: {target} (no such file)"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let body = std::fs::read_to_string(&dest).unwrap_or_default();
            if !anchors(&body).contains(anchor) {
                bad.push(format!("{name}:{line}: {target} (no such heading)"));
            }
        }
    }
    bad
}

#[test]
fn slug_follows_github() {
    assert_eq!(
        slug(" `make demo`: the loop moving CPU"),
        "make-demo-the-loop-moving-cpu"
    );
    assert_eq!(
        slug(" Calibration repeatability (session 10, issue 20 item 5, calib22)"),
        "calibration-repeatability-session-10-issue-20-item-5-calib22"
    );
    let a = anchors("# A\n```\n# not a heading\n```\n## A\n");
    assert!(
        a.contains("a") && a.contains("a-1") && !a.contains("not-a-heading"),
        "{a:?}"
    );
}

#[test]
fn a_broken_link_is_found() {
    let dir = std::env::temp_dir().join(format!("qosd-links-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).expect("tmp");
    std::fs::write(
        dir.join("README.md"),
        "# Top\n[ok](docs/a.md#part) [gone](docs/b.md) [x](#nope) [y](#top)\n",
    )
    .expect("write");
    std::fs::write(dir.join("docs/a.md"), "# Part\n[up](../README.md#top)\n").expect("write");
    std::fs::write(dir.join("BENCHMARKS.md"), "").expect("write");
    std::fs::create_dir_all(dir.join("scenarios")).expect("tmp");
    std::fs::write(dir.join("scenarios/README.md"), "").expect("write");
    let bad = broken(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(
        bad[0].contains("docs/b.md (no such file)") && bad[1].contains("#nope (no such heading)"),
        "{bad:?}"
    );
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let bad = broken(&repo());
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}
