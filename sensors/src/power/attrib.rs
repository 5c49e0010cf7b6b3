//! Power attribution of paper 001 §3.1.1, pure arithmetic:
//!
//! eq. (1)  `W_i(t,s) = A_i(s,t) + HT_r/2 · O_i(s,t)`: thread i's weighted
//!          work on socket s, where A is work (cycles, or on-CPU time
//!          without a PMU) done while the SMT sibling was idle and O while it
//!          was busy;
//! eq. (2)  `P_i(t) = Σ_s P_s(t) · W_i(t,s) / Σ_k W_k(t,s)`: socket power
//!          split by weighted share, summed over sockets.

/// What one thread did on one socket over an interval, in the weight unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SocketUse {
    pub socket: usize,
    /// Work while the SMT sibling was idle (A of eq. (1)).
    pub alone: f64,
    /// Work while the SMT sibling was busy (O of eq. (1)).
    pub overlap: f64,
}

/// Eq. (1): weighted work. Each of two co-running hyperthreads weighs
/// HT_r / 2, so together they count HT_r times one thread alone.
pub fn weighted(alone: f64, overlap: f64, ht_ratio: f64) -> f64 {
    alone + ht_ratio / 2.0 * overlap
}

/// Splits work `total` done over `on_ns` of which `sib_busy_ns` with the
/// sibling busy into (alone, overlap), in proportion to time.
pub fn split(total: f64, on_ns: u64, sib_busy_ns: u64) -> (f64, f64) {
    if on_ns == 0 {
        return (total, 0.0);
    }
    let f = (sib_busy_ns.min(on_ns)) as f64 / on_ns as f64;
    (total * (1.0 - f), total * f)
}

/// Result of eq. (2) for one interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attribution {
    /// P_i per thread (same order as the input), W.
    pub thread_w: Vec<f64>,
    /// Σ_s W_i(s) per thread, in the weight unit.
    pub thread_weight: Vec<f64>,
    /// Σ_k W_k(s) per socket.
    pub socket_weight: Vec<f64>,
    /// Power given to threads per socket: P_s where any thread ran on s,
    /// else 0 (nothing to give it to), W.
    pub socket_attributed_w: Vec<f64>,
}

/// Eq. (2): attributes each socket's power `socket_w[s]` to the threads in
/// `uses` (one list of per-socket uses per thread).
pub fn attribute(socket_w: &[f64], uses: &[Vec<SocketUse>], ht_ratio: f64) -> Attribution {
    let n = socket_w.len();
    let mut socket_weight = vec![0.0; n];
    for u in uses.iter().flatten().filter(|u| u.socket < n) {
        socket_weight[u.socket] += weighted(u.alone, u.overlap, ht_ratio);
    }
    let mut thread_w = Vec::with_capacity(uses.len());
    let mut thread_weight = Vec::with_capacity(uses.len());
    for per_socket in uses {
        let mut p = 0.0;
        let mut w_sum = 0.0;
        for u in per_socket.iter().filter(|u| u.socket < n) {
            let w = weighted(u.alone, u.overlap, ht_ratio);
            w_sum += w;
            if socket_weight[u.socket] > 0.0 {
                p += socket_w[u.socket] * w / socket_weight[u.socket];
            }
        }
        thread_w.push(p);
        thread_weight.push(w_sum);
    }
    let socket_attributed_w = socket_w
        .iter()
        .zip(&socket_weight)
        .map(|(p, w)| if *w > 0.0 { *p } else { 0.0 })
        .collect();
    Attribution {
        thread_w,
        thread_weight,
        socket_weight,
        socket_attributed_w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// Eq. (1)-(2) on synthetic numbers, term by term.
    ///
    /// Socket 0 (40 W): a core whose two hyperthreads ran thread 1 and
    /// thread 2; thread 1 did 600 cycles alone and 400 with thread 2 beside
    /// it, thread 2 did 400 with thread 1 beside it. Thread 3 ran alone on
    /// another core of socket 0 (500) and on socket 1 (300).
    /// Socket 1 (10 W): thread 3's 300 and thread 4's 100 with its sibling
    /// busy. HT_r = 1.1.
    #[test]
    fn equations_1_and_2_term_by_term() {
        let ht = 1.1;
        let u = |socket, alone, overlap| SocketUse {
            socket,
            alone,
            overlap,
        };
        let uses = vec![
            vec![u(0, 600.0, 400.0)],
            vec![u(0, 0.0, 400.0)],
            vec![u(0, 500.0, 0.0), u(1, 300.0, 0.0)],
            vec![u(1, 0.0, 100.0)],
        ];
        // eq. (1) per thread and socket
        let w1_0 = 600.0 + 1.1 / 2.0 * 400.0; // 820
        let w2_0 = 0.0 + 0.55 * 400.0; // 220
        let w3_0 = 500.0;
        let w3_1 = 300.0;
        let w4_1 = 0.55 * 100.0; // 55
        assert!(close(weighted(600.0, 400.0, ht), w1_0));
        assert!(close(w1_0, 820.0) && close(w2_0, 220.0) && close(w4_1, 55.0));
        let sum0 = w1_0 + w2_0 + w3_0; // 1540
        let sum1 = w3_1 + w4_1; // 355
        let a = attribute(&[40.0, 10.0], &uses, ht);
        assert!(close(a.socket_weight[0], sum0) && close(a.socket_weight[1], sum1));
        // eq. (2)
        let p = [
            40.0 * w1_0 / sum0,
            40.0 * w2_0 / sum0,
            40.0 * w3_0 / sum0 + 10.0 * w3_1 / sum1,
            10.0 * w4_1 / sum1,
        ];
        for (got, want) in a.thread_w.iter().zip(p) {
            assert!(close(*got, want), "{got} != {want}");
        }
        assert!(close(a.thread_weight[2], 800.0));
        // Nothing is lost or created: Σ P_i = Σ_s P_s.
        assert!(close(a.thread_w.iter().sum::<f64>(), 50.0));
        assert_eq!(a.socket_attributed_w, vec![40.0, 10.0]);
    }

    #[test]
    fn ht_ratio_2_is_plain_sharing_and_1_halves_co_running_work() {
        let uses = vec![
            vec![SocketUse {
                socket: 0,
                alone: 0.0,
                overlap: 100.0,
            }],
            vec![SocketUse {
                socket: 0,
                alone: 100.0,
                overlap: 0.0,
            }],
        ];
        let a = attribute(&[30.0], &uses, 2.0);
        assert!(close(a.thread_w[0], 15.0) && close(a.thread_w[1], 15.0));
        let a = attribute(&[30.0], &uses, 1.0);
        assert!(close(a.thread_w[0], 10.0) && close(a.thread_w[1], 20.0));
    }

    #[test]
    fn a_socket_where_nothing_ran_attributes_nothing() {
        let uses = vec![vec![SocketUse {
            socket: 0,
            alone: 5.0,
            overlap: 0.0,
        }]];
        let a = attribute(&[12.0, 7.0], &uses, 1.1);
        assert_eq!(a.thread_w, vec![12.0]);
        assert_eq!(a.socket_attributed_w, vec![12.0, 0.0]);
    }

    #[test]
    fn split_by_time() {
        assert_eq!(split(1000.0, 100, 25), (750.0, 250.0));
        assert_eq!(split(1000.0, 0, 0), (1000.0, 0.0));
        assert_eq!(split(1000.0, 100, 200), (0.0, 1000.0), "clamped");
    }
}
