#!/usr/bin/env bash
# The checks that need a GPU, in one run on a machine with one (an NVIDIA GPU,
# a python3 with CUDA torch and pytest; none of the server's packages):
# the gpu test tier, then bench/checkpoint.py with the state on the GPU and on
# the CPU, side by side. Logs and JSON go to ${OUT:-bench/results}.
#   bench/device/gpu-checks.sh            (DEVICES=cuda: the GPU bench only)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
{
  nvidia-smi -L
  "$python" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
  nproc; free -g | head -2; df -h /tmp | tail -1
} 2>&1 | tee "$out/machine.txt"
# --confcutdir: the runtime tier's own conftest only (the top one needs the testbed's packages).
"$python" -m pytest -p no:cacheprovider --confcutdir=tests/runtime -m gpu tests/runtime/test_gpu.py \
  -v --durations=5 2>&1 | tee "$out/gpu-tests.log"
tests=$?
for device in ${DEVICES:-cuda cpu}; do
  (cd bench && "$python" checkpoint.py --size 512 --repeat 3 --device "$device" --dir /tmp) \
    2>&1 | tee "$out/checkpoint-$device.log"
done
cp bench/results/checkpoint*.json "$out/" 2>/dev/null
exit "$tests"
