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

from support import FIXTURES_DIR, ScratchTest, main, run_cli, run_json

TINY = main.KernelTables(
    "tiny-gpu", peak_tflops=100.0, bandwidth_gbs=1000.0, source="by hand",
    gemm={"bf16": ((1, 100), (10, 1000), (10, 1000), (10.0, 10.0, 10.0, 20.0, 10.0, 10.0, 10.0, 40.0))},
    prefill_attention={"bf16": (5.0, {1: tuple(1.0 for _ in main.PREFILL_KV_BATCHES),
                                       8: tuple(0.5 for _ in main.PREFILL_KV_BATCHES)},
                                tuple(tuple(1.0 for _ in main.PREFILL_KV_BATCHES) for _ in main.PREFILL_GROUPS),
                                tuple(tuple(0.5 for _ in main.PREFILL_BATCH_HEADS) for _ in main.PREFILL_LENGTHS))},
    decode_attention={"bf16": (2.0, 16, {1: tuple(tuple(0.5 for _ in main.DECODE_CONTEXTS)
                                                  for _ in main.DECODE_BATCHES)})},
    moe={"bf16": (3.0, (tuple(2.0 for _ in main.MOE_TOKENS_PER_EXPERT),) * 2, 100.0, tuple(None for _ in main.MOE_SHAPES))},
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


HW = main.Hardware("tiny-gpu", memory_gib=16, bandwidth_gbs=1000, tflops=100.0, mfu=0.5, mbu=0.5,
                   step_overhead_ms=1.0, reserve_gib=0.5)
MODEL = main.ModelSpec("tiny", params=1e6, layers=2, kv_heads=1, head_dim=10, num_heads=2, bytes_per_param=2,
                       kv_dtype_bytes=2, hidden_size=100, intermediate_size=200, vocab_size=1000)


def tiny_cost(capture_sizes=()):
    return main.KernelCost(HW, MODEL, TINY, "bf16", "bf16", capture_sizes)


class StepTermsTest(unittest.TestCase):

    def test_a_layer_runs_qkv_output_gate_up_and_down_and_the_head_runs_once(self):
        # QKV: (2 + 2 x 1) heads x 10 = 40 wide; output 100 from 20; gate/up 2 x 200; down 100 from 200
        self.assertEqual(main.kernel_gemm_shapes(MODEL),
                         ([(40, 100, 2), (100, 20, 2), (400, 100, 2), (100, 200, 2)], (1000, 100)))
        self.assertEqual(main.kernel_gemm_shapes(MODEL.sharded(2))[0][2:], [(200.0, 100, 2), (100, 100.0, 2)])

    def test_elementwise_work_is_norms_rotary_and_activation_bytes(self):
        # 2 bytes x (8 x 100 + 2 x (2 + 1) x 10 + 3 x 200) = 2,920 bytes a token a layer
        self.assertEqual(main.elementwise_bytes(MODEL), 2920)

    def test_vllm_captures_graphs_at_1_2_4_then_every_8_then_every_16_up_to_twice_the_sequences(self):
        self.assertEqual(main.cudagraph_capture_sizes(4), (1, 2, 4, 8))
        sizes = main.cudagraph_capture_sizes(256)
        self.assertEqual((sizes[:5], sizes[-3:], len(sizes)), ((1, 2, 4, 8, 16), (480, 496, 512), 51))

    def test_a_step_under_the_largest_graph_prices_its_gemms_at_the_next_captured_size(self):
        padded, eager = tiny_cost((1, 2, 4, 8)), tiny_cost()
        self.assertEqual(padded.base_terms(3, 3, 3)[1], eager.base_terms(4, 3, 3)[1])
        self.assertEqual(padded.base_terms(9, 9, 9)[1], eager.base_terms(9, 9, 9)[1])  # past it: eager

    def test_the_step_is_the_sum_of_its_terms_and_a_decode_pricer_agrees(self):
        cost = tiny_cost((1, 2, 4, 8))
        shape = main.StepShape(20, 300, 3, 2, 100, 4, 18 * 109.5)
        self.assertAlmostEqual(cost.step_s(*shape), cost.terms(shape).seconds, places=15)
        self.assertEqual(cost.decode_pricer(5)(700), cost.step_s(*main.StepShape.decoding(5, 700)))

def held_out(name):
    with open(os.path.join(FIXTURES_DIR, "kernels", name), encoding="utf-8") as handle:
        return json.load(handle)


def mean_error(pairs):
    """Mean absolute relative error of (predicted, measured) pairs."""
    return sum(abs(predicted / measured - 1) for predicted, measured in pairs) / len(pairs)


KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "int4_wo": "int4_wo", "nvfp4": "nvfp4"}


