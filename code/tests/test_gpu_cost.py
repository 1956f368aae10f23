"""The step and request cost of a GPU server, term by term, each against a figure worked by hand.

A tiny hardware and a tiny model keep the arithmetic writable: 100 GB/s of memory at mbu
0.5, 1 TFLOPS at mfu 0.5, a 10 GB/s link; two layers 1,000 wide.
"""

import dataclasses
import math
import unittest

from support import main

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


class TermsTest(unittest.TestCase):

    def test_the_terms_add_up_to_the_step(self):
        shard = DENSE.sharded(2)
        terms = main.step_cost_terms(HW, shard, 8, 8, 8000)
        memory = terms["weights_ms"] + terms["kv_reads_ms"]
        fixed = terms["step_overhead_ms"] + terms["layer_overhead_ms"] + terms["seq_overhead_ms"]
        self.assertAlmostEqual(terms["step_ms"], fixed + max(memory, terms["compute_ms"]) + terms["collectives_ms"],
                               places=9)
        self.assertEqual((terms["bound"], terms["request_path_ms"]), ("memory", 3.0))
        self.assertAlmostEqual(terms["layer_overhead_ms"], 0.08)
        self.assertAlmostEqual(terms["seq_overhead_ms"], 0.04)

    def test_a_slower_hardware_prices_every_step_that_much_dearer(self):
        shard = DENSE.sharded(2)
        for tokens, context in ((1, 10), (64, 64_000), (2048, 2048)):
            base = main.step_seconds(HW, shard, tokens, context, tokens, 1, 1)
            slower = main.step_seconds(main.slower_by(HW, 1.05), shard, tokens, context, tokens, 1, 1)
            self.assertAlmostEqual(slower / base, 1.05, places=9)
        self.assertEqual(main.RooflineCost(main.slower_by(HW, 1.05), DENSE).request_overhead_s, 0.003)


if __name__ == "__main__":
    unittest.main()
