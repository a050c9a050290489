#!/usr/bin/env bash
# The prepared GPU run (docs/benchmarks.md, "GPU first contact"): one call that ends inside its
# budget and leaves every step's results under $OUT as that step ends.
#   on the GPU machine (device tool `run`, timeout_s 600):  bash scripts/gpu_check.sh
#   on a CPU (the test in tests/test_gpu_check.py):         bash scripts/gpu_check.sh --dry-run
# Each step gets the smaller of its cap and the time left, its exit code and seconds go to
# summary.txt at once, and a failed or cut step never stops the next. The dry run runs the same
# steps on toy shapes and reports the CUDA-only checks as skipped, with the reason.
# Environment: OUT (default /tmp/membound-gpu), PYTHON (default python3: the one holding torch),
# GPU_CHECK_BUDGET_S (default 560), GPU_CHECK_CAPS ("step=seconds,..."), GPU_CHECK_STEPS (a comma
# list: only these), GPU_CHECK_FAULT ("step:hang", "step:stubborn" or "step:fail": tests the deadline).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

DRY_RUN=0
case "${1:-}" in
    "") ;;
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: bash scripts/gpu_check.sh [--dry-run]   (results under \$OUT)" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/membound-gpu}
PY=${PYTHON:-python3}
BUDGET_S=${GPU_CHECK_BUDGET_S:-560}
RESERVE_S=15      # kept back for the summary at the end
KILL_GRACE_S=5    # after its time, a step gets SIGTERM, then SIGKILL this much later
MIN_STEP_S=${GPU_CHECK_MIN_STEP_S:-10}
# name and cap in seconds, in order of value (0: whatever time is left)
STEPS=(env:30 nvidia-smi:15 nvml-probe:30 kernel-tests:60 smoke:90 bench:150 batch:90 attention:70 overhead:60
       speculative:75 weights:0)

mkdir -p "$OUT"
rm -f "$OUT"/checks.json "$OUT"/kernel-tests.xml "$OUT"/bench-*.json "$OUT"/sweep-*.json "$OUT"/*.tmp  # a rerun's
SUMMARY=$OUT/summary.txt
LOG=$OUT/gpu_check.log
: >"$SUMMARY"
: >"$LOG"
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPU_CHECK_DRY_RUN=$DRY_RUN
if ((DRY_RUN)); then
    export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # a CPU, shared: one thread per step
fi

now_ms() { echo $(($(date +%s%N) / 1000000)); }
START_MS=$(now_ms)
DEADLINE_MS=$((START_MS + BUDGET_S * 1000))

say() { echo "$*" | tee -a "$SUMMARY"; }

cap_of() {  # GPU_CHECK_CAPS overrides the table
    local name=$1 cap=$2 item
    IFS=, read -ra items <<<"${GPU_CHECK_CAPS:-}"
    for item in "${items[@]}"; do
        [[ "${item%%=*}" == "$name" ]] && cap=${item#*=}
    done
    echo "$cap"
}

wanted() {
    [[ -z "${GPU_CHECK_STEPS:-}" || ",${GPU_CHECK_STEPS}," == *",$1,"* ]]
}

N_OK=0 N_FAILED=0 N_SKIPPED=0 N_CUT=0
run_step() {
    local name=$1 cap left_s allow_s t0 rc secs status note offset
    cap=$(cap_of "$name" "$2")
    left_s=$(((DEADLINE_MS - $(now_ms)) / 1000 - RESERVE_S - KILL_GRACE_S))
    if ((cap > 0 && cap < left_s)); then allow_s=$cap; else allow_s=$left_s; fi
    if ((left_s < MIN_STEP_S)); then
        N_SKIPPED=$((N_SKIPPED + 1))
        printf '%-13s %-10s %4s %8s %8s  %s\n' "$name" skipped - 0.0 "$allow_s" \
            "no time left (${left_s} s before the summary)" | tee -a "$SUMMARY"
        return
    fi
    local cmd=("$PY" scripts/gpu_steps.py "$name")
    case "${GPU_CHECK_FAULT:-}" in
        "$name:hang") cmd=("$PY" -c "import time; time.sleep(3600)") ;;
        "$name:stubborn") cmd=("$PY" -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)") ;;
        "$name:fail") cmd=("$PY" -c "print('RESULT: injected failure'); raise SystemExit(3)") ;;
    esac
    offset=$(($(stat -c %s "$LOG") + 1))
    echo "===== step $name: at most ${allow_s} s ($(date -u +%H:%M:%S) UTC) =====" >>"$LOG"
    t0=$(now_ms)
    STEP_BUDGET_S=$allow_s timeout --kill-after="$KILL_GRACE_S" "$allow_s" "${cmd[@]}" >>"$LOG" 2>&1 </dev/null
    rc=$?
    secs=$(awk -v ms=$(($(now_ms) - t0)) 'BEGIN { printf "%.1f", ms / 1000 }')
    note=$(tail -c +"$offset" "$LOG" | grep -a '^RESULT: ' | tail -n 1 | cut -c 9-)
    case $rc in
        0) status=ok; N_OK=$((N_OK + 1)) ;;
        77) status=skipped; N_SKIPPED=$((N_SKIPPED + 1)) ;;
        124 | 137) status="TIMED-OUT"; N_CUT=$((N_CUT + 1)); note="cut at ${allow_s} s${note:+; last result: $note}" ;;
        *) status=FAILED; N_FAILED=$((N_FAILED + 1)) ;;
    esac
    echo "===== step $name: $status, exit $rc, $secs s =====" >>"$LOG"
    printf '%-13s %-10s %4s %8s %8s  %s\n' "$name" "$status" "$rc" "$secs" "$allow_s" "${note:-}" | tee -a "$SUMMARY"
    if [[ $status != ok && $status != skipped ]]; then  # the cause, where the tool's output tail shows it
        tail -c +"$offset" "$LOG" | tail -n 15 | sed 's/^/    | /'
    fi
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown (no git here)")
say "membound GPU check: $( ((DRY_RUN)) && echo "DRY RUN on a CPU, toy shapes" || echo "device run"); $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "commit $commit; budget ${BUDGET_S} s (${RESERVE_S} s kept for this summary); host $(uname -n); $PY"
say "$(printf '%-13s %-10s %4s %8s %8s  %s' step status rc seconds allowed result)"
for entry in "${STEPS[@]}"; do
    wanted "${entry%%:*}" && run_step "${entry%%:*}" "${entry#*:}"
done
rm -f "$OUT"/*.tmp  # a step cut while writing leaves one: at most 8 files come back
STEP_BUDGET_S=$RESERVE_S timeout --kill-after=2 "$RESERVE_S" "$PY" scripts/gpu_steps.py summarize >>"$LOG" 2>&1 </dev/null ||
    say "summary of the figures failed (see gpu_check.log)"
sed -n '/^figures/,$p' "$SUMMARY"
total=$(awk -v ms=$(($(now_ms) - START_MS)) 'BEGIN { printf "%.1f", ms / 1000 }')
say "gpu_check: done in $total s: $N_OK ok, $N_FAILED failed, $N_CUT timed out, $N_SKIPPED skipped"
((N_FAILED + N_CUT == 0))
