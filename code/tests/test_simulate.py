"""simulate and sweep: the Step 9 runs of the lesson, their shapes and their figures."""

import json
import os
import subprocess
import sys
import unittest

from support import (CODE_DIR, FIXTURES_DIR, main, make_request, make_scheduler, run_cli, run_json,
                     synthetic_requests)

BURST = os.path.join(FIXTURES_DIR, "burst.jsonl")
H100_SWEEP = ("sweep", "--requests", "256", "--concurrency", "1,8,32,128,256")
CPU_SWEEP = ("sweep", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096",
             "--max-num-seqs", "4", "--prompt-tokens", "40", "--output-tokens", "64", "--requests", "16",
             "--concurrency", "1,4,8")


def by_concurrency(report):
    return {run["settings"]["arrivals"]["concurrency"]: run for run in report["runs"]}


class SweepShapeTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.h100 = by_concurrency(run_json(*H100_SWEEP))
        cls.cpu = by_concurrency(run_json(*CPU_SWEEP))

    def test_h100_single_client_decodes_at_the_weight_read_rate(self):
        # the lesson's plain roofline gave 7.4 ms; the H100 fitted to real vLLM runs reads the
        # weights at 0.835 of the peak and pays its step and 32 layers' floor: 16.06 GB / 2.80 TB/s
        # + 0.245 ms + 32 x 23 us
        run = self.h100[1]["summary"]
        self.assertAlmostEqual(run["tpot_ms"]["p50"], 6.9, delta=0.3)
        self.assertAlmostEqual(run["output_tok_per_s"], 140, delta=14)

    def test_h100_eight_clients_buy_six_times_the_throughput_for_a_millisecond_of_tpot(self):
        one, eight = self.h100[1]["summary"], self.h100[8]["summary"]
        self.assertGreaterEqual(eight["output_tok_per_s"], 6 * one["output_tok_per_s"])
        self.assertLessEqual(eight["tpot_ms"]["p50"] - one["tpot_ms"]["p50"], 1.5)

    def test_h100_256_clients_pay_ten_times_the_ttft_of_128(self):
        self.assertGreaterEqual(self.h100[256]["summary"]["ttft_ms"]["p50"],
                                10 * self.h100[128]["summary"]["ttft_ms"]["p50"])

    def test_h100_sweep_never_preempts(self):
        self.assertEqual([run["engine"]["num_preemptions"] for run in self.h100.values()], [0] * 5)

    def test_h100_sweep_finishes_every_request_with_its_output_length(self):
        for run in self.h100.values():
            self.assertEqual(run["summary"]["num_completed"], 256)
            self.assertEqual(run["summary"]["errors"], {})

    def test_cpu_single_client_tpot_is_about_9_ms(self):
        self.assertAlmostEqual(self.cpu[1]["summary"]["tpot_ms"]["p50"], 9.2, delta=1.0)

    def test_cpu_four_slots_buy_two_to_two_and_a_half_times_the_throughput(self):
        ratio = self.cpu[4]["summary"]["output_tok_per_s"] / self.cpu[1]["summary"]["output_tok_per_s"]
        self.assertTrue(2.0 <= ratio <= 2.5, ratio)

    def test_cpu_eighth_client_only_waits(self):
        four, eight = self.cpu[4], self.cpu[8]
        self.assertAlmostEqual(eight["summary"]["output_tok_per_s"] / four["summary"]["output_tok_per_s"],
                               1.0, delta=0.02)
        self.assertEqual(round(eight["engine"]["mean_batch_seqs"], 1), 4.0)
        self.assertGreater(eight["summary"]["queue_ms"]["p95"], 0)
        self.assertEqual(four["summary"]["queue_ms"]["p95"], 0)

    def test_cpu_sweep_prints_the_lessons_table(self):
        code, out, err = run_cli(*CPU_SWEEP)
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines(), [
            "sweep smollm2-135m-q8_0 on cpu-4vcpu 16 requests prompt 40 output 64",
            "concurrency  out tok/s  ttft p50  tpot p50  tpot p95  queue p95  batch  kv peak  preempt",
            "          1       92.6     109.6       9.2       9.2        0.0    1.0     2.7%        0",
            "          4      207.1     432.4      12.8      12.8        0.0    4.0    10.9%        0",
            "          8      207.1    1668.9      12.8      12.8     1236.4    4.0    10.9%        0",
            "steps priced by the roofline of cpu-4vcpu at effective figures fitted to no run (calibrate them on your server)",
        ])


