"""A GPU step priced kernel by kernel (KernelCost): each table's interpolation by hand on a
tiny table, each held-out table within its stated error, and the engines agreeing.

The tiny tables: a GPU of 100 TFLOPS and 1,000 GB/s whose GEMMs take 10 us at every
grid point of m, n, k in (1, 100), (10, 1000), (10, 1000).
"""

import dataclasses
import json
import math
import os
import unittest

from support import FIXTURES_DIR, main

TINY = main.KernelTables(
    "tiny-gpu", peak_tflops=100.0, bandwidth_gbs=1000.0, source="by hand",
    gemm={"bf16": ((1, 100), (10, 1000), (10, 1000), (10.0, 10.0, 10.0, 20.0, 10.0, 10.0, 10.0, 40.0))},
    prefill_attention={"bf16": (5.0, {1: 1.0, 8: 0.5},
                                tuple(tuple(0.5 for _ in main.PREFILL_BATCH_HEADS) for _ in main.PREFILL_LENGTHS))},
    decode_attention={"bf16": (2.0, 16, {1: tuple(tuple(0.5 for _ in main.DECODE_CONTEXTS)
                                                  for _ in main.DECODE_BATCHES)})},
    moe={"bf16": (3.0, tuple(2.0 for _ in main.MOE_TOKENS_PER_EXPERT), 100.0, tuple(None for _ in main.MOE_SHAPES))},
    allreduce={2: tuple(float(1 + index) for index, _ in enumerate(main.ALLREDUCE_BYTES))})


class InterpolationTest(unittest.TestCase):

    def test_a_gemm_between_grid_points_is_log_linear_in_each_axis(self):
        # m = 1, n = 1000: k = 10 takes 10 us, k = 1000 takes 20 us; k = 100 is halfway in log: sqrt(10 x 20)
        self.assertAlmostEqual(main.gemm_us(TINY, "bf16", 1, 1000, 100), math.sqrt(200), places=9)
        # m = 100, n = k = 1000: 40 us; at m = 10 (halfway in log m) sqrt(20 x 40)
        self.assertAlmostEqual(main.gemm_us(TINY, "bf16", 10, 1000, 1000), math.sqrt(800), places=9)

    def test_past_the_grid_a_gemm_grows_in_proportion_and_below_it_stays_at_the_edge(self):
        self.assertAlmostEqual(main.gemm_us(TINY, "bf16", 400, 1000, 1000), 160.0, places=9)  # 4 x 40 us
        self.assertAlmostEqual(main.gemm_us(TINY, "bf16", 100, 2000, 2000), 160.0, places=9)  # 2 x 2 x 40 us
        self.assertAlmostEqual(main.gemm_us(TINY, "bf16", 1, 5, 5), 10.0, places=9)

    def test_prefill_attention_is_its_flops_at_the_tables_share_of_the_peak_plus_the_floor(self):
        # 1,000 pairs x 4 x 2 heads x 64 = 512,000 FLOPs at 0.5 x 100 TFLOPS x KV factor 1 = 0.01024 us; floor 5
        self.assertAlmostEqual(main.prefill_attention_us(TINY, "bf16", 1000, 1, 100, 2, 1, 64), 5.01024, places=9)
        # eight KV heads take the factor 0.5: twice the time
        self.assertAlmostEqual(main.prefill_attention_us(TINY, "bf16", 1000, 1, 100, 2, 8, 64), 5.02048, places=9)

    def test_decode_attention_reads_each_tokens_kv_and_s0_tokens_a_sequence_at_the_tables_share(self):
        # 4 sequences, 1,000 tokens of context: (1,000 + 4 x 16) x 1 head x 2 x 128 x 2 bytes = 544,768 bytes
        # at 0.5 x 1,000 GB/s = 1.089536 us; floor 2
        self.assertAlmostEqual(main.decode_attention_us(TINY, "bf16", 4, 1000, 1, 128), 3.089536, places=9)

    def test_moe_is_the_slower_of_the_touched_experts_bytes_and_their_flops_times_the_ratio(self):
        # 2 tokens x top 2 of 8 experts: 4 experts touched of 3 x 100 x 50 x 2 bytes = 120,000 bytes at 1,000 GB/s
        # = 0.12 us; FLOPs 6 x 4 x 100 x 50 = 120,000 at 100 TFLOPS = 0.0012 us; x 2 + floor 3 = 3.24 us
        self.assertAlmostEqual(main.moe_us(TINY, "bf16", 2, 100, 50, 2, 8), 3.24, places=9)

    def test_an_all_reduce_is_log_linear_in_its_bytes_and_free_on_one_device(self):
        # 2 KiB is halfway in log from 1 KiB (1 us) to 4 KiB (2 us): log-linear, sqrt(1 x 2)
        self.assertAlmostEqual(main.allreduce_us(TINY, 2, 2048), math.sqrt(2), places=9)
        self.assertEqual(main.allreduce_us(TINY, 1, 2048), 0.0)


if __name__ == "__main__":
    unittest.main()
