"""The Prometheus text format of health results, for node_exporter's textfile collector. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet.health.checks import SEVERITY, HostHealth


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class _Metric:
    name: str
    help: str
    type: str = "gauge"
    samples: list[str] = field(default_factory=list)


def prometheus_text(results: Sequence[HostHealth], now: float) -> str:
    """node_exporter textfile-collector format."""
    m = {
        "status": _Metric("fleet_host_status", "Worst check status: 0 ok, 1 warning, 2 critical, 3 unknown."),
        "check": _Metric("fleet_check_status", "Per check status: 0 ok, 1 warning, 2 critical, 3 unknown."),
        "up": _Metric("fleet_server_up", "1 if every recorded inference server of the host is alive."),
        "dup": _Metric("fleet_deployment_up", "1 if the deployment's recorded server process is alive."),
        "mem": _Metric("fleet_gpu_memory_used_bytes", "GPU memory used."),
        "temp": _Metric("fleet_gpu_temperature_celsius", "GPU temperature."),
        "dur": _Metric("fleet_health_check_duration_seconds", "Time to check the host."),
    }
    for r in results:
        h = _label(r.host)
        m["status"].samples.append(f'fleet_host_status{{host="{h}"}} {SEVERITY[r.status]}')
        m["up"].samples.append(f'fleet_server_up{{host="{h}"}} {int(r.server_up)}')
        m["dur"].samples.append(f'fleet_health_check_duration_seconds{{host="{h}"}} {r.duration_s:.3f}')
        for name, up in sorted(r.up.items()):
            m["dup"].samples.append(f'fleet_deployment_up{{host="{h}",deployment="{_label(name)}"}} {int(up)}')
        for c in r.checks:
            where = f',deployment="{_label(c.deployment)}"' if c.deployment else ""
            m["check"].samples.append(
                f'fleet_check_status{{host="{h}"{where},check="{_label(c.name)}"}} {SEVERITY[c.status]}'
            )
        for g in r.gpus:
            m["mem"].samples.append(
                f'fleet_gpu_memory_used_bytes{{host="{h}",gpu="{g["index"]}"}} {int(g["memory_used_mib"]) << 20}'
            )
            if g.get("temperature_c") is not None:
                m["temp"].samples.append(
                    f'fleet_gpu_temperature_celsius{{host="{h}",gpu="{g["index"]}"}} {g["temperature_c"]}'
                )
    lines: list[str] = []
    for metric in m.values():
        lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.type}", *metric.samples]
    lines += [
        "# HELP fleet_health_last_run_timestamp_seconds When fleet health last ran.",
        "# TYPE fleet_health_last_run_timestamp_seconds gauge",
        f"fleet_health_last_run_timestamp_seconds {now:.3f}",
    ]
    return "\n".join(lines) + "\n"
