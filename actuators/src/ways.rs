//! The cache-way allocator: each app gets one contiguous run of capacity
//! bitmask bits, disjoint from every other app's, inside `cbm_mask` and at
//! least `min_cbm_bits` long (the rules Intel CAT and resctrl impose).

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WayAllocator {
    /// `info/L3/cbm_mask`: every way the hardware has.
    pub cbm_mask: u64,
    /// `info/L3/min_cbm_bits`: the shortest mask the hardware accepts.
    pub min_cbm_bits: u32,
}

impl WayAllocator {
    pub fn nr_ways(&self) -> u32 {
        self.cbm_mask.count_ones()
    }

    /// Places each request (in order) in `available` (a subset of
    /// `cbm_mask`: ways not held by anyone else), taking the highest free
    /// run that fits, so the low ways stay with the default group.
    pub fn allocate<K: Clone>(
        &self,
        available: u64,
        requests: &[(K, u32)],
    ) -> Result<Vec<(K, u64)>> {
        let mut free = available & self.cbm_mask;
        let total: u64 = requests.iter().map(|(_, n)| u64::from(*n)).sum();
        if requests.len() > 1 && total > u64::from(free.count_ones()) {
            return Err(Error::Invalid(format!(
                "{total} cache ways asked for by {} apps together, {} of the {} are free for them",
                requests.len(),
                free.count_ones(),
                self.nr_ways()
            )));
        }
        let mut out = Vec::with_capacity(requests.len());
        for (k, n) in requests {
            let n = *n;
            if n < self.min_cbm_bits.max(1) {
                return Err(Error::Invalid(format!(
                    "{n} cache ways is below the minimum of {} (min_cbm_bits)",
                    self.min_cbm_bits.max(1)
                )));
            }
            if n > self.nr_ways() {
                return Err(Error::Invalid(format!(
                    "{n} cache ways asked for, the cache has {} (cbm_mask {:x})",
                    self.nr_ways(),
                    self.cbm_mask
                )));
            }
            let mask = highest_run(free, n).ok_or_else(|| {
                Error::Invalid(format!(
                    "no {n} contiguous free cache ways left (free mask {free:x} of cbm_mask {:x})",
                    self.cbm_mask
                ))
            })?;
            free &= !mask;
            out.push((k.clone(), mask));
        }
        Ok(out)
    }
}

/// The highest run of `n` contiguous set bits of `free`.
fn highest_run(free: u64, n: u32) -> Option<u64> {
    if n == 0 || n > 64 {
        return None;
    }
    let run = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    (0..=64 - n)
        .rev()
        .map(|s| run << s)
        .find(|m| free & m == *m)
}

/// True when the set bits of `m` are one contiguous run.
pub fn is_contiguous(m: u64) -> bool {
    m != 0 && {
        let shifted = m >> m.trailing_zeros();
        shifted & (shifted + 1) == 0
    }
}

/// Parses a hex mask as resctrl prints it ("fffff", or "0xff" from pqos).
pub fn parse_mask(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    u64::from_str_radix(t, 16).map_err(|_| Error::Invalid(format!("bad cache bitmask {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn packs_from_the_top() {
        let a = WayAllocator {
            cbm_mask: 0xfffff,
            min_cbm_bits: 1,
        };
        let got = a.allocate(0xfffff, &[("a", 4), ("b", 2)]).unwrap();
        assert_eq!(got, vec![("a", 0xf0000), ("b", 0x0c000)]);
        assert!(a.allocate(0xfffff, &[("a", 21)]).is_err());
        assert!(a.allocate(0xfffff, &[("a", 0)]).is_err());
        // A hole too small for the request.
        assert!(a.allocate(0b1110111, &[("a", 4)]).is_err());
        assert!(is_contiguous(0x3c) && !is_contiguous(0x5) && !is_contiguous(0));
        assert_eq!(parse_mask("0xff\n").unwrap(), 0xff);
    }

    proptest! {
        #[test]
        fn allocation_is_contiguous_disjoint_within_mask(
            width in 1u32..24, lead in 0u32..8, min_bits in 1u32..4,
            holes in any::<u64>(),
            reqs in proptest::collection::vec(0u32..10, 0..6),
        ) {
            let cbm_mask = ((1u64 << width) - 1) << lead;
            let a = WayAllocator { cbm_mask, min_cbm_bits: min_bits };
            // Ways other owners hold: sparse random holes.
            let available = cbm_mask & !(holes & (holes >> 7) & (holes >> 13));
            let requests: Vec<(usize, u32)> = reqs.iter().copied().enumerate().collect();
            if let Ok(got) = a.allocate(available, &requests) {
                let mut union = 0u64;
                for (i, (k, m)) in got.iter().enumerate() {
                    prop_assert_eq!(*k, i);
                    prop_assert_eq!(m.count_ones(), reqs[i]);
                    prop_assert!(reqs[i] >= min_bits);
                    prop_assert!(is_contiguous(*m));
                    prop_assert_eq!(m & !available, 0, "outside the available ways");
                    prop_assert_eq!(union & m, 0, "overlaps another app");
                    union |= m;
                }
                // Every way is accounted for: given out or still free.
                let leftover = available & !union;
                prop_assert_eq!(union | leftover, available);
                prop_assert_eq!(union.count_ones() + leftover.count_ones(), available.count_ones());
            } else {
                // It failed: some request was too small, or did not fit
                // anywhere in what the ones before it left.
                let mut free = available;
                let mut failed = false;
                for &n in &reqs {
                    if n < min_bits || n > width { failed = true; break; }
                    match highest_run(free, n) {
                        Some(m) => free &= !m,
                        None => { failed = true; break; }
                    }
                }
                prop_assert!(failed);
            }
        }

        #[test]
        fn fits_whenever_the_free_ways_are_one_run(width in 1u32..24, reqs in proptest::collection::vec(1u32..6, 0..5)) {
            let cbm_mask = (1u64 << width) - 1;
            let a = WayAllocator { cbm_mask, min_cbm_bits: 1 };
            let total: u32 = reqs.iter().sum();
            let requests: Vec<(usize, u32)> = reqs.iter().copied().enumerate().collect();
            prop_assert_eq!(a.allocate(cbm_mask, &requests).is_ok(), total <= width);
        }
    }
}
