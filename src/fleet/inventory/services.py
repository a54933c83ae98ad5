"""Services (`services/*.yaml`): one playbook served by several replicas behind the SGLang router,
validated with file:line errors like playbooks."""

from __future__ import annotations

from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from fleet.errors import ConfigError
from fleet.inventory.hosts import Inventory
from fleet.inventory.playbooks import NamedPlaybook, _check_gpus, _check_host_name
from fleet.inventory.strict import (
    NAME_RE,
    _check_remote_path,
    _Invalid,
    _Strict,
    parse_document,
)
from fleet.yamlfile import YamlDoc, load_yaml

# The router's load-balancing policies (sglang-router 0.3.2's --policy choices, less `manual`, which
# routes by a header fleet does not set).
Policy = Literal["cache_aware", "round_robin", "power_of_two", "random"]
MAX_SERVICE_NAME = 56  # a replica's deployment is NAME-<index>, and deployment names end at 63 characters


class Replica(_Strict, frozen=True, kw_only=True):
    host: str
    gpus: Annotated[int, Meta(ge=1, le=64)] | list[Annotated[int, Meta(ge=0, le=63)]] | None = None

    checks = {"host": _check_host_name, "gpus": _check_gpus}


class Router(_Strict, frozen=True, kw_only=True):
    host: str
    port: Annotated[int, Meta(ge=1024, le=65535)] = 30080
    policy: Policy = "cache_aware"
    # its Prometheus exporter, which it always starts (on 29000 unless told: a second router on the host
    # then dies with "Address already in use"); default: port + 10000
    metrics_port: Annotated[int, Meta(ge=1024, le=65535)] | None = None
    python: str | None = None  # a Python with sglang-router installed; default: the host's SGLang Python

    checks = {"host": _check_host_name, "python": _check_remote_path}

    @property
    def metrics(self) -> int:
        return self.metrics_port if self.metrics_port is not None else self.port + 10000

    def check_together(self) -> None:
        if self.metrics > 65535:
            raise _Invalid(("port",), "value", f"leaves no default metrics port ({self.metrics}); set metrics_port:")
        if self.metrics == self.port:
            raise _Invalid(("metrics_port",), "value", "must differ from port")


def _check_playbook_name(value: str) -> None:
    if not NAME_RE.match(value):
        raise ValueError("must be a playbook's name (playbooks/NAME.yaml)")


def _check_host_names(names: list[str]) -> None:
    for name in names:
        _check_host_name(name)


class Service(_Strict, frozen=True, kw_only=True):
    playbook: str
    replicas: Annotated[int, Meta(ge=1, le=64)] | list[Replica]
    hosts: list[str] | None = None  # where `replicas: N` are placed: host or group names
    router: Router
    min_healthy: Annotated[int, Meta(ge=1, le=64)] = 1  # health is critical below this many serving replicas
    drain_s: Annotated[float, Meta(ge=0, le=3600)] = 30.0  # a replica's in-flight requests may take this long

    checks = {"playbook": _check_playbook_name, "hosts": _check_host_names}

    def check_together(self) -> None:
        if isinstance(self.replicas, int) and not self.hosts:
            raise _Invalid(
                ("replicas",),
                "value",
                f"is a count ({self.replicas}), which needs hosts: (host or group names) to place them on",
            )
        if isinstance(self.replicas, list):
            if not self.replicas:
                raise _Invalid(("replicas",), "value", "lists no replica; list them or give a count with hosts:")
            if self.hosts is not None:
                raise _Invalid(
                    ("hosts",), "value", "is only read with a count of replicas; each listed replica names its host"
                )
        count = self.replicas if isinstance(self.replicas, int) else len(self.replicas)
        if self.min_healthy > count:
            raise _Invalid(("min_healthy",), "value", f"is {self.min_healthy}, more than the {count} replicas")


