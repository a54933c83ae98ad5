#!/usr/bin/env bash
# Interleaved A/B of the cold health sweep, with the Fabric anchor in the same loop, on a machine with
# more CPUs (as root, no network): fleet as committed at BEFORE_REV against the working tree, each
# installed from its own wheels (.whl/ and .whl-before/, made by testbed/device-prepare.sh with
# BEFORE_REV=<rev>). Usage: [SIZES=1,10,50] [RUNS=10] testbed/device-sweep-ab.sh OUTDIR
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
"$WORK/before/bin/python" -m pip install -q --no-index --find-links "$REPO/.whl-before" "$REPO"/.whl-before/fleet-*.whl || exit 1
"$WORK/after/bin/python" -m pip install -q --no-index --find-links "$REPO/.whl" "$REPO"/.whl/fleet-*.whl || exit 1
. "$REPO/testbed/device-sshd.sh"
cd "$REPO" && PYTHONPATH=$REPO/testbed "$WORK/after/bin/python" -u -m fleet_testbed.sweep_ab \
    --a "$WORK/before/bin/fleet" --b "$WORK/after/bin/fleet" --sizes "${SIZES:-1,10,50}" --runs "${RUNS:-10}"
