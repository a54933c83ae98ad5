"""--force stops a foreign container that holds the deployment's GPUs through its runtime: only for the
processes that run in it. The container id read from a process's cgroup is a name anyone may give a
cgroup (`systemd-run --user --scope --unit=docker-<id>`); the runtime's own first process says which
processes are the container's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from fleet.host import container
from fleet.host.container import runs_in, stop_foreign_containers

BOX = "ab" * 32


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A process (standing in for a container's first one) and the pid of a child of its child."""
    parent = subprocess.Popen(["sh", "-c", "sh -c 'sleep 600' & wait"], start_new_session=True)
    try:
        for _ in range(200):
            children = subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.split()
            grand = (
                subprocess.run(["pgrep", "-P", children[0]], capture_output=True, text=True).stdout.split()
                if children
                else []
            )
            if grand:
                yield parent, int(grand[0])
                return
            subprocess.run(["sleep", "0.05"])
        raise AssertionError("the child processes did not start")
    finally:
        subprocess.run(["pkill", "-KILL", "-g", str(parent.pid)])
        parent.wait()


def test_a_process_runs_in_a_container_only_below_its_first_process(tree: tuple[Any, int]) -> None:
    parent, grandchild = tree
    assert runs_in(grandchild, parent.pid)
    with subprocess.Popen(["sleep", "600"]) as other:
        try:
            assert not runs_in(other.pid, parent.pid)  # a process elsewhere, whatever its cgroup says
        finally:
            other.kill()
    assert not runs_in(grandchild, 0)  # a container the runtime says nothing of


def target(pid: int) -> dict[str, Any]:
    return {"container_id": BOX, "container_cli": "podman", "pgid": pid, "user": "them", "cmdline": "x", "why": "w"}


def test_a_cgroup_named_like_a_container_does_not_get_the_container_stopped(
    tree: tuple[Any, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, grandchild = tree
    calls: list[list[str]] = []
    monkeypatch.setattr(container, "run_cli", lambda argv, *a, **k: (calls.append(argv), (0, "", ""))[1])
    with subprocess.Popen(["sleep", "600"]) as impostor:
        try:
            monkeypatch.setattr(container, "inspect", lambda cli, ident: {"pid": parent.pid})
            targets = {impostor.pid: target(impostor.pid)}
            assert stop_foreign_containers(targets, 5) == [] and calls == []
            assert impostor.pid in targets  # still the kill policy's to stop, as a process
            targets = {grandchild: target(grandchild), impostor.pid: target(impostor.pid)}
            stopped = stop_foreign_containers(targets, 5)  # the container's own process: stopped through it
            assert [s["pid"] for s in stopped] == [grandchild] and calls == [["podman", "stop", "-t", "5", BOX]]
            assert list(targets) == [impostor.pid]
        finally:
            impostor.kill()
