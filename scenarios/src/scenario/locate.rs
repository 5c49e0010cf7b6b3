//! Finds where a key path (`apps[1].load.to`) sits in a YAML text, so that a
//! semantic error can name `file:line:col`. Block-style YAML only (what the
//! shipped scenarios use); flow mappings (`{a: 1}`) are searched on the line
//! of their parent key. Falls back to the closest ancestor found.

/// One step of a path into a YAML document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// Renders a path as `apps[1].load.to`.
pub fn render(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if s.is_empty() => s.push_str(k),
            Seg::Key(k) => {
                s.push('.');
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_content(line: &str) -> bool {
    let t = line.trim_start();
    !t.is_empty() && !t.starts_with('#')
}

/// 1-based (line, column) of the deepest segment of `path` found.
pub fn locate(text: &str, path: &[Seg]) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    // The block being searched: lines [lo, hi) whose items sit at indentation
    // greater than `parent` (or any, at the top).
    let (mut lo, mut hi) = (0usize, lines.len());
    let mut found: Option<(usize, usize)> = None;
    let mut min_indent = 0usize;
    for seg in path {
        match seg {
            Seg::Key(k) => {
                // A flow mapping on the found line: search that line only.
                if let Some((l, _)) = found {
                    let line = lines[l - 1];
                    if let Some(pos) = line.find(&format!("{k}:")).filter(|_| line.contains('{')) {
                        return Some((l, pos + 1));
                    }
                }
                let key = format!("{k}:");
                let mut hit = None;
                let mut level = None;
                for (i, line) in lines.iter().enumerate().take(hi).skip(lo) {
                    if !is_content(line) {
                        continue;
                    }
                    let ind = indent(line);
                    let t = line.trim_start().trim_start_matches("- ");
                    let ind = ind + (line.trim_start().len() - t.len());
                    if ind < min_indent {
                        break;
                    }
                    let lvl = *level.get_or_insert(ind);
                    if ind == lvl && t.starts_with(&key) {
                        hit = Some((i, ind));
                        break;
                    }
                }
                let Some((i, ind)) = hit else { return found };
                found = Some((i + 1, ind + 1));
                lo = i + 1;
                // Children sit deeper, except a sequence written at the key's
                // own indentation (`apps:\n- name: a`).
                let same_level_seq = lines[lo.min(lines.len())..]
                    .iter()
                    .find(|l| is_content(l))
                    .is_some_and(|l| indent(l) == ind && l.trim_start().starts_with("- "));
                min_indent = if same_level_seq { ind } else { ind + 1 };
                hi = if same_level_seq {
                    (lo..lines.len())
                        .find(|&j| {
                            is_content(lines[j])
                                && (indent(lines[j]) < ind
                                    || (indent(lines[j]) == ind
                                        && !lines[j].trim_start().starts_with("- ")))
                        })
                        .unwrap_or(lines.len())
                } else {
                    block_end(&lines, lo, ind + 1)
                };
            }
            Seg::Index(n) => {
                let mut count = 0;
                let mut item_indent = None;
                let mut hit = None;
                for (i, line) in lines.iter().enumerate().take(hi).skip(lo) {
                    if !is_content(line) {
                        continue;
                    }
                    let ind = indent(line);
                    if !line.trim_start().starts_with("- ") {
                        continue;
                    }
                    if *item_indent.get_or_insert(ind) != ind {
                        continue;
                    }
                    if count == *n {
                        hit = Some((i, ind));
                        break;
                    }
                    count += 1;
                }
                let Some((i, ind)) = hit else { return found };
                found = Some((i + 1, ind + 3));
                // The item's own keys: its first line (after "- ") and the
                // following lines indented past the dash.
                lo = i;
                hi = block_end(&lines, i + 1, ind + 1);
                min_indent = ind + 2;
            }
        }
    }
    found
}

/// First line at or after `from` whose indentation is below `min`.
fn block_end(lines: &[&str], from: usize, min: usize) -> usize {
    (from..lines.len())
        .find(|&i| is_content(lines[i]) && indent(lines[i]) < min)
        .unwrap_or(lines.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "name: x\nnode:\n  nr_cores: 4\napps:\n  - name: a\n    load: {kind: constant, level: 2}\n  - name: b\n    load:\n      kind: ramp\n      to: 3\n";

    fn k(s: &str) -> Seg {
        Seg::Key(s.into())
    }

    #[test]
    fn finds_keys_items_and_flow_maps() {
        assert_eq!(locate(DOC, &[k("node"), k("nr_cores")]), Some((3, 3)));
        assert_eq!(
            locate(DOC, &[k("apps"), Seg::Index(0), k("name")]),
            Some((5, 5))
        );
        assert_eq!(
            locate(DOC, &[k("apps"), Seg::Index(0), k("load"), k("level")]),
            Some((6, 28))
        );
        assert_eq!(
            locate(DOC, &[k("apps"), Seg::Index(1), k("load"), k("to")]),
            Some((10, 7))
        );
        assert_eq!(
            locate(DOC, &[k("apps"), Seg::Index(1), k("name")]),
            Some((7, 5))
        );
        // Missing key: the closest ancestor.
        assert_eq!(
            locate(DOC, &[k("apps"), Seg::Index(1), k("nope")]),
            Some((7, 5))
        );
        let flat = "apps:\n- name: a\n- name: b\n  port: 3\nseed: 1\n";
        assert_eq!(
            locate(flat, &[k("apps"), Seg::Index(1), k("port")]),
            Some((4, 3))
        );
        assert_eq!(locate(flat, &[k("seed")]), Some((5, 1)));
        assert_eq!(
            render(&[k("apps"), Seg::Index(1), k("load")]),
            "apps[1].load"
        );
    }
}
