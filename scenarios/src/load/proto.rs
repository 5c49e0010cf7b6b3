//! Wire formats the load generator speaks: HTTP/1.1 requests and responses
//! (Content-Length, chunked, or read-to-close bodies) and the memcached text
//! protocol (`get`/`set`). Parsers are incremental: they look at the bytes
//! received so far and either return one complete response or ask for more.

/// What one complete response said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Success (HTTP 1xx–3xx, memcached VALUE/STORED/NOT_STORED).
    Ok,
    /// memcached `get` that found no value.
    Miss,
    /// HTTP 4xx/5xx or a memcached ERROR/CLIENT_ERROR/SERVER_ERROR line.
    Failed,
}

/// Result of looking at buffered bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse {
    /// A whole response: its length in bytes and what it said. `close` is
    /// true when the server announced it will close the connection.
    Done {
        len: usize,
        outcome: Outcome,
        close: bool,
    },
    /// Not enough bytes yet.
    Partial,
    /// HTTP body delimited by the end of the connection: complete on EOF.
    UntilClose { outcome: Outcome },
    /// Bytes that are not a valid response.
    Invalid(&'static str),
}

/// The kind of request in flight, so the reply can be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    Http,
    Get,
    Set,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses one HTTP/1.1 response at the start of `buf`.
pub fn parse_http(buf: &[u8]) -> Parse {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() > 64 * 1024 {
            Parse::Invalid("HTTP header over 64 KiB")
        } else {
            Parse::Partial
        };
    };
    let head = &buf[..head_end];
    let Ok(head) = std::str::from_utf8(head) else {
        return Parse::Invalid("HTTP header not UTF-8");
    };
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.split(' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Parse::Invalid("not an HTTP/1.x status line");
    }
    let Some(code) = parts.next().and_then(|c| c.parse::<u16>().ok()) else {
        return Parse::Invalid("HTTP status code missing");
    };
    let mut content_length = None;
    let mut chunked = false;
    let mut close = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse::<usize>() {
                Ok(n) => content_length = Some(n),
                Err(_) => return Parse::Invalid("bad Content-Length"),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    let outcome = if code < 400 {
        Outcome::Ok
    } else {
        Outcome::Failed
    };
    let body = head_end + 4;
    let no_body = (100..200).contains(&code) || code == 204 || code == 304;
    if no_body {
        return Parse::Done {
            len: body,
            outcome,
            close,
        };
    }
    if chunked {
        return match chunked_len(&buf[body..]) {
            Ok(Some(n)) => Parse::Done {
                len: body + n,
                outcome,
                close,
            },
            Ok(None) => Parse::Partial,
            Err(e) => Parse::Invalid(e),
        };
    }
    match content_length {
        Some(n) if buf.len() >= body + n => Parse::Done {
            len: body + n,
            outcome,
            close,
        },
        Some(_) => Parse::Partial,
        None => Parse::UntilClose { outcome },
    }
}

/// Length of a complete chunked body (through the last CRLF), if complete.
fn chunked_len(buf: &[u8]) -> Result<Option<usize>, &'static str> {
    let mut pos = 0;
    loop {
        let Some(eol) = find(&buf[pos..], b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[pos..pos + eol]).map_err(|_| "bad chunk size")?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| "bad chunk size")?;
        pos += eol + 2;
        if size == 0 {
            // Trailers end with an empty line.
            let Some(end) = find(&buf[pos..], b"\r\n") else {
                return Ok(None);
            };
            if end == 0 {
                return Ok(Some(pos + 2));
            }
            pos += end + 2;
            continue;
        }
        if buf.len() < pos + size + 2 {
            return Ok(None);
        }
        pos += size + 2;
    }
}

/// Parses one memcached text-protocol reply to a request of kind `kind`.
pub fn parse_memcache(buf: &[u8], kind: ReqKind) -> Parse {
    let Some(eol) = find(buf, b"\r\n") else {
        return if buf.len() > 4096 {
            Parse::Invalid("memcached line over 4 KiB")
        } else {
            Parse::Partial
        };
    };
    let line = &buf[..eol];
    if line.starts_with(b"ERROR")
        || line.starts_with(b"CLIENT_ERROR")
        || line.starts_with(b"SERVER_ERROR")
    {
        return Parse::Done {
            len: eol + 2,
            outcome: Outcome::Failed,
            close: false,
        };
    }
    match kind {
        ReqKind::Set => match line {
            b"STORED" | b"NOT_STORED" | b"EXISTS" => Parse::Done {
                len: eol + 2,
                outcome: Outcome::Ok,
                close: false,
            },
            _ => Parse::Invalid("unexpected reply to set"),
        },
        ReqKind::Get => {
            if line == b"END" {
                return Parse::Done {
                    len: eol + 2,
                    outcome: Outcome::Miss,
                    close: false,
                };
            }
            if !line.starts_with(b"VALUE ") {
                return Parse::Invalid("unexpected reply to get");
            }
            let Some(n) = std::str::from_utf8(line)
                .ok()
                .and_then(|l| l.split(' ').nth(3))
                .and_then(|n| n.parse::<usize>().ok())
            else {
                return Parse::Invalid("bad VALUE line");
            };
            let end = eol + 2 + n + 2 + 5; // data, CRLF, "END\r\n"
            if buf.len() < end {
                return Parse::Partial;
            }
            if &buf[end - 5..end] != b"END\r\n" {
                return Parse::Invalid("VALUE not followed by END");
            }
            Parse::Done {
                len: end,
                outcome: Outcome::Ok,
                close: false,
            }
        }
        ReqKind::Http => Parse::Invalid("HTTP request on a memcached connection"),
    }
}

