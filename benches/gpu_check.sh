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
#   benches/gpu_check.sh all     # last call: tests/cuda.rs, bench forward (before, graphs off
#                                # and on, runs of 512 keys), the engine tests twice at once,
#                                # bench engine and bench spec
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
mods="speculation:: serving:: kv_cache:: structured:: masked_sampling:: errors:: speculator_seam:: prediction::"
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
    step 120 test-cuda.log $t cuda:: --test-threads=1 --nocapture
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
*)
    echo "usage: benches/gpu_check.sh setup|all" >&2
    exit 2
    ;;
esac
cat "$summary"
