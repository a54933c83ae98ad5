"""Parts of the probe step (fleet/host/probe.py) in this process: whether a group's rank 0 can be reached
from a host before launch and over which interface, and fleet's own engine environments as the probe
lists them. The whole probe runs in simulated hosts and over real sshd."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from fleet.host import probe


def test_rank_0_reached_refused_or_not_reachable_is_told_apart() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert probe._reach({"address": "127.0.0.1", "port": port}) == "open"
    # the host answers, nothing listens there yet: reachable. The port is held bound, not listening, so no
    # other process of the machine can start listening on it meanwhile
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        assert probe._reach({"address": "127.0.0.1", "port": bound.getsockname()[1]}) == "refused"
    # the broadcast address has no TCP route (no name lookup: a CI machine may have no resolver to ask)
    said = probe._reach({"address": "255.255.255.255", "port": 29500, "timeout_s": 1})
    assert said.startswith(("error: ", "timeout after")) and said != "error: "


def test_the_interface_a_host_reaches_an_address_on_is_the_kernels_route() -> None:
    assert probe._route_interface("127.0.0.1") == "lo"
    assert probe._route_interface("not an address") is None


def test_fleets_own_engine_environments_say_which_are_whole_and_current(tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    for version, whole in (("0.5.11", True), ("0.5.23", True), ("0.6.0", False)):
        env = engines / f"sglang-{version}"
        env.mkdir(parents=True)
        if whole:
            (env / ".fleet-engine.json").write_text(json.dumps({"engine": "sglang", "version": version}))
    (engines / "sglang-current").symlink_to("sglang-0.5.23")
    (engines / "sglang-0.5.24.123.tmp").mkdir()  # a link being swapped in: not an environment
    (engines / "vllm-0.11.0").symlink_to(tmp_path)  # a link fleet did not make: not one of its own
    (engines / ".sglang-0.5.23.lock").write_text("")
    listed = {(e["engine"], e["version"]): (e["whole"], e["current"]) for e in probe._managed_engines(str(tmp_path))}
    assert listed == {
        ("sglang", "0.5.11"): (True, False),
        ("sglang", "0.5.23"): (True, True),
        ("sglang", "0.6.0"): (False, False),
    }
    assert probe._managed_engines(str(tmp_path / "nothing-here")) == []
    assert probe._managed_engines(None) == []
