//! The checks every file qosd reads passes before it is parsed, so that
//! hostile input fails fast with a position: only regular files (a FIFO
//! would block `read`, `/dev/zero` never ends, a directory is not
//! "missing"), a size cap per kind of file ([`Kind`]), a time cap, UTF-8
//! with the position of the first bad byte and no byte-order mark; for
//! YAML also a nesting limit (deep nesting is quadratic in both YAML
//! parsers) and no duplicate key (serde reports those without a line).
//! Config, policy, scenario, trace, calibration, model, token, state,
//! timeline and summary files all come through [`read_kind`].

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use yaml_rust2::parser::{Event, Parser};

use super::FileError;

/// The largest YAML file qosd reads (config, policy, scenario, model):
/// far above any real one (the shipped files are a few KiB), small enough
/// to parse fast.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// How long reading one file may take. A regular file on a local disk
/// reads its cap in well under a second; past this the read is given up
/// (checked between chunks: a read(2) that blocks forever, on a hung
/// network filesystem, is not interrupted).
pub const MAX_READ_TIME: Duration = Duration::from_secs(10);

/// The kinds of file qosd reads, each with its own size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Config, policy, scenario or fitted model (YAML).
    Yaml,
    /// A scenario's load trace (`t_s,level` CSV): a day at a row per
    /// second is about 2 MiB; the cap holds a row every 30 ms for a day.
    Trace,
    /// `calibration.json` from `qosd calibrate` or a replay.
    Calibration,
    /// The API's write token: one line.
    Token,
    /// The state file (a few hundred bytes per change of every app).
    State,
    /// A replay's `timeline.csv` (one row per app per interval).
    Timeline,
    /// A replay's `summary.json` or `seeds.json`.
    Summary,
}

impl Kind {
    pub fn max_bytes(self) -> u64 {
        match self {
            Kind::Yaml | Kind::Calibration | Kind::Summary => MAX_FILE_BYTES,
            Kind::Trace | Kind::State => 64 << 20,
            Kind::Timeline => 256 << 20,
            Kind::Token => 4 << 10,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Yaml => "a regular YAML file",
            Kind::Trace => "a regular CSV file (t_s,level)",
            Kind::Calibration => "a regular calibration.json",
            Kind::Token => "a regular token file",
            Kind::State => "a regular qosd state file",
            Kind::Timeline => "a regular timeline.csv",
            Kind::Summary => "a regular JSON file",
        }
    }
}

/// A size in the unit that reads best (`16 MiB`, `4 KiB`).
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// The deepest nesting of mappings and sequences accepted; the shipped
/// files need 5.
pub const MAX_DEPTH: usize = 32;

fn whole_file(path: &Path, msg: String) -> FileError {
    FileError {
        path: path.to_owned(),
        line: 0,
        col: 0,
        key: String::new(),
        msg,
    }
}

/// What a non-regular file is, for the message.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Reads a YAML file ([`Kind::Yaml`]); see [`read_kind`].
pub fn read(path: &Path) -> Result<String, FileError> {
    read_kind(path, Kind::Yaml)
}

/// Reads a file as UTF-8 text without a byte-order mark. Anything but a
/// regular file of at most `kind`'s cap, read within [`MAX_READ_TIME`], is
/// refused, saying what it is.
pub fn read_kind(path: &Path, kind: Kind) -> Result<String, FileError> {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused
    // below); it changes nothing for a regular file.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| whole_file(path, format!("cannot read: {e}")))?;
    read_open(path, file, kind)
}

