#!/usr/bin/env bash
# Installs the Debian packages hp needs to build and test. Idempotent: packages already
# present are skipped, so a second run costs one dpkg query.
#
#   scripts/install-deps.sh          build + test dependencies
#
# Runs as root (apt-get) or through sudo when available.
set -euo pipefail

pkgs=(
    build-essential cmake pkg-config git clang-format
    clang libclang-rt-dev bc
    protobuf-c-compiler libprotobuf-c-dev
    libcriterion-dev
    libopenblas-dev
    libuv1-dev
    libgrpc-dev
    libsqlite3-dev
    libglpk-dev coinor-libclp-dev
    libjansson-dev
    libmicrohttpd-dev
    python3 python3-numpy python3-torch python3-grpcio python3-protobuf
    prometheus chromium libjs-chart.js fonts-dejavu-core
    slurmctld slurmd slurm-client munge systemd shellcheck curl
)

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=120 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=120 install -y --no-install-recommends "${missing[@]}"
