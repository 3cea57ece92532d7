#!/usr/bin/env bash
# The meter against a real NVIDIA GPU in one go (devtools/gpu_check.py says what it checks).
#
# Here, once (copies the agent's runtime dependencies from .venv, ~27 MB, into .gpu-deps/,
# which .gitignore lists: it travels only when carried):
#     devtools/gpu_check.sh --prepare
# On the GPU machine (the device tool: carry [".gpu-deps"], timeout_s 420):
#     bash devtools/gpu_check.sh [SECONDS] [INTERVAL_S]
# It writes $OUT/gpu_check.json (or ./gpu_check.json) and prints OK:/FAIL: lines. The
# compiled dependencies need the same Python minor version there as here (3.11); the
# first part (NVML facts) needs only pynvml, which is pure Python.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=.gpu-deps
if [[ "${1:-}" == "--prepare" ]]; then
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$deps" && mkdir -p "$deps"
    for name in msgspec nacl cffi _cffi_backend cryptography structlog prometheus_client \
        greenlet typing_extensions pynvml PyNaCl.libs; do
        cp -r "$site"/"$name"* "$deps"/ 2>/dev/null || true
    done
    du -sh "$deps"
    exit 0
fi
seconds=${1:-120}
interval=${2:-10}
out=${OUT:-.}
python=$(command -v python3.11 || command -v python3)
echo "python: $($python --version 2>&1); GPUs: $(nvidia-smi -L 2>/dev/null | wc -l)"
nvidia-smi --query-gpu=index,uuid,name,memory.total,power.draw,clocks.sm,mig.mode.current \
    --format=csv 2>/dev/null || echo "nvidia-smi: unavailable"
PYTHONPATH="$PWD:$PWD/$deps" "$python" -m devtools.gpu_check \
    --seconds "$seconds" --interval-s "$interval" --out "$out/gpu_check.json"
