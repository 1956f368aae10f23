"""The step-cost contract (StepCost): one shape in, one price out, the same for every cost.

The roofline's terms are worked out in one place (roofline_terms); step_seconds, the
terms report and the fast engine's decode runs (DecodeTerms) all read it.
"""

import dataclasses
import random
import unittest

from support import main

HW = main.Hardware("tiny", memory_gib=16, bandwidth_gbs=100, tflops=1.0, mfu=0.5, mbu=0.5, step_overhead_ms=1.0,
                   reserve_gib=0.5, interconnect_gbs=10, layer_overhead_us=40, seq_overhead_us=5,
                   allreduce_latency_us=10, link_efficiency=0.5, attention_efficiency=0.1)
DENSE = main.ModelSpec("dense", params=1e9, layers=2, kv_heads=1, head_dim=100, num_heads=4, bytes_per_param=2,
                       kv_dtype_bytes=2, hidden_size=1000)
MOE = dataclasses.replace(DENSE, name="moe", num_experts=8, num_experts_per_tok=2, expert_params=50e6,
                          num_moe_layers=2)


class RooflineTermsTest(unittest.TestCase):

    def test_a_decode_step_combines_its_terms_as_documented(self):
        # 4 sequences decoding over 4,000 tokens of context:
        # fixed 1 ms + 2 x 40 us + 4 x 5 us = 1.1 ms; weights 2 GB and KV 4,000 x 800 B = 3.2 MB at 50 GB/s
        # = 40.064 ms; compute 2 x 1e9 x 4 / 0.5 TFLOPS = 16 ms; attention 4,000 x 2 layers x 4 x 4 x 100
        # FLOPs at 0.1 TFLOPS = 0.128 ms: 1.1 + 40.064 + 0.128 = 41.292 ms
        terms = main.roofline_terms(HW, DENSE, main.StepShape.decoding(4, 4000))
        self.assertAlmostEqual(terms.fixed_s, 1.1e-3, places=12)
        self.assertAlmostEqual(terms.memory_s, 40.064e-3, places=12)
        self.assertAlmostEqual(terms.compute_s, 16e-3, places=12)
        self.assertAlmostEqual(terms.attention_s, 0.128e-3, places=12)
        self.assertAlmostEqual(terms.seconds, 41.292e-3, places=12)

    def test_step_seconds_and_the_report_read_the_same_terms(self):
        terms = main.roofline_terms(HW, DENSE, main.StepShape.decoding(4, 4000))
        self.assertEqual(main.step_seconds(HW, DENSE, 4, 4000, 4, 1, 4), terms.seconds)
        report = main.step_cost_terms(HW, DENSE, 4, 4, 4000)
        self.assertEqual(report["step_ms"], terms.seconds * 1000)
        parts = (report["step_overhead_ms"] + report["layer_overhead_ms"] + report["seq_overhead_ms"]
                 + max(report["weights_ms"] + report["kv_reads_ms"], report["compute_ms"]) + report["attention_ms"])
        self.assertAlmostEqual(parts, report["step_ms"], places=9)


class DecodeTermsTest(unittest.TestCase):
    """The fast engine prices runs of decode steps from DecodeTerms: bit for bit the step's price."""

    def assert_decode_terms_match(self, cost, seeds=range(5)):
        for seed in seeds:
            draw = random.Random(seed)
            num_seqs, context = draw.randint(1, 300), draw.randint(0, 400_000)
            terms = cost.decode_terms(num_seqs)
            self.assertIsNotNone(terms)
            self.assertEqual(terms.price_s(context), cost.step_s(*main.StepShape.decoding(num_seqs, context)))
            self.assertEqual(cost.decode_pricer(num_seqs)(context), terms.price_s(context))

    def test_dense_moe_and_tensor_parallel_rooflines_give_their_decode_steps_exactly(self):
        for model in (DENSE, MOE, DENSE.sharded(2), MOE.sharded(4)):
            with self.subTest(model=model.name, tp=model.tensor_parallel_size):
                self.assert_decode_terms_match(main.RooflineCost(HW, model))

    def test_every_preset_gpu_gives_its_decode_steps_exactly(self):
        for name, hardware in main.HARDWARE.items():
            with self.subTest(hardware=name):
                self.assert_decode_terms_match(main.RooflineCost(hardware, main.MODELS["llama-3.1-8b"]), range(2))

    def test_sliding_windows_and_llamacpp_passes_have_no_decode_terms_but_a_pricer(self):
        windowed = dataclasses.replace(DENSE, sliding_window=128, num_sliding_layers=1)
        for cost in (main.RooflineCost(HW, windowed), main.RooflineCost(HW, DENSE, ubatch_tokens=2)):
            self.assertIsNone(cost.decode_terms(4))
            self.assertEqual(cost.decode_pricer(4)(1000), cost.step_s(*main.StepShape.decoding(4, 1000)))


class StepShapeTest(unittest.TestCase):

    def test_a_prompt_chunk_counts_its_causal_attention_pairs(self):
        scheduler = main.Scheduler(main.SchedulerConfig(block_size=16, max_num_batched_tokens=4), 100)
        seen = []

        class Recorder(main.RooflineCost):
            def step_s(self, *shape):
                seen.append(main.StepShape(*shape))
                return super().step_s(*shape)

        requests = [main.Request(0, 14, 2)]
        main.run_engine(main.Engine(scheduler, HW, DENSE, Recorder(HW, DENSE)), requests)
        self.assertEqual([shape.prefill_pairs for shape in seen], [10.0, 26.0, 42.0, 27.0, 0.0])
        # chunks of 4, 4, 4, 2 tokens after 0, 4, 8, 12: 4 x 2.5, 4 x 6.5, 4 x 10.5, 2 x 13.5; then a decode


if __name__ == "__main__":
    unittest.main()


class EvidenceTest(unittest.TestCase):

    def test_runs_priced_alike_say_once_what_they_rest_on_by_the_one_that_went_furthest(self):
        base = {"kind": "roofline", "hardware": "h100-sxm-80gb", "basis": "fitted", "fitted_to": "nine runs"}
        inside = dict(base, outside=[], text="the roofline")
        beyond = dict(base, outside=["256 sequences", "8,192 tokens"], text="the roofline; beyond: both")
        other = {"kind": "roofline", "hardware": "l4-24gb", "basis": "datasheet", "fitted_to": "", "outside": [],
                 "text": "the L4's datasheet"}
        self.assertEqual(main.cost_model_lines([inside, beyond, inside, other]),
                         ["the roofline; beyond: both", "the L4's datasheet"])

    def test_a_preset_fitted_to_runs_says_so_and_what_a_step_held_beyond_them(self):
        cost = main.RooflineCost(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"])
        cost.step_s(*main.StepShape.decoding(200, 200_000))
        described = cost.describe()
        self.assertEqual((described["basis"], described["outside"]),
                         ("fitted", ["200 sequences decoding in a step (the runs: at most 128)"]))
        datasheet = main.RooflineCost(main.HARDWARE["l4-24gb"], main.MODELS["llama-3.1-8b"]).describe()
        self.assertEqual((datasheet["basis"], datasheet["outside"]), ("datasheet", []))
