"""SGLang's own verdict on a command line, run by fleet's act step in the engine's Python (`python -c`, on
the host or in the server's image) before anything is stopped. Exit 0: accepted.

1. The engine's arguments, parsed and resolved as `sglang serve` does: `prepare_server_args` (0.5.11
   resolves there, in the dataclass's `__post_init__`), then `resolve_once()` where the record has it
   (0.5.23 only parses in `prepare_server_args`). Resolution runs against this host's real GPUs
   (the plan's CUDA_VISIBLE_DEVICES), so speculative, mamba and attention-backend errors are found here.
2. The architecture, as SGLang's model loader resolves it at load time (srt/model_loader/utils.py
   `get_model_architecture`, 0.5.11 L193 / 0.5.23 L198): registered -> SGLang's own class; otherwise
   the Transformers backend when transformers has a compatible class (`resolve_transformers_arch`), or
   the model's own code (`auto_map.AutoModel`); else the engine's own ValueError. (A config that needs
   the model's own code without --trust-remote-code is refused earlier, by resolution reading it.)
   Before this, an unknown architecture failed only at model load, after the old server was stopped.

The registry is read from the installed package's files (`EntryClass` of each module in
`sglang.srt.models`, as srt/models/registry.py `import_model_classes` collects them), not imported:
importing it imports every model SGLang has. Errors are raised as SGLang raises them, so fleet's crash
signatures read this output as they read the engine's.
"""

import ast
import json
import os
import sys
from typing import Dict, List, Mapping, Optional, Set, Tuple


class Settings:
    """What the architecture lookup reads from the engine's parsed arguments."""

    def __init__(self, model_path: Optional[str], model_impl: str = "auto", override_args: str = "") -> None:
        self.model_path = model_path
        self.model_impl = str(model_impl or "auto").lower()
        self.override_args = override_args or ""

    @classmethod
    def of(cls, server_args: object) -> "Settings":
        """From SGLang's own record: what it parsed (abbreviated flags, --config files and all)."""
        impl = getattr(server_args, "model_impl", "auto")
        return cls(
            getattr(server_args, "model_path", None),
            str(getattr(impl, "value", impl)),
            str(getattr(server_args, "json_model_override_args", "") or ""),
        )


def registered_architectures(models_dir: str, disabled: Set[str]) -> Set[str]:
    """The architecture names SGLang registers: each module's `EntryClass` (a class or a list of them),
    skipping the modules SGLANG_DISABLED_MODEL_ARCHS names."""
    names = set()  # type: Set[str]
    for file in sorted(os.listdir(models_dir)):
        stem, _, ext = file.rpartition(".")
        if ext != "py" or stem in disabled:
            continue
        try:
            with open(os.path.join(models_dir, file), encoding="utf-8-sig") as f:  # a BOM is allowed
                text = f.read()
            if "EntryClass" not in text:
                continue
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            continue  # SGLang skips a module it cannot import, too
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            if not any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                continue
            value = node.value
            for item in value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]:
                if isinstance(item, ast.Name):
                    names.add(item.id)
                elif isinstance(item, ast.Attribute):
                    names.add(item.attr)
    return names


def disabled_modules(env_value: str) -> Set[str]:
    """SGLANG_DISABLED_MODEL_ARCHS: module names, comma-separated (srt/environ.py EnvArray)."""
    return set(part.strip() for part in env_value.split(",") if part.strip())


def transformers_class(arch: str) -> Optional[object]:
    """The host's transformers class of that name (the Transformers backend's fallback). No transformers:
    no fallback."""
    try:
        import transformers  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        return getattr(transformers, arch, None)
    except Exception:  # a lazy module that fails to import: SGLang's getattr would fail the same way
        return None


