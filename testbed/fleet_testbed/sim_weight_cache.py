"""SGLang 0.5.23's weight cache daemon on a simulated host, and the engine's side of it (IpcModelLoader).

`python -m sglang.srt.weight_cache.daemon ARGS` on a simulated host runs `daemon_main`: like the real
`launch_weight_cache_daemons` (weight_cache/daemon.py) it parses its own flags and every `sglang serve`
flag, refuses a GPU whose daemon files name a live process, and starts one process per TP x PP rank
(`rank_main`). Each rank holds its GPU's device files and the model's sharded weights in the simulated
GPU memory, loads for the host's `load_s_per_gib` seconds per GiB, binds its socket, writes its .ready
file and logs "Listening on" as the real one does, then answers engines: the weights when the engine's
configuration equals its own, a mismatch otherwise. Paths follow SGLang's templates and defaults
(SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE, SGLANG_WEIGHT_CACHE_READY_TEMPLATE, /tmp/sglang_weight_cache_{uuid}).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from fleet_testbed import gpustate
from fleet_testbed.sglang_flags import Version, parse_version

SITE = "/opt/sglang/.venv/lib/python3.12/site-packages/sglang"
SOCKET_TEMPLATE = "/tmp/sglang_weight_cache_{device_uuid}.sock"
READY_TEMPLATE = "/tmp/sglang_weight_cache_{device_uuid}.ready"
CONTEXT_MIB = 500  # each rank's CUDA context
log = logging.getLogger("sglang.srt.weight_cache.daemon")


def socket_path(uuid: str) -> str:
    return os.environ.get("SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE", SOCKET_TEMPLATE).format(device_uuid=uuid)


def ready_path(uuid: str) -> str:
    return os.environ.get("SGLANG_WEIGHT_CACHE_READY_TEMPLATE", READY_TEMPLATE).format(device_uuid=uuid)


def cache_config(args: Any, model: Any, version: Version, tp_rank: int, gpu: dict[str, Any]) -> dict[str, Any]:
    """The fields of the real CacheConfig (weight_cache/protocol.py) the simulated engine can differ in."""
    return {
        "model_path": os.path.abspath(args.model_path),
        "model_arch": model.arch,
        "tp_size": args.tp_size,
        "tp_rank": tp_rank,
        "ep_size": args.ep_size,
        "dp_size": args.dp_size,
        "quant_method": args.quantization or model_quant(model)[0],
        "dtype": args.dtype,
        "device_capability": gpu["compute_capability"],
        # the host's torch as each process finds it at its start (host.json `torch_version`: an upgrade of the
        # engine's environment under a running daemon, which keeps the torch it started with)
        "torch_version": gpustate.load_host().get("torch_version") or "2.11.0+sim-sglang-{}.{}.{}".format(*version),
    }


def ipc_quant_error(method: str, block_fp8: bool, where: str) -> str | None:
    """protocol.py check_ipc_quant_support: unquantised and block-wise FP8 only."""
    if method == "" or (method == "fp8" and block_fp8):
        return None
    return (
        f"[weight_cache:{where}] quantization method {method!r} is not verified for CUDA IPC zero-copy weight "
        "sharing. Its process_weights_after_loading may stamp Python-side metadata (e.g. format_ue8m0) or "
        "repack/transpose weights into shapes the meta-initialized client cannot reproduce, which would silently "
        "serve wrong-numerics weights. Verified methods: '' (unquantized), 'fp8'. Note: FP8 is only verified for "
        "block-wise configs (weight_block_size set), not per-tensor FP8. Disable the weight cache "
        "(--weight-cache-mode off) for this model."
    )


def model_quant(model: Any) -> tuple[str, bool]:
    """(SGLang's quant_method for the checkpoint, whether it is FP8 with block-wise scales)."""
    qc = model.config.get("quantization_config")
    qc = qc if isinstance(qc, dict) else {}
    if model.nvfp4:
        return "modelopt_fp4", False
    if model.quant_algo:
        return "modelopt_fp8" if "FP8" in model.quant_algo.upper() else "modelopt", False
    method = str(qc.get("quant_method") or "")
    return method, method == "fp8" and qc.get("weight_block_size") is not None


def load_seconds(weights_mib: int) -> float:
    """A disk load of `weights_mib` MiB on this host (host.json `load_s_per_gib`; unscaled, like a slow disk)."""
    return float(gpustate.load_host().get("load_s_per_gib") or 0) * weights_mib / 1024


def _traceback(exc_type: str, message: str, frame: tuple[str, int, str]) -> str:
    path, line, func = frame
    return (
        f'Traceback (most recent call last):\n  File "{SITE}/{path}", line {line}, in {func}\n{exc_type}: {message}\n'
    )


def daemon_main(argv: list[str]) -> None:
    from fleet_testbed.sglang_sim import SimError, resolve

    worker = argparse.ArgumentParser(add_help=False)
    for flag in ("--gpu-id", "--tp-rank", "--pp-rank"):
        worker.add_argument(flag, type=int)
    worker.add_argument("--dist-init-method")
    worker.add_argument("--timeout", type=int, default=1800)
    worker.add_argument("--force", action="store_true")
    own, rest = worker.parse_known_args(argv)
    host = gpustate.load_host()
    version = parse_version(gpustate.sglang_version(host))
    try:
        r = resolve(rest, version, gpustate.visible_gpus(), dict(os.environ), host.get("engine_picks"))
    except SimError as err:
        sys.stderr.write(err.traceback_text([]))
        sys.exit(1)
    ranks = r.args.tp_size * getattr(r.args, "pp_size", 1)
    gpus = r.gpus[:ranks]
    for gpu in gpus:  # cleanup_stale_daemon_files
        ready = ready_path(gpu["uuid"])
        pid = _ready_pid(ready)
        if pid is not None and gpustate._alive(pid) and not own.force:
            sys.stderr.write(
                _traceback(
                    "RuntimeError",
                    f"Weight cache daemon for GPU {gpu['uuid']} is already running (pid={pid}, ready={ready}). Stop "
                    "the existing daemon before launching a new one, or pass force=True (--force) to kill it and "
                    "take over.",
                    ("srt/weight_cache/protocol.py", 371, "cleanup_stale_daemon_files"),
                )
            )
            sys.exit(1)
        for path in (ready, socket_path(gpu["uuid"])):
            if os.path.exists(path):
                os.unlink(path)
    weights_mib = r.model.weights_bytes // r.args.tp_size // (1 << 20)
    method, blocks = model_quant(r.model)
    config = {"quant_method": r.args.quantization or method, "block_fp8": blocks and not r.args.quantization}
    procs = []
    for rank, gpu in enumerate(gpus):
        spec = cache_config(r.args, r.model, version, rank, gpu)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "fleet_testbed.sim_weight_cache", "rank", json.dumps([gpu, spec, weights_mib])]
                + [json.dumps(config)],
                stdin=subprocess.DEVNULL,
            )
        )
    _watch_ranks(procs, gpus, own.timeout)


