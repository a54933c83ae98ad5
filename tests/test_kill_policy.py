"""The kill policy as a table: what fleet does with each kind of process it finds on the GPUs or the port.
The same function the host scripts run (host_common.kill_verdict); docs/reference.md's kill-policy table states it."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.host.common import engine_under, kill_verdict

ME, OTHER = 1000, 1001
OWN = (4242, 4242)  # fleet's own command on the host: its pid and process group
FLEETS_GROUP = 500
ENGINE = ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m"]


# The processes above the table's, by pid: (ppid, argv). A process whose parent is not here is orphaned.
PARENTS: dict[int, tuple[int, list[str]]] = {
    700: (600, ["python3", "batch.py"]),  # a user's own script running vllm.LLM / sglang.Engine
    720: (1, ["/venv/bin/vllm", "serve", "/m"]),  # a vLLM server
    721: (720, ["VLLM::EngineCore"]),  # its engine core
    730: (1, ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m"]),  # an SGLang server
    731: (730, ["python3", "-c", "from multiprocessing.forkserver import main; main(3, 4)"]),  # its workers' forkserver
    732: (
        730,
        ["python3", "-B", "-c", "from multiprocessing.forkserver import main; main(3, 4)"],
    ),  # PYTHONDONTWRITEBYTECODE
    740: (
        1,
        ["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(5)"],
    ),  # a job's rank, its driver gone
    750: (1, ["/lib/systemd/systemd", "--user"]),  # a session's subreaper (or a job named so)
    760: (1, ["python3", "-c", "from multiprocessing.forkserver import main; main(3, 4)"]),  # its server gone
}


def proc(
    argv: list[str], *, uid: int = ME, pgid: int = 900, pid: int = 901, comm: str = "", ppid: int = 1
) -> dict[str, Any]:
    return {
        "pid": pid,
        "ppid": ppid,
        "pgid": pgid,
        "uid": uid,
        "user": "me" if uid == ME else "alice",
        "comm": comm or (argv[0].rsplit("/", 1)[-1][:15] if argv else ""),
        "cmdline": " ".join(argv),
        "argv": argv,
    }


CASES = [
    # (what, process, port held by it, force) -> verdict, why
    ("own engine", proc(ENGINE), None, False, ("stop", "inference server")),
    # known by an engine's title: an engine's only under an engine (or orphaned: its server gone), since
    # sglang.Engine and vllm.LLM title the workers of a user's own script alike
    ("own engine by title, orphaned", proc(["sglang::scheduler_TP0"]), None, False, ("stop", "inference server")),
    ("a titled worker of a server", proc(["VLLM::EngineCore"], ppid=720), None, False, ("stop", "inference server")),
    (
        "a titled worker of a titled worker",
        proc(["VLLM::Worker_TP0"], ppid=721),
        None,
        False,
        ("stop", "inference server"),
    ),
    (
        "a worker from the server's forkserver",
        proc(["sglang::scheduler_TP0"], ppid=731),
        None,
        False,
        ("stop", "inference server"),
    ),
    (
        "a titled worker of a user's own script",
        proc(["VLLM::EngineCore"], ppid=700),
        None,
        False,
        ("refuse", "not an inference server"),
    ),
    (
        "a worker from a forkserver with options",
        proc(["sglang::scheduler_TP0"], ppid=732),
        None,
        False,
        ("stop", "inference server"),
    ),
    (
        "a titled worker of a job's rank left running",
        proc(["VLLM::EngineCore"], ppid=740),
        None,
        False,
        ("refuse", "not an inference server"),
    ),
    (
        "a titled worker adopted by a subreaper: no proof of adoption",
        proc(["sglang::scheduler_TP0"], ppid=750),
        None,
        False,
        ("refuse", "not an inference server"),
    ),
    (
        "a server's worker under its forkserver, left behind",
        proc(["sglang::scheduler_TP0"], ppid=760),
        None,
        False,
        ("stop", "inference server"),
    ),
    (
        "vLLM's offline batch runner",
        proc(["python3", "-m", "vllm.entrypoints.openai.run_batch", "-i", "in.jsonl"]),
        None,
        False,
        ("refuse", "not an inference server"),
    ),
    # the real SGLang router titles itself sglang::router: it serves other servers and is never stale
    (
        "the SGLang router on the port",
        proc(["sglang::router"]),
        30000,
        False,
        ("refuse", "holds port 30000, not an inference server"),
    ),
    (
        "fleet's group member",
        proc(["python3", "worker.py"], pgid=FLEETS_GROUP),
        None,
        False,
        ("stop", "fleet's server"),
    ),
    (
        "another user in fleet's group",
        proc(["python3", "job.py"], uid=OTHER, pgid=FLEETS_GROUP),
        None,
        False,
        ("refuse", "process of user alice"),
    ),
    ("another user's engine", proc(ENGINE, uid=OTHER), None, False, ("refuse", "process of user alice")),
    ("another user's, forced", proc(ENGINE, uid=OTHER), None, True, ("stop", "process of user alice")),
    ("own non-engine on the GPU", proc(["python3", "train.py"]), None, False, ("refuse", "not an inference server")),
    (
        "own non-engine on the port",
        proc(["nginx"]),
        30000,
        False,
        ("refuse", "holds port 30000, not an inference server"),
    ),
    (
        "a name that mentions the engine",
        proc(["tail", "-f", "sglang.launch_server.log"]),
        None,
        False,
        ("refuse", "not an inference server"),
    ),
    (
        "GPU daemon",
        proc(["/usr/bin/nvidia-persistenced"]),
        None,
        True,
        ("leave", "GPU daemon or tool nvidia-persistenced"),
    ),
    (
        "GPU daemon by comm only",
        proc([], comm="nvidia-persiste"),
        None,
        True,
        ("leave", "GPU daemon or tool nvidia-persistenced"),
    ),
    # issue 39's rows: what holds the GPUs or port in another container, or merely looks like an engine
    (
        "an engine of fleet's user in another container",
        dict(proc(ENGINE), container="foreign-sglang (img)"),
        None,
        False,
        ("refuse", "runs in container foreign-sglang (img), which is not this deployment's"),
    ),
    (
        "the same, forced (stopped through its runtime, never removed)",
        dict(proc(ENGINE), container="foreign-sglang (img)"),
        None,
        True,
        ("stop", "runs in container foreign-sglang (img), which is not this deployment's"),
    ),
    (
        "an SGLang tool module, not its server, on the GPU",
        proc(["python3", "-m", "sglang.srt.some_tool"]),
        None,
        False,
        ("refuse", "not an inference server"),
    ),
    (
        "another user's process in fleet's own group, in a container",
        dict(proc(["python3", "job.py"], uid=OTHER, pgid=FLEETS_GROUP), container="x"),
        None,
        False,
        ("refuse", "process of user alice"),
    ),
    # issue 41: SGLang's weight cache daemon is no server; only the group its deployment's record names is
    # fleet's (classify then keeps it for a launch with the same settings, or stops it as the daemon)
    (
        "a weight cache daemon no record names",
        proc(["python3", "-m", "sglang.srt.weight_cache.daemon", "--model-path", "/m", "--tp-size", "2"]),
        None,
        False,
        ("refuse", "not an inference server"),
    ),
    (
        "a rank of the weight cache daemon fleet recorded",
        proc(
            [
                "python3",
                "-c",
                "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
                "--multiprocessing-fork",
            ],
            pgid=FLEETS_GROUP,
        ),
        None,
        False,
        ("stop", "fleet's server"),
    ),  # fmt: skip
    ("sshd", proc(["sshd: root@notty"], comm="sshd"), None, True, ("skip", "init, sshd or fleet's own command")),
    ("init", proc(["/sbin/init"], pid=1, pgid=1), None, True, ("skip", "init, sshd or fleet's own command")),
    (
        "fleet's own command",
        proc(ENGINE, pgid=OWN[1], pid=4243),
        None,
        True,
        ("skip", "init, sshd or fleet's own command"),
    ),
]


@pytest.mark.parametrize(("what", "info", "port", "force", "expected"), CASES, ids=[c[0] for c in CASES])
def test_kill_policy(what: str, info: dict[str, Any], port: int | None, force: bool, expected: tuple[str, str]) -> None:
    table = {**PARENTS, info["pid"]: (info["ppid"], info["argv"])}
    engine = engine_under(info["argv"], info["pid"], table.get) is not None
    assert (
        kill_verdict(info, me=ME, own=OWN, recorded_pgid=FLEETS_GROUP, port=port, force=force, engine=engine)
        == expected
    )


def test_a_recorded_group_without_exact_identity_is_passed_as_none_and_earns_no_trust() -> None:
    member = proc(["python3", "worker.py"], pgid=FLEETS_GROUP)
    verdict = kill_verdict(member, me=ME, own=OWN, recorded_pgid=None, port=None, force=False, engine=False)
    assert verdict == ("refuse", "not an inference server")