class BurstTest(unittest.TestCase):
    """The Monday incident: 48 requests in 3.5 s sharing two 1,024-token system prompts."""

    @classmethod
    def setUpClass(cls):
        cls.plain = run_json("simulate", "--hardware", "l4-24gb", "--trace", BURST)
        cls.cached = run_json("simulate", "--hardware", "l4-24gb", "--trace", BURST, "--prefix-caching")

    def test_without_prefix_caching_the_cache_fills_and_requests_are_preempted(self):
        self.assertEqual(self.plain["engine"]["kv_peak"], 1.0)
        self.assertGreater(self.plain["engine"]["num_preemptions"], 0)
        self.assertEqual(self.plain["engine"]["prefix_hit_rate"], 0.0)

    def test_with_prefix_caching_nothing_is_preempted_and_most_prompt_tokens_hit(self):
        self.assertEqual(self.cached["engine"]["num_preemptions"], 0)
        self.assertGreater(self.cached["engine"]["prefix_hit_rate"], 0.6)

    def test_prefix_caching_cuts_ttft_fivefold_and_raises_throughput_and_batch(self):
        plain, cached = self.plain, self.cached
        self.assertGreaterEqual(plain["summary"]["ttft_ms"]["p50"], 5 * cached["summary"]["ttft_ms"]["p50"])
        self.assertGreaterEqual(cached["summary"]["output_tok_per_s"], 1.5 * plain["summary"]["output_tok_per_s"])
        self.assertGreaterEqual(cached["engine"]["mean_batch_seqs"], 1.5 * plain["engine"]["mean_batch_seqs"])

    def test_every_request_of_the_burst_completes(self):
        for report in (self.plain, self.cached):
            self.assertEqual(report["summary"]["num_completed"], 48)


class SimulateTest(unittest.TestCase):

    def test_the_same_seed_gives_the_same_output_byte_for_byte(self):
        argv = ("simulate", "--rate", "20", "--requests", "64", "--seed", "7", "--json")
        first, second = run_cli(*argv), run_cli(*argv)
        self.assertEqual(first, second)
        other_seed = run_cli("simulate", "--rate", "20", "--requests", "64", "--seed", "8", "--json")
        self.assertNotEqual(first[1], other_seed[1])

    def test_poisson_arrivals_average_the_requested_rate(self):
        requests = synthetic_requests(4000, (10, 10), (10, 10), seed=3, rate=50.0)
        mean_gap = requests[-1].arrival_s / (len(requests) - 1)
        self.assertAlmostEqual(mean_gap, 1 / 50, delta=0.001)

    def test_range_lengths_are_uniform_within_bounds_and_fixed_lengths_are_fixed(self):
        requests = synthetic_requests(500, (256, 1024), (64, 64), seed=0)
        prompts = [request.prompt_tokens for request in requests]
        self.assertEqual((min(prompts) >= 256, max(prompts) <= 1024), (True, True))
        self.assertGreater(max(prompts) - min(prompts), 600)
        self.assertEqual({request.max_tokens for request in requests}, {64})

    def test_closed_loop_keeps_exactly_n_requests_in_flight(self):
        requests = [make_request(index, prompt_tokens=16, max_tokens=8) for index in range(10)]
        scheduler = make_scheduler(num_blocks=100, block_size=16)
        main.simulate(scheduler, main.HARDWARE["l4-24gb"], main.MODELS["llama-3.1-8b"], requests,
                      concurrency=3)
        ends = sorted(request.token_times[-1] for request in requests)
        for request in requests[3:]:
            # Each later request is sent the moment an earlier one finishes.
            self.assertIn(request.sent_s, ends)
        self.assertEqual([request.sent_s for request in requests[:3]], [0.0, 0.0, 0.0])

    def test_open_loop_requests_are_sent_at_their_arrival_and_queue_from_there(self):
        requests = [make_request(0, 16, 4, arrival_s=0.0), make_request(1, 16, 4, arrival_s=5.0)]
        scheduler = make_scheduler(num_blocks=100, block_size=16)
        main.simulate(scheduler, main.HARDWARE["l4-24gb"], main.MODELS["llama-3.1-8b"], requests)
        self.assertEqual([request.sent_s for request in requests], [0.0, 5.0])
        self.assertEqual([request.queue_s for request in requests], [0.0, 0.0])
        self.assertGreater(requests[1].token_times[0], 5.0)

    def test_rejected_requests_are_reported_not_looped_on(self):
        code, out, err = run_cli("simulate", "--concurrency", "2", "--requests", "4", "--prompt-tokens", "3000",
                                 "--output-tokens", "64", "--max-model-len", "2048")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("rejected 4 requests (max-model-len), e.g. request 0: prompt + output 3,064 tokens "
                      "exceed --max-model-len 2,048", out)

    def test_simulate_text_report_has_the_lessons_lines(self):
        code, out, _ = run_cli("simulate", "--hardware", "l4-24gb", "--trace", BURST, "--prefix-caching")
        lines = out.splitlines()
        self.assertEqual(lines[0], "servesim llama-3.1-8b on l4-24gb 48 requests trace arrivals")
        self.assertRegex(lines[1], r"^kv cache 1,941 blocks x 16 tokens peak \d+\.\d% mean \d+\.\d%$")
        self.assertRegex(lines[2], r"^steps [\d,]+ mean batch \d+\.\d seqs preemptions 0 evictions \d+ "
                                   r"prefix hits \d+\.\d%$")
        self.assertEqual(lines[3].split(), ["p50", "p99"])
        self.assertEqual([line.split()[0] for line in lines[4:9]], ["ttft", "tpot", "itl", "queue", "e2e"])
        self.assertRegex(lines[9], r"^throughput \d+\.\d output tok/s \d+\.\d total tok/s \d+\.\d\d req/s$")

    def test_a_single_request_is_one_request_in_the_header(self):
        code, out, _ = run_cli("simulate", "--hardware", "l4-24gb", "--concurrency", "1", "--requests", "1")
        self.assertEqual((code, out.splitlines()[0]),
                         (0, "servesim llama-3.1-8b on l4-24gb 1 request closed loop concurrency 1"))

    def test_json_report_carries_settings_capacity_engine_and_summary(self):
        report = run_json("simulate", "--concurrency", "4", "--requests", "16")  # four a client: no warning
        self.assertEqual(set(report), {"settings", "capacity", "engine", "summary", "rejected", "step_cost",
                                       "sensitivity"})
        self.assertEqual(report["settings"]["arrivals"], {"mode": "closed", "concurrency": 4})
        self.assertEqual(report["settings"]["scheduler"]["max_num_seqs"], 256)
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "queue_ms", "e2e_ms"):
            self.assertEqual(set(report["summary"][name]), {"count", "mean", "p50", "p90", "p95", "p99", "max"})


