"""The step and request cost of a GPU server, term by term, each against a figure worked by hand.

A tiny hardware and a tiny model keep the arithmetic writable: 100 GB/s of memory at mbu
0.5, 1 TFLOPS at mfu 0.5, a 10 GB/s link; two layers 1,000 wide.
"""

import dataclasses
import math
import unittest

from support import main, run_cli, run_json

HW = main.Hardware("tiny", memory_gib=16, bandwidth_gbs=100, tflops=1.0, mfu=0.5, mbu=0.5, step_overhead_ms=1.0,
                   reserve_gib=0.5, interconnect_gbs=10, layer_overhead_us=40, seq_overhead_us=5,
                   allreduce_latency_us=10, link_efficiency=0.5, request_overhead_ms=3.0)
DENSE = main.ModelSpec("dense", params=1e9, layers=2, kv_heads=1, head_dim=100, bytes_per_param=2,
                       kv_dtype_bytes=2, hidden_size=1000)
MOE = dataclasses.replace(DENSE, name="moe", num_experts=8, num_experts_per_tok=2, expert_params=50e6,
                          num_moe_layers=2)


class FixedCostTest(unittest.TestCase):

    def test_a_step_pays_its_own_overhead_each_layers_floor_and_each_sequences_share(self):
        # 1 ms + 2 layers x 40 us + 10 sequences x 5 us = 1.13 ms
        self.assertAlmostEqual(main.fixed_step_seconds(HW, DENSE, 10), 1.13e-3, places=12)

    def test_the_request_path_is_paid_once_per_request_before_the_engine_sees_it(self):
        self.assertEqual(main.RooflineCost(HW, DENSE).request_overhead_s, 0.003)
        requests = [main.Request(0, 10, 2)]
        scheduler = main.Scheduler(main.SchedulerConfig(block_size=16), 100)
        main.run_engine(main.Engine(scheduler, HW, DENSE), requests)
        self.assertEqual(requests[0].received_s, 0.003)
        self.assertEqual(requests[0].scheduled_s, 0.003)


class AllReduceTest(unittest.TestCase):

    def test_each_all_reduce_pays_its_latency_and_its_ring_bytes_over_the_link(self):
        shard = DENSE.sharded(4)
        # 10 tokens x 1,000 x 2 bytes = 20,000 bytes; a ring moves 2 x 3/4 of them = 30,000 bytes over
        # 10 GB/s x 0.5 = 6 us; plus 10 us latency = 16 us each; 2 per layer x 2 layers = 64 us
        self.assertAlmostEqual(main.allreduce_seconds(HW, shard, 10), 64e-6, places=15)

    def test_at_decode_sizes_the_latency_is_most_of_it(self):
        shard = DENSE.sharded(4)
        latency_only = 4 * 10e-6
        self.assertLess(main.allreduce_seconds(HW, shard, 1) - latency_only, 0.1 * latency_only)

    def test_one_device_has_no_collectives(self):
        self.assertEqual(main.allreduce_seconds(HW, DENSE, 1000), 0.0)


