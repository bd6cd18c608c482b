#!/usr/bin/env bash
# Builds the Trireme image without a registry: the release binaries are built on this host and
# copied, with exactly the shared libraries they load, into an image FROM scratch. It has the
# same name, user (uid 10001), data directory, environment, ports, health check and entrypoint
# as the Dockerfile's image, so docker-compose.yml runs either unchanged.
#
#     docker/build-local.sh            # builds and tags trireme:local
#     TRIREME_IMAGE=name:tag docker/build-local.sh
#     docker/build-local.sh --no-cargo # reuses target/release as it is
#
# Needs: cargo, docker, ldd and ldconfig (glibc), nothing pulled.
set -euo pipefail
cd "$(dirname "$0")/.."

image="${TRIREME_IMAGE:-trireme:local}"
build=1
for arg in "$@"; do
  case "$arg" in
    --no-cargo) build=0 ;;
    *) echo "build-local.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

if [ "$build" = 1 ]; then
  cargo build --release --locked -p trireme-node -p trireme-client --bins
fi
target="${CARGO_TARGET_DIR:-target}/release"
binaries=("$target/trireme-node" "$target/trireme")
for binary in "${binaries[@]}"; do
  [ -x "$binary" ] || { echo "build-local.sh: $binary is missing (build without --no-cargo)" >&2; exit 1; }
done

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
root="$context/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc" "$context/data" "$context/certs"
install -m 0755 "${binaries[@]}" "$root/usr/local/bin/"

# Every library the binaries load, at the path the loader looks for it (the interpreter's path
# included, e.g. /lib64/ld-linux-x86-64.so.2); -L copies a symlink's target under its name.
libraries="$(ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)"
# Name resolution goes through NSS, which glibc loads at run time (ldd cannot see it): compose
# service names need the files and dns modules and the resolver library they use.
for module in libnss_files.so.2 libnss_dns.so.2 libresolv.so.2; do
  path="$(ldconfig -p | awk -v m="$module" '$1 == m && /x86-64|x86_64|aarch64|AArch64/ { print $NF; exit }')"
  [ -n "$path" ] || path="$(ldconfig -p | awk -v m="$module" '$1 == m { print $NF; exit }')"
  [ -n "$path" ] || { echo "build-local.sh: $module not found by ldconfig" >&2; exit 1; }
  libraries="$libraries"$'\n'"$path"
done
for library in $(printf '%s\n' "$libraries" | sort -u); do
  cp -L --parents "$library" "$root/"
done

cat > "$root/etc/nsswitch.conf" <<'NSS'
passwd: files
group: files
hosts: files dns
NSS
cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/nonexistent:/nonexistent
trireme:x:10001:10001:trireme:/var/lib/trireme:/nonexistent
PASSWD
cat > "$root/etc/group" <<'GROUP'
root:x:0:
trireme:x:10001:
GROUP

# The same runtime settings as the Dockerfile's final stage; keep the two in step.
cat > "$context/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
# The data directory is created by this COPY (of an empty directory), so that it is owned by
# the node's user; a named volume mounted on it starts with that owner.
COPY --chown=10001:10001 data /var/lib/trireme
# The same for the peers' certificates (docker-compose.yml's `certs` volume).
COPY --chown=10001:10001 certs /etc/trireme/certs
USER 10001:10001
ENV TRIREME_DATA_DIR=/var/lib/trireme \
    TRIREME_LISTEN=0.0.0.0:7100 \
    TRIREME_SQS_LISTEN=0.0.0.0:9324 \
    TRIREME_PEER_LISTEN=0.0.0.0:7200 \
    TRIREME_METRICS_LISTEN=0.0.0.0:9100
VOLUME ["/var/lib/trireme"]
EXPOSE 7100 9324 7200 9100
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/trireme-node", "probe", "http://127.0.0.1:9100/ready"]
ENTRYPOINT ["/usr/local/bin/trireme-node"]
DOCKERFILE
chmod 0750 "$context/data" "$context/certs"

docker build --quiet -t "$image" "$context" >/dev/null
echo "build-local.sh: built $image ($(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.1f MB", $1 / 1e6 }'))"
