#!/usr/bin/env bash
# The checks that need the GPU machine, in one call (docs/benchmarks.md, "On a GPU").
#
#   1. simulator fidelity on the machine's CPU cores, 4 stages (runtime_fidelity.py);
#   2. bf16 swap and recompute of one gpt stage (width 4096) with the simulator's
#      predictions, the same model as 2 stages sharing the GPU, and plain PyTorch beside it;
#   3. the fp32 case of 2 stages sharing one GPU: gpt of 8 blocks, width 1024, sequence 512.
#
# Each step has its own time limit so that a slow one cannot starve the next; every log and
# the benchmarks' output folders end up in $OUT (or ./gpu-checks when OUT is unset) as
# results.tar.gz. Python packages missing on the machine travel as wheels in .whl/.
set -u
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-checks}"
work=$(mktemp -d)
mkdir -p "$out"
if [ -z "${NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
pack() { tar -C "$work" -czf "$out/results.tar.gz" . ; }
trap pack EXIT

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$work/machine.log"
"$python" -c "import os, torch; print('torch', torch.__version__, 'cores', os.cpu_count())" \
    | tee -a "$work/machine.log"

timeout "${FIDELITY_S:-190}" "$python" bench/runtime_fidelity.py --stages 4 --quiet-wait 10 \
    --out "$work/fidelity" 2>&1 | tee "$work/fidelity.log"
timeout "${BF16_S:-150}" "$python" bench/runtime_gpu.py --precision bf16 --shared --plain \
    --rounds 1 --steps 3 --warm-steps 1 --out "$work/bf16" 2>&1 | tee "$work/bf16.log"
timeout "${SHARED_S:-70}" "$python" bench/runtime_gpu.py --precision fp32 --variants keep \
    --shared --model-arg layers=8 --model-arg width=1024 \
    --model-arg seq_len=512 --rounds 1 --steps 3 --warm-steps 1 --out "$work/shared" 2>&1 \
    | tee "$work/shared.log"