/// Appends an HTTP/1.1 GET. `{seq}` in `path` becomes the request number, so
/// a fixture server can pick its slow requests by id (the same ones for
/// every contender).
pub fn write_http(out: &mut Vec<u8>, path: &str, host: &str, seq: u64, keepalive: bool) {
    let path = if path.contains("{seq}") {
        path.replace("{seq}", &seq.to_string())
    } else {
        path.to_owned()
    };
    out.extend_from_slice(b"GET ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\nUser-Agent: qosd-load\r\n");
    if !keepalive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends a memcached request for key number `key`.
pub fn write_memcache(out: &mut Vec<u8>, kind: ReqKind, key: u32, value_bytes: usize) {
    use std::io::Write;
    match kind {
        ReqKind::Set => {
            let _ = write!(out, "set key:{key:08} 0 0 {value_bytes}\r\n");
            out.resize(out.len() + value_bytes, b'x');
            out.extend_from_slice(b"\r\n");
        }
        _ => {
            let _ = write!(out, "get key:{key:08}\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_content_length_and_partial() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(
            parse_http(r),
            Parse::Done {
                len: r.len(),
                outcome: Outcome::Ok,
                close: false
            }
        );
        assert_eq!(parse_http(&r[..r.len() - 1]), Parse::Partial);
        let two = [&r[..], &r[..]].concat();
        assert_eq!(
            parse_http(&two),
            Parse::Done {
                len: r.len(),
                outcome: Outcome::Ok,
                close: false
            }
        );
    }

    #[test]
    fn http_chunked_status_close() {
        let r = b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(
            parse_http(r),
            Parse::Done {
                len: r.len(),
                outcome: Outcome::Failed,
                close: true
            }
        );
        assert_eq!(parse_http(&r[..r.len() - 2]), Parse::Partial);
        assert_eq!(
            parse_http(b"HTTP/1.0 200 OK\r\n\r\nbody"),
            Parse::UntilClose {
                outcome: Outcome::Ok
            }
        );
        assert!(matches!(parse_http(b"SSH-2.0\r\n\r\n"), Parse::Invalid(_)));
    }

    #[test]
    fn memcache_replies() {
        let hit = b"VALUE key:00000001 0 3\r\nabc\r\nEND\r\n";
        assert_eq!(
            parse_memcache(hit, ReqKind::Get),
            Parse::Done {
                len: hit.len(),
                outcome: Outcome::Ok,
                close: false
            }
        );
        assert_eq!(
            parse_memcache(&hit[..hit.len() - 1], ReqKind::Get),
            Parse::Partial
        );
        assert_eq!(
            parse_memcache(b"END\r\n", ReqKind::Get),
            Parse::Done {
                len: 5,
                outcome: Outcome::Miss,
                close: false
            }
        );
        assert_eq!(
            parse_memcache(b"STORED\r\n", ReqKind::Set),
            Parse::Done {
                len: 8,
                outcome: Outcome::Ok,
                close: false
            }
        );
        assert_eq!(
            parse_memcache(b"SERVER_ERROR out of memory\r\n", ReqKind::Set),
            Parse::Done {
                len: 28,
                outcome: Outcome::Failed,
                close: false
            }
        );
        let mut out = Vec::new();
        write_memcache(&mut out, ReqKind::Set, 7, 3);
        assert_eq!(out, b"set key:00000007 0 0 3\r\nxxx\r\n");
        out.clear();
        write_http(&mut out, "/r/{seq}", "h", 42, false);
        assert_eq!(
            out,
            b"GET /r/42 HTTP/1.1\r\nHost: h\r\nUser-Agent: qosd-load\r\nConnection: close\r\n\r\n"
        );
    }
}
