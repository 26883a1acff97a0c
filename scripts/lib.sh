# Shell helpers shared by the scripts that start servers (source it; not run on its own).

# wait_http URL NAME PID LOG: waits up to 5 minutes for URL to answer 2xx; fails (exit 1) when
# process PID exits first or the time is up, naming NAME and where its LOG is.
wait_http() {
  for _ in $(seq 600); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "$2 exited; see $4" >&2; exit 1; }
    sleep 0.5
  done
  echo "$2 did not become ready; see $4" >&2
  exit 1
}
