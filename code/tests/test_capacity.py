"""The memory plan and the roofline: the lesson's Step 1, Step 2 and Step 9 figures."""

import dataclasses
import json
import unittest

from support import main, run_cli, run_json


class CapacityTest(unittest.TestCase):

    def test_capacity_l4_prints_the_lessons_memory_plan_line_for_line(self):
        code, out, err = run_cli("capacity", "--hardware", "l4-24gb")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines(), [
            "capacity llama-3.1-8b on l4-24gb gpu-memory-utilization 0.90",
            "weights         16.06 GB    8.03 B params x 2 bytes",
            "kv per token    128.0 KiB   2 x 32 layers x 8 kv heads x 128 head dim x 2 bytes",
            "memory budget   20.25 GiB   22.5 GiB x 0.90",
            "kv cache        3.79 GiB    budget - weights - 1.5 GiB reserve",
            "blocks          1,941 x 16 tokens = 31,056 tokens",
            "max concurrency 7.58x at 4,096 tokens per request",
            "decode step     72.38 ms at batch 1; compute catches up with the weight read at ~269 tokens per step",
            "price           $0.71/h     $0.71 per device-hour x 1 device",  # beyond the lesson: the cost line
        ])

    def test_capacity_70b_on_h100_exits_1_naming_the_three_ways_out(self):
        code, out, err = run_cli("capacity", "--model", "llama-3.1-70b")
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(len(err.splitlines()), 1)
        self.assertIn("servesim: llama-3.1-70b does not fit on h100-sxm-80gb: weights 141.20 GB "
                      "plus 2.0 GiB reserve exceed 71.64 GiB", err)
        for way_out in ("quantize", "tensor parallelism", "more memory"):
            self.assertIn(way_out, err)

    def test_kv_tokens_fixes_the_cache_like_llama_cpp_ctx_size(self):
        report = run_json("capacity", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0",
                          "--kv-tokens", "4096")
        self.assertEqual(report["capacity"]["num_blocks"], 256)
        self.assertEqual(report["capacity"]["num_kv_tokens"], 4096)
        self.assertTrue(report["capacity"]["kv_tokens_fixed"])

    def test_num_gpu_blocks_override_fixes_the_cache_at_that_many_blocks_as_vllm_does(self):
        report = run_json("capacity", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0",
                          "--num-gpu-blocks-override", "200", "--block-size", "32")
        self.assertEqual((report["capacity"]["num_blocks"], report["capacity"]["num_kv_tokens"]), (200, 6400))
        self.assertTrue(report["capacity"]["kv_tokens_fixed"])
        code, _, err = run_cli("capacity", "--num-gpu-blocks-override", "200", "--kv-tokens", "4096")
        self.assertEqual((code, err), (2, "servesim: error: --num-gpu-blocks-override and --kv-tokens both size "
                                          "the KV cache; give one of them\n"))

    def test_kv_tokens_larger_than_free_memory_exits_1(self):
        code, _, err = run_cli("capacity", "--hardware", "l4-24gb", "--kv-tokens", "100000")
        self.assertEqual(code, 1)
        self.assertIn("does not fit", err)

    def test_gpu_memory_utilization_and_block_size_change_the_block_count(self):
        plan = main.plan_capacity(main.HARDWARE["l4-24gb"], main.MODELS["llama-3.1-8b"],
                                  gpu_memory_utilization=0.95, block_size=32)
        # 22.5 GiB x 0.95 - 16.06 GB - 1.5 GiB = 5,279,014,400 bytes, 4 MiB per 32-token block.
        self.assertEqual(plan.num_blocks, 1258)
        self.assertEqual(plan.num_kv_tokens, 40256)

    def test_max_model_len_sets_the_concurrency_line(self):
        code, out, _ = run_cli("capacity", "--hardware", "l4-24gb", "--max-model-len", "8192")
        self.assertEqual(code, 0)
        self.assertIn("max concurrency 3.79x at 8,192 tokens per request", out)

    def test_kv_bytes_per_token_uses_kv_heads_not_query_heads(self):
        self.assertEqual(main.MODELS["llama-3.1-8b"].kv_bytes_per_token, 131072)
        self.assertEqual(main.MODELS["llama-3.1-70b"].kv_bytes_per_token, 327680)
        self.assertEqual(main.MODELS["smollm2-135m-q8_0"].kv_bytes_per_token, 23040)

    def test_q8_0_weights_take_34_bytes_per_32_params(self):
        self.assertAlmostEqual(main.MODELS["smollm2-135m-q8_0"].weight_bytes, 134_515_008 * 34 / 32)

    def test_unknown_preset_exits_2_listing_the_valid_names(self):
        code, out, err = run_cli("capacity", "--hardware", "tpu-v5")
        self.assertEqual((code, out), (2, ""))
        self.assertEqual(err, "servesim: error: --hardware: unknown preset 'tpu-v5'; expected one of "
                              "h100-sxm-80gb, h100-lesson, h200-sxm-141gb, b200-180gb, mi300x-192gb, a100-sxm-80gb, l40s-48gb, "
                              "l4-24gb, cpu-4vcpu, cpu-2vcpu\n")
        code, _, err = run_cli("simulate", "--model", "gpt-5", "--concurrency", "1")
        self.assertEqual(code, 2)
        self.assertIn("llama-3.1-8b, llama-3.1-70b, qwen3-32b, qwen3-30b-a3b, gpt-oss-120b, deepseek-v3, "
                      "smollm2-135m-q8_0, gemma-3-270m-q4_k_m", err)

    def test_an_empty_preset_or_file_name_exits_2_naming_the_flag(self):
        for subcommand, flag in (("capacity", "--model"), ("capacity", "--hardware"), ("simulate", "--model-file"),
                                 ("explain", "--hardware"), ("loadgen", "--model")):
            with self.subTest(subcommand=subcommand, flag=flag):
                code, out, err = run_cli(subcommand, flag, "")
                self.assertEqual((code, out, err), (2, "", f"servesim: error: argument {flag}: expected a non-empty "
                                                          f"name, got ''\n"))

    def test_capacity_json_carries_a_mixtures_total_and_active_parameters(self):
        code, out, _ = run_cli("capacity", "--model", "qwen3-30b-a3b", "--json")
        capacity = json.loads(out)["capacity"]
        model = main.MODELS["qwen3-30b-a3b"]
        self.assertEqual((code, capacity["params"]), (0, 30.5e9))
        # every parameter but the 120 of 128 experts a token is not routed to, in each of 48 layers
        self.assertEqual(capacity["active_params"], 30.5e9 - 120 * model.expert_params * 48)
        self.assertIn("30.50 B params (3.32 B active per token)", run_cli("capacity", "--model", "qwen3-30b-a3b")[1])

    def test_presets_are_frozen(self):
        with self.assertRaises(Exception):
            main.HARDWARE["l4-24gb"].memory_gib = 48