@dataclass(frozen=True)
class PlacedReplica:
    """One replica as fleet runs it: a deployment named `<service>-<n>` (n from 1, in file order) on a host."""

    index: int
    host: str
    deployment: str
    gpus: int | tuple[int, ...] | None


@dataclass(frozen=True)
class NamedService:
    name: str
    path: Path
    spec: Service
    lines: dict[str, int] = dataclass_field(default_factory=dict)

    def where(self, key: str) -> str:
        return f"{self.path}:{self.lines[key]}" if key in self.lines else str(self.path)

    def replicas(self, inventory: Inventory) -> list[PlacedReplica]:
        """Each replica's host and deployment; a count is spread over `hosts:` in turn, one per host first."""
        spec = self.spec
        if isinstance(spec.replicas, list):
            wanted = [(r.host, r.gpus) for r in spec.replicas]
        else:
            hosts = [h.name for h in self._select(inventory, spec.hosts or [], "hosts")]
            wanted = [(hosts[i % len(hosts)], None) for i in range(spec.replicas)]
        placed = []
        for i, (host, gpus) in enumerate(wanted):
            self._select(inventory, [host], "replicas")
            chosen = tuple(gpus) if isinstance(gpus, list) else gpus
            placed.append(PlacedReplica(i + 1, host, f"{self.name}-{i + 1}", chosen))
        return placed

    def check_playbook(self, playbook: NamedPlaybook) -> None:
        """What a service cannot serve yet, refused before anything starts. An engine with an API key
        (api_key_env) wants it from the router too, and the router takes a worker key only on its command
        line, where every user of the host reads it: fleet will not put a secret there."""
        if playbook.spec.api_key_env:
            raise ConfigError(
                f"{self.where('playbook')}: playbook {playbook.name!r} ({playbook.where('api_key_env')}) gives "
                "its engine an API key, which a service's router cannot pass on to its replicas without "
                "showing it in the host's process list.",
                "Serve that playbook with `fleet deploy` (fleet proves it with the key), or give the service "
                "a playbook without api_key_env and let the router's host be the one clients reach.",
            )

    def router_host(self, inventory: Inventory) -> str:
        hosts = self._select(inventory, [self.spec.router.host], "router")
        if len(hosts) != 1:
            raise ConfigError(
                f"{self.where('router')}: router host {self.spec.router.host!r} is a group.", "Name one host."
            )
        return str(hosts[0].name)

    def _select(self, inventory: Inventory, names: list[str], key: str) -> list:  # type: ignore[type-arg]
        try:
            return inventory.select(names)
        except ConfigError as exc:
            raise ConfigError(f"{self.where(key)}: {exc.message}", exc.hint) from None


def parse_service(doc: YamlDoc, name: str) -> NamedService:
    spec, origins = parse_document(doc, Service, "service", "services/qwen36.yaml")
    return NamedService(name, doc.path, spec, origins)


def load_service(ref: str, services_dir: Path) -> NamedService:
    """`ref` is a service name (`qwen36` → services/qwen36.yaml) or a path to a YAML file."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path, name = Path(ref), Path(ref).stem
    else:
        path, name = services_dir / f"{ref}.yaml", ref
        if not NAME_RE.match(ref) or not path.exists():
            known = sorted(p.stem for p in services_dir.glob("*.yaml")) if services_dir.is_dir() else []
            raise ConfigError(f'service "{ref}": no file {path}.', f"Known services: {', '.join(known) or '(none)'}.")
    if not NAME_RE.match(name) or len(name) > MAX_SERVICE_NAME:
        raise ConfigError(
            f"{path}: {name!r} is not a service name.",
            f"Name the file with letters, digits and ._- (at most {MAX_SERVICE_NAME}, from a letter or digit).",
        )
    return parse_service(load_yaml(path), name)


def service_names(services_dir: Path) -> list[str]:
    return sorted(p.stem for p in services_dir.glob("*.yaml")) if services_dir.is_dir() else []
