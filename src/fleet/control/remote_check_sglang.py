"""SGLang's own verdict on a command line, run by fleet's act step in the engine's Python (`python -c`, on
the host or in the server's image) before anything is stopped. Exit 0: accepted.

1. The engine's arguments, parsed and resolved as `sglang serve` does: `prepare_server_args` (0.5.11
   resolves there, in the dataclass's `__post_init__`), then `resolve_once()` where the record has it
   (0.5.23 only parses in `prepare_server_args`). Resolution runs against this host's real GPUs
   (the plan's CUDA_VISIBLE_DEVICES), so speculative, mamba and attention-backend errors are found here.
2. The architecture, as SGLang's model loader resolves it at load time (srt/model_loader/utils.py
   `get_model_architecture`, 0.5.11 L193 / 0.5.23 L198): registered -> SGLang's own class; otherwise
   the Transformers backend when transformers has the class (`resolve_transformers_arch`), or custom
   code from the config's `auto_map` (with --trust-remote-code); else the engine's own ValueError.
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
from typing import List, Mapping, Optional, Set


def flag_value(argv: List[str], names: List[str]) -> Optional[str]:
    """The last value given for any of `names` (argparse keeps the last), `--flag value` or `--flag=value`."""
    found = None
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif word.startswith(name + "="):
                found = word[len(name) + 1 :]
    return found


def registered_architectures(models_dir: str, disabled: Set[str]) -> Set[str]:
    """The architecture names SGLang registers: each module's `EntryClass` (a class or a list of them),
    skipping the modules SGLANG_DISABLED_MODEL_ARCHS names."""
    names = set()  # type: Set[str]
    for file in sorted(os.listdir(models_dir)):
        stem, _, ext = file.rpartition(".")
        if ext != "py" or stem in disabled:
            continue
        try:
            with open(os.path.join(models_dir, file), encoding="utf-8") as f:
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


def in_transformers(arch: str) -> bool:
    """Whether the host's transformers has the class (the Transformers backend's fallback). No
    transformers: no fallback."""
    try:
        import transformers  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return False
    try:
        return getattr(transformers, arch, None) is not None
    except Exception:  # a lazy module that fails to import: SGLang's getattr would fail the same way
        return False


def architecture_error(argv: List[str], registered: Set[str], env: Mapping[str, str]) -> Optional[str]:
    """SGLang's error for the checkpoint's architecture, or None when its loader finds a class (or this
    cannot be known here: a Hub id, no config, a MindSpore or external model package)."""
    model = flag_value(argv, ["--model-path", "--model"])
    if not model:
        return None
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None  # not a local directory (a Hub id), or a config the argument check has already judged
    if not isinstance(config, dict):
        return None
    impl = flag_value(argv, ["--model-impl"]) or "auto"
    if impl == "mindspore" or env.get("SGLANG_EXTERNAL_MODEL_PACKAGE"):
        return None
    archs = [str(a) for a in config.get("architectures") or []]
    if impl != "transformers" and any(a in registered for a in archs):
        return None
    auto_map = config.get("auto_map")
    custom = isinstance(auto_map, dict) and "AutoModel" in auto_map
    trusted = "--trust-remote-code" in argv
    for arch in archs:
        if arch.startswith("Transformers") or in_transformers(arch):
            continue
        if custom:
            if trusted:
                continue
            # transformers' own refusal, raised while SGLang reads the config (dynamic_module_utils.py)
            return (
                "Loading %s requires you to execute the configuration file in that repo on your local machine. "
                "Make sure you have read the code there to avoid malicious use, then set the option "
                "`trust_remote_code=True` to remove this error." % model
            )
        return (
            "Cannot find model module. '%s' is not a registered model in the Transformers library (only relevant "
            "if the model is meant to be in Transformers) and 'AutoModel' is not present in the model config's "
            "'auto_map' (relevant if the model is custom)." % arch
        )
    if not archs:
        return "Model architectures [] are not supported for now. Supported architectures: %s" % sorted(registered)
    return None


def main() -> None:
    from sglang.srt.server_args import prepare_server_args  # type: ignore[import-not-found,unused-ignore]

    argv = sys.argv[1:]
    server_args = prepare_server_args(argv)
    resolve = getattr(server_args, "resolve_once", None)
    if callable(resolve):  # 0.5.23 only parses in prepare_server_args; launch_server resolves, on this GPU
        resolve()
    import sglang.srt  # type: ignore[import-not-found,unused-ignore]

    models_dir = os.path.join(os.path.dirname(os.path.abspath(sglang.srt.__file__)), "models")
    if not os.path.isdir(models_dir):
        return
    disabled = disabled_modules(os.environ.get("SGLANG_DISABLED_MODEL_ARCHS", ""))
    error = architecture_error(argv, registered_architectures(models_dir, disabled), os.environ)
    if error:
        # fleet's words first, then the error as SGLang's loader raises it (one line, as in a traceback)
        sys.stderr.write("[fleet] SGLang's model loader (get_model_architecture) would refuse this model:\n")
        sys.stderr.write("ValueError: %s\n" % error)
        sys.exit(1)


if __name__ == "__main__":
    main()
