"""explain: the diagnosis table reaches the right verdict on inputs built here."""

import json
import os
import tempfile
import unittest

from fake_server import FakeServer
from support import ScratchTest, main, run_cli, run_json

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'


def vllm_scrape(running, waiting, kv, preemptions, requests=2000, queue_s=20.0, prefill_s=0.6, decode_s=10.0,
                prompt=1250, output=250):
    """A vLLM /metrics text; histograms carry means over `requests` requests."""
    lines = [f"# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{MODEL}}} {running}",
             f"vllm:num_requests_waiting{{{MODEL}}} {waiting}", f"vllm:kv_cache_usage_perc{{{MODEL}}} {kv}",
             f"vllm:num_preemptions_total{{{MODEL}}} {preemptions}"]
    for name, mean in (("request_queue_time_seconds", queue_s), ("request_prefill_time_seconds", prefill_s),
                       ("request_decode_time_seconds", decode_s), ("request_prompt_tokens", prompt),
                       ("request_generation_tokens", output)):
        lines += [f"vllm:{name}_sum{{{MODEL}}} {mean * requests}", f"vllm:{name}_count{{{MODEL}}} {requests}"]
    return "\n".join(lines) + "\n"


class ExplainTest(ScratchTest):

    def explain(self, *argv):
        code, out, err = run_cli("explain", *argv, "--json")
        self.assertEqual((code, err), (0, ""))
        return json.loads(out)

    def monday(self):
        """The lesson's Monday incident: 40 waiting, KV 1.0, preemptions climbing, L4, Llama 3.1 8B."""
        before = self.write("before.prom", vllm_scrape(running=20, waiting=38, kv=0.99, preemptions=412))
        after = self.write("after.prom", vllm_scrape(running=19, waiting=40, kv=1.0, preemptions=431, requests=2040))
        return before, after, ("--hardware", "l4-24gb", "--model", "llama-3.1-8b", "--max-num-seqs", "256")

    def test_the_monday_incident_points_to_prefix_caching_not_more_sequences_or_a_second_gpu(self):
        before, after, flags = self.monday()
        result = self.explain(before, after, *flags, "--shared-prefix-tokens", "1000")
        binding = result["binding"]
        self.assertEqual(binding["budget"], "KV cache blocks")
        self.assertTrue(binding["knob"].startswith("turn on prefix caching, so the 1,000 shared prompt tokens"))
        self.assertIn("vLLM --enable-prefix-caching", binding["knob"])
        not_helpful = " / ".join(binding["not_helpful"])
        self.assertIn("raising --max-num-seqs (say to 512): memory, not the sequence cap, holds the batch "
                      "(20 running, 40 waiting)", not_helpful)
        self.assertIn("a second GPU because utilisation reads 100%", not_helpful)
        self.assertIn("vllm:num_preemptions_total rise over 2 scrapes = 19", binding["evidence"])
        self.assertEqual(result["phase"]["dominant"], "queue")

    def test_the_monday_capacity_arithmetic_is_the_lessons(self):
        before, after, flags = self.monday()
        result = self.explain(before, after, *flags, "--shared-prefix-tokens", "1000")
        self.assertEqual(result["capacity"], [
            "llama-3.1-8b on l4-24gb at --gpu-memory-utilization 0.90: 1,941 blocks x 16 = 31,056 KV tokens "
            "(128 KiB per token); decode knee ~269 tokens per step",
            "a request of 1,500 tokens (1,250 prompt + 250 output): the cache holds 20.7 of them",
            "20 running + 40 waiting x 1,500 = 90,000 KV tokens wanted: 2.9x the cache",
            "with the 1,000 shared tokens stored once: 60 x 500 + 1,000 = 31,000 KV tokens: fits",
        ])

    def test_the_text_report_has_the_five_parts(self):
        before, after, flags = self.monday()
        code, out, _ = run_cli("explain", before, after, *flags, "--shared-prefix-tokens", "1000")
        self.assertEqual(code, 0)
        starts = [line.split(":")[0] for line in out.splitlines() if line[:2] in ("1.", "2.", "3.", "4.", "5.")]
        self.assertEqual(starts, ["1. latency", "2. binding budget", "3. capacity", "4. change first",
                                  "5. will not help"])

    def test_kv_bound_without_a_shared_prefix_asks_for_memory_not_prefix_caching(self):
        before, after, flags = self.monday()
        binding = self.explain(before, after, *flags)["binding"]
        self.assertEqual(binding["budget"], "KV cache blocks")
        self.assertIn("--gpu-memory-utilization", binding["knob"])
        self.assertIn("--kv-cache-dtype fp8", binding["knob"])

    def test_a_scrape_with_no_prefix_cache_queries_says_caching_is_off_and_checks_it_first(self):
        counters = "vllm:prefix_cache_queries_total 0\nvllm:prefix_cache_hits_total 0\nvllm:prompt_tokens_total 2550000\n"
        before = self.write("before.prom", vllm_scrape(running=20, waiting=38, kv=0.99, preemptions=412) + counters)
        after = self.write("after.prom", vllm_scrape(running=19, waiting=40, kv=1.0, preemptions=431,
                                                     requests=2040) + counters)
        binding = self.explain(before, after, "--hardware", "l4-24gb", "--model", "llama-3.1-8b")["binding"]
        self.assertEqual(binding["budget"], "KV cache blocks")
        self.assertTrue(binding["knob"].startswith("check prefix caching first: it is off, and if requests share a "
                                                   "leading text (a system prompt) turn it on"), binding["knob"])
        self.assertIn("vLLM --enable-prefix-caching", binding["knob"])
        self.assertIn("--gpu-memory-utilization", binding["knob"])  # the way out when nothing is shared
        self.assertIn("prefix caching (vllm:prefix_cache_queries_total is 0 though vllm:prompt_tokens_total is not) "
                      "= off", binding["evidence"])

    def test_prefix_cache_queries_are_no_sign_of_caching_before_any_prompt_was_served(self):
        idle = self.write("idle.prom", "vllm:prefix_cache_queries_total 0\nvllm:prompt_tokens_total 0\n")
        self.assertNotIn("prefix_caching", self.explain(idle)["evidence"])

    def test_a_single_scrape_cannot_see_preemptions_climbing_but_still_sees_the_full_cache(self):
        _, after, flags = self.monday()
        result = self.explain(after, *flags)
        self.assertEqual(result["binding"]["budget"], "KV cache blocks")
        self.assertIn("vllm:num_preemptions_total total since start in one scrape = 431", result["binding"]["evidence"])

    def test_the_sequence_cap_binds_when_every_slot_is_taken_and_the_cache_has_room(self):
        scrape = self.write("seqs.prom", vllm_scrape(running=64, waiting=30, kv=0.35, preemptions=0,
                                                     prompt=500, output=300))
        binding = self.explain(scrape, "--max-num-seqs", "64", "--hardware", "h100-sxm-80gb",
                               "--model", "llama-3.1-8b")["binding"]
        self.assertEqual(binding["budget"], "sequences per step (--max-num-seqs)")
        self.assertEqual(binding["knob"], "raise --max-num-seqs to about 560, what the KV cache holds at these request "
                                          "lengths (llama.cpp --parallel, SGLang --max-running-requests)")
        self.assertIn("more KV memory: the cache is not what is full (KV 35% used)", binding["not_helpful"])

    def test_the_token_budget_binds_for_long_prompts_with_slots_and_memory_free(self):
        report = run_json("simulate", "--max-num-batched-tokens", "1024", "--prompt-tokens", "3000-6000",
                          "--output-tokens", "50-100", "--rate", "4", "--requests", "100")
        binding = self.explain(self.write("long.json", report))["binding"]
        self.assertEqual(binding["budget"], "tokens per step (--max-num-batched-tokens)")
        self.assertTrue(binding["knob"].startswith("raise --max-num-batched-tokens from 1,024 to 2,048"))
        self.assertIn("ITL p99 rises", binding["effect"])

    def test_compute_binds_past_the_knee_and_the_answer_is_replicas_not_a_bigger_batch(self):
        report = run_json("sweep", "--concurrency", "8,512", "--max-num-seqs", "1024", "--requests", "512")
        binding = self.explain(self.write("sweep.json", report))["binding"]
        self.assertEqual(binding["budget"], "compute")
        self.assertTrue(binding["knob"].startswith("add replicas"))
        self.assertTrue(binding["not_helpful"][0].startswith("a bigger batch (raising --max-num-seqs)"))

    def test_a_light_load_is_healthy(self):
        report = run_json("simulate", "--concurrency", "4", "--requests", "32")
        result = self.explain(self.write("light.json", report))
        self.assertEqual(result["binding"]["budget"], "none")
        self.assertEqual(result["undecided"], [])

    def test_a_llama_cpp_scrape_cannot_tell_about_the_kv_cache_and_says_so(self):
        before = self.write("a.prom", "llamacpp:requests_processing 4\nllamacpp:requests_deferred 0\n"
                                      "llamacpp:n_decode_total 100\nllamacpp:n_busy_slots_per_decode 2\n"
                                      "llamacpp:prompt_seconds_total 1\nllamacpp:tokens_predicted_seconds_total 3\n")
        after = self.write("b.prom", "llamacpp:requests_processing 4\nllamacpp:requests_deferred 4\n"
                                     "llamacpp:n_decode_total 300\nllamacpp:n_busy_slots_per_decode 3.5\n"
                                     "llamacpp:prompt_seconds_total 2\nllamacpp:tokens_predicted_seconds_total 12\n")
        result = self.explain(before, after, "--max-num-seqs", "4")
        self.assertEqual(result["binding"]["budget"], "sequences per step (--max-num-seqs)")
        self.assertIn("cannot tell whether KV cache blocks binds: the input has no kv_usage_peak", result["undecided"])
        self.assertEqual(result["phase"]["dominant"], "decode")
        self.assertEqual(result["evidence"]["mean_batch"]["value"], 4.25)  # (3.5 x 300 - 2 x 100) / 200

    def test_a_loadgen_report_is_read_with_its_server_window(self):
        report = {"settings": {"url": "http://x", "max_tokens": 64, "shared_prefix_tokens": 0},
                  "summary": {"num_completed": 16, "prompt_tokens": 16 * 60, "output_tokens": 16 * 64,
                              "ttft_ms": {"count": 16, "p50": 3000.0}, "tpot_ms": {"count": 16, "p50": 35.0},
                              "e2e_ms": {"count": 16, "p50": 5200.0}, "queue_ms": {"count": 0}},
                  "server": {"max_running": 4, "max_waiting": 4, "mean_batch": 4.0}}
        result = self.explain(self.write("c8.json", report), "--max-num-seqs", "4")
        self.assertEqual(result["binding"]["budget"], "sequences per step (--max-num-seqs)")
        self.assertIn("server max waiting = 4", result["binding"]["evidence"])

    def test_a_loadgen_report_of_a_server_that_told_its_settings_needs_no_flag_for_them(self):
        report = {"settings": {"url": "http://x", "max_tokens": 64, "shared_prefix_tokens": 0,
                               "server_info": {"kind": "sglang", "max_num_seqs": 4, "prefix_caching": True}},
                  "summary": {"num_completed": 16, "prompt_tokens": 16 * 60, "output_tokens": 16 * 64,
                              "ttft_ms": {"count": 16, "p50": 3000.0}, "tpot_ms": {"count": 16, "p50": 35.0},
                              "e2e_ms": {"count": 16, "p50": 5200.0}, "queue_ms": {"count": 0}},
                  "server": {"max_running": 4, "max_waiting": 4, "mean_batch": 4.0}}
        path = self.write("told.json", report)
        result = self.explain(path)
        self.assertEqual(result["binding"]["budget"], "sequences per step (--max-num-seqs)")
        self.assertEqual(result["evidence"]["max_num_seqs"], {"value": 4.0, "source": "the server's own max_num_seqs"})
        self.assertEqual(result["evidence"]["prefix_caching"]["value"], 1.0)
        overruled = self.explain(path, "--max-num-seqs", "64")["evidence"]["max_num_seqs"]
        self.assertEqual(overruled, {"value": 64.0, "source": "--max-num-seqs"})

    def test_url_reads_what_the_live_server_tells_of_its_settings(self):
        info = {"max_running_requests": 20, "chunked_prefill_size": 2048, "disable_radix_cache": True}
        with FakeServer(metrics=[vllm_scrape(20, 38, 0.99, 412)], pages={"/server_info": info}) as server:
            result = self.explain("--url", server.url, "--scrapes", "1")
        self.assertEqual({name: result["evidence"][name]["value"] for name in
                          ("max_num_seqs", "max_num_batched_tokens", "prefix_caching")},
                         {"max_num_seqs": 20.0, "max_num_batched_tokens": 2048.0, "prefix_caching": 0.0})

    def test_an_sglang_scrape_is_understood(self):
        scrape = self.write("sglang.prom", 'sglang:num_running_reqs{m="x"} 162\nsglang:num_queue_reqs{m="x"} 2826\n'
                                           'sglang:token_usage{m="x"} 0.99\n')
        result = self.explain(scrape)
        self.assertEqual(result["binding"]["budget"], "KV cache blocks")
        self.assertIn("sglang:token_usage in one scrape = 99%", result["binding"]["evidence"])

    def test_an_sglang_scrapes_inter_token_latency_is_read_as_vllms(self):
        scrape = self.write("sglang.prom", "".join(
            f'sglang:inter_token_latency_seconds_bucket{{m="x",le="{le}"}} {count}\n'
            for le, count in (("0.02", 90), ("0.2", 100), ("+Inf", 100))) + 'sglang:num_running_reqs{m="x"} 10\n')
        itl = self.explain(scrape)["evidence"]["itl_p99_ms"]
        self.assertAlmostEqual(itl["value"], 182.0)  # 9 of the last 10 into the 0.02-0.2 s bucket
        self.assertEqual(itl["source"], "sglang:inter_token_latency_seconds p99 in one scrape")

    def test_an_older_llama_cpp_builds_kv_cache_usage_ratio_is_its_kv_use(self):
        scrape = self.write("llama.prom", "llamacpp:requests_processing 4\nllamacpp:requests_deferred 6\n"
                                          "llamacpp:kv_cache_usage_ratio 0.97\n")
        result = self.explain(scrape)
        self.assertEqual(result["evidence"]["kv_usage_peak"],
                         {"value": 0.97, "source": "llamacpp:kv_cache_usage_ratio in one scrape"})
        self.assertEqual(result["binding"]["budget"], "KV cache blocks")

    def test_sglang_retractions_count_as_preemptions_by_either_of_their_names(self):
        for name in ("sglang:num_retracted_requests_total", "sglang:num_retracted_reqs_total"):
            scrapes = [self.write(f"s{count}.prom", f'sglang:num_running_reqs{{m="x"}} 10\n{name}{{m="x"}} {count}\n')
                       for count in (5, 12)]
            self.assertEqual(self.explain(*scrapes)["evidence"]["preemptions"],
                             {"value": 7.0, "source": f"{name} rise over 2 scrapes"})

    def test_without_hardware_and_model_the_capacity_check_says_what_it_needs(self):
        _, after, _ = self.monday()
        result = self.explain(after)
        self.assertEqual(result["capacity"], ["cannot check the capacity: name the --hardware and --model "
                                              "(or --model-file) the server runs"])

    def test_url_scrapes_a_live_server(self):
        metrics = [vllm_scrape(20, 38, 0.99, 412), vllm_scrape(19, 40, 1.0, 431, requests=2040)]
        with FakeServer(metrics=metrics) as server:
            result = self.explain("--url", server.url, "--scrape-interval", "0.01", "--hardware", "l4-24gb",
                                  "--model", "llama-3.1-8b")
        self.assertEqual(result["binding"]["budget"], "KV cache blocks")
        self.assertEqual(result["input"], f"{server.url}/metrics (2 scrapes)")

    def test_bad_inputs_exit_2(self):
        for argv, fragment in (((), "give a scrape file, a --json report, or --url"),
                               ((self.write("x.txt", "hello\n"),), "neither a --json report nor a Prometheus"),
                               ((self.write("y.json", {"a": 1}),), "not a loadgen, simulate or sweep --json report")):
            code, out, err = run_cli("explain", *argv)
            self.assertEqual((code, out), (2, ""))
            self.assertIn(fragment, err)


