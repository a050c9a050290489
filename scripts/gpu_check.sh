#!/usr/bin/env bash
# The one prepared GPU run (device tool): CUDA correctness checks, then the bench sweeps.
# Usage on the GPU machine, from the repo root:  bash scripts/gpu_check.sh [PART...]   (writes under $OUT)
# PART: smoke (environment, imports, CUDA smoke, unit tests), bench (batch-1 decode), sweeps (weights,
# attention), batch (the batch sweep); none: all of them. The device tool runs one command for at
# most 600 s and lends 15 minutes in all, so run the parts as separate calls if all do not fit.
# That machine has torch/triton/tokenizers/jinja2/pytest but no gguf, PySide6 or pyqtgraph:
# the engine runs from the source tree (PYTHONPATH), nothing is installed.
set -uo pipefail
OUT=${OUT:-/tmp/membound-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
PARTS=${*:-smoke bench sweeps batch}
want() { [[ " $PARTS " == *" $1 "* ]]; }

if want smoke; then
log "environment"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/summary.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,memory.used --format=csv | tee -a "$OUT/summary.txt"

log "engine imports without gguf / PySide6 / pyqtgraph"
python3 -c "import engine.engine, engine.bench, engine.cli, kernels; print('ok')" 2>&1 | tee -a "$OUT/summary.txt"

log "CUDA smoke: graph decode == eager decode, metrics sane"
timeout 300 python3 scripts/gpu_smoke.py 2>&1 | tee -a "$OUT/summary.txt"

log "unit tests that need no gguf (kernels run compiled on the GPU where they parametrise over devices)"
timeout 300 python3 -m pytest -q -x tests/engine/test_model.py tests/engine/test_engine.py tests/engine/test_metrics.py \
    tests/engine/test_hardware.py $(ls tests/kernels/test_*.py 2>/dev/null) 2>&1 | tail -n 15 | tee -a "$OUT/summary.txt"

fi

if want bench; then
log "bench: batch-1 decode, llama3-8b shape, bf16"
timeout 400 python3 -m engine.cli bench --device cuda --model synthetic:llama3-8b --dtype bf16 \
    --repeats 3 --json "$OUT/bench-bf16.json" 2>&1 | tee -a "$OUT/summary.txt"

fi

if want sweeps && python3 -m engine.cli bench --help | grep -q -- "--sweep"; then
    for sweep in weights attention; do
        if python3 -m engine.cli bench --help | grep -q "$sweep"; then
            log "bench sweep: $sweep"
            timeout 400 python3 -m engine.cli bench --device cuda --model synthetic:llama3-8b --dtype bf16 \
                --sweep "$sweep" --json "$OUT/sweep-$sweep.json" 2>&1 | tee -a "$OUT/summary.txt"
        fi
    done
fi
if want batch; then
log "bench sweep: batch (issue 6 target: aggregate decode tok/s at batch 64 >= 30x batch 1)"
timeout 400 python3 -m engine.cli bench --device cuda --model synthetic:llama3-8b --sweep batch \
    --json "$OUT/sweep-batch.json" 2>&1 | tee -a "$OUT/summary.txt"
fi
log "done: $PARTS"
