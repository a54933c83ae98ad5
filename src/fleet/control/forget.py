"""`fleet forget HOST/NAME`: a deployment's records taken off its host, once nothing of it runs.

A stopped deployment stays in `fleet status` (its record is its history: plan, fixes, outcome) until it is
forgotten. Forgetting takes the deployment's lock like any change; its server still running refuses
(stop it first), and so does its directory holding anything fleet did not write there. The host's
start-up timelines (per model, engine version and GPUs) and the logs are kept."""

from __future__ import annotations

from fleet.control.answers import refuse_unless_taken
from fleet.control.deploy import Deployer
from fleet.control.gather import read_facts
from fleet.errors import ConfigError, PreflightError
from fleet.hostscripts import run_step, step_python
from fleet.inventory import Host
from fleet.protocol import FixesRequest
from fleet.step_answers import FIXES
from fleet.terminal import safe_line
from fleet.transport import Transport


def forget_fixes(t: Transport, host: Host, signature: str | None, model: str | None) -> list[dict[str, object]]:
    """`fleet fixes forget`: the host's learned fixes with this signature (every one: None), for this model
    path only if given, forgotten under the host's guard; what was forgotten."""
    args: FixesRequest = {"state_dir": host.settings.state_dir, "signature": signature, "model": model}
    return run_step(t, step_python(host), FIXES, args, timeout_s=30)["forgotten"]


def forget(t: Transport, host: Host, name: str) -> None:
    facts = read_facts(t, host)
    if name not in facts.remote.deployments:
        known = ", ".join(sorted(facts.remote.deployments)) or "none"
        raise ConfigError(
            f"{host.name}: no deployment named {name} (deployments there: {known}); nothing was forgotten.",
            f"`fleet status --host {host.name}` lists them.",
        )
    deployer = Deployer(
        t,
        host,
        playbook_name=facts.remote.deployments[name].recorded.playbook or "-",
        smoke={},
        kill_policy=host.settings.kill_policy,
        secrets={},
        deployment=name,
    )
    out = deployer.steps.act(step_python(host), {"op": "forget", "lock": deployer.lock_args("forget")}, timeout_s=300)
    refuse_unless_taken(host.name, name, out)
    said = out.get("forget") or {}
    if said.get("running"):
        raise PreflightError(
            f"{host.name}: deployment {name} is running (process group {said['running']}); nothing was forgotten.",
            f"Stop it first: fleet stop --host {host.name}/{name}.",
        )
    if said.get("newer"):
        raise PreflightError(
            f"{host.name}: deployment {name}'s records were written by a newer fleet "
            f"({', '.join(safe_line(str(n)) for n in said['newer'][:5])}); nothing was forgotten.",
            "Forget it with that fleet, or upgrade this one.",
        )
    if said.get("container"):
        raise PreflightError(
            f"{host.name}: deployment {name}'s container could not be removed ({safe_line(said['container'])}); "
            "nothing was forgotten: without its record nothing would prove that container fleet's.",
            f"Stop it first (fleet stop --host {host.name}/{name}), or make its runtime answer, then forget again.",
        )
    if said.get("left"):
        raise PreflightError(
            f"{host.name}: deployment {name}'s directory holds files fleet did not write there "
            f"({', '.join(said['left'][:5])}); nothing was forgotten.",
            "Move them out of the state directory, then forget it again.",
        )
    if not said.get("forgotten"):
        raise PreflightError(f"{host.name}: the host did not say it forgot deployment {name}.", "Run it again.")
