//! The evaluation's report as text: the Markdown table of paper 003's
//! Table 4.2, the stalls each contender met, the kernel hedger's counters,
//! the unrelated flow's check and the goals with their figures.

use super::{Report, STALL_MIN};
use crate::{flow, stall};

impl Report {
    /// The Markdown table of Table 4.2, the counters and the flow check.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| contender | requests | lost | P50 ms | P95 ms | P99 ms | max ms | duplicates | slowest request |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        );
        for r in &self.rows {
            let m = &r.summary;
            s += &format!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
                r.contender,
                m.requests,
                m.lost,
                m.p50_ms,
                m.p95_ms,
                m.p99_ms,
                m.max_ms,
                r.duplicates,
                match r.slowest {
                    Some((id, true)) => format!("id {id} (a slow id)"),
                    Some((id, false)) => format!("id {id} (a fast id)"),
                    None => "-".into(),
                }
            );
        }
        s += &self.stall_lines();
        let c = &self.kernel_counters;
        s += &format!(
            "\nkernel hedger: {}\n",
            c.pairs()
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        s +=
            &match &self.delay {
                Some(d) => {
                    format!(
                "delay line: qosd thread ({}, sleeps to {} µs before a due time, then spins; \
                 {:.0} ms of CPU), {} clones held, {} partial checksums completed, \
                 late p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs at {} (longest send {:.0} µs; \
                 stalls of the whole CPU meanwhile: {})\n",
                if d.realtime { "SCHED_FIFO" } else { "normal class" },
                crate::delay::SPIN_NS / 1000,
                d.cpu_ms,
                d.held,
                d.csum_completed,
                d.late_p50_us,
                d.late_p99_us,
                d.late_max_us,
                clock_of(d.late_max_at_ns),
                d.send_max_us,
                stall::describe(&self.delay_stalls),
            )
                }
                None => "delay line: netem\n".to_owned(),
            };
        let extra = 100.0 * c.hedges_sent as f64 / c.requests.max(1) as f64;
        s += &format!(
            "extra requests {extra:.2} % (budget {:.1} %)\n",
            f64::from(self.args.budget_permille) / 10.0
        );
        s += &flow::summary(&self.flow_rps, self.args.flow_requests);
        for (name, n, ns) in &self.flow_bpf {
            s += &format!(
                "unrelated flow, {name}: {n} runs, {:.0} ns per packet (bpf_stats, one more \
                 on-round after the measured ones, which run without the stats)\n",
                *ns as f64 / (*n).max(1) as f64
            );
        }
        s + "\n" + &self.goals()
    }

    /// Per contender: when its slowest request was sent and which stalls
    /// of a whole CPU ([`crate::stall`]) it met, and its run's stalls and
    /// steal time.
    fn stall_lines(&self) -> String {
        let mut s = format!(
            "\nstalls (a SCHED_FIFO watch thread per CPU woke > {} µs late: the CPU ran nothing else \
             it could preempt for) and steal time (/proc/stat):\n",
            STALL_MIN.as_micros()
        );
        for r in &self.rows {
            let at = r.slowest_at.map_or("-".into(), |(t, lat)| {
                format!("sent {}, {:.2} ms", clock_of(t), lat / 1000.0)
            });
            s += &format!(
                "- {}: slowest request {at}; stalls during it: {}; in the run: {} stalls, largest \
                 {:.2} ms, steal {}\n",
                r.contender,
                stall::describe(&r.slowest_stalls),
                r.nr_stalls,
                r.stall_max_us / 1000.0,
                r.steal_ms.map_or("unknown".into(), |m| format!("{m} ms")),
            );
        }
        s
    }

    /// The goals, each with the figures it compares.
    pub fn goals(&self) -> String {
        let get = |name: &str| {
            self.rows
                .iter()
                .find(|r| r.contender == name)
                .map(|r| r.summary)
        };
        let (Some(app), Some(kernel)) = (get("app-hedged"), get("kernel-hedged")) else {
            return String::new();
        };
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        let bound = self.args.t_hedge_ms + 2.0 * self.no_fault_p99_ms;
        let c = &self.kernel_counters;
        let extra = c.hedges_sent as f64 * 1000.0 / c.requests.max(1) as f64;
        let [q1, median, q3] = flow::quartiles(&flow::ratios(&self.flow_rps));
        format!(
            "- p99 kernel-hedged {:.2} ms <= T_hedge + 2 x no-fault p99 = {:.2} + 2 x {:.2} = {bound:.2} ms: {}\n\
             - max kernel-hedged {:.2} ms <= max app-hedged {:.2} ms over {} requests: {}\n\
             - extra requests {extra:.1} per 1000 <= budget {}: {}\n\
             - unrelated flow, median ratio with/without the hedger {median:.3} \
             (quartiles {q1:.3}-{q3:.3}) >= 0.99: {}\n",
            kernel.p99_ms,
            self.args.t_hedge_ms,
            self.no_fault_p99_ms,
            verdict(kernel.p99_ms <= bound),
            kernel.max_ms,
            app.max_ms,
            kernel.requests,
            verdict(kernel.max_ms <= app.max_ms),
            self.args.budget_permille,
            verdict(extra <= f64::from(self.args.budget_permille)),
            verdict(median >= 0.99),
        )
    }
}

/// A CLOCK_REALTIME stamp as UTC time of day, to the µs.
fn clock_of(ns: u64) -> String {
    let day_us = (ns / 1000) % 86_400_000_000;
    let (h, m) = (day_us / 3_600_000_000, day_us / 60_000_000 % 60);
    format!("{h:02}:{m:02}:{:09.6}", (day_us % 60_000_000) as f64 / 1e6)
}
