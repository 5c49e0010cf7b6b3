//! Reading YAML files (config, policies, scenarios) so that every error names
//! `file:line:col` and the key. Parse and type errors carry serde_yaml_ng's
//! location; semantic errors from a `validate()` pass carry a [`KeyPath`],
//! which [`locate`] finds in the text with yaml-rust2's marked event parser.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// One step of a path into a YAML document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// Where a value sits in a document: `apps[0].target`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyPath(pub Vec<Seg>);

impl KeyPath {
    pub fn root() -> KeyPath {
        KeyPath(Vec::new())
    }

    /// This path extended by a mapping key.
    pub fn key(&self, k: &str) -> KeyPath {
        let mut v = self.0.clone();
        v.push(Seg::Key(k.to_owned()));
        KeyPath(v)
    }

    /// This path extended by a sequence index.
    pub fn index(&self, i: usize) -> KeyPath {
        let mut v = self.0.clone();
        v.push(Seg::Index(i));
        KeyPath(v)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A semantic error found by a `validate()` pass: which key, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub key: KeyPath,
    pub msg: String,
}

impl Invalid {
    pub fn new(key: KeyPath, msg: impl Into<String>) -> Invalid {
        Invalid {
            key,
            msg: msg.into(),
        }
    }
}

/// An invalid file: `path:line:col: key: message`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct FileError {
    pub path: PathBuf,
    /// 1-based; 0 when the position is unknown (e.g. unreadable file).
    pub line: usize,
    /// 1-based; 0 when the position is unknown.
    pub col: usize,
    /// The key at fault (`apps[0].target`); empty for the whole document.
    pub key: String,
    pub msg: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.col)?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.msg)
    }
}

mod guard;
mod locate;
use guard::strip_bom;
pub use guard::{
    precheck, read, read_kind, read_open, short, Kind, MAX_DEPTH, MAX_FILE_BYTES, MAX_READ_TIME,
};
pub use locate::locate;
use locate::{backticked_after, key_path, locate_str, seq_items, tagged_field};

/// The kinds of YAML file qosd reads, as far as their top-level keys tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doc {
    Config,
    Policy,
    Scenario,
    Model,
}

impl Doc {
    pub fn name(self) -> &'static str {
        match self {
            Doc::Config => "daemon config",
            Doc::Policy => "policy",
            Doc::Scenario => "scenario",
            Doc::Model => "sim model",
        }
    }

    /// What `text` looks like: `parties:` or `rules:` → policy;
    /// `duration_s:` → scenario; `node:` → sim model; else a config.
    /// `None` when it is no YAML mapping at all.
    pub fn guess(text: &str) -> Option<Doc> {
        // Hostile shapes (deep nesting) are refused by the kind's own parse.
        precheck(Path::new(""), text).ok()?;
        let Ok(serde_yaml_ng::Value::Mapping(m)) = serde_yaml_ng::from_str(strip_bom(text)) else {
            return None;
        };
        let has = |k: &str| m.contains_key(k);
        Some(if has("parties") || has("rules") {
            Doc::Policy
        } else if has("duration_s") {
            Doc::Scenario
        } else if has("node") {
            Doc::Model
        } else {
            Doc::Config
        })
    }
}

/// [`parse`] of a file meant to be a `want`: when it fails and the file
/// looks like another kind, the message says so ("this looks like a
/// policy") instead of only listing the fields a `want` has.
pub fn parse_doc<T: DeserializeOwned>(path: &Path, text: &str, want: Doc) -> Result<T, FileError> {
    parse(path, text).map_err(|mut e| {
        if let Some(d) = Doc::guess(text).filter(|d| *d != want) {
            e.msg = format!(
                "this looks like a {}, not a {} ({})",
                d.name(),
                want.name(),
                e.msg
            );
        }
        e
    })
}

/// Deserialises `text` (the contents of `path`) into `T`, after
/// [`precheck`] (nesting limit, duplicate keys) and without a byte-order mark.
pub fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, FileError> {
    let text = guard::strip_bom(text);
    precheck(path, text)?;
    serde_yaml_ng::from_str(text).map_err(|e| from_serde(path, text, &e))
}

/// Turns a `validate()` error into a `FileError` at the key's position
/// (or at its closest ancestor that is present in the text).
pub fn invalid(path: &Path, text: &str, inv: Invalid) -> FileError {
    let (line, col) = locate(text, &inv.key).unwrap_or((0, 0));
    FileError {
        path: path.to_owned(),
        line,
        col,
        key: inv.key.to_string(),
        msg: inv.msg,
    }
}