class MemoryAndComputeTest(unittest.TestCase):

    def test_the_memory_rate_is_the_peak_times_mbu(self):
        self.assertEqual(main.memory_rate(HW), 50e9)

    def test_attention_reads_grow_with_each_sequences_context(self):
        # 2 layers x 2 (key, value) x 1 head x 100 x 2 bytes = 800 bytes per token of context; at 50 GB/s,
        # 1,000 more tokens of context cost 16 us more
        short = main.step_seconds(HW, DENSE, 1, 1000, 1, 1, 1)
        long = main.step_seconds(HW, DENSE, 1, 2000, 1, 1, 1)
        self.assertAlmostEqual(long - short, 1000 * 800 / 50e9, places=12)

    def test_a_decode_step_is_the_fixed_costs_plus_the_slower_of_bytes_and_flops(self):
        # fixed 1 ms + 2 x 40 us + 5 us; weights 2 GB at 50 GB/s = 40 ms; compute 2 x 1e9 / 0.5 TFLOPS = 4 ms
        expected = 1.085e-3 + (2e9 + 800) / 50e9
        self.assertAlmostEqual(main.step_seconds(HW, DENSE, 1, 1, 1, 1, 1), expected, places=12)

    def test_grouped_expert_gemms_run_at_moe_efficiency_of_the_dense_rate(self):
        slow = dataclasses.replace(HW, moe_efficiency=0.25)
        # 1e9 params, 800e6 of them experts: per token 2 x 200e6 dense FLOPs at 0.5 TFLOPS, and 2 x (2 of 8
        # experts x 50e6 x 2 layers) expert FLOPs at a quarter of that rate
        dense_s, expert_s = 2 * 0.2e9 / 0.5e12, 2 * 0.2e9 / (0.5e12 * 0.25)
        self.assertAlmostEqual(main.compute_seconds(slow, MOE, 1, 1), dense_s + expert_s, places=15)
        self.assertAlmostEqual(main.compute_seconds(HW, MOE, 1, 1), dense_s + 2 * 0.2e9 / 0.5e12, places=15)

    def test_a_step_reads_the_experts_its_tokens_touch(self):
        # 4 tokens touch 8 x (1 - (3/4)^4) = 5.46875 experts a layer of the 8
        self.assertAlmostEqual(MOE.distinct_experts(4), 5.46875, places=12)
        touched = 5.46875 * 50e6 * 2
        self.assertAlmostEqual(MOE.step_weight_bytes(4), (1e9 - 8 * 50e6 * 2 + touched) * 2, places=3)


class DecodeAttentionTest(unittest.TestCase):
    """Decode attention's arithmetic: 4 query heads of 100 over 1 KV head, at a quarter of the 1 TFLOPS peak."""

    HEADS = dataclasses.replace(DENSE, num_heads=4)
    PRICED = dataclasses.replace(HW, attention_efficiency=0.25)

    def test_each_query_head_scores_and_weighs_every_token_of_context_in_every_layer(self):
        # 2 layers x 4 heads x 2 x (100 key + 100 value) = 3,200 FLOPs a token of context; at 0.25 TFLOPS
        # 12.8 ns, so 1,000 tokens of context add 12.8 us on top of the unpriced step
        self.assertEqual(self.HEADS.attention_flops_per_token, 3200)
        added = (main.step_seconds(self.PRICED, self.HEADS, 8, 1000, 8, 1, 8)
                 - main.step_seconds(HW, self.HEADS, 8, 1000, 8, 1, 8))
        self.assertAlmostEqual(added, 12.8e-6, places=15)

    def test_tensor_parallelism_splits_the_query_heads(self):
        self.assertEqual(self.HEADS.sharded(2).num_heads, 2)
        self.assertAlmostEqual(main.decode_attention_seconds(self.PRICED, self.HEADS.sharded(2), 1000, 8), 6.4e-6,
                               places=15)

    def test_prompt_tokens_and_unpriced_hardware_or_heads_pay_nothing(self):
        unpriced = main.step_seconds(HW, self.HEADS, 300, 1000, 1, 1, 1)
        self.assertEqual(main.step_seconds(self.PRICED, self.HEADS, 300, 1000, 1, 1, 1, 0, 0), unpriced)
        self.assertEqual(main.decode_attention_seconds(self.PRICED, DENSE, 1000, 8), 0.0)  # heads unknown
        self.assertEqual(main.decode_attention_seconds(HW, self.HEADS, 1000, 8), 0.0)

    def test_latent_attention_scores_against_the_latent_and_its_rotary_part(self):
        latent = dataclasses.replace(self.HEADS, kv_lora_rank=512, rope_head_dim=64)
        # 2 layers x 4 heads x 2 x (512 + 64 for the score + 512 for the value) = 17,408
        self.assertEqual(latent.attention_flops_per_token, 17408)

    def test_sliding_window_layers_attend_to_at_most_their_window(self):
        sliding = dataclasses.replace(self.HEADS, layers=4, sliding_window=100, num_sliding_layers=2)
        # 2 full layers over 3,000 tokens and 2 sliding ones over 3 sequences x 100: 1,600 FLOPs a token-layer pair
        expected = (3000 * 3200 + 300 * 3200) / 0.25e12
        self.assertAlmostEqual(main.decode_attention_seconds(self.PRICED, sliding, 3000, 3), expected, places=15)

    def test_a_hardware_file_keeps_its_attention_efficiency_and_an_older_one_leaves_it_unpriced(self):
        data = dict(dataclasses.asdict(self.PRICED))
        self.assertEqual(main.hardware_from_json(main.JsonObject(data, "x"), "x").attention_efficiency, 0.25)
        del data["attention_efficiency"]
        self.assertEqual(main.hardware_from_json(main.JsonObject(data, "x"), "x").attention_efficiency, 0.0)

    def test_the_flag_sets_or_unprices_it_on_a_preset_and_simulate_shows_it_in_the_mean_step(self):
        argv = ["simulate", "--requests", "8", "--concurrency", "4", "--no-sensitivity"]
        preset, priced, unpriced = (run_json(*argv, *flags)["step_cost"] for flags in (
            (), ("--attention-efficiency", "0.05"), ("--attention-efficiency", "0")))
        # Llama 3.1 8B: 32 layers x 32 query heads x 4 x 128 = 524,288 FLOPs a token of context, at 5% of
        # 989.4 TFLOPS, and at the h100-sxm-80gb preset's fitted 6.32%
        for cost, share in ((priced, 0.05), (preset, 0.0632)):
            self.assertAlmostEqual(cost["attention_ms"], cost["num_context_tokens"] * 524288 / (share * 989.4e12) * 1000,
                                   places=9)
        self.assertEqual(unpriced["attention_ms"], 0.0)
        code, out, err = run_cli(*argv, "--attention-efficiency", "2")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--attention-efficiency: expected 0, or a number from 1e-6 to 1, got '2'", err)


