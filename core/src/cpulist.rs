//! The kernel's CPU list format ("0-3,8,10-11"), as used by `cpuset.cpus`,
//! `thread_siblings_list`, `Cpus_allowed_list` and `taskset -c`: the one
//! parser and formatter of every crate.

/// A CPU list that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad CPU list {list:?}: {part:?} is not N or N-M")]
pub struct CpuListError {
    pub list: String,
    pub part: String,
}

/// Upper bound on a CPU id we accept, so a typo cannot allocate gigabytes.
const MAX_CPU: u32 = 1 << 16;

/// Parses "0-3,8" into a sorted, de-duplicated list. Empty input (or a
/// lone newline, as in an empty `cpuset.cpus`) is the empty list.
pub fn parse(s: &str) -> Result<Vec<u32>, CpuListError> {
    let mut out = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || CpuListError {
            list: s.to_owned(),
            part: part.to_owned(),
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<u32>().map_err(|_| bad())?,
                b.trim().parse::<u32>().map_err(|_| bad())?,
            ),
            None => {
                let n = part.parse::<u32>().map_err(|_| bad())?;
                (n, n)
            }
        };
        if lo > hi || hi > MAX_CPU {
            return Err(bad());
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Formats a list in the kernel's compact form ("0-3,8").
pub fn format(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && v[i + 1] == end + 1 {
            i += 1;
            end = v[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_kernel_forms() {
        assert_eq!(parse("0-3,8\n").unwrap(), vec![0, 1, 2, 3, 8]);
        assert_eq!(parse("\n").unwrap(), Vec::<u32>::new());
        assert_eq!(parse("5").unwrap(), vec![5]);
        assert!(parse("3-1").is_err());
        assert!(parse("a").is_err());
        assert!(parse("0-999999").is_err());
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format(&[]), "");
    }

    proptest! {
        #[test]
        fn round_trips(set in proptest::collection::btree_set(0u32..200, 0..40)) {
            let v: Vec<u32> = set.into_iter().collect();
            prop_assert_eq!(parse(&format(&v)).unwrap(), v);
        }
    }
}
