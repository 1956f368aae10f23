"""--disaggregate (the lesson's Hard exercise): a prefill engine, a KV link, a decode engine."""

import os
import unittest

from support import FIXTURES_DIR, main, run_cli, run_json

MIXED = os.path.join(FIXTURES_DIR, "mixed.jsonl")

H100 = main.HARDWARE["h100-sxm-80gb"]
LLAMA_8B = main.MODELS["llama-3.1-8b"]


def disaggregated(requests, link_gbs, min_prompt_tokens=0, config=main.SchedulerConfig()):
    plan = main.plan_capacity(H100, LLAMA_8B)
    prefill = main.Engine(main.PrefillScheduler(config, plan.num_blocks), H100, LLAMA_8B)
    decode = main.Engine(main.DecodeScheduler(config, plan.num_blocks), H100, LLAMA_8B)
    link = main.KvLink(link_gbs)
    main.simulate_disaggregated(prefill, decode, requests, link, min_prompt_tokens)
    return prefill, decode, link


class DisaggregateTest(unittest.TestCase):

    trace = MIXED

    def test_a_2000_token_prompt_of_llama_8b_waits_about_10_ms_on_a_25_gbs_link(self):
        request = main.Request(0, 2000, 8, 0.0)
        _, _, link = disaggregated([request], 25.0)
        self.assertEqual(len(link.waits_s), 1)
        self.assertAlmostEqual(link.waits_s[0], 2000 * 131072 / 25e9)   # 10.49 ms
        prefill_s = main.step_seconds(H100, LLAMA_8B, 2000, 2000, 1, num_decodes=0, num_decode_context_tokens=0)
        first_decode_s = main.step_seconds(H100, LLAMA_8B, 1, 2000, 1)  # the last prompt token, recomputed
        path_s = H100.request_overhead_ms / 1000  # HTTP, tokenising, the hops: before the prefill engine sees it
        self.assertAlmostEqual(request.token_times[0], path_s + prefill_s + 2000 * 131072 / 25e9 + first_decode_s)
        self.assertEqual(request.generated, 8)

    def test_decode_side_itl_does_not_spike_when_long_prompts_arrive(self):
        colocated = run_json("simulate", "--trace", self.trace)["summary"]
        split = run_json("simulate", "--trace", self.trace, "--disaggregate", "--kv-link-gbs", "25")["summary"]
        self.assertGreater(colocated["itl_ms"]["p99"], 10 * colocated["tpot_ms"]["p50"])
        self.assertLess(split["itl_ms"]["p99"], 1.2 * split["tpot_ms"]["p50"])
        self.assertLess(split["itl_ms"]["p99"], colocated["itl_ms"]["p99"] / 10)

    def test_the_search_finds_the_link_bandwidth_below_which_colocated_wins_on_ttft_p95(self):
        argv = ("simulate", "--trace", self.trace, "--max-num-seqs", "24")
        report = run_json(*argv, "--find-kv-link-crossover")
        crossover = report["kv_link_crossover"]["crossover_gbs"]
        self.assertIsNotNone(crossover)
        colocated = report["colocated"]["summary"]["ttft_ms"]["p95"]

        def ttft_p95(gbs):
            return run_json(*argv, "--disaggregate", "--kv-link-gbs", gbs)["summary"]["ttft_ms"]["p95"]
        self.assertLess(ttft_p95(crossover * 1.02), colocated)
        self.assertGreaterEqual(ttft_p95(crossover / 1.02), colocated)
        lines = main.format_disaggregated(report["settings"], report)
        self.assertEqual(lines[-1], f"kv link crossover: below {crossover:.3g} GB/s the colocated engine has "
                                    f"the lower TTFT p95 ({colocated:.1f} ms)")

    def test_without_a_binding_cap_one_colocated_engine_keeps_the_lower_ttft(self):
        report = run_json("simulate", "--trace", self.trace, "--find-kv-link-crossover")
        self.assertIsNone(report["kv_link_crossover"]["crossover_gbs"])
        self.assertIn("the colocated engine has the lower TTFT p95 even over", report["kv_link_crossover"]["verdict"])

    def test_every_request_finishes_and_both_engines_end_with_every_block_free(self):
        requests = main.read_trace(self.trace)
        prefill, decode, link = disaggregated(requests, 2.0)  # a slow link: prefill blocks wait for it
        self.assertTrue(all(r.error is None and r.generated == r.max_tokens for r in requests))
        for engine in (prefill, decode):
            self.assertEqual(engine.scheduler.pool.free_count(), engine.scheduler.pool.num_blocks)
        self.assertEqual(prefill.scheduler.held, {})
        self.assertEqual(link.num_transfers, len(requests))

    def test_the_prefill_engine_holds_blocks_until_the_link_delivers(self):
        fast = disaggregated(main.read_trace(self.trace), 1000.0)[0].report()
        slow = disaggregated(main.read_trace(self.trace), 0.5)[0].report()
        self.assertGreater(slow["kv_peak"], 5 * fast["kv_peak"])

    def test_conditional_disaggregation_keeps_short_prompts_on_the_decode_engine(self):
        requests = main.read_trace(self.trace)
        _, _, link = disaggregated(requests, 25.0, min_prompt_tokens=1000)
        self.assertEqual(link.num_transfers, sum(r.prompt_tokens >= 1000 for r in requests))
        self.assertTrue(all(r.generated == r.max_tokens for r in requests))

    def test_each_engine_takes_its_own_hardware_and_limits(self):
        report = run_json("simulate", "--trace", self.trace, "--disaggregate", "--prefill-hardware", "a100-sxm-80gb",
                          "--decode-max-num-seqs", "64", "--prefill-max-num-batched-tokens", "16384")
        self.assertEqual((report["prefill"]["hardware"], report["decode"]["hardware"]),
                         ("a100-sxm-80gb", "h100-sxm-80gb"))
        self.assertEqual(report["prefill"]["scheduler"]["max_num_batched_tokens"], 16384)
        self.assertEqual(report["decode"]["scheduler"]["max_num_seqs"], 64)
        self.assertEqual(report["decode"]["scheduler"]["max_num_batched_tokens"], 8192)

    def test_the_text_report_names_both_engines_the_link_and_the_colocated_baseline(self):
        code, out, _ = run_cli("simulate", "--trace", self.trace, "--disaggregate", "--kv-link-gbs", "25")
        lines = out.splitlines()
        self.assertEqual(lines[0], "servesim llama-3.1-8b disaggregated, 240 requests: prefill on h100-sxm-80gb, "
                                   "decode on h100-sxm-80gb, KV link 25 GB/s")
        self.assertEqual([line.split()[0] for line in lines[1:4]], ["prefill", "decode", "kv"])
        self.assertIn("versus one colocated engine on h100-sxm-80gb:", lines)


