# The LC server managed by a `qosd run` daemon that asks for real time
# (sourced by idle_class.sh's +lcqosd and rt_gate.sh): the server as an LC
# app with `initial: { cpu_priority: 3 }`, only the priority knob enabled
# (the policy moves nothing else), so the gate makes its threads fifo:1 in
# a group with an RT budget while its CPU use allows. Uses the caller's
# QOSD, st (a temp dir), srv (the server's pid) and qd (the daemon's pid).

# lcqosd_config API: the daemon's config in $st/qosd.yaml, its API on API.
lcqosd_config() {
  cat >"$st/qosd.yaml" <<YAML
apps:
  - name: fixture
    match: { pid: $srv }
    class: lc
    target: { p99: 50ms }
    resources: { initial: { cpu_priority: 3 } }
policy: $PWD/policies/parties.yaml
monitor_interval_ms: 100
decide_interval_ms: 500
actuators: { enabled: [cpu_priority] }
sensors: { power: false }
api: { listen: "$1", token_file: $st/api.token }
state_file: $st/daemon-state.json
YAML
}

# start_daemon WHO: starts it and waits (10 s at most) until the gate has
# made the server's main thread real-time; WHO names the caller in errors.
start_daemon() {
  "$QOSD" run --config "$st/qosd.yaml" >"$st/daemon.log" 2>&1 & qd=$!
  for _ in $(seq 100); do
    [ "$(ps -o cls= -p "$srv" | tr -d ' ')" = FF ] && return
    kill -0 "$qd" 2>/dev/null || break
    sleep 0.1
  done
  echo "$1: the server is not real-time 10 s after qosd run started:" >&2
  tail -5 "$st/daemon.log" >&2; exit 1
}

# stop_daemon: SIGTERM (its own restore), waited for.
stop_daemon() {
  [ -n "$qd" ] || return 0
  kill -TERM "$qd" 2>/dev/null; wait "$qd" 2>/dev/null || true; qd=
}
