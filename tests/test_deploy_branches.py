"""Every branch of the deploy loop (fleet.control.deploy.Deployer) against a scripted host
(fleet_testbed.fakehost): what the loop does with each answer a host can give, in milliseconds, without
root or sshd. The same loop over real sshd and simulated GPU hosts is in test_deploy.py and
test_deploy_loop.py; the decision after each attempt alone is in test_relaunch.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from factsdata import RTX_PRO_6000, facts
from fleet import events
from fleet.control import placing
from fleet.control.deploy import Deployer
from fleet.control.ops import plan_from_record
from fleet.errors import LockedError
from fleet.facts.recorded import parse_recorded
from fleet.plan.build import PlanResult
from fleet.protocol import FAILED
from fleet_testbed.fakehost import ScriptedHost, Watch, crashes, cut, ready
from test_plan import host, playbook

SPEC_CRASH = (
    "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible with radix cache "
    "when using --mamba-scheduler-strategy no_buffer. To use radix cache with speculative decoding, please use "
    "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
)


def planned(pb_name: str = "qwen35-nvfp4-handwritten") -> PlanResult:
    pb = playbook(pb_name)
    f = facts("blackwell", RTX_PRO_6000, 8, model=pb.spec.model)
    result = placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=False).result
    assert result.plan is not None and not result.errors, result.verdicts
    return result


def deploy(scripted: ScriptedHost, r: PlanResult, **kw: Any) -> tuple[Any, list[events.Event]]:
    seen: list[events.Event] = []
    replan = kw.pop("replan", None)
    d = Deployer(
        scripted,
        host("blackwell"),
        playbook_name="qwen35",
        smoke={"prompt": "2+2=", "expect": "4", "max_tokens": 8},
        kill_policy="safe",
        secrets={},
        progress=seen.append,
        max_attempts=3,
        **kw,
    )
    assert r.plan is not None and r.model is not None and r.gpus is not None
    out = d.run(r.plan, r.model, r.gpus, r.wishes, learned_key=r.learned_key, learned_existing=[], replan=replan)
    return out, seen


def test_a_known_crash_is_fixed_and_the_fixed_plan_relaunched() -> None:
    scripted = ScriptedHost(watches=[crashes(SPEC_CRASH), ready()])
    result, seen = deploy(scripted, planned())
    assert result.ok and [a.outcome for a in result.attempts] == ["crashed", "ready"]
    first, second = scripted.launches
    assert "extra_buffer" not in first and "extra_buffer" in second  # the fix, in the second command line
    relaunch = next(e for e in seen if isinstance(e, events.Relaunching))
    assert relaunch.signature == result.new_fixes[0] and not relaunch.nothing_stopped
    assert result.round_trips == 4  # act + watch, twice
    learned = scripted.watched[-1]["learned"]
    assert [e["signature"] for e in learned] == result.new_fixes  # remembered on the host once proven


def test_a_port_swept_on_the_way_is_not_learned_as_a_fix() -> None:
    """The sweep is the relaunch's own (it stops stale engine servers on the port first) and changes no
    flag: learned, `fleet fixes` would list a fix that does nothing."""
    scripted = ScriptedHost(watches=[crashes("OSError: [Errno 98] Address already in use"), ready()])
    result, _ = deploy(scripted, planned())
    assert result.ok and result.new_fixes == ["port-in-use"]
    assert scripted.watched[-1]["learned"] == []


def test_what_fleet_cannot_explain_is_given_up_and_the_attempt_stopped() -> None:
    scripted = ScriptedHost(watches=[crashes("RuntimeError: a failure nobody has seen before")])
    result, _ = deploy(scripted, planned())
    assert not result.ok and "unknown failure" in result.reason and len(result.attempts) == 1
    give_up = scripted.acts[-1]
    assert not give_up.get("launch") and give_up["release_lock"] and give_up["lock"]["command"] == "give-up"
    assert give_up["state_update"] is not None and give_up["state_update"]["status"] == FAILED


def test_a_command_line_the_engine_refuses_stops_nothing() -> None:
    refused = {"verdict": "rejected", "output": "launch_server.py: error: unrecognized arguments: --made-up-flag"}
    scripted = ScriptedHost(checks=[refused])
    result, seen = deploy(scripted, planned())
    assert not result.ok and [a.outcome for a in result.attempts] == ["rejected"]
    assert scripted.watched == []  # nothing was launched, so nothing watched
    release = scripted.acts[-1]
    assert release["op"] == "release" and not release.get("state_update")  # the old server serves on
    assert not any(isinstance(e, events.Launched) for e in seen)


def test_a_host_another_run_holds_is_refused_before_anything_is_launched() -> None:
    scripted = ScriptedHost(lock="held")
    with pytest.raises(LockedError):
        deploy(scripted, planned())
    assert len(scripted.acts) == 1 and scripted.watched == []


def test_a_cut_watch_resumes_from_the_last_line_it_read() -> None:
    scripted = ScriptedHost(watches=[cut("loading weights", "capturing graphs"), ready()])
    result, seen = deploy(scripted, planned())
    assert result.ok and len(result.attempts) == 1
    assert [w["offset"] for w in scripted.watched] == [0, 2]
    assert any(isinstance(e, events.Reconnecting) and e.offset == 2 for e in seen)


def test_ctrl_c_while_watching_frees_the_host_for_the_next_run() -> None:
    scripted = ScriptedHost(watches=[ready()])

    def interrupted(*args: Any, **kw: Any) -> int:
        raise KeyboardInterrupt

    scripted.watch = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        deploy(scripted, planned())
    assert scripted.acts[-1].get("abandon") and scripted.acts[-1]["op"] == "release"


def test_picks_the_engine_makes_otherwise_plan_the_same_attempt_again() -> None:
    r = planned("qwen35-nvfp4")
    scripted = ScriptedHost(watches=[ready()], picks_differ={"MoE runner": "triton"})
    asked: list[dict[str, str]] = []

    def replan(picks: dict[str, str]) -> Any:
        asked.append(picks)
        return r.plan

    result, seen = deploy(scripted, r, replan=replan)
    assert asked == [{"MoE runner": "triton"}]
    assert result.ok and len(result.attempts) == 1 and len(scripted.acts) == 2
    assert [e.attempt for e in seen if isinstance(e, events.AttemptStarted)] == [1]  # announced once
    said = next(e for e in seen if isinstance(e, events.Replanned))
    assert said.picks == {"MoE runner": "triton"}
    learned = [e for e in scripted.watched[-1]["learned"] if e["signature"] == "engine-picks"]
    assert [e["picks"] for e in learned] == [{"MoE runner": "triton"}]  # remembered once proven
    assert "picks" in scripted.acts[0]["check"] and "picks" not in scripted.acts[1]["check"]  # asked once


class CountedProbe(ScriptedHost):
    """A scripted host that records what each probe was asked, and fails each with `error` if given."""

    def __init__(self, error: Exception | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.asked: list[Any] = []
        self.error = error

    def facts(self, request: Any, pythons: Any) -> Any:
        self.asked.append((request, list(pythons)))
        if self.error is not None:
            raise self.error
        return super().facts(request, pythons)


def test_facts_read_ahead_are_the_deploys_own_read_and_its_only_probe() -> None:
    """The CLI starts reading a deploy's facts while it imports the deploy loop: the deploy then takes that
    answer instead of probing again; a read that asks something else probes for itself."""
    from fleet.control.gather import asked_for, read_facts, read_facts_ahead

    pb = playbook("qwen35-nvfp4-handwritten")
    scripted = CountedProbe(facts_found=facts("blackwell", RTX_PRO_6000, 8, model=pb.spec.model))
    read_facts_ahead(scripted, host("blackwell"), pb)
    found = read_facts(scripted, host("blackwell"), **asked_for(host("blackwell"), pb))
    assert found.host == "scripted" and len(scripted.asked) == 1
    read_facts_ahead(scripted, host("blackwell"), pb)
    read_facts(scripted, host("blackwell"), model="/elsewhere", engine="sglang")
    assert len(scripted.asked) == 3 and scripted.asked[2][0]["model_path"] == "/elsewhere"
    read_facts(scripted, host("blackwell"), **asked_for(host("blackwell"), pb))  # nothing ahead now: probes
    assert len(scripted.asked) == 4


def test_a_failure_while_reading_ahead_is_the_deploys_own_error() -> None:
    from fleet.control.gather import asked_for, read_facts, read_facts_ahead
    from fleet.errors import HostUnreachable

    pb = playbook("qwen35-nvfp4-handwritten")
    scripted = CountedProbe(error=HostUnreachable("blackwell: cannot connect", "Check the address."))
    read_facts_ahead(scripted, host("blackwell"), pb)
    with pytest.raises(HostUnreachable, match="cannot connect"):
        read_facts(scripted, host("blackwell"), **asked_for(host("blackwell"), pb))
    assert len(scripted.asked) == 1


def test_a_memory_fraction_the_engine_resolves_smaller_than_the_plan_counted_stops_nothing() -> None:
    """Issue 42 item 1: the engine's check resolves mem_fraction_static on the host itself. Where it leaves
    each GPU less than the weights and one prefill step's cache (a version whose budget fleet's formula
    does not know), the deploy is refused before anything is stopped, saying whose number it was; a
    fraction that leaves enough goes ahead."""
    from fleet.errors import PreflightError

    r = planned()
    assert r.plan is not None and r.plan.need_mib and r.plan.memory_mib == RTX_PRO_6000[2]
    small = {"verdict": "accepted", "output": "", "resolved": {"memory fraction": "0.2"}}
    scripted = ScriptedHost(checks=[small])
    with pytest.raises(PreflightError, match=r"resolved mem_fraction_static 0.2 on this host: 19.1 GiB"):
        deploy(scripted, r)
    assert len(scripted.acts) == 1 and not scripted.watched  # one act, answered before it stopped anything
    assert scripted.acts[0]["check"]["budget"] == {"need_mib": r.plan.need_mib, "gpu_mib": RTX_PRO_6000[2]}
    enough = {"verdict": "accepted", "output": "", "resolved": {"memory fraction": "0.85"}}
    result, _ = deploy(ScriptedHost(checks=[enough], watches=[ready()]), planned())
    assert result.ok


def test_a_recorded_plan_reads_back_whole_so_a_restart_records_it_as_it_was() -> None:
    """`fleet restart` runs the plan its record holds; the record it writes keeps the plan's reasons and
    the engine's picks it stood on (a rollback's record compared equal to the one it rolled back to)."""
    plan = planned().plan
    assert plan is not None and plan.left_to_engine and plan.verdicts
    told = dataclasses.replace(plan, told=(("attention", "flashinfer"),))
    again = plan_from_record(parse_recorded({"plan": told.to_json(), "check_address": plan.check_address}))
    assert again.to_json() == told.to_json()


def test_a_containers_own_steps_run_under_the_hosts_python_not_the_images_name() -> None:
    """A process's act and watch steps run under its engine's Python (the engine's check imports the
    engine). A container's engine and check are in its image, and its plan's `python3` names the image's:
    its steps run under the host's step Python, whose NVML bindings answer where `python3` without them
    asks nvidia-smi before anything in the way is stopped."""
    from fleet.hostscripts import deployment_python, step_python

    r = planned()
    assert r.plan is not None
    blackwell = host("blackwell")
    boxed = dataclasses.replace(r.plan, container=object(), python="python3")  # the image's Python
    assert deployment_python(blackwell, r.plan) == r.plan.python
    assert deployment_python(blackwell, boxed) == step_python(blackwell) != "python3"


def test_a_stop_on_a_host_with_no_record_names_no_deployment_for_memory_still_in_use() -> None:
    """`fleet stop --host` where fleet keeps no record (an engine started by hand): the memory it says is
    still in use is no deployment's ("deployment default" was an internal name)."""
    from fleet.control import ops

    scripted = ScriptedHost(facts_found=facts("blackwell", RTX_PRO_6000, 8))
    scripted.servers[31] = "default"
    scripted.stop_finds = {"memory": {"after_mib": [30_000], "waited_s": 30.0, "gpus": [0]}}
    out = ops.stop(scripted, host("blackwell"), force=False)
    assert [p["pid"] for p in out["ended"]] == [31]
    assert out["memory_held"] == [{"deployment": None, "gpus": [0], "mib": 30_000, "waited_s": 30.0}]