fn from_serde(path: &Path, text: &str, e: &serde_yaml_ng::Error) -> FileError {
    let full = e.to_string();
    let (line, col) = e
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((0, 0));
    // serde_yaml_ng renders "<path>: <message> at line L column C"; the
    // position is ours to print, the path becomes the key.
    let msg = match full.rfind(" at line ") {
        Some(i) => &full[..i],
        None => &full[..],
    };
    let (mut key, msg) = match msg.split_once(": ") {
        Some((k, m)) if !k.contains(char::is_whitespace) && k != "." => (k.to_owned(), m),
        _ => (String::new(), msg),
    };
    if let Some(field) = backticked_after(msg, "unknown field `") {
        key = if key.is_empty() {
            field
        } else {
            format!("{key}.{field}")
        };
    }
    let (mut line, mut col) = if line == 0 && !key.is_empty() {
        locate_str(text, &key).unwrap_or((0, 0))
    } else {
        (line, col)
    };
    if msg.contains("unknown field `") {
        if let Some((k, Some(p))) = tagged_field(text, &key_path(&key)) {
            (key, (line, col)) = (k.to_string(), p);
        }
    }
    // serde_yaml_ng stops the path at a sequence when one of its scalar
    // items fails to convert (e.g. a rule condition); the message quotes
    // the item, which finds its index and position.
    if !key.is_empty() {
        for (i, v, pos) in seq_items(text, &key_path(&key)) {
            if msg.contains(&format!("`{v}`")) {
                key = format!("{key}[{i}]");
                if let Some(p) = pos {
                    (line, col) = p;
                }
                break;
            }
        }
    }
    FileError {
        path: path.to_owned(),
        line,
        col,
        key,
        msg: guard::elide_quotes(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
name: x
apps:
  - name: memcached
    target: { p99: 0ms }
  - name: nginx
    limits:
      min: { cores: 1 }
list: [a, b]
";

    #[test]
    fn locates_keys_and_items() {
        let p = KeyPath::root();
        assert_eq!(locate(DOC, &p.key("name")), Some((1, 1)));
        assert_eq!(locate(DOC, &p.key("apps")), Some((2, 1)));
        assert_eq!(locate(DOC, &p.key("apps").index(0)), Some((3, 5)));
        assert_eq!(
            locate(DOC, &p.key("apps").index(0).key("target")),
            Some((4, 5))
        );
        assert_eq!(
            locate(DOC, &p.key("apps").index(0).key("target").key("p99")),
            Some((4, 15))
        );
        assert_eq!(
            locate(
                DOC,
                &p.key("apps").index(1).key("limits").key("min").key("cores")
            ),
            Some((7, 14))
        );
        assert_eq!(locate(DOC, &p.key("list").index(1)), Some((8, 11)));
        // Absent leaf: nearest present ancestor.
        assert_eq!(
            locate(DOC, &p.key("apps").index(1).key("target")),
            Some((5, 5))
        );
    }

    /// The cases of the scenarios' former block-style locator: flow maps
    /// inside items, sequences at their key's indentation.
    #[test]
    fn locates_what_scenario_files_use() {
        let doc = "name: x\nnode:\n  nr_cores: 4\napps:\n  - name: a\n    load: {kind: constant, level: 2}\n  - name: b\n    load:\n      kind: ramp\n      to: 3\n";
        let apps = KeyPath::root().key("apps");
        assert_eq!(
            locate(doc, &KeyPath::root().key("node").key("nr_cores")),
            Some((3, 3))
        );
        assert_eq!(locate(doc, &apps.index(0).key("name")), Some((5, 5)));
        assert_eq!(
            locate(doc, &apps.index(0).key("load").key("level")),
            Some((6, 28))
        );
        assert_eq!(
            locate(doc, &apps.index(1).key("load").key("to")),
            Some((10, 7))
        );
        assert_eq!(locate(doc, &apps.index(1).key("nope")), Some((7, 5)));
        let flat = "apps:\n- name: a\n- name: b\n  port: 3\nseed: 1\n";
        let apps1 = KeyPath::root().key("apps").index(1);
        assert_eq!(locate(flat, &apps1.key("port")), Some((4, 3)));
        assert_eq!(locate(flat, &KeyPath::root().key("seed")), Some((5, 1)));
        // Sequences in sequences, and keys after them.
        let nested = "l: [[a, b], [c]]\nm:\n  - - x\n    - y\n  - z\nk: 1\n";
        let l = KeyPath::root().key("l");
        assert_eq!(locate(nested, &l.index(1).index(0)), Some((1, 14)));
        assert_eq!(locate(nested, &l.index(0).index(1)), Some((1, 9)));
        let m = KeyPath::root().key("m");
        assert_eq!(locate(nested, &m.index(0).index(1)), Some((4, 7)));
        assert_eq!(locate(nested, &m.index(1)), Some((5, 5)));
        assert_eq!(locate(nested, &KeyPath::root().key("k")), Some((6, 1)));
        assert_eq!(apps1.key("load").to_string(), "apps[1].load");
    }

    #[test]
    fn serde_errors_carry_position_and_key() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct App {
            name: String,
            nr: u32,
        }
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Doc {
            apps: Vec<App>,
        }
        let e = parse::<Doc>(
            Path::new("c.yaml"),
            "apps:\n  - name: a\n    nr: 1\n  - name: b\n    colour: red\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.col), (5, 5), "{e}");
        assert_eq!(e.key, "apps[1].colour", "{e}");
        assert!(e
            .to_string()
            .starts_with("c.yaml:5:5: apps[1].colour: unknown field"));

        let e =
            parse::<Doc>(Path::new("c.yaml"), "apps:\n  - name: a\n    nr: many\n").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert_eq!(e.key, "apps[0].nr", "{e}");
    }

    #[test]
    fn validation_errors_point_at_the_key() {
        let inv = Invalid::new(
            KeyPath::root().key("apps").index(0).key("target"),
            "must be > 0",
        );
        let e = invalid(Path::new("c.yaml"), DOC, inv);
        assert_eq!(e.to_string(), "c.yaml:4:5: apps[0].target: must be > 0");
    }
}
