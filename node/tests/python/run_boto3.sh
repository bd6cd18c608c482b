#!/usr/bin/env bash
# Runs boto3_smoke.py (boto3, and the aws CLI commands the SQS README shows) against a freshly started trireme-node: builds the node, creates a venv,
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

"$binary" --data-dir "$data_dir/db" --listen "127.0.0.1:$grpc_port" \
  --sqs-listen "127.0.0.1:$sqs_port" --sqs-advertised-host 127.0.0.1 >"$log" 2>&1 &
node_pid=$!
stop() {
  kill "$node_pid" 2>/dev/null || true
  wait "$node_pid" 2>/dev/null || true
  rm -rf "$data_dir"
}
trap stop EXIT

# Wait for the SQS listener: at most 30 s, in 0.2 s steps.
for _ in $(seq 150); do
  if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $sqs_port), 0.2)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$node_pid" 2>/dev/null; then
    echo "trireme-node exited early:"; cat "$log"; exit 1
  fi
  sleep 0.2
done

if ! "$venv/bin/python" node/tests/python/boto3_smoke.py "http://127.0.0.1:$sqs_port"; then
  echo "--- node log ---"; cat "$log"; exit 1
fi