class RooflineTest(unittest.TestCase):
    L4 = main.HARDWARE["l4-24gb"]
    H100 = main.HARDWARE["h100-sxm-80gb"]
    LLAMA_8B = main.MODELS["llama-3.1-8b"]

    def test_decode_at_batch_1_is_overhead_plus_the_weight_read(self):
        # 1 ms + 16.06 GB / (300 GB/s x 0.75)
        self.assertAlmostEqual(main.step_seconds(self.L4, self.LLAMA_8B, 1, 0), 0.07238, places=5)

    def test_context_tokens_add_their_kv_read_and_attention_arithmetic(self):
        base = main.step_seconds(self.H100, self.LLAMA_8B, 1, 0)
        with_context = main.step_seconds(self.H100, self.LLAMA_8B, 1, 10_000)
        # 10,000 x 128 KiB / (3,350 GB/s x 0.835, the fitted mbu), and 10,000 x 32 layers x 4 x 32
        # heads x 128 FLOPs at 989.4 TFLOPS x 0.0632, the fitted share decode attention reaches
        self.assertAlmostEqual(with_context - base, 10_000 * 131072 / (3350e9 * 0.835)
                               + 10_000 * 32 * 4 * 32 * 128 / (989.4e12 * 0.0632))

    def test_batching_16_decodes_costs_barely_more_than_one(self):
        one = main.step_seconds(self.H100, self.LLAMA_8B, 1, 1000)
        sixteen = main.step_seconds(self.H100, self.LLAMA_8B, 16, 16 * 1000)
        self.assertLess(sixteen / one, 1.15)

    def test_a_prefill_chunk_is_compute_bound(self):
        # 0.245 ms + 32 layers x 23 us + 2 x 8.03e9 x 8192 / (989.4e12 x 0.556), and the attention of
        # the one sequence over its 8,192 tokens of context
        self.assertAlmostEqual(main.step_seconds(self.H100, self.LLAMA_8B, 8192, 8192),
                               0.245e-3 + 32 * 23e-6 + 2 * 8.03e9 * 8192 / (989.4e12 * 0.556)
                               + 8192 * 32 * 4 * 32 * 128 / (989.4e12 * 0.0632))

    def test_the_lm_head_is_priced_only_for_tokens_that_sample(self):
        cpu = main.HARDWARE["cpu-4vcpu"]
        gemma = main.MODELS["gemma-3-270m-q4_k_m"]
        body, head = 268_098_176 - 167_772_160, 167_772_160
        prefill = main.step_seconds(cpu, gemma, 100, 100, num_sampled=1)
        self.assertAlmostEqual(prefill, 0.002 + 2 * (body * 100 + head) / 0.1e12)
        decode = main.step_seconds(cpu, gemma, 4, 400)
        self.assertAlmostEqual(decode, 0.002 + 2 * (body + head) * 4 / 0.1e12)

    def test_without_head_params_every_token_pays_for_every_parameter(self):
        self.assertEqual(main.step_seconds(self.H100, self.LLAMA_8B, 512, 512, num_sampled=1),
                         main.step_seconds(self.H100, self.LLAMA_8B, 512, 512))

    def test_critical_batch_is_about_197_on_h100_269_on_l4_under_3_on_cpu(self):
        self.assertEqual(round(main.critical_batch(self.H100, self.LLAMA_8B)), 197)
        self.assertEqual(round(main.critical_batch(self.L4, self.LLAMA_8B)), 269)
        cpu = main.critical_batch(main.HARDWARE["cpu-4vcpu"], main.MODELS["smollm2-135m-q8_0"])
        self.assertLess(cpu, 3)

    def test_past_the_critical_batch_every_token_makes_the_step_slower(self):
        knee = int(main.critical_batch(self.H100, self.LLAMA_8B))
        below = main.step_seconds(self.H100, self.LLAMA_8B, knee - 50, 0)
        at = main.step_seconds(self.H100, self.LLAMA_8B, knee, 0)
        above = main.step_seconds(self.H100, self.LLAMA_8B, knee + 50, 0)
        self.assertAlmostEqual(below, at, places=4)
        self.assertGreater(above, at * 1.2)