/// [`read_kind`] on a file the caller opened itself (with `O_NOFOLLOW`,
/// after checking its owner, ...). Open it with `O_NONBLOCK`, or a FIFO
/// blocks before this sees it.
pub fn read_open(path: &Path, file: std::fs::File, kind: Kind) -> Result<String, FileError> {
    let meta = file
        .metadata()
        .map_err(|e| whole_file(path, format!("cannot read: {e}")))?;
    if !meta.is_file() {
        let what = kind_of(meta.file_type());
        return Err(whole_file(
            path,
            format!("{what}: expected {}", kind.what()),
        ));
    }
    let cap = kind.max_bytes();
    if meta.len() > cap {
        return Err(whole_file(path, format!("larger than {}", size(cap))));
    }
    let bytes = read_capped(path, file, cap)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        // `good` is valid UTF-8 by construction.
        let before = std::str::from_utf8(good).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        FileError {
            path: path.to_owned(),
            line,
            col,
            key: String::new(),
            msg: "not UTF-8 text (an invalid byte here)".to_owned(),
        }
    })?;
    Ok(strip_bom(&text).to_owned())
}

/// At most `cap` bytes (one more is an error: a file that grew after its
/// size was checked), in chunks, within [`MAX_READ_TIME`].
fn read_capped(path: &Path, mut file: std::fs::File, cap: u64) -> Result<Vec<u8>, FileError> {
    let start = Instant::now();
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = match file.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(whole_file(path, format!("cannot read: {e}"))),
        };
        if n == 0 {
            return Ok(bytes);
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() as u64 > cap {
            return Err(whole_file(path, format!("larger than {}", size(cap))));
        }
        if start.elapsed() > MAX_READ_TIME {
            return Err(whole_file(
                path,
                format!(
                    "not read within {} s (a slow or stuck filesystem?)",
                    MAX_READ_TIME.as_secs()
                ),
            ));
        }
    }
}