class TermsTest(unittest.TestCase):

    def test_the_terms_add_up_to_the_step(self):
        shard = dataclasses.replace(DENSE, num_heads=2).sharded(2)
        terms = main.step_cost_terms(dataclasses.replace(HW, attention_efficiency=0.25), shard, 8, 8, 8000)
        memory = terms["weights_ms"] + terms["kv_reads_ms"]
        fixed = terms["step_overhead_ms"] + terms["layer_overhead_ms"] + terms["seq_overhead_ms"]
        self.assertAlmostEqual(terms["attention_ms"], 8000 * 2 * 1 * 4 * 100 / 0.25e12 * 1000, places=12)
        self.assertAlmostEqual(terms["step_ms"], fixed + max(memory, terms["compute_ms"]) + terms["collectives_ms"]
                               + terms["attention_ms"], places=9)
        self.assertEqual((terms["bound"], terms["request_path_ms"]), ("memory", 3.0))
        self.assertAlmostEqual(terms["layer_overhead_ms"], 0.08)
        self.assertAlmostEqual(terms["seq_overhead_ms"], 0.04)

    def test_a_slower_hardware_prices_every_step_that_much_dearer(self):
        shard = dataclasses.replace(DENSE, num_heads=2).sharded(2)
        priced = dataclasses.replace(HW, attention_efficiency=0.1)
        for tokens, context in ((1, 10), (64, 64_000), (2048, 2048)):
            base = main.step_seconds(priced, shard, tokens, context, tokens, 1, 1)
            slower = main.step_seconds(main.slower_by(priced, 1.05), shard, tokens, context, tokens, 1, 1)
            self.assertAlmostEqual(slower / base, 1.05, places=9)
        self.assertEqual(main.RooflineCost(main.slower_by(HW, 1.05), DENSE).request_overhead_s, 0.003)


if __name__ == "__main__":
    unittest.main()
