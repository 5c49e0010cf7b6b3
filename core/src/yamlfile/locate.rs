//! Finding a key in a YAML file's text: the `file:line:col` of a
//! [`KeyPath`] (yaml-rust2's marked event parser), the items of a sequence,
//! and the keys serde loses inside internally tagged enums.

use yaml_rust2::parser::{Event, Parser};

use super::{guard, KeyPath, Seg, MAX_DEPTH};

/// serde loses the path inside an internally tagged enum (`job: { kind:
/// hash, thread: 2 }` says `apps[1].thread`): when `key` is not in the
/// text, the one place one level down where its last key is written.
pub(super) fn tagged_field(text: &str, key: &KeyPath) -> Option<(KeyPath, Pos)> {
    let (field, parent) = key.0.split_last()?;
    let mut exact = false;
    let mut found = Vec::new();
    walk(text, |at, _, pos| {
        if at == &key.0[..] {
            exact = true;
            return true;
        }
        if at.len() == key.0.len() + 1 && at.starts_with(parent) && at.last() == Some(field) {
            found.push((KeyPath(at.to_vec()), pos));
        }
        false
    });
    if exact || found.len() != 1 {
        return None;
    }
    found.pop()
}

pub(super) fn backticked_after(msg: &str, prefix: &str) -> Option<String> {
    let rest = &msg[msg.find(prefix)? + prefix.len()..];
    Some(rest[..rest.find('`')?].to_owned())
}

/// Position of a dotted key written like `apps[0].target`.
pub(super) fn locate_str(text: &str, key: &str) -> Option<(usize, usize)> {
    locate(text, &key_path(key))
}

/// Parses `apps[0].target` back into a [`KeyPath`].
pub(super) fn key_path(key: &str) -> KeyPath {
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
    path
}

/// 1-based (line, col) of the node at `path` in a YAML document: the key
/// itself for a mapping entry, the item for a sequence index. When the full
/// path is absent, the position of the deepest ancestor that is present.
pub fn locate(text: &str, path: &KeyPath) -> Option<(usize, usize)> {
    let mut best: Option<(usize, Pos)> = None;
    walk(text, |at, _, pos| {
        let n = at.len();
        if n <= path.0.len() && at == &path.0[..n] && best.is_none_or(|(d, _)| n > d) {
            best = Some((n, pos));
        }
        n == path.0.len() && at == &path.0[..]
    });
    best.and_then(|(_, p)| p)
}

/// A 1-based (line, col), when known.
pub(super) type Pos = Option<(usize, usize)>;

/// The scalar items of the sequence at `path`: (index, value, position).
pub(super) fn seq_items(text: &str, path: &KeyPath) -> Vec<(usize, String, Pos)> {
    let mut out = Vec::new();
    let n = path.0.len();
    walk(text, |at, scalar, pos| {
        if at.len() == n + 1 && at[..n] == path.0[..] {
            if let (Seg::Index(i), Some(v)) = (&at[n], scalar) {
                out.push((*i, v.to_owned(), pos));
            }
        }
        false
    });
    out
}

/// An open collection of [`walk`]: a mapping (expecting a key or its
/// value) or a sequence (the index of its next item).
enum Frame {
    Map { expect_key: bool },
    Seq { next: usize },
}

/// A value or item just ended: the parent expects the next key/item.
fn finish_node(frames: &mut [Frame]) {
    match frames.last_mut() {
        Some(Frame::Map { expect_key }) => *expect_key = true,
        Some(Frame::Seq { next }) => *next += 1,
        None => {}
    }
}

/// Walks a YAML document, calling `visit(path, scalar, position)` for every
/// mapping key (path ends with the key, position of the key) and every
/// sequence item (path ends with the index, `scalar` set for scalar items).
/// Stops when `visit` returns true or at the first syntax error.
fn walk(text: &str, mut visit: impl FnMut(&[Seg], Option<&str>, Pos) -> bool) {
    let mut parser = Parser::new_from_str(guard::strip_bom(text));
    let mut frames: Vec<Frame> = Vec::new();
    // The path of the current node: path[i] is where frame i+1 sits inside
    // frame i, then the key or index of the node being read. Pushed and
    // popped in place (never cloned), so a walk is linear in the text.
    let mut path: Vec<Seg> = Vec::new();
    // A block mapping's start event is marked after its first key, so a
    // mapping that is a sequence item is placed at its first key.
    let mut item_at_next = false;
    while let Ok((ev, mark)) = parser.next_token() {
        if frames.len() > MAX_DEPTH {
            return;
        }
        let pos = Some((mark.line(), mark.col() + 1));
        if std::mem::take(&mut item_at_next) {
            let p = matches!(ev, Event::Scalar(..)).then_some(pos).flatten();
            if visit(&path, None, p) {
                return;
            }
        }
        let scalar = match &ev {
            Event::Scalar(v, ..) => Some(v.as_str()),
            _ => None,
        };
        let starts = matches!(
            ev,
            Event::Scalar(..)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
                | Event::Alias(_)
        );
        // Whether this node is a key, and whether a segment for it is on
        // top of `path` (to pop when a scalar ends).
        let mut is_key = false;
        let mut owns_seg = false;
        if starts {
            match frames.last_mut() {
                Some(Frame::Map { expect_key: true }) => {
                    // The key's name is where the value will sit.
                    path.push(Seg::Key(scalar.unwrap_or_default().to_owned()));
                    if visit(&path, None, pos) {
                        return;
                    }
                    is_key = true;
                }
                // The value sits at the key pushed with it.
                Some(Frame::Map { expect_key: false }) => owns_seg = true,
                Some(Frame::Seq { next }) => {
                    path.push(Seg::Index(*next));
                    if matches!(ev, Event::MappingStart(..)) {
                        item_at_next = true;
                    } else if visit(&path, scalar, pos) {
                        return;
                    }
                    owns_seg = true;
                }
                None => {}
            }
        }
        match ev {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                frames.push(if matches!(ev, Event::MappingStart(..)) {
                    Frame::Map { expect_key: true }
                } else {
                    Frame::Seq { next: 0 }
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                frames.pop();
                if !frames.is_empty() {
                    path.pop();
                }
                finish_node(&mut frames);
            }
            Event::Scalar(..) | Event::Alias(_) => {
                if is_key {
                    if let Some(Frame::Map { expect_key }) = frames.last_mut() {
                        *expect_key = false;
                    }
                } else {
                    if owns_seg {
                        path.pop();
                    }
                    finish_node(&mut frames);
                }
            }
            Event::StreamEnd => return,
            _ => {}
        }
    }
}
