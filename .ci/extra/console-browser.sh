#!/usr/bin/env bash
# The web console tested in a real browser: headless Chromium from Debian's packages, driven over
# the Chrome DevTools Protocol by node/tests/browser/console_browser.py (websocket-client from
# PyPI, in a venv under target/), against a dev cluster (three members on free loopback ports,
# SQS access keys set, so the console asks for a login). Screenshots of every step are kept in
# the directory printed below ($CONSOLE_ARTIFACTS, or target/console-browser). Run by .ci/run
# (as root, CI=true), which lets this script install Chromium; elsewhere install it first.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "console-browser: needs chromium (apt-get install -y chromium)"; exit 1
  fi
fi
chromium=$(command -v chromium)

target_dir=${CARGO_TARGET_DIR:-target}
venv="$target_dir/browser-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check "websocket-client>=1.6,<2"

cargo build --quiet -p trireme-node --bin trireme-node -p trireme-client --bin trireme
node_binary="$target_dir/debug/trireme-node"
cli_binary="$target_dir/debug/trireme"

artifacts=${CONSOLE_ARTIFACTS:-$target_dir/console-browser}
rm -rf "$artifacts"
mkdir -p "$artifacts"
artifacts=$(cd "$artifacts" && pwd)
echo "console-browser: screenshots go to $artifacts"

# Four bases of three free ports each (gRPC, SQS, peers, metrics), far from the defaults.
read -r grpc_base sqs_base peer_base metrics_base < <(python3 - <<'EOF'
import random, socket
def free(base):
    for port in range(base, base + 3):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        finally:
            s.close()
    return True
bases = []
for _ in range(1000):
    base = random.randrange(20000, 60000, 3)
    if free(base) and all(abs(base - other) >= 3 for other in bases):
        bases.append(base)
    if len(bases) == 4:
        break
print(*bases)
EOF
)

root=$(mktemp -d)
key_id=console
key_secret=console-secret-$RANDOM$RANDOM
log="$root/dev-cluster.log"
TRIREME_SQS_ACCESS_KEYS="$key_id:$key_secret" "$node_binary" dev-cluster \
  --data-dir "$root/cluster" --grpc-port "$grpc_base" --sqs-port "$sqs_base" \
  --peer-port "$peer_base" --metrics-port "$metrics_base" >"$log" 2>&1 &
cluster_pid=$!
stop() {
  kill -TERM "$cluster_pid" 2>/dev/null || true
  wait "$cluster_pid" 2>/dev/null || true
  rm -rf "$root"
}
trap stop EXIT

# Every member ready (joined, a quorum reachable): at most 60 s.
for member in 0 1 2; do
  port=$((metrics_base + member))
  for attempt in $(seq 300); do
    if "$node_binary" probe "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then
      break
    fi
    if ! kill -0 "$cluster_pid" 2>/dev/null || [ "$attempt" = 300 ]; then
      echo "console-browser: member on $port never became ready:"; cat "$log"; exit 1
    fi
    sleep 0.2
  done
done

if ! "$venv/bin/python" node/tests/browser/console_browser.py "$chromium" \
    "http://127.0.0.1:$metrics_base" "$cli_binary" "http://127.0.0.1:$grpc_base" \
    "$artifacts" "$key_id" "$key_secret"; then
  echo "--- dev-cluster log ---"; cat "$log"; exit 1
fi
echo "console-browser: passed; screenshots in $artifacts"
