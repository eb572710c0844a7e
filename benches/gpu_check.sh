#!/usr/bin/env bash
# The checks and timings of thicket's CUDA backend on a lent GPU machine, in as few calls as
# its time allows. Everything it runs was built elsewhere (scripts/build-cuda.sh --tests) and
# carried in the working tree under $GPU_DIR (default .gpu, ignored by git), in calls each
# under the carry limit: a warm machine keeps /tmp between calls, not the carried folders, so
# every call copies its pieces into /tmp/gpu first.
#
#   $GPU_DIR/m*/smol.xz.N               SmolLM2's GGUF, xz-compressed, in pieces (N = 0, 1)
#   $GPU_DIR/m*/smollm2-135m.gguf.sha256
#   $GPU_DIR/bin/thicket.xz             the CUDA binary under test
#   $GPU_DIR/bin/thicket-before.xz      the binary from before the change (optional)
#   $GPU_DIR/tests/tests.xz             the test binary
#
#   benches/gpu_check.sh setup   # first call: copies its pieces and stops
#   benches/gpu_check.sh all     # last call: tests/model/cuda.rs, bench forward (before, graphs off
#                                # and on, runs of 512 keys), the engine tests twice at once,
#                                # bench engine and bench spec
#   benches/gpu_check.sh speculation   # instead of `all`: Spec-Bench chat cold and warm, and
#                                      # the batch job (none, auto, its ceiling)
#
# Logs are archived to $OUT/logs.tgz (or /tmp/gpu-out) with a summary printed last. Every step
# has its own time limit, and none starts after DEADLINE seconds (default 520).
set -u
cd "$(dirname "$0")/.."
GPU_DIR=${GPU_DIR:-.gpu}
OUT=${OUT:-/tmp/gpu-out}
# Logs are kept apart and come back as one archive (a call returns only a few files).
LOGS=/tmp/gpu-logs
mkdir -p "$OUT" "$LOGS" /tmp/gpu/models
export THICKET_MODELS=/tmp/gpu/models
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

site=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)
libs=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"

