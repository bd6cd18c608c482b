#!/usr/bin/env bash
# The three-node compose cluster under real faults (issue 12). It builds the image without a
# registry (docker/build-local.sh), starts docker-compose.yml under its own project name, waits
# until all three nodes are healthy, and runs the load generator (client/examples/fault_load.rs)
# against all three while it
#   1. SIGKILLs one container and starts it again,
#   2. cuts one container off the network (docker network disconnect) and reconnects it,
#   3. restarts all three, one at a time;
# then the generator drains and checks (no acknowledged send lost, no acknowledged delete
# delivered again, both queues readable on every node) and prints its counts, and this script
# checks the SQS endpoint of every node with Python's standard library. The cluster, its network
# and its volumes are removed whatever the outcome; every wait is bounded, the run after the
# build by COMPOSE_FAULTS_MAX_S (600 s).
#
# Settings (environment): TRIREME_GRPC_PORT_1..3, TRIREME_SQS_PORT_1..3 and
# TRIREME_METRICS_PORT_1..3 (host ports, default 7101-7103, 9325-9327 and 9101-9103), COMPOSE_FAULTS_MESSAGES (at most, default 6000),
# COMPOSE_FAULTS_RATE (sends per second, default 25), COMPOSE_FAULTS_NO_BUILD=1 (reuse the
# image and target/release as they are), COMPOSE_TOOL=v1|v2 (which Compose runs the cluster).
set -euo pipefail
cd "$(dirname "$0")/../.."

started=$(date +%s)
run_max_s="${COMPOSE_FAULTS_MAX_S:-600}"
say() { echo "compose-faults [$(( $(date +%s) - started )) s]: $*"; }
fail() { say "FAIL: $*"; exit 1; }
left() { echo $(( run_max_s - ($(date +%s) - started) )); }

# COMPOSE_TOOL=v1 runs `docker-compose`, v2 runs `docker compose` (the plugin); unset, whichever
# is installed, v1 first (this machine's own tool). .ci/extra/compose-v2.sh runs this script again
# under v2, so the compose file is proven with both.
case "${COMPOSE_TOOL:-}" in
  v1) compose_tool=(docker-compose) ;;
  v2) compose_tool=(docker compose) ;;
  "")
    if command -v docker-compose >/dev/null 2>&1; then
      compose_tool=(docker-compose)
    elif docker compose version >/dev/null 2>&1; then
      compose_tool=(docker compose)
    else
      fail "neither docker-compose nor docker compose is installed"
    fi ;;
  *) fail "COMPOSE_TOOL is v1 or v2, not ${COMPOSE_TOOL}" ;;
esac
"${compose_tool[@]}" version >/dev/null 2>&1 || fail "${compose_tool[*]} does not run"
say "compose tool: $("${compose_tool[@]}" version 2>/dev/null | head -1)"
project="trireme-faults-$$"
compose=("${compose_tool[@]}" -p "$project" -f docker-compose.yml)
export TRIREME_IMAGE="${TRIREME_IMAGE:-trireme:local}"
export TRIREME_GRPC_PORT_1="${TRIREME_GRPC_PORT_1:-7101}" TRIREME_GRPC_PORT_2="${TRIREME_GRPC_PORT_2:-7102}" TRIREME_GRPC_PORT_3="${TRIREME_GRPC_PORT_3:-7103}"
export TRIREME_SQS_PORT_1="${TRIREME_SQS_PORT_1:-9325}" TRIREME_SQS_PORT_2="${TRIREME_SQS_PORT_2:-9326}" TRIREME_SQS_PORT_3="${TRIREME_SQS_PORT_3:-9327}"
export TRIREME_METRICS_PORT_1="${TRIREME_METRICS_PORT_1:-9101}" TRIREME_METRICS_PORT_2="${TRIREME_METRICS_PORT_2:-9102}" TRIREME_METRICS_PORT_3="${TRIREME_METRICS_PORT_3:-9103}"
# A fresh secret per run: nothing outside this run can make a valid receipt handle.
TRIREME_CLUSTER_SECRET="faults-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
export TRIREME_CLUSTER_SECRET

