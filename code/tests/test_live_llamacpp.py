"""The lesson's Use It shape on a real llama.cpp server (skipped unless one is named).

    SERVESIM_LLAMA_SERVER=/path/to/llama-server SERVESIM_GGUF=/path/to/model.gguf \\
        python3 -m unittest discover -s code/tests -v

code/live/llamacpp.sh builds both into ~/.cache/servesim. The server runs with the
lesson's flags (--parallel 4 --ctx-size 4096 -cb --metrics) on a free port; loadgen
measures concurrency 1, 4 and 8 (16 requests of 64 tokens each, EOS ignored).
"""

import json
import os
import socket
import subprocess
import time
import unittest
import urllib.request

from support import main, run_cli

SERVER = os.environ.get("SERVESIM_LLAMA_SERVER")
GGUF = os.environ.get("SERVESIM_GGUF")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@unittest.skipUnless(SERVER and GGUF, "live llama.cpp tests: set SERVESIM_LLAMA_SERVER (a llama-server binary) "
                                      "and SERVESIM_GGUF (a .gguf model); code/live/llamacpp.sh builds both")
class LiveLlamaCppTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.url = f"http://127.0.0.1:{free_port()}"
        threads = os.environ.get("SERVESIM_THREADS") or str(os.cpu_count() or 4)
        cls.server = subprocess.Popen(
            [SERVER, "-m", GGUF, "--host", "127.0.0.1", "--port", cls.url.rsplit(":", 1)[1], "--parallel", "4",
             "--ctx-size", "4096", "-cb", "--metrics", "--threads", threads],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            cls.wait_healthy()
            cls.runs = {concurrency: cls.loadgen(concurrency) for concurrency in (1, 4, 8)}
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        cls.server.wait(30)

    @classmethod
    def wait_healthy(cls, timeout_s=120):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(cls.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass  # refused while starting, 503 while loading
            if cls.server.poll() is not None:
                raise RuntimeError(f"llama-server exited with {cls.server.returncode}")
            time.sleep(0.5)
        raise RuntimeError("llama-server was not healthy within 120 s")

    @classmethod
    def loadgen(cls, concurrency):
        code, out, err = run_cli("loadgen", "--url", cls.url, "--concurrency", concurrency, "--requests", 16,
                                 "--max-tokens", 64, "--ignore-eos", "--json", "--quiet")
        if code != 0:
            raise RuntimeError(f"loadgen at concurrency {concurrency} exited {code}: {err}{out[-500:]}")
        return json.loads(out)

    def throughput(self, concurrency):
        return self.runs[concurrency]["summary"]["output_tok_per_s"]

    def test_every_request_generated_exactly_64_tokens(self):
        for run in self.runs.values():
            self.assertEqual((run["summary"]["num_completed"], run["summary"]["output_tokens"]), (16, 16 * 64))

    def test_four_clients_get_at_least_one_and_a_half_times_the_throughput_of_one(self):
        self.assertGreaterEqual(self.throughput(4), 1.5 * self.throughput(1))

    def test_tpot_grows_with_the_batch(self):
        self.assertGreater(self.runs[4]["summary"]["tpot_ms"]["p50"], self.runs[1]["summary"]["tpot_ms"]["p50"])

    def test_the_servers_mean_batch_is_one_alone_and_near_four_with_four_clients(self):
        self.assertEqual(round(self.runs[1]["server"]["mean_batch"], 2), 1.0)
        self.assertTrue(3.5 <= self.runs[4]["server"]["mean_batch"] <= 4.0, self.runs[4]["server"])

    def test_the_eighth_client_only_waits_for_a_slot(self):
        self.assertAlmostEqual(self.throughput(8) / self.throughput(4), 1.0, delta=0.15)
        self.assertEqual(self.runs[8]["server"]["max_waiting"], 4)
        self.assertGreater(self.runs[8]["summary"]["ttft_ms"]["p50"], self.runs[4]["summary"]["ttft_ms"]["p50"])

    def test_a_prompt_longer_than_the_slot_context_is_an_http_error_and_the_others_are_reported(self):
        endpoint = main.Endpoint.parse(self.url)
        model = main.discover_model(endpoint, {}, 10)
        prompts = main.build_prompts(4, 40, 0, seed=11)
        prompts[2] = " ".join(["word"] * 1100)  # more than the 1,024-token context of a slot
        bodies = [main.chat_body(model, prompt, 64, True, 0.0) for prompt in prompts]
        plan = main.LoadPlan(endpoint, bodies, {"Content-Type": "application/json"}, 0, 2, None, 120.0)
        with main.LoadRun(plan) as run:
            run.start()
            run.wait()
        failed = run.records[2]
        self.assertEqual((failed.error_kind, failed.status), ("http 400", 400))
        self.assertIn("exceeds the available context size", failed.error)
        summary = main.summarize(run.records)
        self.assertEqual((summary["num_completed"], summary["errors"]), (3, {"http 400": 1}))

    def test_the_gemma_preset_equals_what_the_model_file_reads(self):
        if os.path.basename(GGUF) != "gemma-3-270m-q4_k_m.gguf":
            self.skipTest("SERVESIM_GGUF is not gemma-3-270m-q4_k_m.gguf")
        self.assertEqual(main.model_from_file(GGUF), main.MODELS["gemma-3-270m-q4_k_m"])


if __name__ == "__main__":
    unittest.main()