# Pieces carried in earlier calls wait in /tmp/gpu/parts (a warm machine keeps /tmp, not the
# carried folders); the model is joined once all are there.
mkdir -p /tmp/gpu/parts
for f in "$GPU_DIR"/m*/*; do [ -f "$f" ] && cp "$f" /tmp/gpu/parts/; done
model=/tmp/gpu/models/smollm2-135m.gguf
if [ ! -s "$model" ] && [ -f /tmp/gpu/parts/smol.xz.1 ]; then
    cat /tmp/gpu/parts/smol.xz.* | xz -dc >"$model"
    cp /tmp/gpu/parts/smollm2-135m.gguf.sha256 /tmp/gpu/models/
fi

unpack() { # unpack NAME.xz -> /tmp/gpu/NAME (a copy already unpacked is kept)
    if [ -f "$1" ]; then
        xz -dc "$1" >"/tmp/gpu/$2" && chmod +x "/tmp/gpu/$2"
        return
    fi
    [ -x "/tmp/gpu/$2" ]
}
unpack "$GPU_DIR/tests/tests.xz" tests
unpack "$GPU_DIR/bin/thicket.xz" thicket
unpack "$GPU_DIR/bin/thicket-before.xz" thicket-before
if [ -s "$model" ]; then
    want=$(cat /tmp/gpu/models/smollm2-135m.gguf.sha256)
    have=$(sha256sum "$model" | cut -d' ' -f1)
    [ "$want" = "$have" ] || note "SmolLM2 checksum mismatch: $have"
fi

# Steps stop starting once DEADLINE seconds have passed (the call's own limit is near).
DEADLINE=${DEADLINE:-520}
step() { # step SECONDS LOG COMMAND...: runs, logs, notes the outcome
    local limit=$1 log=$2
    shift 2
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 20 ]; then
        note "[$log] skipped: the deadline is near"
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0=$SECONDS
    timeout "$limit" "$@" >"$LOGS/$log" 2>&1
    local rc=$?
    note "[$log] rc=$rc in $((SECONDS - t0)) s: $*"
    return $rc
}

new=/tmp/gpu/thicket old=/tmp/gpu/thicket-before t=/tmp/gpu/tests
fwd="bench forward --model $model --context 512 --sizes 1,16,64,80 --repeats 7"
eng="bench engine --model $model --concurrency 1,64 --max-tokens 64 --speculation none"
mods="engine::speculation:: engine::requests:: model::kv_cache:: engine::structured:: engine::masked_sampling:: model::load_and_input_errors:: http::error_responses:: engine::speculator_seam:: engine::prediction::"
results() {
    note "--- results"
    for f in "$LOGS"/fwd*.log; do
        [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E '^Backend|^\| *[0-9]' "$f" | head -8; } >>"$summary"
    done
    for f in "$LOGS"/engine-*.log "$LOGS"/spec-*.log; do
        [ -f "$f" ] && { echo "== $(basename "$f")"; tail -22 "$f"; } >>"$summary"
    done
    for f in "$LOGS"/test-*.log; do
        [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E '^test result|FAILED|panicked|graphs:|largest|running for over' "$f" | head -30; } >>"$summary"
    done
}

case "${1:-}" in
setup)
    ls -la /tmp/gpu /tmp/gpu/parts
    ;;
all)
    nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee -a "$summary"
    step 120 test-cuda.log $t model::cuda:: --test-threads=1 --nocapture
    [ -x $old ] && step 40 fwd-before.log $old $fwd
    step 40 fwd-split512.log env THICKET_CUDA_SPLIT_KEYS=512 $new $fwd
    step 40 fwd-graphs-off.log env THICKET_CUDA_GRAPHS=0 $new $fwd
    step 40 fwd-graphs-on.log $new $fwd
    # The engine's tests twice at once, four at a time each, as CI runs them (tests that
    # start the thicket binary or fetch packages cannot run here).
    skip="--skip a_batch_line_with_a_prediction"
    (step 110 test-engine-a.log $t $mods $skip --test-threads=4) &
    (step 110 test-engine-b.log $t $mods $skip --test-threads=4) &
    wait
    step 60 engine-after.log $new $eng
    step 60 spec-after.log $new bench spec --model "$model" --per-category 1 --max-tokens 128 \
        --control --out "$LOGS/spec-after.json"
    results
    tar -czf "$OUT/logs.tgz" -C "$LOGS" .
    ;;
speculation)
    # The chat and batch speculation targets where a verified row costs little: Spec-Bench chat at
    # one client, cold and warm (the other half served first), then the batch job through one
    # JSON schema at 4 lines in flight, none and auto alternating, then its ceiling (each line
    # predicting its own answer from none's results).
    nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv | tee -a "$summary"
    step 240 spec-chat.log $new bench spec --model "$model" --methods auto --control \
        --warm-up half --per-category 2 --warm-up-per-category 1000 --max-tokens 128 \
        --out "$LOGS/spec-chat.json"
    python3 benches/batch_json_job.py >/tmp/gpu/job.jsonl
    job() { # job NAME METHOD INPUT: one batch job in a fresh process, its wall time noted
        rm -f "/tmp/gpu/$1.jsonl"
        local t0
        t0=$(date +%s.%N)
        step 90 "batch-$1.log" $new batch --model "$model" --speculation "$2" --max-in-flight 4 \
            --input "$3" --output "/tmp/gpu/$1.jsonl" &&
            note "batch $1: $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f} s')")"
    }
    job none-1 none /tmp/gpu/job.jsonl
    job auto-1 auto /tmp/gpu/job.jsonl
    job auto-2 auto /tmp/gpu/job.jsonl
    job none-2 none /tmp/gpu/job.jsonl
    python3 benches/batch_json_job.py --predict-from /tmp/gpu/none-1.jsonl >/tmp/gpu/perfect.jsonl &&
        job perfect-1 auto /tmp/gpu/perfect.jsonl
    python3 - /tmp/gpu/none-1.jsonl /tmp/gpu/none-2.jsonl /tmp/gpu/auto-1.jsonl \
        /tmp/gpu/auto-2.jsonl /tmp/gpu/perfect-1.jsonl <<'PY' | tee -a "$summary"
import json, sys
def answers(path):
    try:
        lines = [json.loads(l) for l in open(path)]
    except OSError:
        return None
    return {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"]
            for r in lines if r.get("response")}
base = answers(sys.argv[1])
for path in sys.argv[2:]:
    other = answers(path)
    if base is None or other is None:
        print(f"{path}: missing")
        continue
    same = sum(1 for k, v in base.items() if other.get(k) == v)
    print(f"{path}: {same} of {len(base)} answers identical to none-1's ({len(other)} lines)")
PY
    for f in "$LOGS"/batch-*.log; do
        [ -f "$f" ] && { echo "== $(basename "$f")"; tail -4 "$f"; } >>"$summary"
    done
    { echo "== spec-chat.log"; tail -30 "$LOGS/spec-chat.log"; } >>"$summary"
    cp "$LOGS/spec-chat.json" "$OUT/" 2>/dev/null
    tar -czf "$OUT/logs.tgz" -C "$LOGS" .
    ;;
*)
    echo "usage: benches/gpu_check.sh setup|all|speculation" >&2
    exit 2
    ;;
esac
cat "$summary"