class FixtureTest(unittest.TestCase):

    def test_the_committed_traces_are_what_their_generators_write(self):
        for generator, trace in (("make_burst.py", "burst.jsonl"), ("make_mixed.py", "mixed.jsonl"),
                                 ("make_two_prefixes.py", "two_prefixes.jsonl"), ("make_documents.py", "documents.jsonl")):
            generated = subprocess.run([sys.executable, os.path.join(FIXTURES_DIR, generator)],
                                       capture_output=True, text=True, check=True).stdout
            with open(os.path.join(FIXTURES_DIR, trace), encoding="utf-8") as handle:
                self.assertEqual(handle.read(), generated, trace)

    def test_the_burst_is_48_requests_within_3_5_seconds_on_two_system_prompts(self):
        with open(BURST, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle]
        self.assertEqual(len(rows), 48)
        self.assertLess(max(row["arrival_s"] for row in rows), 3.5)
        self.assertEqual({row["prefix"] for row in rows}, {"system-a", "system-b"})
        self.assertEqual({row["prefix_tokens"] for row in rows}, {1024})
        self.assertAlmostEqual(sum(row["prompt_tokens"] for row in rows) / 48, 1300, delta=60)
        self.assertAlmostEqual(sum(row["output_tokens"] for row in rows) / 48, 250, delta=25)


class EntryPointTest(unittest.TestCase):

    def run_script(self, *argv):
        return subprocess.run([sys.executable, os.path.join(CODE_DIR, "main.py"), *argv],
                              capture_output=True, text=True)

    def test_capacity_as_a_script_exits_0_with_an_empty_stderr(self):
        result = self.run_script("capacity", "--hardware", "l4-24gb")
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertIn("blocks          1,941 x 16 tokens = 31,056 tokens", result.stdout)

    def test_the_70b_error_as_a_script_is_one_line_and_exit_1(self):
        result = self.run_script("capacity", "--model", "llama-3.1-70b")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(len(result.stderr.splitlines()), 1)
        self.assertNotIn("Traceback", result.stderr)

    def test_help_lists_the_subcommands(self):
        result = self.run_script("--help")
        self.assertEqual(result.returncode, 0)
        for command in ("capacity", "simulate", "sweep"):
            self.assertIn(command, result.stdout)


if __name__ == "__main__":
    unittest.main()