class WhatIfTest(ScratchTest):
    """explain simulates the server as it is and with each change its advice names."""

    MONDAY = [os.path.join(main.__file__.rsplit(os.sep, 1)[0], "fixtures", "monday", name)
              for name in ("before.prom", "after.prom")]
    FLAGS = ["--hardware", "l4-24gb", "--model", "llama-3.1-8b", "--max-num-seqs", "256",
             "--shared-prefix-tokens", "1000"]

    def test_the_monday_what_ifs_carry_before_and_after_and_they_differ(self):
        result = run_json("explain", *self.MONDAY, *self.FLAGS)
        entries = result["what_if"]
        self.assertEqual([(entry["knob"], entry["flags"]) for entry in entries][:3],
                         [("turn on prefix caching", ["--prefix-caching"]),
                          ("raise --gpu-memory-utilization to 0.95", ["--gpu-memory-utilization", "0.95"]),
                          ("store the KV cache in FP8", ["--kv-cache-dtype", "fp8"])])
        for entry in entries:
            self.assertEqual(set(entry), {"knob", "flags", "before", "after", "preemptions"})
            self.assertEqual(set(entry["after"]), set(entry["before"]))  # simulate's summary object
        first = entries[0]
        self.assertLess(first["after"]["ttft_ms"]["p50"], first["before"]["ttft_ms"]["p50"] / 5)
        self.assertLess(first["preemptions"]["after"], first["preemptions"]["before"])
        self.assertEqual(result["what_if_run"]["unsupported"],
                         [{"knob": "a second GPU because utilisation reads 100%",
                           "why": "a reading of utilisation, not a change to the server"}])

    def test_the_as_it_is_row_is_what_simulate_prints_for_the_base_flags(self):
        result = run_json("explain", *self.MONDAY, *self.FLAGS)
        base = result["what_if_run"]["base_flags"]
        self.assertIn("--concurrency", base)
        self.assertEqual(base[base.index("--concurrency") + 1], "60")  # 20 running + 40 waiting at the busiest
        self.assertEqual(run_json("simulate", *base)["summary"], result["what_if"][0]["before"])
        self.assertEqual(result["what_if"][0]["flags"], ["--prefix-caching"])
        self.assertNotIn("--prefix-caching", base)
        self.assertEqual(run_json("simulate", *base, "--prefix-caching")["summary"], result["what_if"][0]["after"])

    def test_without_a_model_to_simulate_nothing_is_simulated_and_it_says_why(self):
        result = run_json("explain", *self.MONDAY, "--max-num-seqs", "256")
        self.assertEqual(result["what_if"], [])
        self.assertEqual(result["what_if_run"]["not_simulated"], "no --hardware and --model to simulate (give both)")

    def test_a_change_is_made_by_dropping_the_field_and_giving_it_anew(self):
        pairs = (("max_num_seqs", 1), ("prefix_caching", True), ("block_size", 2))
        self.assertEqual(main.with_changes(pairs, [("max_num_seqs", 3), ("prefix_caching", None), ("sensitivity", False)]),
                         (("block_size", 2), ("max_num_seqs", 3), ("sensitivity", False)))
        self.assertEqual(main.flags_text([("speculative_config", None), ("max_num_seqs", 3), ("prefix_caching", True),
                                          ("sensitivity", False), ("rate", 2.0), ("gpu_memory_utilization", 0.95)]),
                         ["no --speculative-config", "--max-num-seqs", "3", "--prefix-caching", "--no-sensitivity",
                          "--rate", "2", "--gpu-memory-utilization", "0.95"])

    def test_a_what_if_is_run_from_its_fields_not_parsed_flags(self):
        run = main.what_if_run((("hardware", "l4-24gb"), ("model", "llama-3.1-8b"), ("prompt_tokens", 100),
                                ("output_tokens", 10), ("concurrency", 4), ("requests", 8), ("sensitivity", False),
                                ("max_num_seqs", 16), ("replicas", 2)))
        self.assertEqual((run.engine.config.max_num_seqs, run.num_replicas, run.load.concurrency, run.sensitivity),
                         (16, 2, 4, False))
        self.assertEqual((run.workload.prompt_tokens, run.workload.output_tokens), ((100, 100), (10, 10)))

    def test_a_simulate_report_is_explained_at_its_own_load(self):
        report = run_json("simulate", "--hardware", "l4-24gb", "--rate", "3", "--requests", "100",
                          "--prompt-tokens", "1200", "--output-tokens", "200", "--shared-prefix-tokens", "800")
        path = self.write("run.json", json.dumps(report))
        run = run_json("explain", path)["what_if_run"]
        self.assertEqual(run["workload"], "rate 3, 180 requests of 1,200 + 200 tokens, 800 of them shared")


if __name__ == "__main__":
    unittest.main()