/// The text without a UTF-8 byte-order mark (editors on Windows write one;
/// the YAML parser would read it as content).
pub fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Checks the document's shape before serde parses it: nesting at most
/// [`MAX_DEPTH`] deep and no key twice in one mapping, each refused at its
/// line and column. Syntax errors are left to serde, whose messages say more.
/// Linear in the text; stops at the first problem.
pub fn precheck(path: &Path, text: &str) -> Result<(), FileError> {
    enum Frame {
        Map {
            expect_key: bool,
            keys: HashSet<String>,
        },
        Seq,
    }
    let at = |line, col, msg: String| FileError {
        path: path.to_owned(),
        line,
        col,
        key: String::new(),
        msg,
    };
    let mut parser = Parser::new_from_str(text);
    let mut frames: Vec<Frame> = Vec::new();
    loop {
        let (ev, mark) = match parser.next_token() {
            Ok(x) => x,
            // The scanner looks ahead through flow nesting and stops at its
            // own limit (255) before the events reach ours.
            Err(e) if e.info().contains("recursion limit") => {
                let m = e.marker();
                return Err(at(
                    m.line(),
                    m.col() + 1,
                    format!("nested more than {MAX_DEPTH} levels deep"),
                ));
            }
            // Other syntax errors: serde's messages say more.
            Err(_) => break,
        };
        let (line, col) = (mark.line(), mark.col() + 1);
        // A tag changes what a value is behind the reader's back
        // (`name: !!binary d2Vi` is the name `web`): none is accepted.
        if let Event::Scalar(_, _, _, Some(t))
        | Event::MappingStart(_, Some(t))
        | Event::SequenceStart(_, Some(t)) = &ev
        {
            return Err(at(
                line,
                col,
                format!(
                    "YAML tag `{}{}` is not accepted: write the value itself",
                    match t.handle.as_str() {
                        "tag:yaml.org,2002:" => "!!".to_owned(),
                        h => short(h),
                    },
                    short(&t.suffix)
                ),
            ));
        }
        // A node starts: a key, a value or an item of the innermost frame.
        let node = matches!(
            ev,
            Event::Scalar(..)
                | Event::Alias(_)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
        );
        if node {
            if let Some(Frame::Map { expect_key, keys }) = frames.last_mut() {
                if *expect_key {
                    if let Event::Scalar(k, ..) = &ev {
                        if !keys.insert(k.clone()) {
                            return Err(at(line, col, format!("duplicate key `{}`", short(k))));
                        }
                    }
                }
                *expect_key = !*expect_key;
            }
        }
        match ev {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                if frames.len() >= MAX_DEPTH {
                    return Err(at(
                        line,
                        col,
                        format!("nested more than {MAX_DEPTH} levels deep"),
                    ));
                }
                frames.push(if matches!(ev, Event::MappingStart(..)) {
                    Frame::Map {
                        expect_key: true,
                        keys: HashSet::new(),
                    }
                } else {
                    Frame::Seq
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                frames.pop();
            }
            Event::StreamEnd => break,
            _ => {}
        }
    }
    Ok(())
}

/// At most 40 characters of `s`, for messages that quote file content.
pub fn short(s: &str) -> String {
    const MAX: usize = 40;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// `msg` with every quoted part ("…" or `…`) longer than 40 characters cut:
/// an error about a file that is not YAML (`policy: /etc/passwd`) names
/// the problem without echoing the file.
pub fn elide_quotes(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(512));
    let mut rest = msg;
    while let Some(i) = rest.find(['"', '`']) {
        let q = rest[i..].chars().next().unwrap_or('"');
        out.push_str(&rest[..=i]);
        let after = &rest[i + 1..];
        match after.find(q) {
            Some(j) => {
                out.push_str(&short(&after[..j]));
                out.push(q);
                rest = &after[j + 1..];
            }
            None => {
                out.push_str(&short(after));
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(text: &str) -> Result<(), FileError> {
        precheck(Path::new("f.yaml"), text)
    }

    #[test]
    fn duplicate_keys_are_found_at_their_line() {
        let e = pre("a: 1\nb:\n  c: 1\n  d: 2\n  c: 3\n").unwrap_err();
        assert_eq!((e.line, e.col), (5, 3), "{e}");
        assert_eq!(e.msg, "duplicate key `c`");
        // The same key in two mappings, or as a value, is fine.
        pre("a: {x: 1}\nb: {x: a}\nl: [{x: 1}, {x: 2}]\n").unwrap();
        let e = pre("l: [{x: 1, x: 2}]\n").unwrap_err();
        assert_eq!((e.line, e.msg.as_str()), (1, "duplicate key `x`"));
    }

    #[test]
    fn tags_are_refused_at_their_position() {
        let e = pre("name: !!binary d2Vi\n").unwrap_err();
        assert_eq!(e.line, 1, "{e}");
        assert!(e.msg.contains("YAML tag `!!binary`"), "{e}");
        assert!(pre("a: !foo {x: 1}\n").unwrap_err().msg.contains("`!foo`"));
        assert!(pre("a: [!!str 1]\n").is_err());
        pre("a: '!!binary'\n").unwrap();
    }

    #[test]
    fn deep_nesting_stops_at_the_limit_in_linear_time() {
        // 100 000 levels: quadratic parsers took minutes on this.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = pre(&deep).unwrap_err();
        assert_eq!(e.line, 1, "{e}");
        assert!(e.msg.contains("nested more than 32 levels"), "{e}");
        let block: String = (0..40)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert!(pre(&block).unwrap_err().msg.contains("nested"));
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        pre(&ok).unwrap();
    }

    #[test]
    fn quoted_content_is_cut_in_messages() {
        let long = "root:x:0:0:root:/root:/bin/bash daemon:x:1:1:daemon:/usr/sbin";
        let m = elide_quotes(&format!("invalid type: string \"{long}\", expected x"));
        assert!(m.starts_with("invalid type: string \"root:x:0:0:root:/root:/bin/bash daemon:x…\""));
        assert!(m.ends_with(", expected x"), "{m}");
        assert_eq!(
            elide_quotes("unknown field `a`, expected `b`"),
            "unknown field `a`, expected `b`"
        );
        assert_eq!(short("é".repeat(50).as_str()).chars().count(), 41);
    }
}
