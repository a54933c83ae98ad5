"""Stand-in `nvidia-smi` for a simulated host: the `--query-gpu` / `--query-compute-apps` CSV forms and
the plain header (driver/CUDA version), driven by the same data as the stand-in pynvml."""

from __future__ import annotations

import sys

from fleet_testbed import gpustate

FIELDS = {
    "index": lambda g: str(g["index"]),
    "name": lambda g: g["name"],
    "uuid": lambda g: g["uuid"],
    "compute_cap": lambda g: g["compute_capability"],
    "memory.total": lambda g: str(g["memory_total_mib"]),
    "memory.used": lambda g: str(g["memory_used_mib"]),
    "memory.free": lambda g: str(g["memory_total_mib"] - g["memory_used_mib"]),
    "temperature.gpu": lambda g: str(g.get("temperature_c", 35)),
}


def main(argv: list[str]) -> int:
    host = gpustate.load_host()
    if host.get("nvidia_smi_broken"):
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", file=sys.stderr)
        return 9
    table = gpustate.gpu_table()
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    apps = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-compute-apps=")), None)
    if query:
        for g in table:
            print(", ".join(FIELDS[f](g) for f in query.split(",")))
        return 0
    if apps:
        for g in table:
            for p in g["processes"]:
                row = {"gpu_uuid": g["uuid"], "pid": str(p["pid"]), "used_memory": str(p["used_mib"])}
                print(", ".join(row[f] for f in apps.split(",")))
        return 0
    print(
        f"| NVIDIA-SMI {host.get('driver_version')}   Driver Version: {host.get('driver_version')}"
        f"   CUDA Version: {host.get('cuda_version')} |"
    )
    for g in table:
        print(f"| {g['index']}  {g['name']}  {g['memory_used_mib']}MiB / {g['memory_total_mib']}MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
