#!/usr/bin/env bash
# Runs boto3_smoke.py (boto3, and the aws CLI commands the SQS README shows) against a freshly
# started trireme-node, then against a freshly started three-member cluster with every call on
# the next member: builds the node, creates a venv,
# installs boto3 from PyPI into it, starts the node on free loopback ports with a temporary data
# directory, runs the checks, and stops the node. Called from .ci/run (via .ci/extra/).
set -euo pipefail
cd "$(dirname "$0")/../../.."

target_dir=${CARGO_TARGET_DIR:-target}
venv="$target_dir/boto3-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check "boto3>=1.34" "awscli>=1.32"

cargo build --quiet -p trireme-node --bin trireme-node
binary="$target_dir/debug/trireme-node"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
grpc_port=$(free_port)
sqs_port=$(free_port)
data_dir=$(mktemp -d)
log="$data_dir/node.log"
member_pids=()

"$binary" --data-dir "$data_dir/db" --listen "127.0.0.1:$grpc_port" \
  --sqs-listen "127.0.0.1:$sqs_port" --sqs-advertised-host 127.0.0.1 \
  --metrics-listen 127.0.0.1:0 >"$log" 2>&1 &
node_pid=$!
stop() {
  kill "$node_pid" "${member_pids[@]}" 2>/dev/null || true
  wait "$node_pid" "${member_pids[@]}" 2>/dev/null || true
  rm -rf "$data_dir"
}
trap stop EXIT

# Waits for the SQS listener on port $1 of the process $2 logging to $3: at most 30 s.
await_sqs() {
  for _ in $(seq 150); do
    if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$2" 2>/dev/null; then
      echo "trireme-node exited early:"; cat "$3"; exit 1
    fi
    sleep 0.2
  done
  echo "trireme-node never listened on $1:"; cat "$3"; exit 1
}
await_sqs "$sqs_port" "$node_pid" "$log"

if ! "$venv/bin/python" node/tests/python/boto3_smoke.py "http://127.0.0.1:$sqs_port"; then
  echo "--- node log ---"; cat "$log"; exit 1
fi

# The same checks against three cluster members, each call through the next one. The members
# advertise one address in queue URLs (member 1's, as a cluster behind one name would), and each
# accepts a URL of any host.
peer_ports=() member_sqs=() endpoints=()
for id in 1 2 3; do peer_ports+=("$(free_port)"); member_sqs+=("$(free_port)"); done
peers="1=127.0.0.1:${peer_ports[0]},2=127.0.0.1:${peer_ports[1]},3=127.0.0.1:${peer_ports[2]}"
# The members speak mutual TLS, with a CA and certificates made for this run.
certs="$data_dir/certs"
"$binary" certs --out "$certs" --nodes 3 >/dev/null
for id in 1 2 3; do
  port=${member_sqs[$((id - 1))]}
  TRIREME_CLUSTER_SECRET="boto3 run's shared cluster secret" "$binary" \
    --data-dir "$data_dir/member-$id" --listen "127.0.0.1:$(free_port)" \
    --sqs-listen "127.0.0.1:$port" --sqs-advertised-host 127.0.0.1 --metrics-listen 127.0.0.1:0 \
    --sqs-advertised-port "${member_sqs[0]}" \
    --node-id "$id" --peer-listen "127.0.0.1:${peer_ports[$((id - 1))]}" --peers "$peers" \
    --peer-tls-ca "$certs/ca.pem" --peer-tls-cert "$certs/node-$id.pem" \
    --peer-tls-key "$certs/node-$id-key.pem" \
    >"$data_dir/member-$id.log" 2>&1 &
  member_pids+=($!)
  endpoints+=("http://127.0.0.1:$port")
done
# A member with a new data directory serves once every peer has answered its join (it prints
# its data directory then, as its last line): at most 30 s.
await_joined() {
  for _ in $(seq 150); do
    grep -q "^trireme-node: data in " "$2" && return 0
    kill -0 "$1" 2>/dev/null || { echo "trireme-node exited early:"; cat "$2"; exit 1; }
    sleep 0.2
  done
  echo "trireme-node never joined:"; cat "$2"; exit 1
}
for id in 1 2 3; do
  await_sqs "${member_sqs[$((id - 1))]}" "${member_pids[$((id - 1))]}" "$data_dir/member-$id.log"
done
for id in 1 2 3; do
  await_joined "${member_pids[$((id - 1))]}" "$data_dir/member-$id.log"
done
if ! "$venv/bin/python" node/tests/python/boto3_smoke.py "$(IFS=,; echo "${endpoints[*]}")"; then
  for id in 1 2 3; do echo "--- member $id log ---"; cat "$data_dir/member-$id.log"; done
  exit 1
fi
