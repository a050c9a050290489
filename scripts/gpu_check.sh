#!/usr/bin/env bash
# The prepared GPU run (docs/benchmarks.md, "GPU first contact"), in two passes that fit one loan of
# 15 minutes of device time (machine starts included; at most 600 s a command; no machine starts with
# under 4 minutes left): pass 1, at most 300 s, the figures that matter most, in order of value; pass
# 2, the rest, in the time left after it. Every step writes its files under $OUT as it ends.
#   on the GPU machine (device tool `run`):  bash scripts/gpu_check.sh --pass 1    (timeout_s 330)
#                                            bash scripts/gpu_check.sh --pass 2    (timeout_s 330)
#   on a CPU (tests/scripts/test_gpu_check.py, in `make test`):  bash scripts/gpu_check.sh --pass N --dry-run
# Each step gets the smaller of its cap (its share of the budget) and the time left; its status and
# seconds go to summary.txt at once; a failed or cut step never stops the next; the summary ends with
# what to run next. The dry run runs the same steps on toy shapes and says which checks need CUDA.
# Environment: OUT (default /tmp/membound-gpu), PYTHON (default python3: the one holding torch),
# GPU_CHECK_BUDGET_S (default 300: the caps scale with it), GPU_CHECK_CAPS ("step=seconds,...": caps
# in seconds, not scaled), GPU_CHECK_STEPS (a comma list: only these), GPU_CHECK_FAULT ("step:hang",
# "step:stubborn" or "step:fail": tests the deadline).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() { echo "usage: bash scripts/gpu_check.sh [--pass 1|2] [--dry-run]   (results under \$OUT)" >&2; exit 2; }
DRY_RUN=0
PASS=1
while (($#)); do
    case $1 in
        --dry-run) DRY_RUN=1 ;;
        --pass) PASS=${2:-}; shift ;;
        --pass=*) PASS=${1#--pass=} ;;
        *) usage ;;
    esac
    shift
done
[[ $PASS == 1 || $PASS == 2 ]] || usage
OUT=${OUT:-/tmp/membound-gpu}
PY=${PYTHON:-python3}
NOMINAL_S=300     # the budget the caps below are written for
BUDGET_S=${GPU_CHECK_BUDGET_S:-$NOMINAL_S}
RESERVE_S=10      # kept back for the summary at the end
KILL_GRACE_S=5    # after its time, a step gets SIGTERM, then SIGKILL this much later
MIN_STEP_S=${GPU_CHECK_MIN_STEP_S:-5}
# name:cap in seconds of the nominal budget, in order of value; the caps add up to the budget less
# the summary's reserve and one kill's grace. From the first GPU run's times (session 22): the 8B
# quantise-and-compile went to pass 2, batch 64 to the end of pass 1 (pass 2 sweeps it).
if ((PASS == 1)); then
    STEPS=(env:10 nvidia-smi:4 nvml-probe:12 kernel-tests:45 smoke:45 bench:45 weights:55 flash-decode:18
           speculative:41 batch:10)
else
    STEPS=(smoke-2:30 overhead:60 batch-sweep:45 attention:35 weights-8b:115)
fi

mkdir -p "$OUT"
rm -f "$OUT"/summary.txt "$OUT"/gpu_check.log "$OUT"/checks.json "$OUT"/kernel-tests.xml "$OUT"/bench-*.json \
    "$OUT"/sweep-*.json "$OUT"/*.tmp  # a rerun's (the device tool empties $OUT; a CPU run may not)
SUMMARY=$OUT/summary.txt
LOG=$OUT/gpu_check.log
: >"$SUMMARY"
: >"$LOG"
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPU_CHECK_DRY_RUN=$DRY_RUN GPU_CHECK_PASS=$PASS
if ((DRY_RUN)); then
    export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # a CPU, shared: one thread per step
fi

now_ms() { echo $(($(date +%s%N) / 1000000)); }
START_MS=$(now_ms)
DEADLINE_MS=$((START_MS + BUDGET_S * 1000))

say() { echo "$*" | tee -a "$SUMMARY"; }

cap_of() {  # the nominal cap scaled to the budget; GPU_CHECK_CAPS overrides it (seconds)
    local name=$1 cap=$(($2 * BUDGET_S / NOMINAL_S)) item
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
    if ((cap < left_s)); then allow_s=$cap; else allow_s=$left_s; fi
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
say "membound GPU check, pass $PASS: $( ((DRY_RUN)) && echo "DRY RUN on a CPU, toy shapes" || echo "device run"); $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "commit $commit; budget ${BUDGET_S} s (${RESERVE_S} s kept for this summary); host $(uname -n); $PY"
say "$(printf '%-13s %-10s %4s %8s %8s  %s' step status rc seconds allowed result)"
for entry in "${STEPS[@]}"; do
    wanted "${entry%%:*}" && run_step "${entry%%:*}" "${entry#*:}"
done
rm -f "$OUT"/*.tmp  # a step cut while writing leaves one: at most 8 files come back
total=$(awk -v ms=$(($(now_ms) - START_MS)) 'BEGIN { printf "%.1f", ms / 1000 }')
say "gpu_check pass $PASS: steps done in $total s: $N_OK ok, $N_FAILED failed, $N_CUT timed out, $N_SKIPPED skipped"
# the figures, and what to run next (no torch: it runs last, always)
STEP_BUDGET_S=$RESERVE_S timeout --kill-after=2 "$RESERVE_S" "$PY" scripts/gpu_steps.py summarize >>"$LOG" 2>&1 </dev/null ||
    say "summary of the figures failed (see gpu_check.log)"
sed -n '/^figures/,$p' "$SUMMARY"
((N_FAILED + N_CUT == 0))
