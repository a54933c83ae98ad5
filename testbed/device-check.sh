#!/usr/bin/env bash
# What only a real GPU machine can show, recorded in one run (docs/real-gpu.md holds the results):
#   1. `fleet facts` with `connection: local` against the real NVML, idle and with a foreign process
#      holding the GPU; what `fleet stop` does with that holder (it must be left alone); the plan
#      fleet makes from those facts.
#   2. The health sweep over 1/10/50 simulated hosts on a machine with more CPUs than the 2 that the
#      simulated hosts share with the client here.
# It runs as root on a machine with no network: fleet and its dependencies come as wheels in .whl/
# (Python 3.12), OpenSSH and psmisc as Debian packages in .deb/ when the machine lacks them
# (testbed/device-prepare.sh fetches both). Usage: testbed/device-check.sh OUTDIR
set -u
OUT=${1:?usage: testbed/device-check.sh OUTDIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
WHEELS=${WHEELS:-$REPO/.whl}
WORK=/tmp/fleet-gpu
mkdir -p "$OUT" "$WORK"
LOG=$OUT/device-check.log
exec > >(tee -a "$LOG") 2>&1
step() { printf '\n== %s\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; local rc=$?; printf '[rc=%s]\n' "$rc"; return "$rc"; }

step machine
show uname -srm
grep PRETTY_NAME /etc/os-release
echo "cpus: $(nproc)  python: $(command -v "$PY") ($("$PY" -V 2>&1))"
for tool in sshd ssh ssh-keygen fuser unshare nvidia-smi useradd; do
    printf '%s: %s\n' "$tool" "$(command -v "$tool" || echo missing)"
done

step "fleet from wheels (no network)"
rm -rf "$WORK/venv"
if "$PY" -m venv "$WORK/venv" 2>/dev/null; then
    "$WORK/venv/bin/python" -m pip install -q --no-index --no-deps --disable-pip-version-check "$WHEELS"/*.whl
else  # an interpreter without ensurepip: let its own pip install into the new venv
    "$PY" -m venv --without-pip "$WORK/venv"
    "$PY" -m pip --python "$WORK/venv/bin/python" install -q --no-index --no-deps "$WHEELS"/*.whl
fi
FLEET="$WORK/venv/bin/fleet"
show "$FLEET" --help >/dev/null || exit 1

step "a local host backed by the real NVML"
# The engine's interpreter is the machine's own python3 (it has nvidia-ml-py, as an engine venv does);
# sglang itself is not installed, so a dist-info stands in for its version, as on the simulated hosts.
ENGINE_SITE=$WORK/engine-site
mkdir -p "$ENGINE_SITE/sglang-0.5.23.dist-info" "$WORK/bin"
printf 'Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n' >"$ENGINE_SITE/sglang-0.5.23.dist-info/METADATA"
printf '#!/bin/sh\nexport PYTHONPATH=%s\nexec %s "$@"\n' "$ENGINE_SITE" "$(command -v "$PY")" >"$WORK/bin/engine-python"
chmod +x "$WORK/bin/engine-python"
# The same interpreter without its site-packages (no nvidia-ml-py): the probe falls back to nvidia-smi.
printf '#!/bin/sh\nexport PYTHONPATH=%s\nexec %s -S "$@"\n' "$ENGINE_SITE" "$(command -v "$PY")" >"$WORK/bin/python-without-nvml"
chmod +x "$WORK/bin/python-without-nvml"
INV=$WORK/inventory.yaml
cat >"$INV" <<EOF
hosts:
  gpu:
    connection: local
    engines: {sglang: $WORK/bin/engine-python}
    models_dir: $REPO/testbed/fleet_testbed/models
    state_dir: $WORK/state
    log_dir: $WORK/logs
    expected_gpus: {count: 1, name_contains: H200, compute_capability: "9.0"}
  gpu-via-nvidia-smi:  # the same machine, read through nvidia-smi
    connection: local
    engines: {sglang: $WORK/bin/python-without-nvml}
    models_dir: $REPO/testbed/fleet_testbed/models
    state_dir: $WORK/state
    log_dir: $WORK/logs
  gpu-as-blackwell:  # the same machine, described wrongly: facts must say so
    connection: local
    engines: {sglang: $WORK/bin/engine-python}
    models_dir: $REPO/testbed/fleet_testbed/models
    state_dir: $WORK/state
    log_dir: $WORK/logs
    expected_gpus: {count: 8, name_contains: RTX PRO 6000, compute_capability: "12.0"}
EOF
export FLEET_INVENTORY=$INV FLEET_PLAYBOOKS=$REPO/playbooks
show "$FLEET" facts --host gpu
"$FLEET" facts --host gpu --json >"$OUT/facts-idle.json"; echo "facts --json: rc=$?"
"$FLEET" facts --host gpu-via-nvidia-smi --json >"$OUT/facts-nvidia-smi.json"; echo "facts --json (nvidia-smi): rc=$?"
show "$FLEET" facts --host gpu-as-blackwell
show "$FLEET" plan qwen36-27b --host gpu
show "$FLEET" plan qwen35-nvfp4 --host gpu

step "raw readings beside fleet's"
show nvidia-smi
show nvidia-smi --query-gpu=index,name,uuid,compute_cap,memory.total,memory.used,temperature.gpu --format=csv,noheader,nounits
show ls -l /dev/nvidia*
"$PY" - <<'EOF'
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
calls = {
    "name": lambda: n.nvmlDeviceGetName(h),
    "cuda_compute_capability": lambda: n.nvmlDeviceGetCudaComputeCapability(h),
    "memory_info": lambda: vars(n.nvmlDeviceGetMemoryInfo(h)) if hasattr(n.nvmlDeviceGetMemoryInfo(h), "__dict__") else n.nvmlDeviceGetMemoryInfo(h),
    "nvlink_state_0": lambda: n.nvmlDeviceGetNvLinkState(h, 0),
    "current_clocks_throttle_reasons": lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h),
    "current_clocks_event_reasons": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
    "total_ecc_errors_uncorrected_volatile": lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
    "retired_pages_pending": lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h),
    "remapped_rows": lambda: n.nvmlDeviceGetRemappedRows(h),
    "mig_mode": lambda: n.nvmlDeviceGetMigMode(h),
    "pcie_link_gen_width": lambda: (n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h)),
    "driver_version": n.nvmlSystemGetDriverVersion,
    "cuda_driver_version": n.nvmlSystemGetCudaDriverVersion,
    "nvml_binding": lambda: __import__("importlib.metadata").metadata.version("nvidia-ml-py"),
}
for key, call in calls.items():
    try:
        print(f"{key}: {call()!r}")
    except Exception as exc:
        print(f"{key}: raises {type(exc).__name__}: {exc}")
n.nvmlShutdown()
EOF

step "a foreign process holds the GPU: facts see it, stop leaves it alone"
"$PY" -u -c "
import time, torch
x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')
print('holding', x.numel() >> 20, 'MiB', flush=True)
time.sleep(300)
" >"$WORK/holder.out" 2>&1 &
HOLDER=$!
for _ in $(seq 1 120); do grep -q holding "$WORK/holder.out" && break; kill -0 "$HOLDER" 2>/dev/null || break; sleep 0.5; done
cat "$WORK/holder.out"
echo "holder pid: $HOLDER"
show fuser -v /dev/nvidia*
show nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits
show "$FLEET" facts --host gpu
"$FLEET" facts --host gpu --json >"$OUT/facts-busy.json"; echo "facts --json: rc=$?"
show "$FLEET" plan qwen36-27b --host gpu
show "$FLEET" stop --host gpu  # refused: a foreign holder (exit 1), nothing stopped
if ! grep -q holding "$WORK/holder.out"; then echo "no holder: the GPU could not be taken"
elif kill -0 "$HOLDER" 2>/dev/null; then echo "holder $HOLDER still alive after fleet stop: OK"
else echo "holder $HOLDER KILLED by fleet stop: WRONG"; fi
show "$FLEET" stop --host gpu --force
sleep 1
state=$(awk '{print $3}' "/proc/$HOLDER/stat" 2>/dev/null)  # Z: exited, not yet collected by this script
if [ -n "$state" ] && [ "$state" != Z ]; then echo "holder $HOLDER alive after fleet stop --force: WRONG"; kill "$HOLDER"
else echo "holder $HOLDER stopped by fleet stop --force: OK"; fi
wait "$HOLDER" 2>/dev/null
[ "${SWEEP:-1}" = 1 ] || exit 0

step "health sweep over simulated hosts on $(nproc) CPUs"
. "$REPO/testbed/device-sshd.sh"
show sshd -V
SIZES=${SIZES:-1,10,50} RUNS=${RUNS:-5}
cd "$REPO" && SIM_SPEED=0 PYTHONPATH=$REPO/testbed timeout "${SWEEP_TIMEOUT_S:-300}" "$WORK/venv/bin/python" -u - "$SIZES" "$RUNS" <<'EOF' | tee "$OUT/sweep.md"
import sys, time
from dataclasses import replace
from fleet_testbed import bench, simhost

sizes, runs = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2])
bench.compile_fleet()
specs = [replace(simhost.extra_host(i), address=f"127.0.5.{i}") for i in range(1, max(sizes) + 1)]
started = time.monotonic()
sb = simhost.up(bench.ROOT / "sweep", specs, bench.PORT + 1)
print(f"{len(specs)} simulated hosts up in {time.monotonic() - started:.1f} s", file=sys.stderr)
try:
    print("\n".join(bench.bench_sweep(sb, specs, sizes, runs, f"### Health sweep on a {__import__('os').cpu_count()}-CPU machine (seconds, all hosts in parallel)")))
finally:
    simhost.down(bench.ROOT / "sweep")
EOF
echo "sweep rc=${PIPESTATUS[0]}"
