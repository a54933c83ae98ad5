#!/usr/bin/env bash
# Interleaved A/B of the cold health sweep on a machine with more CPUs (as root, no network): fleet as
# committed at BEFORE_REV against the working tree, both installed from wheels (.whl/ holds the
# dependencies and the working tree's fleet, .whl-before/ the other fleet; testbed/device-prepare.sh
# makes them, with BEFORE_REV=<rev>). Usage: testbed/device-sweep-ab.sh OUTDIR
set -u
OUT=${1:?usage: testbed/device-sweep-ab.sh OUTDIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
WORK=/tmp/fleet-ab
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/sweep-ab.log") 2>&1
for build in before after; do
    rm -rf "$WORK/$build" && "$PY" -m venv "$WORK/$build" || exit 1
done
deps=$(ls "$REPO"/.whl/*.whl | grep -v /fleet-)
"$WORK/before/bin/python" -m pip install -q --no-index --no-deps $deps "$REPO"/.whl-before/fleet-*.whl || exit 1
"$WORK/after/bin/python" -m pip install -q --no-index --no-deps $deps "$REPO"/.whl/fleet-*.whl || exit 1
. "$REPO/testbed/device-sshd.sh"
cd "$REPO" && PYTHONPATH=$REPO/testbed "$WORK/after/bin/python" -u -m fleet_testbed.sweep_ab \
    --a "$WORK/before/bin/fleet" --b "$WORK/after/bin/fleet" --hosts "${HOSTS:-50}" --runs "${RUNS:-10}"