if __name__ == "__main__":
    unittest.main()


class DecodeEngineRulesTest(unittest.TestCase):
    """What the decode engine computes for a request whose prompt's KV came over the link."""

    def decode_scheduler(self, prefix_caching=False):
        config = main.SchedulerConfig(max_num_batched_tokens=64, block_size=4, prefix_caching=prefix_caching)
        return main.DecodeScheduler(config, 100)

    def test_the_last_prompt_token_is_recomputed_for_its_logits(self):
        scheduler = self.decode_scheduler()
        request = main.Request(0, 40, 3)
        self.assertTrue(scheduler.add_with_kv(request))
        batch = scheduler.schedule(0.0)
        self.assertEqual([(r.request_id, tokens) for r, tokens in batch], [(0, 1)])
        self.assertEqual(request.computed, 39)  # 39 tokens of KV arrived; the 40th is computed here
        self.assertEqual(len(request.blocks), 10)

    def test_a_prompt_that_stayed_on_the_decode_engine_still_finds_its_prefix_in_the_cache(self):
        scheduler = self.decode_scheduler(prefix_caching=True)
        first = main.Request(0, 20, 1, prefix="system", prefix_tokens=16)
        second = main.Request(1, 20, 1, prefix="system", prefix_tokens=16)
        scheduler.add(first)  # too short to disaggregate: prefilled here, as a colocated engine would
        scheduler.update(scheduler.schedule(0.0), 1.0)
        scheduler.add(second)
        batch = scheduler.schedule(1.0)
        self.assertEqual([(r.request_id, tokens) for r, tokens in batch], [(1, 4)])  # 16 of 20 tokens hit
        self.assertEqual(second.num_prefix_hit_tokens, 16)

    def test_a_preempted_request_recomputes_what_came_over_the_link_but_not_its_cached_prefix(self):
        config = main.SchedulerConfig(max_num_batched_tokens=64, block_size=4, prefix_caching=True)
        scheduler = main.DecodeScheduler(config, 12)
        holder = main.Request(0, 20, 1, prefix="system", prefix_tokens=16)
        scheduler.add(holder)
        scheduler.update(scheduler.schedule(0.0), 1.0)  # the prefix blocks are cached
        scheduler.add(main.Request(2, 8, 24))  # grows until the newest running request must go
        scheduler.add_with_kv(main.Request(1, 20, 12, prefix="system", prefix_tokens=16))
        batches = []
        for index in range(1, 40):
            batch = scheduler.schedule(float(index))
            batches.append([(r.request_id, tokens) for r, tokens in batch])
            scheduler.update(batch, index + 1.0)
        self.assertEqual(scheduler.num_preemptions, 1)
        self.assertEqual(batches[8:10], [[(2, 1), (1, 1)], [(2, 1)]])  # 1 is preempted with 9 tokens out
        # 29 tokens (20 prompt + 9 generated) less the 16 cached: the transferred KV is gone
        self.assertEqual(batches[24], [(1, 13)])