def ops_pairs():
    """{(operation, hardware, dtype): [(predicted us, measured us)]} of ops_heldout.json's points,
    each priced by main's own function (decode: the points whose KV is bigger than the L2
    cache, as serving reads it; all-reduce: vLLM's custom all-reduce in a CUDA graph)."""
    tables, found = held_out("ops_heldout.json")["tables"], {}
    for point in tables["prefill"]:
        kernels, c = main.KERNEL_TABLES[point["hw"]], point["isl"]
        us = main.prefill_attention_us(kernels, KV_DTYPES[point["kv_dtype"]], point["batch"] * c * c / 2,
                                       point["batch"], c, point["heads"], point["kv_heads"], 128)
        found.setdefault(("prefill", point["hw"], point["kv_dtype"]), []).append((us, point["measured_us"]))
    for point in (p for p in tables["decode"] if p["dram_sized"]):
        kernels = main.KERNEL_TABLES[point["hw"]]
        us = main.decode_attention_us(kernels, KV_DTYPES[point["kv_dtype"]], point["batch"],
                                      point["batch"] * point["context"], point["kv_heads"], 128)
        found.setdefault(("decode", point["hw"], point["kv_dtype"]), []).append((us, point["measured_us"]))
    for point in tables["moe"]:
        us = main.moe_us(main.KERNEL_TABLES[point["hw"]], KV_DTYPES[point["dtype"]], point["tokens"], point["hidden"],
                         point["inter"], point["topk"], point["experts"], point["ep"])
        found.setdefault(("moe", point["hw"], point["dtype"]), []).append((us, point["measured_us"]))
    for point in (p for p in tables["allreduce"] if p["backend"] == "vllm_graph"):
        us = main.allreduce_us(main.KERNEL_TABLES[point["hw"]], point["tp"], point["bytes"])
        found.setdefault(("allreduce", point["hw"], "bf16"), []).append((us, point["measured_us"]))
    return found


class HeldOutTest(unittest.TestCase):
    """Each table against kernel times measured at shapes it was not distilled from
    (code/fixtures/kernels/*_heldout.json; README there): the mean error per table."""

    def test_every_gemm_table_is_within_ten_percent_of_its_held_out_shapes(self):
        found = {}
        for name in ("gemm_heldout.json", "mi300x_gemm_heldout.json"):
            for point in held_out(name)["points"]:
                us = main.gemm_us(main.KERNEL_TABLES[point["gpu"]], point["dtype"], point["m"], point["n"], point["k"])
                found.setdefault((point["gpu"], point["dtype"]), []).append((us, point["latency_us"]))
        tabled = {(tables.hardware, dtype) for tables in main.KERNEL_TABLES.values() for dtype in tables.gemm}
        self.assertEqual(tabled - set(found), UNMEASURED_GEMMS)  # every measured table is checked
        for table, pairs in found.items():
            with self.subTest(table=table, points=len(pairs)):
                self.assertLessEqual(mean_error(pairs), GEMM_BOUNDS.get(table, 0.10))

    def test_every_attention_moe_and_all_reduce_table_is_within_its_bound(self):
        for table, pairs in ops_pairs().items():
            with self.subTest(table=table, points=len(pairs)):
                self.assertLessEqual(mean_error(pairs), OPS_BOUNDS.get(table, 0.10))


