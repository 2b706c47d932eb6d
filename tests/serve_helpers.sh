# Shared by the tests of `marlhf serve` (tests/cli/serve.sh, serve_embeddings.sh), sourced
# after tests/cli_helpers.sh once `bin` and `tmp` are set: one server at a time, killed
# when the script exits.
server_pid=
port=
cleanup() { [ -n "$server_pid" ] && kill -9 "$server_pid" 2> /dev/null; }
trap cleanup EXIT

# start_server LOG ARGS...: the server on a free port (--port 0), waiting for its ready
# line (a generative model's or a reward model's); sets server_pid and port.
start_server() {
    local log=$1
    shift
    "$bin" serve --port 0 "$@" 2> "$log" &
    server_pid=$!
    wait_port "$server_pid" "$log" 's|^serve: listening on http://.*:\([0-9][0-9]*\) (\(reward \)\{0,1\}model .*)$|\1|p' 600
}

# stop_server: SIGTERM, then at most 20 s for the exit; sets stop_rc (124: hung, killed).
stop_server() {
    kill -TERM "$server_pid" 2> /dev/null
    wait_exit "$server_pid" 20
    stop_rc=$exit_rc
    server_pid=
}

# request METHOD PATH [BODY [CURL ARGS...]]: the body of the answer in $tmp/body, the
# status on stdout (000: no answer within 60 s).
request() {
    local method=$1 path=$2
    shift 2
    local data=()
    if [ $# -gt 0 ]; then
        data=(--data-binary "$1")
        shift
    fi
    curl -s --max-time 60 -X "$method" -o "$tmp/body" -w '%{http_code}' -H 'Content-Type: application/json' \
        "${data[@]}" "$@" "http://127.0.0.1:$port$path"
}
