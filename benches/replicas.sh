#!/usr/bin/env bash
# aiperf against one `thicket serve` replica and against two replicas behind vllm-router
# (power_of_two), alternating, at each concurrency given (default 1 8 32); chat, streaming, synthetic
# prompts of 128 tokens and 64 output tokens (ignore_eos). Prints one line per run: setup,
# concurrency, TTFT p50/p90 (ms), ITL p50 (ms), output tokens/s, requests completed/failed.
# Both replicas run on this host, so on a small machine they share its cores.
#
# Needs the pinned Python packages the tests install (`cargo test --release aiperf router`
# puts them under target/e2e-python/) and a release build.
#
#   benches/replicas.sh [CONCURRENCY ...]
set -euo pipefail
cd "$(dirname "$0")/.."
concurrencies=("${@:-1 8 32}")
read -r -a concurrencies <<<"${concurrencies[*]}"
bin=target/release/thicket
aiperf_py=$(ls -d target/e2e-python/aiperf-* | head -1)
router_py=$(ls -d target/e2e-python/vllm-router-* | head -1)
$bin fetch smollm2-135m >/dev/null
tokenizer=$(cd "${THICKET_MODELS:-models}/smollm2-135m.tokenizer" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

replica() { # port
    $bin serve --port "$1" --served-model-name smollm2 --kv-cache-mib 512 2>"$work/replica-$1.log" &
    pids+=($!)
    until curl -sf "http://127.0.0.1:$1/health" >/dev/null; do sleep 0.5; done
}

seed=0
profile() { # label url concurrency
    local dir="$work/run-$seed" requests=$(($3 * 4 > 16 ? $3 * 4 : 16))
    # A new seed each run: no run's prompts are in a replica's prefix cache already.
    seed=$((seed + 1))
    PYTHONPATH=$aiperf_py HF_ENDPOINT=http://127.0.0.1:9 python3 -m aiperf profile \
        --model smollm2 --url "$2" --endpoint-type chat --streaming --tokenizer "$tokenizer" \
        --random-seed "$seed" --concurrency "$3" --request-count "$requests" --warmup-request-count "$3" \
        --synthetic-input-tokens-mean 128 --synthetic-input-tokens-stddev 0 \
        --output-tokens-mean 64 --output-tokens-stddev 0 --extra-inputs ignore_eos:true \
        --ui-type none --artifact-dir "$dir" >"$dir.log" 2>&1
    python3 - "$dir/profile_export_aiperf.json" "$1" "$3" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ttft, itl = r["time_to_first_token"], r["inter_token_latency"]
failed = r.get("error_request_count", {}).get("avg", 0)
print(f"{sys.argv[2]:>22}  c={sys.argv[3]:>2}  TTFT p50 {ttft['p50']:7.0f} ms  p90 {ttft['p90']:7.0f} ms"
      f"  ITL p50 {itl['p50']:6.1f} ms  {r['output_token_throughput']['avg']:6.1f} tok/s"
      f"  {r['completed_request_count']['avg']:.0f} done, {failed:.0f} failed")
EOF
}

a=$(free_port)
b=$(free_port)
replica "$a"
replica "$b"
r=$(free_port)
PYTHONPATH=$router_py python3 -m vllm_router.launch_router --host 127.0.0.1 --port "$r" \
    --worker-urls "http://127.0.0.1:$a" "http://127.0.0.1:$b" --policy power_of_two \
    --prometheus-port "$(free_port)" --log-level warning >"$work/router.log" 2>&1 &
pids+=($!)
until curl -sf "http://127.0.0.1:$r/v1/models" >/dev/null; do sleep 0.5; done
# Interleaved, so the host's noise falls on both setups alike; the second replica idles
# (its engine thread sleeps) while the first is measured alone.
for c in "${concurrencies[@]}"; do
    profile "one replica" "http://127.0.0.1:$a" "$c"
    profile "two behind vllm-router" "http://127.0.0.1:$r" "$c"
done
