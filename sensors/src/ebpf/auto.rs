//! The `auto` choice between request boundary modes, from the evidence
//! the records of each kind accumulate in [`TargetStats`]: turns per
//! connection, connections that close, HTTP/2 prefaces and gRPC calls.

use super::target::TargetStats;
use super::Mode;

/// Connections average at least this many turns: keep-alive, use `turn`.
const TURNS_PER_CONN_FOR_TURN: f64 = 1.5;
/// Connections average at least this many gRPC calls: multiplexed, use
/// `grpc`; fewer (one call per connection) and `connection` counts them.
const CALLS_PER_CONN_FOR_GRPC: f64 = 1.5;
/// HTTP/2 without probes: a call on its own connection takes two or three
/// turns (settings, the call, acks); closing connections with fewer turns
/// than this are taken as one call each.
const H2_TURNS_PER_CALL_CONN: f64 = 4.0;

impl TargetStats {
    /// The mode in use: the requested one, or for `auto` what the records
    /// show (`Auto` while nothing has been seen).
    pub fn effective_mode(&self) -> Mode {
        if self.requested != Mode::Auto {
            return self.requested;
        }
        // Connections that close, about one per connection opened: what
        // `connection` mode needs.
        let closing = |opened: u64| self.conn.total_count * 2 >= opened;
        if self.grpc.total_count > 0 {
            // Calls seen by the uprobes. Connections with no preface seen
            // (open before tracing) count as multiplexed.
            let conns = self.h2_conns.max(self.conn.total_count);
            let per_conn = self.grpc.total_count as f64 / conns.max(1) as f64;
            if conns > 0 && per_conn < CALLS_PER_CONN_FOR_GRPC && closing(self.h2_conns) {
                return Mode::Connection;
            }
            return Mode::Grpc;
        }
        if self.h2_conns > 0 && self.probes.is_none() {
            // HTTP/2 without probes: its turns (settings, pings, window
            // updates) are not calls, but a short connection per call still
            // counts one; a busy multiplexed connection gets the turn
            // fallback (the warning says calls cannot be told apart).
            let turns_per_conn = self.turn.total_count as f64 / self.first_turns.max(1) as f64;
            return if closing(self.h2_conns) && turns_per_conn < H2_TURNS_PER_CALL_CONN {
                Mode::Connection
            } else {
                Mode::Turn
            };
        }
        if self.first_turns == 0 {
            return Mode::Auto;
        }
        let turns_per_conn = self.turn.total_count as f64 / self.first_turns as f64;
        // One turn per connection *and* connections that actually close
        // (not kept open with closes deferred to the end).
        let closing = self.conn.total_count * 2 >= self.first_turns;
        if turns_per_conn < TURNS_PER_CONN_FOR_TURN && closing {
            Mode::Connection
        } else {
            Mode::Turn
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_with(turns: u64, first_turns: u64, conns: u64) -> TargetStats {
        let mut t = TargetStats::new(Mode::Auto, 100, 0);
        t.turn.total_count = turns;
        t.first_turns = first_turns;
        t.conn.total_count = conns;
        t
    }

    #[test]
    fn auto_picks_connection_for_one_turn_per_closed_connection() {
        assert_eq!(stats_with(100, 100, 100).effective_mode(), Mode::Connection);
    }

    #[test]
    fn auto_picks_turn_for_keepalive() {
        assert_eq!(stats_with(1000, 10, 10).effective_mode(), Mode::Turn);
    }

    #[test]
    fn auto_picks_turn_when_connections_stay_open() {
        // One request each so far, but nothing closed: deferred closes.
        assert_eq!(stats_with(20, 20, 0).effective_mode(), Mode::Turn);
    }

    #[test]
    fn auto_is_undecided_before_any_request() {
        assert_eq!(stats_with(0, 0, 0).effective_mode(), Mode::Auto);
    }

    fn grpc_stats(calls: u64, h2: u64, closed: u64) -> TargetStats {
        let mut t = stats_with(calls * 3, h2, closed);
        t.grpc.total_count = calls;
        t.h2_conns = h2;
        t.probes = Some("grpc-go".into());
        t
    }

    #[test]
    fn auto_picks_grpc_for_multiplexed_streams() {
        assert_eq!(grpc_stats(1000, 1, 0).effective_mode(), Mode::Grpc);
        // Two calls per connection are already invisible to `connection`.
        assert_eq!(grpc_stats(200, 100, 100).effective_mode(), Mode::Grpc);
    }

    #[test]
    fn auto_picks_grpc_on_connections_open_before_tracing() {
        assert_eq!(grpc_stats(50, 0, 0).effective_mode(), Mode::Grpc);
    }

    #[test]
    fn auto_picks_connection_for_a_connection_per_call() {
        assert_eq!(grpc_stats(500, 500, 500).effective_mode(), Mode::Connection);
        // Not yet closed: still `grpc`, which counts them all meanwhile.
        assert_eq!(grpc_stats(500, 500, 0).effective_mode(), Mode::Grpc);
    }

    #[test]
    fn http2_without_probes_counts_short_connections_else_turns() {
        let h2 = |turns, first, closed| {
            let mut t = stats_with(turns, first, closed);
            t.h2_conns = first;
            t.effective_mode()
        };
        // A connection per call: two or three turns each, all closed.
        assert_eq!(h2(2500, 1000, 1000), Mode::Connection);
        // One multiplexed connection, open or closed at the end.
        assert_eq!(h2(5000, 1, 0), Mode::Turn);
        assert_eq!(h2(5000, 1, 1), Mode::Turn);
    }

    #[test]
    fn a_forced_mode_is_kept() {
        let mut t = stats_with(1000, 10, 10);
        t.requested = Mode::Connection;
        assert_eq!(t.effective_mode(), Mode::Connection);
    }
}