work="$(mktemp -d)"
load_pid=""
watchdog=""
cleanup() {
  status=$?
  trap - EXIT
  [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null || true
  exec 3>&- || true
  if [ -n "$load_pid" ] && kill -0 "$load_pid" 2>/dev/null; then
    kill "$load_pid" 2>/dev/null || true
  fi
  if [ "$status" != 0 ]; then
    say "logs of the nodes (last 60 lines each):"
    for service in node1 node2 node3; do
      timeout 30 "${compose[@]}" logs --no-color --tail 60 "$service" 2>&1 | sed "s/^/  /" || true
    done
    [ -f "$work/load.log" ] && { say "load generator output:"; sed 's/^/  /' "$work/load.log"; }
  fi
  say "tearing down (containers, network, volumes)"
  timeout 120 "${compose[@]}" down --volumes --remove-orphans --timeout 5 >/dev/null 2>&1 \
    || say "docker-compose down failed; remove project $project by hand"
  rm -rf "$work"
  say "$([ "$status" = 0 ] && echo PASS || echo "FAIL (status $status)") in $(( $(date +%s) - started )) s"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# A write to the load generator after it exited fails (EPIPE) instead of killing this script.
trap '' PIPE

for port in "$TRIREME_GRPC_PORT_1" "$TRIREME_GRPC_PORT_2" "$TRIREME_GRPC_PORT_3" \
            "$TRIREME_SQS_PORT_1" "$TRIREME_SQS_PORT_2" "$TRIREME_SQS_PORT_3" \
            "$TRIREME_METRICS_PORT_1" "$TRIREME_METRICS_PORT_2" "$TRIREME_METRICS_PORT_3"; do
  if (exec 2>/dev/null; : > "/dev/tcp/127.0.0.1/$port"); then
    fail "host port $port is in use; set TRIREME_GRPC_PORT_n / TRIREME_SQS_PORT_n / TRIREME_METRICS_PORT_n"
  fi
done

if [ "${COMPOSE_FAULTS_NO_BUILD:-0}" != 1 ]; then
  say "building the release binaries and image $TRIREME_IMAGE, and the load generator"
  docker/build-local.sh
  # Apart from the binaries: an example is built with the crate's dev-dependencies, whose
  # features would change (and rebuild) every dependency the binaries share.
  cargo build --release --locked -p trireme-client --example fault_load
else
  docker/build-local.sh --no-cargo
fi
load_bin="${CARGO_TARGET_DIR:-target}/release/examples/fault_load"
[ -x "$load_bin" ] || fail "$load_bin is missing"
# The time limit counts from here: the build's time depends on the cache, the run's does not.
say "built; the run starts now (at most $run_max_s s; times below count from here)"
started=$(date +%s)
# The last bound: every step below is bounded too, but whatever hangs is stopped here (and the
# EXIT trap still tears the cluster down).
( sleep "$run_max_s"; say "out of time after $run_max_s s"; kill -TERM $$ ) &
watchdog=$!

# Container ids by service, known once the cluster is up (kill, start and restart keep them).
declare -A containers=()
container() {
  [ -n "${containers[$1]:-}" ] || containers[$1]="$("${compose[@]}" ps -q "$1")"
  echo "${containers[$1]}"
}
health() { docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$(container "$1")" 2>/dev/null || echo missing; }
# Waits until each named service reports healthy, at most $1 seconds.
wait_healthy() {
  local limit="$1"; shift
  local until=$(( $(date +%s) + limit )) service
  for service in "$@"; do
    while [ "$(health "$service")" != healthy ]; do
      [ "$(date +%s)" -lt "$until" ] || fail "$service not healthy within $limit s (is $(health "$service"))"
      [ "$(left)" -gt 0 ] || fail "out of time"
      sleep 1
    done
  done
}
# A phase for the load generator, which measures stalls per phase.
phase() {
  kill -0 "$load_pid" 2>/dev/null || fail "the load generator exited early"
  say "phase $1"
  echo "phase $1" >&3 || fail "the load generator stopped reading"
}

say "starting the cluster (project $project)"
timeout 120 "${compose[@]}" up -d
wait_healthy 120 node1 node2 node3
say "all three healthy"

network="$(docker inspect -f '{{range $name, $_ := .NetworkSettings.Networks}}{{$name}}{{end}}' "$(container node3)")"
[ -n "$network" ] || fail "cannot tell node3's network"

mkfifo "$work/commands"
"$load_bin" \
  --endpoint "http://127.0.0.1:$TRIREME_GRPC_PORT_1,http://127.0.0.1:$TRIREME_GRPC_PORT_2,http://127.0.0.1:$TRIREME_GRPC_PORT_3" \
  --messages "${COMPOSE_FAULTS_MESSAGES:-6000}" --rate "${COMPOSE_FAULTS_RATE:-25}" \
  --run-max-s 300 --drain-max-s 120 \
  --report "$work/report.json" < "$work/commands" > "$work/load.log" 2>&1 &
load_pid=$!
exec 3> "$work/commands"
ready_until=$(( $(date +%s) + 90 ))
until grep -q '^fault_load: ready' "$work/load.log"; do
  kill -0 "$load_pid" 2>/dev/null || fail "the load generator exited before it was ready"
  [ "$(date +%s)" -lt "$ready_until" ] || fail "the load generator was not ready within 90 s"
  sleep 1
done
say "$(grep '^fault_load: ready' "$work/load.log")"

phase steady
sleep 10

phase kill
victim="$(container node2)"
say "SIGKILL node2"
timeout 60 docker kill --signal KILL "$victim" >/dev/null
sleep 8
# A killed container may already be back by its restart policy; start it if it is not.
if [ "$(docker inspect -f '{{.State.Running}}' "$victim")" != true ]; then
  say "starting node2 again"
  timeout 60 docker start "$victim" >/dev/null
else
  say "node2 was restarted by its restart policy"
fi
wait_healthy 90 node2
say "node2 healthy again"
sleep 5

phase partition
isolated="$(container node3)"
say "cutting node3 off $network"
timeout 60 docker network disconnect "$network" "$isolated"
sleep 15
say "reconnecting node3 (alias node3, so its peers find it by name)"
timeout 60 docker network connect --alias node3 "$network" "$isolated"
wait_healthy 90 node3
say "node3 healthy again"
sleep 5

phase rolling
for service in node1 node2 node3; do
  say "restarting $service"
  timeout 60 "${compose[@]}" restart --timeout 20 "$service" >/dev/null
  wait_healthy 90 "$service"
  say "$service healthy again"
  sleep 3
done

phase after
sleep 5
say "drain"
echo drain >&3 || fail "the load generator stopped reading"
exec 3>&-
load_until=$(( $(date +%s) + 240 ))
while kill -0 "$load_pid" 2>/dev/null; do
  if [ "$(date +%s)" -ge "$load_until" ] || [ "$(left)" -le 0 ]; then
    fail "the load generator did not finish its drain and checks in time"
  fi
  sleep 1
done
load_status=0
wait "$load_pid" || load_status=$?
load_pid=""
grep '^fault_load:' "$work/load.log" | grep -v '^fault_load: phase [a-z]* at' | sed 's/^/  /'
[ "$load_status" = 0 ] || fail "the load generator's checks failed (status $load_status)"

say "the SQS endpoint of every node"
timeout 60 python3 - "$TRIREME_SQS_PORT_1" "$TRIREME_SQS_PORT_2" "$TRIREME_SQS_PORT_3" <<'PYTHON'
# SQS's JSON protocol through the standard library: the queues listed and described on every
# node, and one message sent on the first, received on the second and deleted on the third.
import json, sys, time, urllib.request, urllib.error

ports = sys.argv[1:]

def call(port, action, body, attempts=10):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/x-amz-json-1.0",
                 "X-Amz-Target": f"AmazonSQS.{action}"})
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return json.loads(reply.read() or b"{}")
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            last = error
            if isinstance(error, urllib.error.HTTPError) and error.code < 500:
                raise SystemExit(f"SQS {action} on port {port}: {error.code} {error.read()!r}")
            time.sleep(1)
    raise SystemExit(f"SQS {action} on port {port}: no answer after {attempts} attempts: {last}")

for port in ports:
    urls = call(port, "ListQueues", {}).get("QueueUrls", [])
    names = sorted(url.rsplit("/", 1)[-1] for url in urls)
    for name in ("faults", "faults-dlq"):
        if name not in names:
            raise SystemExit(f"SQS ListQueues on port {port} lacks {name}: {names}")
        url = call(port, "GetQueueUrl", {"QueueName": name})["QueueUrl"]
        attributes = call(port, "GetQueueAttributes",
                          {"QueueUrl": url, "AttributeNames": ["All"]})["Attributes"]
        print(f"  SQS on port {port}: {name} visible {attributes['ApproximateNumberOfMessages']}, "
              f"in flight {attributes['ApproximateNumberOfMessagesNotVisible']}")

first, second, third = ports
url = call(first, "CreateQueue", {"QueueName": "faults-sqs"})["QueueUrl"]
sent = call(first, "SendMessage", {"QueueUrl": url, "MessageBody": "through SQS"})
received = []
for _ in range(10):
    received = call(second, "ReceiveMessage", {"QueueUrl": url, "WaitTimeSeconds": 2,
                                               "MaxNumberOfMessages": 1}).get("Messages", [])
    if received:
        break
if not received or received[0]["MessageId"] != sent["MessageId"]:
    raise SystemExit(f"SQS: the message sent on port {first} was not received on port {second}: {received}")
call(third, "DeleteMessage", {"QueueUrl": url, "ReceiptHandle": received[0]["ReceiptHandle"]})
again = call(first, "ReceiveMessage", {"QueueUrl": url, "WaitTimeSeconds": 0}).get("Messages", [])
if again:
    raise SystemExit(f"SQS: a message deleted on port {third} was received again: {again}")
print(f"  SQS: sent on {first}, received on {second}, deleted on {third}")
PYTHON
say "done"
