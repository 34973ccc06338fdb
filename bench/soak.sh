#!/usr/bin/env bash
# bench/soak.sh — hpd under churn for at most 10 minutes (bench/soak.py does the work):
# 50 WatchJob streams, a burst of submits every 20 s, an hp-worker SIGKILLed every 30 s, hpd
# SIGKILLed and restarted every 2 minutes; then a drain until every job is final (at most
# --drain-s, default 300). Checks, from the store: every job final and SUCCEEDED, every step of
# every job's every rank in the metrics exactly once. Prints the counts and hpd's RSS per
# incarnation (after a 20 s warm-up, and at its end).
#
#   bench/soak.sh [--minutes N] [--build DIR] [--watchers W] [--burst B] [--burst-s S]
#                 [--steps N] [--slots N] [--drain-s S] [--keep]
#
# Defaults: --minutes 10 (the most), --build build. Exit 0: every check held.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
args=()
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
        --keep) args+=("$1"); shift ;;
        --minutes | --watchers | --burst | --burst-s | --steps | --slots | --drain-s)
            [ $# -ge 2 ] || { echo "bench/soak.sh: $1 needs a value" >&2; exit 2; }
            args+=("$1" "$2"); shift 2 ;;
        *) echo "bench/soak.sh: unknown flag $1" >&2; exit 2 ;;
    esac
done
for f in daemon/hpd client/hpctl worker/hp-worker proto/hp.desc; do
    [ -e "$build/$f" ] || { echo "bench/soak.sh: no $build/$f (build first)" >&2; exit 2; }
done
exec /usr/bin/python3 bench/soak.py --hpd "$build/daemon/hpd" --hpctl "$build/client/hpctl" \
    --desc "$build/proto/hp.desc" "${args[@]}"