def test_a_stop_beside_a_deployment_on_all_gpus_asks_for_its_own_gpus_and_touches_nothing_else() -> None:
    """Issue 38's first defect, the part fleet sends: `fleet stop` of one deployment beside another on all
    GPUs (whose record names none) is one stop step, for its own deployment and its own GPUs; the other's
    server and record are left as they were, and nothing is said of it. (What the host step does with
    them is test_deployments.py's, and over sshd test_deployments_ssh.py's.)"""
    from fleet.control import ops

    scripted = ScriptedHost(facts_found=facts("blackwell", RTX_PRO_6000, 8))
    scripted.records["small"] = {"status": "ready", "deployment": "small", "gpus": [0, 1], "pid": 11, "pgid": 11}
    scripted.records["whole"] = {"status": "ready", "deployment": "whole", "pid": 12, "pgid": 12}
    scripted.servers.update({11: "small", 12: "whole"})
    whole = dict(scripted.records["whole"])
    out = ops.stop(scripted, host("blackwell"), force=False, name="small")
    [act] = scripted.acts
    assert act["op"] == "stop" and act["lock"]["deployment"] == "small" and act["free"]["gpus"] == [0, 1]
    assert [p["pid"] for p in out["ended"]] == [11] and out["refused"] == out["memory_held"] == []
    assert scripted.servers == {12: "whole"} and scripted.records["whole"] == whole


def test_a_start_failure_a_client_echoed_after_health_answered_is_no_start_failure() -> None:
    """An engine at --log-level warning prints no ready line: the watcher's word that /health answered
    marks where clients could write to the log, and an echoed "Address already in use" after it (a
    grammar a request sent, logged with its newlines) does not sweep the port and relaunch."""
    t = "[2026-04-05 20:02:53] "
    after = [t + 'Skip invalid ebnf: ebnf=root ::= "a"', "OSError: [Errno 98] Address already in use", ", e=x"]
    after += [t + "Scheduler hit an exception: Traceback (most recent call last):", "KeyError: 'rid-123'"]
    lines = [{"e": "line", "t": text, "o": 100 + i} for i, text in enumerate(after)]
    scripted = ScriptedHost(
        watches=[Watch([t + "WARNING: a start-up warning"], [{"e": "ready_http"}, *lines, {"e": "exit", "code": 1}])]
    )
    result, seen = deploy(scripted, planned())
    assert not result.ok and len(result.attempts) == 1 and result.new_fixes == []
    assert not any(isinstance(e, events.Relaunching) for e in seen)