def architecture_error(settings: Settings, registered: Set[str], env: Mapping[str, str]) -> Optional[str]:
    """SGLang's error for the checkpoint's architecture, or None when its loader finds a class (or this
    cannot be known here: a Hub id, no config, a MindSpore or external model package)."""
    if not settings.model_path:
        return None
    try:
        with open(os.path.join(settings.model_path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        override = json.loads(settings.override_args) if settings.override_args.strip() else {}
    except (OSError, ValueError, RecursionError):
        return None  # not a local directory (a Hub id), or a config the engine judges itself
    if not isinstance(config, dict) or not isinstance(override, dict):
        return None
    impl = settings.model_impl
    if impl == "mindspore" or env.get("SGLANG_EXTERNAL_MODEL_PACKAGE"):
        return None
    archs = override.get("architectures", config.get("architectures")) or []  # SGLang applies the override
    if not isinstance(archs, list):
        return None  # the engine fails on it in its own words
    archs = [str(a) for a in archs]
    if impl != "transformers" and any(a in registered for a in archs):
        return None
    auto_map = config.get("auto_map")
    custom = isinstance(auto_map, dict) and "AutoModel" in auto_map  # loaded from the model's own code
    for arch in archs:
        if arch.startswith("Transformers") or custom:
            continue
        cls = transformers_class(arch)
        if cls is None:
            if impl == "transformers":
                continue  # SGLang skips its compatibility gate when asked for the Transformers backend
            return (
                "Cannot find model module. '%s' is not a registered model in the Transformers library (only "
                "relevant if the model is meant to be in Transformers) and 'AutoModel' is not present in the model "
                "config's 'auto_map' (relevant if the model is custom)." % arch
            )
        compatible = getattr(cls, "is_backend_compatible", None)
        if impl == "auto" and callable(compatible) and not compatible():
            return (
                "%s has no SGlang implementation and the Transformers implementation is not compatible with SGLang."
                % arch
            )
    if not archs:
        return "Model architectures [] are not supported for now. Supported architectures: %s" % sorted(registered)
    return None


# What SGLang decided for the settings a plan most often leaves to it: name shown -> the record's field
# (0.5.23 spelling first). Shown by fleet after the check, so `fleet plan` and a deploy say what runs.
RESOLVED = (
    ("quantization", ("quantization",)),
    ("attention", ("attention_backend",)),
    ("prefill attention", ("prefill_attention_backend",)),
    ("decode attention", ("decode_attention_backend",)),
    ("mamba strategy", ("mamba_radix_cache_strategy", "mamba_scheduler_strategy")),
    ("MoE runner", ("moe_runner_backend",)),
    ("FP4 GEMM", ("fp4_gemm_runner_backend", "fp4_gemm_backend")),
    ("speculative", ("speculative_algorithm",)),
    ("chunked prefill", ("chunked_prefill_size",)),
    ("CUDA graph max batch", ("cuda_graph_max_bs_decode", "cuda_graph_max_bs")),
    ("max running requests", ("max_running_requests",)),
    ("memory fraction", ("mem_fraction_static",)),
    ("overlap scheduler", ("disable_overlap_schedule",)),
)
# shown as what runs, not as the flag's double negative ("overlap scheduler off", not "... off False")
SHOWN_AS = {"overlap scheduler": {"True": "off", "False": "on"}}
RESOLVED_MARK = "FLEET-RESOLVED "


def resolved_settings(record: object) -> Dict[str, str]:
    """The resolved values of RESOLVED that the record has (None: left to a later stage, not shown)."""
    out = {}  # type: Dict[str, str]
    for shown, fields in RESOLVED:
        for name in fields:
            try:
                value = getattr(record, name)
            except Exception:
                continue
            value = getattr(value, "value", value)  # an enum
            if value is not None:
                out[shown] = SHOWN_AS.get(shown, {}).get(str(value), str(value)[:80])
            break
    return out


PICKS_MARK = "FLEET-PICKS "
# the settings fleet's keyed rules decide on (fleet.plan.picks.SETTINGS), by the names RESOLVED shows
PICKED = ("attention", "mamba strategy", "MoE runner", "FP4 GEMM")


def resolve_record(argv: List[str]) -> Tuple[object, object]:
    """SGLang's parsed arguments for `argv` and its resolved record, as the launcher resolves them on this
    host's GPUs (0.5.11: one and the same)."""
    from sglang.srt.server_args import prepare_server_args  # type: ignore[import-not-found,unused-ignore]

    server_args = prepare_server_args(argv)
    resolve = getattr(server_args, "resolve_once", None)
    if not callable(resolve):
        return server_args, server_args
    resolve()  # 0.5.23 only parses in prepare_server_args; launch_server resolves, on this GPU
    try:  # 0.5.23's record keeps what was declared; the resolved values are in its view
        from sglang.srt.arg_groups.model_override_base import resolved_view  # type: ignore[import-not-found,unused-ignore]

        return server_args, resolved_view(server_args)
    except Exception:
        return server_args, server_args


def without(argv: List[str], flags: List[str]) -> List[str]:
    """`argv` less `flags` and their values (`--flag value`, `--flag=value`, or a bare `--flag`)."""
    out = []  # type: List[str]
    skip = False
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in flags:
            skip = "=" not in word and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(word)
    return out


def engine_picks(argv: List[str], resolved: Mapping[str, str], drop: Mapping[str, List[str]]) -> Dict[str, str]:
    """What SGLang picks by itself for PICKED: a setting fleet set is resolved again without its flags (a
    fresh record each time: a resolved one cannot be resolved again; one setting at a time, so that one
    the engine cannot do without does not hide the others: "refused: why"); a setting fleet left alone is
    what the command line itself resolved to (`resolved`)."""
    out = dict((k, resolved[k]) for k in PICKED if k in resolved and k not in drop)
    for setting, flags in drop.items():
        if setting not in PICKED:
            continue
        try:
            again = resolved_settings(resolve_record(without(argv, [str(f) for f in flags]))[1])
        except SystemExit as exc:  # argparse
            out[setting] = "refused: exit %s" % exc.code
            continue
        except Exception as exc:  # the engine's own refusal: the flags fleet set are needed
            out[setting] = ("refused: %s: %s" % (type(exc).__name__, exc))[:300]
            continue
        if setting in again:
            out[setting] = again[setting]
    return out


def main() -> None:
    server_args, record = resolve_record(sys.argv[1:])
    import sglang.srt  # type: ignore[import-not-found,unused-ignore]

    # sglang.srt is a namespace package in the released wheels (no __init__.py, no __file__): its path says
    # where its models are
    found = [os.path.join(p, "models") for p in getattr(sglang.srt, "__path__", [])]
    models_dir = next((d for d in found if os.path.isdir(d)), "")
    if models_dir:
        disabled = disabled_modules(os.environ.get("SGLANG_DISABLED_MODEL_ARCHS", ""))
        registered = registered_architectures(models_dir, disabled)
        error = architecture_error(Settings.of(server_args), registered, os.environ)
        if error:
            # fleet's words first, then the error as SGLang's loader raises it (one line, as in a traceback)
            sys.stderr.write("[fleet] SGLang's model loader (get_model_architecture) would refuse this model:\n")
            sys.stderr.write("ValueError: %s\n" % error)
            sys.exit(1)
    resolved = resolved_settings(record)  # before any resolution again: those may change the process's state
    picks = None
    asked = os.environ.get("FLEET_PICKS")  # {"drop": {setting: [flags fleet set for it]}}
    if asked:
        try:
            drop = json.loads(asked)["drop"]
            picks = engine_picks(sys.argv[1:], resolved, drop) if isinstance(drop, dict) else None
        except (ValueError, TypeError, KeyError):
            picks = None
    # always the last lines on success: fleet reads the last ones (anything the engine printed comes before)
    if picks is not None:
        sys.stdout.write("\n" + PICKS_MARK + json.dumps(picks))
    sys.stdout.write("\n" + RESOLVED_MARK + json.dumps(resolved) + "\n")


if __name__ == "__main__":
    main()
