#!/usr/bin/env bash
# The compose cluster's fault test again, run by Compose v2 (`docker compose`), so that
# docker-compose.yml is proven with both tools (issue 12). This machine has only Compose v1
# (Debian bookworm's docker-compose 1.29); v2 is Debian trixie's docker-compose package, a Go
# binary that needs glibc >= 2.34 (bookworm has 2.36). It is fetched from Debian's archive at a
# pinned version, its SHA-256 checked, and installed as a CLI plugin into a Docker configuration
# directory of this run only (DOCKER_CONFIG): nothing on the machine changes, and `docker compose`
# resolves to it only inside this script.
#
# Settings: as .ci/extra/compose-faults.sh; COMPOSE_V2_DEB (a local copy of the .deb, for a
# machine without Debian's archive).
set -euo pipefail
cd "$(dirname "$0")/../.."

version="2.26.1-4"
sha256="47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea"
url="http://deb.debian.org/debian/pool/main/d/docker-compose/docker-compose_${version}_amd64.deb"
say() { echo "compose-v2: $*"; }

[ "$(uname -m)" = x86_64 ] || { say "FAIL: the pinned package is for amd64, this is $(uname -m)"; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
deb="$work/docker-compose.deb"
if [ -n "${COMPOSE_V2_DEB:-}" ]; then
  cp "$COMPOSE_V2_DEB" "$deb"
else
  say "fetching docker-compose $version from Debian's archive"
  curl --fail --silent --show-error --location --max-time 300 --retry 3 -o "$deb" "$url"
fi
echo "$sha256  $deb" | sha256sum --check --quiet - \
  || { say "FAIL: $deb does not have the pinned SHA-256"; exit 1; }
dpkg-deb -x "$deb" "$work/root"
export DOCKER_CONFIG="$work/docker-config"
mkdir -p "$DOCKER_CONFIG/cli-plugins"
install -m 0755 "$work/root/usr/libexec/docker/cli-plugins/docker-compose" "$DOCKER_CONFIG/cli-plugins/"
say "$(docker compose version)"
docker compose -f docker-compose.yml config --quiet
say "docker-compose.yml is valid for Compose v2"

# The image and the load generator from compose-faults.sh's own run (.ci/run runs it first),
# or built here when this script runs alone.
no_build=0
if docker image inspect "${TRIREME_IMAGE:-trireme:local}" >/dev/null 2>&1 \
  && [ -x "${CARGO_TARGET_DIR:-target}/release/examples/fault_load" ]; then
  no_build=1
fi
COMPOSE_TOOL=v2 COMPOSE_FAULTS_NO_BUILD="${COMPOSE_FAULTS_NO_BUILD:-$no_build}" \
  bash .ci/extra/compose-faults.sh