class SampledTokensPriceTheHeadTest(unittest.TestCase):
    """The engine prices the LM head only for tokens that sample (a model with head_params)."""

    GEMMA = main.MODELS["gemma-3-270m-q4_k_m"]
    CPU = main.HARDWARE["cpu-2vcpu"]

    def one_step(self, prompt_tokens, budget):
        config = main.SchedulerConfig(max_num_batched_tokens=budget)
        engine = main.Engine(main.Scheduler(config, 64), self.CPU, self.GEMMA)
        engine.scheduler.add(main.Request(0, prompt_tokens, 4))
        engine.step()
        return engine.clock_s

    def test_a_whole_prompt_samples_one_token(self):
        self.assertEqual(self.one_step(100, 8192), main.step_seconds(self.CPU, self.GEMMA, 100, 100, 1))
        self.assertGreater(main.step_seconds(self.CPU, self.GEMMA, 100, 100, 100), 2 * self.one_step(100, 8192))

    def test_a_prefill_chunk_that_does_not_end_the_prompt_samples_nothing(self):
        self.assertEqual(self.one_step(100, 64), main.step_seconds(self.CPU, self.GEMMA, 64, 64, 0))


class PhaseFlagsTest(unittest.TestCase):

    def test_interconnect_and_tensor_parallelism_apply_to_an_engine_on_its_own_hardware(self):
        def ttft_p50(gbs):
            report = run_json("simulate", "--trace", MIXED, "--disaggregate", "--prefill-hardware", "a100-sxm-80gb",
                              "--tensor-parallel-size", "2", "--interconnect-gbs", gbs, "--limit", "20")
            self.assertEqual(report["prefill"]["capacity"]["tensor_parallel_size"], 2)
            return report["summary"]["ttft_ms"]["p50"]
        self.assertGreater(ttft_p50("1"), 1.5 * ttft_p50("1000"))
