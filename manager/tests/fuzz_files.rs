//! Fuzzing the three file kinds (config, policy, scenario) through the very
//! path `qosd check` takes (`check_file`: read, precheck, serde, validate,
//! the policy a config or scenario names). Inputs are the shipped files
//! mutated the way a hostile or careless hand would: lines deleted or
//! doubled, values swapped, huge and odd numbers, deep nesting, odd bytes
//! (NUL, a BOM, invalid UTF-8, anchors, tags). A panic fails the test; the
//! case count is bounded, and the nesting limit keeps each case linear.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use qosd_manager::cmd::check::{check_file, Kind};

/// The shipped files, with where each goes in the scratch tree (so the
/// relative policy paths of configs and scenarios resolve) and its kind.
fn shipped() -> Vec<(PathBuf, &'static str, Kind)> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut v = vec![(repo.join("config.yaml"), "", Kind::Config)];
    for (dir, kind) in [("policies", Kind::Policy), ("scenarios", Kind::Scenario)] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(repo.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        v.extend(files.into_iter().map(|p| (p, dir, kind)));
    }
    v
}

/// One edit of a file, as lines of bytes.
#[derive(Debug, Clone)]
enum Mutation {
    DeleteLine(usize),
    DoubleLine(usize),
    SwapValues(usize, usize),
    Value(usize, &'static str),
    Nest(usize, usize),
    Insert(usize, usize, &'static [u8]),
}

const VALUES: &[&str] = &[
    "1e308",
    "-1e308",
    "18446744073709551615",
    "-9223372036854775809",
    "1e-320",
    ".nan",
    "-.inf",
    "-0",
    "0",
    "1e303s",
    "1e308ms",
    "[]",
    "{}",
    "~",
    "\"\"",
    "*nope",
    "&a x",
    "!!binary AAAA",
    "/etc/passwd",
    "../../../../etc",
];

const BYTES: &[&[u8]] = &[
    b"\0",
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"\t",
    b"\r",
    b"{",
    b"]",
    b"\"",
    b"'",
    b": ",
    b"- ",
    b"---\n",
    b"&a ",
    b"*a",
    b"\xe2\x80\xae",
    b"#",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    let line = 0usize..200;
    prop_oneof![
        line.clone().prop_map(Mutation::DeleteLine),
        line.clone().prop_map(Mutation::DoubleLine),
        (line.clone(), line.clone()).prop_map(|(a, b)| Mutation::SwapValues(a, b)),
        (line.clone(), prop::sample::select(VALUES)).prop_map(|(l, v)| Mutation::Value(l, v)),
        (line.clone(), 1usize..300).prop_map(|(l, d)| Mutation::Nest(l, d)),
        (line, 0usize..80, prop::sample::select(BYTES))
            .prop_map(|(l, c, b)| Mutation::Insert(l, c, b)),
    ]
}

/// The value part of a `key: value` line (from after ": ").
fn value_at(line: &[u8]) -> Option<usize> {
    line.windows(2).position(|w| w == b": ").map(|i| i + 2)
}

fn apply(lines: &mut Vec<Vec<u8>>, m: &Mutation) {
    if lines.is_empty() {
        return;
    }
    let n = lines.len();
    match *m {
        Mutation::DeleteLine(i) => {
            lines.remove(i % n);
        }
        Mutation::DoubleLine(i) => {
            let l = lines[i % n].clone();
            lines.insert(i % n, l);
        }
        Mutation::SwapValues(a, b) => {
            let (a, b) = (a % n, b % n);
            if let (Some(x), Some(y)) = (value_at(&lines[a]), value_at(&lines[b])) {
                let va = lines[a][x..].to_vec();
                let vb = lines[b][y..].to_vec();
                lines[a].truncate(x);
                lines[a].extend(vb);
                lines[b].truncate(y);
                lines[b].extend(va);
            }
        }
        Mutation::Value(i, v) => {
            let i = i % n;
            if let Some(x) = value_at(&lines[i]) {
                lines[i].truncate(x);
                lines[i].extend_from_slice(v.as_bytes());
            }
        }
        Mutation::Nest(i, depth) => {
            let i = i % n;
            if let Some(x) = value_at(&lines[i]) {
                let v = lines[i].split_off(x);
                lines[i].extend(std::iter::repeat_n(b'[', depth));
                lines[i].extend(v);
                lines[i].extend(std::iter::repeat_n(b']', depth));
            }
        }
        Mutation::Insert(i, col, b) => {
            let i = i % n;
            let at = col.min(lines[i].len());
            lines[i].splice(at..at, b.iter().copied());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 600,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_shipped_files_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec(mutation(), 1..6),
    ) {
        let files = shipped();
        let (src, dir, kind) = &files[pick.index(files.len())];
        // A scratch copy of the tree the file's relative paths point into.
        let tmp = tempfile::tempdir().unwrap();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::create_dir_all(tmp.path().join("policies")).unwrap();
        std::fs::create_dir_all(tmp.path().join("scenarios")).unwrap();
        for p in ["parties.yaml", "cpu-util.yaml", "power-saver.yaml"] {
            std::fs::copy(repo.join("policies").join(p), tmp.path().join("policies").join(p))
                .unwrap();
        }
        let bytes = std::fs::read(src).unwrap();
        let mut lines: Vec<Vec<u8>> = bytes.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
        for m in &edits {
            apply(&mut lines, m);
        }
        let out = tmp.path().join(dir).join("fuzzed.yaml");
        std::fs::write(&out, lines.join(&b'\n')).unwrap();
        // Both the file's kind and the guess: every branch of `check`.
        for k in [*kind, Kind::Auto] {
            if let Err(e) = check_file(&out, k) {
                // Positions are 1-based when given; messages stay short
                // (nothing echoes a whole file).
                prop_assert!(e.line > 0 || e.col == 0, "{}", e);
                prop_assert!(e.to_string().len() < 2000, "{}", e);
            }
        }
    }
}