# Tables whose held-out error is past 10%, each with the figure it reaches (README in code/fixtures/kernels)
GEMM_BOUNDS = {}
# NOTE: the MI300X's BF16 GEMMs are its FP8 table read at twice the k (the same bytes and tiles), a rule
# and no measurement; 21.6% off 24 BF16 gpt-oss shapes aiter measured (code/fixtures/kernels/README.md)
UNMEASURED_GEMMS = {("mi300x-192gb", "bf16")}
# NOTE: FlashInfer's FP4 MoE on B200 runs token counts that are no power of two erratically, up to 2-3x
# slower than their neighbours, by shape: no smooth table follows it (15.0% held out)
OPS_BOUNDS = {("moe", "b200-180gb", "nvfp4"): 0.15}


class OwnTablesTest(ScratchTest):
    """A --hardware-file may bring its own kernel tables (KernelTables' fields as JSON)."""

    def hardware_file(self, **changes):
        h100 = main.KERNEL_TABLES["h100-sxm-80gb"]
        tables = {"peak_tflops": 989.4, "bandwidth_gbs": 3350, "source": "my own runs, 2026-12-07",
                  "gemm": {"bf16": h100.gemm["bf16"]}, "decode_attention": h100.decode_attention,
                  "prefill_attention": h100.prefill_attention, "allreduce": h100.allreduce, **changes}
        hardware = dict(dataclasses.asdict(main.HARDWARE["h100-sxm-80gb"]), name="my-gpu",
                        kernel_tables=json.loads(json.dumps(tables)))
        return self.write("my-gpu.json", hardware)

    def test_a_gpu_of_ones_own_is_priced_by_its_own_tables_as_the_builtin_ones_price_it(self):
        flags = ("simulate", "--rate", "5", "--requests", "40", "--step-cost", "kernels", "--no-sensitivity")
        own = run_json(*flags, "--hardware-file", self.hardware_file())
        builtin = run_json(*flags, "--hardware", "h100-sxm-80gb")
        self.assertEqual(own["engine"]["cost_model"]["kind"], "kernels")
        self.assertIn("my own runs, 2026-12-07", own["engine"]["cost_model"]["text"])
        self.assertEqual(own["summary"]["tpot_ms"], builtin["summary"]["tpot_ms"])

    def test_a_broken_table_exits_2_naming_kernel_tables(self):
        h100 = main.KERNEL_TABLES["h100-sxm-80gb"].gemm["bf16"]
        for changes in ({"gemm": {"bf16": [h100[0], h100[1], h100[2], h100[3][:10]]}}, {"peak_tflops": "fast"},
                        {"allreduce": {"2": [1, 2]}}, {"decode_attention": {"bf16": [1.0, 16, {"1": [[0]]}]}}):
            with self.subTest(changes=list(changes)):
                code, out, err = run_cli("simulate", "--rate", "5", "--requests", "4", "--step-cost", "kernels",
                                         "--hardware-file", self.hardware_file(**changes))
                self.assertEqual((code, out), (2, ""))
                self.assertIn("kernel_tables", err)
                self.assertEqual(len(err.strip().splitlines()), 1)

    def test_tables_kept_as_text_that_is_not_json_exit_2_naming_kernel_tables(self):
        hardware = dict(dataclasses.asdict(main.HARDWARE["h100-sxm-80gb"]), name="my-gpu", kernel_tables_json="{not")
        code, out, err = run_cli("simulate", "--rate", "5", "--requests", "4", "--step-cost", "kernels",
                                 "--hardware-file", self.write("my-gpu.json", hardware))
        self.assertEqual((code, out), (2, ""))
        self.assertIn("kernel_tables: not KernelTables' form (JSONDecodeError", err)


class MeanStepTest(unittest.TestCase):

    def test_a_run_priced_by_kernels_reports_its_mean_step_kernel_by_kernel(self):
        report = run_json("simulate", "--rate", "5", "--requests", "40", "--step-cost", "kernels", "--no-sensitivity")
        terms = report["step_cost"]
        self.assertEqual(terms["kind"], "kernels")
        parts = sum(terms[name + "_ms"] for name, _ in main.KERNEL_TERM_LABELS)
        self.assertAlmostEqual(parts, terms["step_ms"], places=9)
        self.assertGreater(terms["linear_ms"], terms["decode_attention_ms"])  # a short-context 8B step: its weights
