//! Reading YAML files (config, policies) so that every error names
//! `file:line:col` and the key. Parse and type errors carry serde_yaml_ng's
//! location; semantic errors from a `validate()` pass carry a [`KeyPath`],
//! which [`locate`] finds in the text with yaml-rust2's marked event parser.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use yaml_rust2::parser::{Event, Parser};

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

/// Reads a file; an unreadable file is a `FileError` without a position.
pub fn read(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|e| FileError {
        path: path.to_owned(),
        line: 0,
        col: 0,
        key: String::new(),
        msg: format!("cannot read: {e}"),
    })
}

/// Deserialises `text` (the contents of `path`) into `T`.
pub fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, FileError> {
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
    let (line, col) = if line == 0 && !key.is_empty() {
        locate_str(text, &key).unwrap_or((0, 0))
    } else {
        (line, col)
    };
    FileError {
        path: path.to_owned(),
        line,
        col,
        key,
        msg: msg.to_owned(),
    }
}

fn backticked_after(msg: &str, prefix: &str) -> Option<String> {
    let rest = &msg[msg.find(prefix)? + prefix.len()..];
    Some(rest[..rest.find('`')?].to_owned())
}

/// Position of a dotted key written like `apps[0].target`.
fn locate_str(text: &str, key: &str) -> Option<(usize, usize)> {
    let mut path = KeyPath::root();
    for part in key.split('.') {
        let (name, idx) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            path = path.key(name);
        }
        if let Some(i) = idx {
            path = path.index(i);
        }
    }
    locate(text, &path)
}

/// 1-based (line, col) of the node at `path` in a YAML document: the key
/// itself for a mapping entry, the item for a sequence index. When the full
/// path is absent, the position of the deepest ancestor that is present.
pub fn locate(text: &str, path: &KeyPath) -> Option<(usize, usize)> {
    let mut parser = Parser::new_from_str(text);
    // Container stack: for mappings, whether the next scalar is a key and
    // the current key; for sequences, the index of the next item.
    enum Frame {
        Map {
            expect_key: bool,
            key: Option<String>,
        },
        Seq {
            next: usize,
        },
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut best: Option<(usize, usize)> = None;
    // A block mapping's start event is marked after its first key, so a
    // mapping found as a sequence item is placed at its first key instead.
    // `Some(full)`: the next event is the first key of a matched item.
    let mut item_first_key: Option<bool> = None;
    loop {
        let (ev, mark) = parser.next_token().ok()?;
        let pos = (mark.line(), mark.col() + 1);
        if let Some(full) = item_first_key.take() {
            if matches!(ev, Event::Scalar(..)) {
                best = Some(pos);
            }
            if full {
                return best;
            }
        }
        // The path of the node this event starts (for scalars/containers
        // that are values or items).
        let starts_node = matches!(
            ev,
            Event::Scalar(..)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
                | Event::Alias(_)
        );
        if starts_node {
            let is_key = matches!(
                stack.last(),
                Some(Frame::Map {
                    expect_key: true,
                    ..
                })
            );
            if is_key {
                if let Event::Scalar(ref k, ..) = ev {
                    // A key: does the path so far (parents + this key) match?
                    let depth = stack.len();
                    if depth <= path.0.len()
                        && prefix_matches(&stack, &path.0[..depth - 1])
                        && path.0[depth - 1] == Seg::Key(k.clone())
                    {
                        best = Some(pos);
                        if depth == path.0.len() {
                            return best;
                        }
                    }
                }
            } else if let Some(Frame::Seq { next }) = stack.last() {
                let depth = stack.len();
                if depth <= path.0.len()
                    && prefix_matches(&stack, &path.0[..depth - 1])
                    && path.0[depth - 1] == Seg::Index(*next)
                {
                    best = Some(pos);
                    let full = depth == path.0.len();
                    if matches!(ev, Event::MappingStart(..)) {
                        item_first_key = Some(full);
                    } else if full {
                        return best;
                    }
                }
            }
        }
        // Advance the container state.
        match ev {
            Event::Scalar(ref s, ..) => advance(&mut stack, Some(s)),
            Event::Alias(_) => advance(&mut stack, None),
            Event::MappingStart(..) => stack.push(Frame::Map {
                expect_key: true,
                key: None,
            }),
            Event::SequenceStart(..) => stack.push(Frame::Seq { next: 0 }),
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                advance(&mut stack, None);
            }
            Event::StreamEnd => return best,
            _ => {}
        }
    }

    fn advance(stack: &mut [Frame], scalar: Option<&String>) {
        match stack.last_mut() {
            Some(Frame::Map { expect_key, key }) => {
                if *expect_key {
                    *key = scalar.cloned();
                }
                *expect_key = !*expect_key;
            }
            Some(Frame::Seq { next }) => *next += 1,
            None => {}
        }
    }

    fn prefix_matches(stack: &[Frame], want: &[Seg]) -> bool {
        // stack[0] is the document root; frame i+1 is inside want[i].
        want.iter()
            .enumerate()
            .all(|(i, seg)| match (&stack[i], seg) {
                (Frame::Map { key: Some(k), .. }, Seg::Key(w)) => k == w,
                (Frame::Seq { next }, Seg::Index(w)) => next == w,
                _ => false,
            })
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
