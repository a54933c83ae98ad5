"""A scripted router step for a service's branches (fleet.control.service.ServiceRun on scripted hosts):
each action answered as fleet's router step (fleet/host/router.py) answers it over the real SGLang
router, from a router kept in memory: whether it runs and with which options, its workers and which of
them are healthy, the service's lease and its last good replicas. An action may be scripted to fail as the
real step fails (`fail`), and the answer through the router scripted (`answers`). That the real step
drives the real router so is proven over real sshd and in simulated hosts (test_services*.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet.protocol import RouterAction, RouterRequest
from fleet.step_answers import RouterAnswer, RouterResult

ROUTER_PID = 4242


@dataclass
class ScriptedRouter:
    """`running`/`argv`: the router process and its options; `up`: the service was brought up (its router
    recorded, until `fleet down`), whether or not the router still runs; `workers`: what its /workers lists;
    `unhealthy`: worker URLs it lists as unhealthy; `circuits_open`: worker URLs whose circuit it holds
    open (it refuses them every request while their /health is fine, sglang #13894); `lease`: who holds the service's lease (a run_id,
    owner and command); `kept`: the replicas' last good records; `fail`: an action (by `do`) that fails
    with the given result, once; `answers`: the answers to requests through it, in turn (then a good one)."""

    running: bool = False
    up: bool = False
    argv: list[str] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    unhealthy: set[str] = field(default_factory=set)
    circuits_open: set[str] = field(default_factory=set)
    lease: dict[str, Any] | None = None
    kept: dict[str, Any] = field(default_factory=dict)
    fail: dict[str, RouterResult] = field(default_factory=dict)
    answers: list[dict[str, Any]] = field(default_factory=list)
    asked: list[RouterAction] = field(default_factory=list)  # every action, in order

    def answer(self, request: RouterRequest) -> RouterAnswer:
        """As the real step: each action with the request's common keys merged in, up to the first failure."""
        common = {k: v for k, v in request.items() if k != "actions"}
        results: list[RouterResult] = []
        for action in request.get("actions") or []:
            self.asked.append(action)
            failed = self.fail.pop(str(action.get("do")), None)
            result: RouterResult = failed if failed is not None else self._do({**common, **action})
            results.append({**result, "do": str(action.get("do"))})
            if "error" in result:
                break
        return {"results": results}

    def did(self, do: str) -> list[RouterAction]:
        """The actions of one kind fleet asked, in order."""
        return [a for a in self.asked if a.get("do") == do]

    def _do(self, a: RouterAction) -> RouterResult:
        if not self.running and a["do"] in ("workers", "add", "remove"):  # nothing answers on its port
            return {"error": "the router's /workers answered None: connection refused"}
        act: Callable[[RouterAction], RouterResult] = getattr(self, f"_{a['do']}")
        return act(a)

    def _listed(self) -> list[dict[str, Any]]:
        return [
            {**w, "is_healthy": w["url"] not in self.unhealthy, "circuit_open": w["url"] in self.circuits_open}
            for w in self.workers
        ]

    def _ensure(self, a: RouterAction) -> RouterResult:
        if self.running and (a["argv"] == self.argv or not a.get("replace")):
            return {"router": "running", "pid": ROUTER_PID, "differs": a["argv"] != self.argv}
        replaced = ROUTER_PID if self.running else None
        self.running, self.up, self.argv, self.workers = True, True, list(a["argv"]), []  # it knows no workers
        return {"router": "started", "pid": ROUTER_PID, "replaced": replaced}

    def _workers(self, a: RouterAction) -> RouterResult:
        return {"workers": self._listed()}

    def _add(self, a: RouterAction) -> RouterResult:
        if all(w["url"] != a["url"] for w in self.workers):  # registered first, then waited for
            self.workers.append({"id": f"w{len(self.asked)}", "url": a["url"], "load": 0})
        if a["url"] in self.unhealthy:
            return {"error": f"the router did not list {a['url']} as healthy within {a.get('wait_s', 60)}s"}
        return {"added": a["url"]}

    def _remove(self, a: RouterAction) -> RouterResult:
        url = a["url"]
        others = [w for w in self._listed() if w["url"] != url and w["is_healthy"]]
        if a.get("keep_one_healthy") and not others:
            return {
                "refused": f"the router has no other healthy worker: taking {url} out would leave it "
                "nothing to send requests to"
            }
        was = any(w["url"] == url for w in self.workers)
        self.workers = [w for w in self.workers if w["url"] != url]
        return {"removed": url, "was_listed": was}

    def _ask(self, a: RouterAction) -> RouterResult:
        if not self.running:
            return {"answer": {"ok": False, "status": None, "text": "connection refused"}}
        good = {"ok": True, "status": 200, "text": str(a["smoke"].get("expect", ""))}
        return {"answer": self.answers.pop(0) if self.answers else good}

    def _health(self, a: RouterAction) -> RouterResult:
        return {"router_running": self.running, "health": 200 if self.running else None, "up": self.up}

    def _stop(self, a: RouterAction) -> RouterResult:
        """Stopped and forgotten, also when it had died (fleet.host.router.stop)."""
        was, self.running, self.up, self.workers = self.running, False, False, []
        return {"ended_pid": ROUTER_PID if was else None}

    def _remember(self, a: RouterAction) -> RouterResult:
        for name, value in a["replicas"].items():
            self.kept[name] = {**(self.kept.get(name) or {}), **value}
        return {}

    def _recall(self, a: RouterAction) -> RouterResult:
        return {"record": {"replicas": dict(self.kept)}}

    def _lease(self, a: RouterAction) -> RouterResult:
        held = self.lease
        if held and held["run_id"] != a["run_id"]:
            return {"held": True, "owner": held.get("owner"), "command": held.get("command"), "since": 0}
        if a.get("peek"):
            return {"held": False}
        if a.get("release"):
            self.lease = None
            return {"held": False}
        self.lease = {"run_id": a["run_id"], "owner": a.get("owner"), "command": a.get("command")}
        return {"held": False}