if __name__ == "__main__":
    unittest.main()


class TensorParallelTest(unittest.TestCase):
    H100 = main.HARDWARE["h100-sxm-80gb"]
    LLAMA_70B = main.MODELS["llama-3.1-70b"]

    def test_70b_on_two_h100s_fits_with_the_figures_worked_by_hand(self):
        plan = main.plan_capacity(self.H100, self.LLAMA_70B, tensor_parallel_size=2)
        # Per device: 79.6 GiB x 0.9 = 76,922,864,271 bytes; minus half the weights
        # (70.6e9 bytes) and the 2 GiB reserve leaves 4,175,380,623 bytes; a block of 16
        # tokens x 160 KiB (4 of the 8 KV heads) is 2,621,440 bytes: 1,592 blocks.
        self.assertEqual(plan.model.weight_bytes, 70.6e9)
        self.assertEqual(plan.model.kv_bytes_per_token, 2 * 80 * 4 * 128 * 2)
        self.assertEqual((plan.num_blocks, plan.num_kv_tokens), (1592, 25472))
        self.assertEqual(plan.devices, "2 x h100-sxm-80gb")

    def test_capacity_prints_the_70b_plan_on_two_h100s(self):
        code, out, err = run_cli("capacity", "--model", "llama-3.1-70b", "--tensor-parallel-size", "2")
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        self.assertEqual(lines[0], "capacity llama-3.1-70b on 2 x h100-sxm-80gb, tensor parallel (figures per device) "
                                   "gpu-memory-utilization 0.90")
        self.assertIn("weights         70.60 GB    35.30 B params x 2 bytes", lines)
        self.assertIn("blocks          1,592 x 16 tokens = 25,472 tokens", lines)
        self.assertIn("in all          weights 141.20 GB, kv cache 7.77 GiB on 2 devices; every token's KV is split "
                      "across them", lines)

    def test_the_70b_error_names_the_smallest_tensor_parallel_size_that_fits(self):
        code, _, err = run_cli("capacity", "--model", "llama-3.1-70b")
        self.assertEqual(code, 1)
        self.assertIn("(--tensor-parallel-size 2 is the smallest that fits)", err)
        code, _, err = run_cli("capacity", "--model", "llama-3.1-70b", "--hardware", "l4-24gb")
        self.assertIn("(--tensor-parallel-size 8 is the smallest that fits)", err)

    def test_tp2_halves_the_weight_read_per_device_and_adds_the_all_reduce(self):
        one_device = main.step_seconds(self.H100, self.LLAMA_70B, 1, 0)
        shard = self.LLAMA_70B.sharded(2)
        fixed = 0.245e-3 + 80 * 23e-6  # the fitted cost of a step and floor of each layer
        # 2 x 80 all-reduces of 8,192 x 2 bytes, a ring moving 2 x (1/2) of it over 450 GB/s x 0.25,
        # each after its 7.3 us of latency
        allreduce = 2 * 80 * (7.3e-6 + 2 * 0.5 * 8192 * 2 / (450e9 * 0.25))
        self.assertAlmostEqual(main.allreduce_seconds(self.H100, shard, 1), allreduce)
        self.assertAlmostEqual(main.step_seconds(self.H100, shard, 1, 0),
                               fixed + 70.6e9 / (3350e9 * 0.835) + allreduce)
        self.assertAlmostEqual(one_device - fixed, 2 * (main.step_seconds(self.H100, shard, 1, 0) - fixed - allreduce))

    def test_kv_heads_fewer_than_devices_are_replicated(self):
        self.assertEqual(self.LLAMA_70B.sharded(4).kv_heads, 2)
        self.assertEqual(self.LLAMA_70B.sharded(16).kv_heads, 1)
        self.assertEqual(main.MODELS["smollm2-135m-q8_0"].sharded(2).kv_heads, 2)  # 3 heads: one on both

    def test_the_interconnect_sets_the_all_reduce_price(self):
        l4_shard = main.MODELS["llama-3.1-8b"].sharded(2)
        self.assertEqual(main.HARDWARE["l4-24gb"].interconnect_gbs, 32)
        pcie = main.allreduce_seconds(main.HARDWARE["l4-24gb"], l4_shard, 100)
        nvlink = main.allreduce_seconds(dataclasses.replace(main.HARDWARE["l4-24gb"], interconnect_gbs=450), l4_shard, 100)
        self.assertAlmostEqual(pcie / nvlink, 450 / 32)
        fast = run_json("capacity", "--hardware", "l4-24gb", "--tensor-parallel-size", "2", "--interconnect-gbs", "64")
        slow = run_json("capacity", "--hardware", "l4-24gb", "--tensor-parallel-size", "2")
        self.assertLess(fast["decode_step_ms"], slow["decode_step_ms"])

    def test_simulate_on_two_devices_reports_them(self):
        code, out, _ = run_cli("simulate", "--model", "llama-3.1-70b", "--tensor-parallel-size", "2",
                               "--concurrency", "2", "--requests", "4")
        self.assertEqual(code, 0)
        self.assertTrue(out.startswith("servesim llama-3.1-70b on 2 x h100-sxm-80gb 4 requests"))
