"""Where a deployment goes on a host and what it runs there: its GPUs (asked, fit, or the whole box's
free ones) and port, then its plan on the host's facts. `fleet plan` shows what `fleet deploy` runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace as replace_field

from fleet.control.gather import model_path
from fleet.crashes import Signature
from fleet.errors import PreflightError
from fleet.facts import HostFacts
from fleet.inventory import Host, NamedPlaybook
from fleet.plan import Verdict, args_dict, parse_version
from fleet.plan.build import PlanResult, build_plan, gpu_summary, model_spec
from fleet.plan.fit import Fit, fit_gpus
from fleet.plan.placement import FREE, WITH_REPLACED, WITH_STALE, Placement, free_gpus, place, port_for, stopped_with
from fleet.plan.whole_box import whole_box


@dataclass(frozen=True)
class Placed:
    placement: Placement
    indices: tuple[int, ...] | None  # what the launch names (CUDA_VISIBLE_DEVICES); None: all, unnamed
    result: PlanResult
    how: str


def place_and_plan(
    host: Host,
    playbook: NamedPlaybook,
    facts: HostFacts,
    deployment: str,
    gpus: int | tuple[int, ...] | None,
    *,
    replace: bool,
    signatures: Sequence[Signature] | None = None,
    show_refusal: bool = False,
    nodes: int = 1,
    told: Mapping[str, str] | None = None,
) -> Placed:
    """The deployment's GPUs and port on this host, then its plan (`fleet plan` shows, `deploy` runs it).
    `gpus` (--gpus) overrides the playbook's gpus:. A placement that cannot be made is a PreflightError;
    `show_refusal` (`fleet plan`): an overlap with another deployment is an error verdict of the plan
    instead, shown with the rest of what pre-flight says."""
    path = model_path(host, playbook.spec.model)
    asked, fitted, dp = (
        (gpus, None, 1) if gpus is not None else _asked(playbook, facts, path, nodes, deployment, replace)
    )
    key = "tp" if playbook.spec.gpus is None and playbook.spec.tp else "gpus"
    where = f"{'--gpus' if gpus is not None else playbook.where(key)} ({host.name})"
    refused = None
    try:
        placement = place(deployment, asked, facts, replace=replace, where=where, take_stale=fitted is not None)
    except PreflightError as exc:
        if not show_refusal:
            if fitted is not None:  # the count was fit's, not the operator's: say why it was that many
                raise PreflightError(f"{fitted.message}. {exc.message}", exc.hint) from None
            raise
        placement = place(deployment, asked, facts, replace=True, where=where)  # GPUs it lacks still raise
        refused = Verdict("error", "placement", f"{exc.message} {exc.hint}")  # the fit's own verdict says why
    indices = placement.gpus if asked is not None else None
    stopping = stopped_with(facts, deployment, indices)
    replacing = [o.name for o in placement.replaces] if replace else []  # `fleet plan`'s refusal: not stopped
    port, moved = port_for(deployment, playbook.spec.port, facts, host.settings.bind_address, stopping, replacing)
    result = build_plan(host, playbook, facts, path, signatures, indices, port, deployment, nodes, told, dp)
    if refused is not None:
        result = replace_field(result, verdicts=(refused, *result.verdicts))
    if fitted is not None:
        result = replace_field(result, verdicts=(fitted, *result.verdicts))
    # `fleet plan` (show_refusal) lists the fit's verdict with the others: its line does not say it again
    how = "; ".join(x for x in (fitted.message if fitted and not show_refusal else "", placement.how, moved) if x)
    return Placed(placement, indices, result, how)


# The playbook lays its GPUs out in its own flags (a hand-written command line): placement leaves it every GPU.
PARALLEL_FLAGS = (
    "--tp-size",
    "--tensor-parallel-size",
    "--dp-size",
    "--data-parallel-size",
    "--pp-size",
    "--pipeline-parallel-size",
)


def takes_free_gpus(playbook: NamedPlaybook) -> bool:
    """Whether the playbook leaves its GPUs to the host's free ones (fleet.plan.whole_box): gpus: and tp:
    left out, and a command line that does not lay them out itself (TP, DP or PP in extra_args; literal:)."""
    spec = playbook.spec
    named = args_dict(list(spec.extra_args))
    return spec.gpus is None and not spec.tp and not spec.literal and not any(f in named for f in PARALLEL_FLAGS)


def _asked(
    playbook: NamedPlaybook, facts: HostFacts, path: str, nodes: int, deployment: str, replace: bool
) -> tuple[int | tuple[int, ...] | None, Verdict | None, int]:
    """The playbook's gpus: as a placement, why (a warning when nothing the host has holds the model), and
    the data-parallel replicas to run on it. Left out, gpus: is tp:'s count when tp: is set, every GPU when
    the command line names its TP itself (extra_args, literal:) or the ranks of a group run here (all of
    each host's), else the host's free GPUs used as fleet.plan.whole_box says; `gpus: fit` is the count
    the model needs (fleet.plan.fit). None: every GPU, CUDA_VISIBLE_DEVICES unset."""
    spec = playbook.spec
    value = spec.gpus
    if value == "all" or nodes > 1:
        return None, None, 1
    if isinstance(value, list):
        return tuple(value), None, 1
    if isinstance(value, int):
        return value, None, 1
    if value is None:
        if spec.tp:
            return spec.tp, Verdict("info", "gpus", f"gpus: left out: {spec.tp} GPUs for tp: {spec.tp}"), 1
        if not takes_free_gpus(playbook):
            return None, None, 1
    gpus = gpu_summary(facts)
    model = model_spec(facts, path)
    said = "gpus: fit" if value == "fit" else "gpus: left out, so the host's free GPUs"
    if gpus is None or model is None:  # pre-flight says what is missing; the plan takes every GPU meanwhile
        return None, Verdict("info", "gpus-fit", f"{said}: no GPUs or model to fit; all GPUs"), 1
    speculative = bool(spec.speculative and spec.speculative.enabled)
    install = facts.engines.get(spec.engine)
    version = parse_version(install.version) if install else None

    def fit_on(available: int) -> Fit:
        return fit_gpus(
            model,
            gpus.memory_mib,
            available,
            spec.context_length,
            spec.mem_fraction,
            speculative,
            spec.engine,
            version,
            gpus.sm,
        )

    fit = fit_on(gpus.count)
    if value is None:
        reaches = (FREE, WITH_STALE, WITH_REPLACED) if replace else (FREE, WITH_STALE)
        counts = {reach: len(free_gpus(facts, deployment, reach)) for reach in reaches}
        # the narrowest set that holds the model: nothing is stopped that it makes needless; none: the free
        fits = {r: fit_on(n) for r, n in counts.items() if n}
        reach = next((r for r in reaches if r in fits and fits[r].fits), FREE)
        free, fits_free = counts[reach], fits.get(reach)
        if fits_free is None or (not fits_free.fits and free < fit.gpus):
            # they do not hold it: ask for what it needs of the host, and placement says who holds the rest
            why = f"{said}: {free} free, and it needs more: {fit.why}"
            return fit.gpus, Verdict("info" if fit.fits else "warning", "gpus-fit", why), 1
        shape = whole_box(model, free, gpus.nvlink, fits_free)
        held = "" if reach == FREE else f" ({reach}: the free ones alone do not hold it)"
        why = f"{said}{held}: {shape.why} (gpus: fit takes as few as the model needs)"
        return shape.gpus, Verdict("info" if shape.fits else "warning", "gpus-fit", why), shape.dp
    level = "info" if fit.fits else "warning"
    rest = gpus.count - fit.gpus
    left = f"; the host's other {rest} are left for other deployments or replicas (gpus: all takes every GPU)"
    return fit.gpus, Verdict(level, "gpus-fit", f"{said}: {fit.why}{left if rest else ''}"), 1
