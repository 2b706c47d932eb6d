# Sourced by the serving benches: start_server LOG ARGS... runs `$marlhf serve --port 0
# ARGS...` in the background with its log in LOG, waits (at most 60 s) for its ready line,
# and sets `server` (its pid) and `port`; stop_server ends it.
marlhf=${MARLHF:-build/marlhf}
server=
start_server() {
    local log=$1
    shift
    "$marlhf" serve --port 0 "$@" 2> "$log" &
    server=$!
    port=
    for _ in $(seq 600); do
        port=$(sed -n 's|^serve: listening on http://.*:\([0-9][0-9]*\) (\(reward \)\{0,1\}model .*)$|\1|p' "$log")
        [ -n "$port" ] && return 0
        sleep 0.1
    done
    cat "$log" >&2
    return 1
}
stop_server() {
    kill "$server"
    wait "$server" 2> /dev/null || true
    server=
}