def _ready_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            first = f.readline().strip()
        return int(first.partition("=")[2]) if first.startswith("pid=") else None
    except (OSError, ValueError):
        return None


def _watch_ranks(procs: list[subprocess.Popen[bytes]], gpus: list[dict[str, Any]], timeout: int) -> None:
    """Until every rank is ready, then until one exits: the rest are terminated and the daemon fails."""
    start = time.time()
    for gpu in gpus:
        while not os.path.exists(ready_path(gpu["uuid"])):
            time.sleep(0.05)
            dead = next((p for p in procs if p.poll() is not None), None)
            if dead is not None or time.time() - start > timeout:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                sys.stderr.write(
                    _traceback(
                        "RuntimeError",
                        f"Weight cache daemon exited prematurely with code {dead.returncode}"
                        if dead is not None
                        else f"Weight cache daemon did not become ready within {timeout}s",
                        ("srt/weight_cache/daemon.py", 838, "launch_weight_cache_daemons"),
                    )
                )
                sys.exit(1)
    while True:
        dead = next((p for p in procs if p.poll() is not None), None)
        if dead is not None:
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait()
    sys.stderr.write(
        _traceback(
            "RuntimeError",
            f"Weight cache daemon (pid={dead.pid}) exited with code {dead.returncode}; terminated the remaining "
            "daemons.",
            ("srt/weight_cache/daemon.py", 884, "launch_weight_cache_daemons"),
        )
    )
    sys.exit(1)


