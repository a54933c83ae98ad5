"""Container images for the simulated fleet, made here: no registry is reachable from these machines.

A Debian rootfs with python3 (debootstrap, cached as a tar under .cache/images/), imported into podman
once as `fleet-testbed-base:bookworm-2`; on it, the simulated SGLang (`localhost/fleet-sim-sglang:VERSION`):
the engine simulator and the stand-in `sglang` package whose installed version is the tag's, so the
version fleet reads from an image is the image's, not the host's. `python -m fleet_testbed.images`
builds what is missing.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTBED = Path(__file__).resolve().parent
CACHE = TESTBED.parent.parent / ".cache" / "images"
# python3, and libnuma1 for vLLM's CPU kernels (without it: "libnuma.so.1: cannot open shared object file")
PACKAGES = "python3,libnuma1"
BASE = "localhost/fleet-testbed-base:bookworm-2"  # a new tag (and tar) when PACKAGES change
SIM_SGLANG = "localhost/fleet-sim-sglang"
MIRROR = "http://deb.debian.org/debian"
SIM_FILES = (
    "__init__.py",
    "gpustate.py",
    "sglang_sim.py",
    "sglang_flags.py",
    "sim_child.py",
    "sim_pooling.py",
    "sim_weight_cache.py",
)


def podman(*args: str, check: bool = True, input_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    stdin = input_file.open("rb") if input_file else subprocess.DEVNULL
    try:
        return subprocess.run(["podman", *args], check=check, stdin=stdin, capture_output=True, text=True)
    finally:
        if input_file:
            stdin.close()  # type: ignore[union-attr]


def exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def rootfs_tar() -> Path:
    """A minimal Debian 12 with PACKAGES, as a tar (about two minutes once, then cached)."""
    tar = CACHE / f"rootfs-{BASE.rsplit(':', 1)[1]}.tar"
    if tar.exists():
        return tar
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(root), MIRROR],
            check=True,
            capture_output=True,
        )
        for waste in ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists"):
            shutil.rmtree(root / waste, ignore_errors=True)
        partial = tar.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.replace(tar)
    return tar


def ensure_base() -> str:
    if not exists(BASE):
        podman(
            "import",
            "--change",
            "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "-",
            BASE,
            input_file=rootfs_tar(),
        )
    return BASE


def _sim_digest() -> str:
    files = [TESTBED / n for n in SIM_FILES] + sorted((TESTBED / "simpkgs").rglob("*.py")) + [Path(__file__)]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:10]


def sim_sglang(version: str, cuda: str = "12.9.1") -> str:
    """The simulated SGLang `version` in an image (built once; its CUDA as the engines' images say it)."""
    tag = f"{SIM_SGLANG}:{version}-cu{cuda.replace('.', '')[:3]}-{_sim_digest()}"  # rebuilt when the simulator changes
    if exists(tag):
        return tag
    ensure_base()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        pkg = ctx / "fleet-sim" / "fleet_testbed"
        pkg.mkdir(parents=True)
        for name in SIM_FILES:
            shutil.copy(TESTBED / name, pkg / name)
        site = ctx / "fleet-sim" / "site"
        shutil.copytree(TESTBED / "simpkgs" / "sglang", site / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(TESTBED / "simpkgs" / "pynvml.py", site / "pynvml.py")
        import setproctitle  # the engine's processes are titled as SGLang's are (sglang::scheduler...)

        shutil.copytree(
            Path(setproctitle.__file__).parent, site / "setproctitle", ignore=shutil.ignore_patterns("__pycache__")
        )
        meta = site / f"sglang-{version}.dist-info" / "METADATA"
        meta.parent.mkdir(parents=True)
        meta.write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        (ctx / "Containerfile").write_text(
            f"FROM {BASE}\n"
            "COPY fleet-sim /opt/fleet-sim\n"
            "ENV PYTHONPATH=/opt/fleet-sim/site:/opt/fleet-sim SIM_IN_CONTAINER=1\n"
            f"ENV CUDA_VERSION={cuda}\n"
            f'LABEL org.opencontainers.image.title="fleet testbed: simulated SGLang {version}"\n'
        )
        podman("build", "--network", "none", "-t", tag, str(ctx))
    return tag


def container_playbook(
    hdir: Path, image: str, *, base: str = "qwen35-nvfp4", extra: str = "", cli: str = "podman"
) -> str:
    """A shipped playbook (`base`) run in a container of `image` on the simulated host at `hdir`: the
    host's directory mapped in, where its GPUs and model live; `extra` playbook lines after it."""
    text = (TESTBED.parent.parent / "playbooks" / f"{base}.yaml").read_text()
    runtime = f"runtime:\n  container: {cli}\n  image: {image}\n"
    runtime += f"  run_args: [-v, '{hdir}:{hdir}', -e, 'SIM_HOST_DIR={hdir}']\n"
    return text + runtime + extra


VLLM_CPU = "localhost/fleet-vllm-cpu"


def vllm_cpu(venv: Path) -> tuple[str, list[str]]:
    """The real vLLM on CPU (the environment `make vllm-env` builds) as an image and the mounts it runs
    with: the Debian base, with the environment and the Python it was made with mounted read-only at their
    own paths (copying 1.5 GB into an image took minutes; a mount costs nothing), `python3` the venv's.
    fleet reads the engine version with the runtime's mounts, as the engine will run."""
    venv = venv.resolve()
    home = next(line.split("=", 1)[1].strip() for line in (venv / "pyvenv.cfg").read_text().splitlines()
                if line.startswith("home"))  # fmt: skip
    prefix = Path(home).resolve().parent
    mounts = [f"{venv}:{venv}:ro", f"{prefix}:{prefix}:ro"]
    tag = f"{VLLM_CPU}:{hashlib.sha256(f'{venv} {BASE}'.encode()).hexdigest()[:10]}"
    if not exists(tag):
        ensure_base()
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "Containerfile").write_text(
                f"FROM {BASE}\n"
                f"ENV PATH={venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
                'LABEL org.opencontainers.image.title="fleet testbed: the real vLLM on CPU, mounted"\n'
            )
            podman("build", "--network", "none", "-t", tag, tmp)
    return tag, mounts


def main() -> None:
    for version in ["0.5.11", "0.5.23"]:
        print(sim_sglang(version))
    venv = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if venv is not None and (venv / ".ok").exists():
        print(vllm_cpu(venv)[0])


if __name__ == "__main__":
    main()