def rank_main(gpu: dict[str, Any], spec: dict[str, Any], weights_mib: int, quant: dict[str, Any]) -> None:
    from fleet_testbed.sim_child import set_pdeathsig

    set_pdeathsig()  # run_weight_cache_daemon: kill_itself_when_parent_died
    local = spec["tp_rank"]  # its CUDA device in the visible set (daemon.py compute_local_gpu_id), not nvidia-smi's
    tag = f"[WeightCacheDaemon gpu={local}]"
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [Daemon gpu={local} tp_rank={spec['tp_rank']}] %(levelname)s %(message)s",
    )
    root = gpustate.host_dir()
    held = [open(root / "dev" / n, "rb") for n in (f"nvidia{gpu['index']}", "nvidiactl", "nvidia-uvm")]  # noqa: SIM115
    gpustate.register(gpu["index"], CONTEXT_MIB)
    refused = ipc_quant_error(quant["quant_method"], quant["block_fp8"], "daemon")
    if refused:
        sys.stderr.write(
            _traceback("UnsupportedQuantForIPCError", refused, ("srt/weight_cache/daemon.py", 360, "load"))
        )
        sys.exit(1)
    log.info(f"{tag} Loading model from disk: {spec['model_path']}")
    started = time.time()
    time.sleep(load_seconds(weights_mib))
    gpustate.register(gpu["index"], CONTEXT_MIB + weights_mib)
    log.info(f"{tag} Model loaded from disk in {time.time() - started:.2f}s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(socket_path(gpu["uuid"]))
    finally:
        os.umask(old)
    sock.listen(8)
    sock.settimeout(0.5)
    with open(ready_path(gpu["uuid"]), "w") as f:
        f.write(f"pid={os.getpid()}\nconfig={spec}\n")
    log.info(f"{tag} Listening on {socket_path(gpu['uuid'])}")
    running = [True]

    def on_signal(signum: int, frame: Any) -> None:
        log.info(f"{tag} Received signal {signum}, shutting down")
        running[0] = False

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while running[0]:
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            break
        with conn:
            _answer(conn, spec, weights_mib)
    for path in (socket_path(gpu["uuid"]), ready_path(gpu["uuid"])):
        if os.path.exists(path):
            os.unlink(path)
    log.info(f"{tag} Shutdown complete")
    del held


def _message(sock: socket.socket) -> dict[str, Any]:
    """One JSON message, a line (the real protocol frames pickled messages; the fields are the same)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    said: dict[str, Any] = json.loads(data) if data.strip() else {}
    return said


def _answer(conn: socket.socket, spec: dict[str, Any], weights_mib: int) -> None:
    conn.settimeout(5)
    asked = _message(conn).get("config")
    reply: dict[str, Any]
    if asked != spec:
        reply = {"status": "mismatch", "daemon_config": spec}
    else:
        reply = {"status": "ok", "pid": os.getpid(), "entries": 1, "preloaded_weights_bytes": weights_mib << 20}
    conn.sendall(json.dumps(reply).encode() + b"\n")


def fetch(engine_config: dict[str, Any], uuid: str) -> dict[str, Any] | None:
    """The engine's side (IpcModelLoader._fetch_from_cache): None when no daemon socket exists; the daemon's
    answer otherwise."""
    path = socket_path(uuid)
    if not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    try:
        sock.connect(path)
        sock.sendall(json.dumps({"type": "fetch_state", "config": engine_config}).encode() + b"\n")
        return _message(sock)
    finally:
        sock.close()


def weights_over_ipc(server: Any, ranks: list[tuple[int, dict[str, Any]]]) -> bool:
    """The engine's IpcModelLoader in client mode, for each (rank, GPU): True when every rank mapped the
    daemon's weights; False when a socket is missing (a warning, then a disk load, as the real one does).
    A configuration the daemon does not hold is the real loader's RuntimeError."""
    from fleet_testbed.sglang_sim import SimError, log

    r = server.r
    method, blocks = model_quant(r.model)
    refused = ipc_quant_error(r.args.quantization or method, blocks and not r.args.quantization, "client")
    if refused:
        raise SimError("UnsupportedQuantForIPCError", refused, [(f"{SITE}/srt/weight_cache/protocol.py", 186, "", "")])
    pids = []
    for rank, gpu in ranks:
        config = cache_config(r.args, r.model, r.version, rank, gpu)
        answer = fetch(config, gpu["uuid"])
        if answer is None:
            log(f"[IpcModelLoader] Daemon socket not found at {socket_path(gpu['uuid'])}.", rank)
            log("[IpcModelLoader] Weight cache not available or config mismatch, falling back to disk load", rank)
            return False
        log(
            f"[IpcModelLoader] Requesting weights from daemon at {socket_path(gpu['uuid'])} with config: model="
            f"{config['model_path']}, arch={config['model_arch']}, tp={r.args.tp_size}/{rank}, quant="
            f"{config['quant_method']}, dtype={config['dtype']}",
            rank,
        )
        if answer.get("status") != "ok":
            raise SimError(
                "RuntimeError",
                f"[IpcModelLoader] Daemon config mismatch!\n  Engine config: {config}\n  Daemon config: "
                f"{answer.get('daemon_config')}",
                [(f"{SITE}/srt/weight_cache/ipc_loader.py", 562, "_fetch_from_cache", "raise RuntimeError(")],
            )
        log(f"[IpcModelLoader] Fetched {answer['entries']} tensors from daemon (transport=torch_ipc) in 0.01s", rank)
        log("[IpcModelLoader] Loaded model via IPC (mode=client), total=0.01s", rank)
        pids.append(int(answer["pid"]))
    import threading

    threading.Thread(target=_liveness_watchdog, args=(server, pids), daemon=True).start()
    return True


def _liveness_watchdog(server: Any, pids: list[int]) -> None:
    """ipc_loader.py _start_daemon_liveness_watchdog: the daemon gone, the engine kills itself."""
    from fleet_testbed.sglang_sim import log

    while True:
        time.sleep(0.5)
        for pid in pids:
            if not gpustate._alive(pid):
                log(
                    f"[IpcModelLoader] Weight cache daemon (pid={pid}) died while this engine holds its weights via "
                    "CUDA IPC. The mapped weight pointers are now dangling; continuing would read freed GPU memory. "
                    "Terminating this process."
                )
                server.kill_tree()


def main() -> None:
    if sys.argv[1:2] == ["rank"]:
        gpu, spec, weights_mib = json.loads(sys.argv[2])
        rank_main(gpu, spec, weights_mib, json.loads(sys.argv[3]))
    else:
        daemon_main(sys.argv[1:])


if __name__ == "__main__":
    main()
