"""The deployment question: mixtures of experts, latent and sliding-window attention,
precision, prices, and replicas behind a router. Every expected figure is worked by hand
in the comment beside it."""

import dataclasses
import json
import os
import unittest
from unittest import mock

from support import FIXTURES_DIR, ScratchTest, main, new_scheduler, run_cli, run_json

# The H100's datasheet under the lesson's plain roofline (mfu 0.5, mbu 0.75, 1 ms a step, none of
# the fitted overheads), so the figures below are the arithmetic of the terms they test alone.
H100 = dataclasses.replace(main.HARDWARE["h100-sxm-80gb"], **main.DATASHEET_GPU, layer_overhead_us=0.0,
                           allreduce_latency_us=0.0, link_efficiency=1.0, request_overhead_ms=0.0, moe_efficiency=1.0,
                           attention_efficiency=0.0)
QWEN3_MOE = main.MODELS["qwen3-30b-a3b"]
TWO_PREFIXES = os.path.join(FIXTURES_DIR, "two_prefixes.jsonl")

# Qwen3-30B-A3B: 48 layers of 128 experts, each 3 x 2048 x 768 = 4,718,592 params.
EXPERT = 3 * 2048 * 768
ROUTED = 128 * EXPERT * 48             # 28,991,029,248: every routed expert
DENSE = 30.5e9 - ROUTED                # 1,508,970,752: attention, norms, routers, embeddings, head
H100_READ_BYTES_PER_S = 3350e9 * 0.75  # bandwidth x mbu


class MixtureOfExpertsTest(unittest.TestCase):

    def test_memory_holds_every_expert_and_the_kv_comes_from_attention_alone(self):
        plan = main.plan_capacity(H100, QWEN3_MOE)
        self.assertEqual(plan.model.weight_bytes, 61.0e9)  # 30.5 B params x 2 bytes, all 128 experts
        self.assertEqual(plan.model.kv_bytes_per_token, 98_304)  # 2 x 48 layers x 4 kv heads x 128 x 2 bytes
        # free: 79.6 GiB x 0.9 = 76,922,864,271 B, less 61.0e9 weights and a 2 GiB reserve
        # = 13,775,380,623 B; a block is 16 x 98,304 = 1,572,864 B: 8,758 whole blocks.
        self.assertEqual(plan.num_blocks, 8_758)

    def test_expected_distinct_experts_run_from_k_at_one_token_to_all_at_a_large_batch(self):
        self.assertEqual(QWEN3_MOE.distinct_experts(1), 8)  # 128 x (1 - 15/16)
        self.assertAlmostEqual(QWEN3_MOE.distinct_experts(16), 82.4225, places=4)  # 128 x (1 - (15/16)^16)
        self.assertAlmostEqual(QWEN3_MOE.distinct_experts(512), 128, places=9)  # (15/16)^512 ~ 4e-15

    def test_a_batch_of_one_reads_the_dense_weights_and_eight_experts_per_layer(self):
        read_bytes = (DENSE + 8 * EXPERT * 48) * 2  # 3,320,910,080 params x 2 bytes = 6,641,820,160 B
        self.assertEqual(QWEN3_MOE.step_weight_bytes(1), read_bytes)
        # 1 ms step overhead + 6,641,820,160 B / 2.5125 TB/s = 2.6435 ms; one token of KV is nothing beside it
        self.assertAlmostEqual(main.step_seconds(H100, QWEN3_MOE, 1, 1), 0.001 + read_bytes / H100_READ_BYTES_PER_S,
                               places=7)
        self.assertAlmostEqual(main.step_seconds(H100, QWEN3_MOE, 1, 1) * 1000, 3.6435, places=4)

    def test_a_large_batch_reads_every_expert_and_pays_flops_for_active_params_only(self):
        # 512 tokens touch all 128 experts: the whole 61.0e9 B, 24.279 ms at 2.5125 TB/s, and
        # 512 tokens of KV (512 x 98,304 B) 0.020 ms more. FLOPs count the 8 routed experts per
        # token: 2 x 3.01e9 active params x 512 / 494.7 TFLOPS = 6.2 ms, under the read, so the
        # step is the read (a dense 30.5 B model would be compute bound at 63 ms).
        self.assertAlmostEqual(QWEN3_MOE.step_weight_bytes(512), 61.0e9, delta=1.0)
        self.assertLess(main.compute_seconds(H100, QWEN3_MOE, 512, 512), 0.0065)
        read_s = (61.0e9 + 512 * 98_304) / H100_READ_BYTES_PER_S
        self.assertAlmostEqual(main.step_seconds(H100, QWEN3_MOE, 512, 512), 0.001 + read_s, places=7)

    def test_config_json_of_a_mixture_of_experts_counts_every_expert(self):
        config = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 48,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                  "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                  "vocab_size": 151_936, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
        scratch = ScratchTest("run")
        scratch.setUp()
        self.addCleanup(scratch.doCleanups)
        model = main.model_from_file(scratch.write("config.json", config))
        # per layer: attention 2048 x (4096 + 512 + 512) + 4096 x 2048 = 18,874,368, two norms of 2,048,
        # router 2048 x 128 = 262,144, 128 experts of 4,718,592 = 603,979,776; x 48 = 29,909,777,664
        # (Qwen3's per-head q/k norms, 256 per layer, are not counted); embeddings and head
        # 151,936 x 2048 each = 311,164,928; final norm 2,048.
        self.assertEqual(model.params, 30_532_110_336)
        self.assertEqual((model.num_experts, model.num_experts_per_tok, model.expert_params, model.num_moe_layers),
                         (128, 8, EXPERT, 48))


    SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "torch_dtype": "bfloat16",
             "text_config": {"model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48,
                             "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                             "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 16,
                             "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "vocab_size": 202_048,
                             "tie_word_embeddings": False}}

    def llama4(self, **changes):
        scratch = ScratchTest("run")
        scratch.setUp()
        self.addCleanup(scratch.doCleanups)
        return main.model_from_file(scratch.write("config.json", dict(self.SCOUT, text_config=dict(
            self.SCOUT["text_config"], **changes))))

    def test_llama_4_scout_counts_the_shared_expert_its_config_does_not_name(self):
        model = self.llama4()
        # embeddings and head 2 x 202,048 x 5,120 = 2,068,971,520; per layer attention 5,120 x (5,120 + 2 x 1,024)
        # + 5,120 x 5,120 and two norms = 62,924,800; 16 routed experts of 3 x 5,120 x 8,192 = 125,829,120;
        # one shared expert as wide and a 5,120 x 16 router = 125,911,040; x 48 layers; a final norm of 5,120
        self.assertEqual(model.params, 2_068_971_520 + 48 * (62_924_800 + 16 * 125_829_120 + 125_911_040) + 5120)
        self.assertEqual((model.num_experts, model.num_experts_per_tok, model.num_moe_layers, model.num_shared_experts),
                         (16, 1, 48, 1))
        self.assertEqual(model.num_heads, 40)

    def test_llama_4_scout_in_fp8_keeps_its_attention_and_routers_in_16_bits(self):
        scratch = ScratchTest("run")
        scratch.setUp()
        self.addCleanup(scratch.doCleanups)
        fp8 = dict(self.SCOUT, quantization_config={
            "quant_method": "compressed-tensors", "ignore": ["re:.*lm_head", "re:.*self_attn", "re:.*router",
                                                            "re:vision_model.*", "Llama4TextAttention"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"},
                                          "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}})
        model = main.model_from_file(scratch.write("config.json", fp8))
        # 16 bits: embeddings and head, 48 x 62,914,560 of attention, 48 x 5,120 x 16 of routers; a byte: the rest
        kept = 2_068_971_520 + 48 * 62_914_560 + 48 * 5120 * 16
        self.assertAlmostEqual(model.weight_bytes, 2 * kept + (self.llama4().params - kept), delta=1)
        self.assertTrue(model.fp8_compute)

    def test_llama_4_interleaves_dense_layers_of_intermediate_size_mlp(self):
        every_other = self.llama4(interleave_moe_layer_step=2, num_local_experts=128)
        listed = self.llama4(interleave_moe_layer_step=2, num_local_experts=128, moe_layers=list(range(1, 48, 2)))
        self.assertEqual((every_other.num_moe_layers, listed.num_moe_layers), (24, 24))
        # 24 dense layers of 3 x 5,120 x 16,384 in place of 24 MoE layers (128 experts, one shared, a router to 128)
        moe_layer = 128 * 125_829_120 + 125_829_120 + 5120 * 128
        self.assertEqual(every_other.params, 2_068_971_520 + 48 * 62_924_800 + 24 * moe_layer
                         + 24 * 3 * 5120 * 16384 + 5120)
        self.assertEqual(listed.params, every_other.params)


class AttentionShapesTest(unittest.TestCase):

    def test_sliding_window_layers_hold_the_window_per_sequence_not_per_token(self):
        gpt_oss = main.MODELS["gpt-oss-120b"]
        self.assertEqual(gpt_oss.kv_bytes_per_token, 36_864)  # 18 full layers x 2 x 8 kv heads x 64 x 2 bytes
        self.assertEqual(gpt_oss.sliding_kv_bytes_per_token, 36_864)  # the other 18, up to 128 tokens
        self.assertEqual(gpt_oss.kv_bytes(1000), 1000 * 36_864 + 128 * 36_864)
        plan = main.plan_capacity(H100, gpt_oss, max_num_seqs=256)
        self.assertEqual(plan.window_bytes, 1_207_959_552)  # 256 sequences x 128 tokens x 36,864 B

    def test_latent_attention_caches_one_compressed_latent_per_layer(self):
        self.assertEqual(main.MODELS["deepseek-v3"].kv_bytes_per_token, 70_272)  # 61 layers x (512 + 64) x 2 bytes

    def test_capacity_reports_the_window_reserve_and_the_experts(self):
        code, out, err = run_cli("capacity", "--model", "gpt-oss-120b")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("experts         4 of 128    per token in 36 layers; distinct experts a step reads: "
                      "4.0 at 1, 51.0 at 16, 128.0 at 256 tokens\n", out)
        self.assertIn("sliding windows 1.12 GiB    18 layers x 128 tokens x 256 sequences (36.0 KiB per token)\n", out)
        self.assertIn("kv cache        7.82 GiB    budget - weights - 2.0 GiB reserve - sliding windows\n", out)


class PrecisionTest(unittest.TestCase):

    def test_fp8_kv_cache_doubles_the_blocks(self):
        auto = run_json("capacity", "--model", "llama-3.1-8b")["capacity"]
        fp8 = run_json("capacity", "--model", "llama-3.1-8b", "--kv-cache-dtype", "fp8")["capacity"]
        self.assertEqual((auto["kv_bytes_per_token"], fp8["kv_bytes_per_token"]), (131_072, 65_536))
        # 58,715,380,623 B free: 27,997 blocks of 2 MiB, 55,995 of 1 MiB (not 2 x 27,997: the remainder)
        self.assertEqual((auto["num_blocks"], fp8["num_blocks"]), (27_997, 55_995))

    def test_fp8_weights_fit_a_70b_on_one_h100_and_compute_at_the_fp8_rate(self):
        self.assertEqual(run_cli("capacity", "--model", "llama-3.1-70b")[0], 1)
        report = run_json("capacity", "--model", "llama-3.1-70b", "--quantization", "fp8")["capacity"]
        self.assertEqual(report["weight_bytes"], 70.6e9)
        model = main.with_precision(main.MODELS["llama-3.1-70b"], quantization="fp8")
        self.assertEqual(main.flop_rate(H100, model), 1978.9e12 * 0.5)
        self.assertEqual(main.flop_rate(main.HARDWARE["a100-sxm-80gb"], model), 312e12 * 0.556)  # no FP8 units

    def test_weight_formats_set_bytes_per_parameter(self):
        llama = main.MODELS["llama-3.1-8b"]
        for method, bytes_per_param in (("int8", 1.0), ("int4", 0.5), ("awq", 4.25 / 8), ("mxfp4", 17 / 32),
                                        ("q4_k", 144 / 256), ("q8_0", 34 / 32)):
            self.assertEqual(main.with_precision(llama, quantization=method).bytes_per_param, bytes_per_param, method)
        self.assertEqual(main.with_precision(llama, dtype="float32").bytes_per_param, 4)

    def test_an_unknown_weight_format_exits_2_naming_the_choices(self):
        code, out, err = run_cli("capacity", "--quantization", "fp3")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--quantization/-q: expected one of fp8, int8, int4, awq, gptq, mxfp4 or a ggml type", err)


class CostTest(unittest.TestCase):

    def test_dollars_per_million_tokens_from_price_devices_and_throughput(self):
        summary = main.add_cost({"output_tok_per_s": 500.0, "total_tok_per_s": 2000.0}, 3.6 * 2, 2)
        # $7.20 an hour buys 500 x 3600 = 1.8 M output tokens: $4.00 per M; 7.2 M total: $1.00 per M
        self.assertEqual(summary["cost"], {"usd_per_hour": 7.2, "num_devices": 2,
                                           "usd_per_million_output_tokens": 4.0,
                                           "usd_per_million_total_tokens": 1.0})
        self.assertEqual(main.cost_line(summary["cost"]),
                         "cost $4.00 per M output tokens, $1.00 per M total tokens at $7.20/h for 2 devices")

    def test_no_price_no_cost(self):
        self.assertNotIn("cost", main.add_cost({"output_tok_per_s": 500.0, "total_tok_per_s": 900.0}, 0.0, 1))

    def test_a_simulation_prices_every_device_of_every_replica(self):
        report = run_json("simulate", "--model", "llama-3.1-70b", "--tensor-parallel-size", "2", "--replicas", "2",
                          "--price-per-hour", "3.6", "--rate", "4", "--requests", "40")
        summary = report["summary"]
        cost = summary["cost"]
        self.assertEqual((cost["usd_per_hour"], cost["num_devices"]), (14.4, 4))  # $3.60 x 2 TP x 2 replicas
        self.assertAlmostEqual(cost["usd_per_million_output_tokens"],
                               14.4 / (summary["output_tok_per_s"] * 3600) * 1e6, places=9)


    def test_compare_prices_the_measurement_and_the_prediction_alike(self):
        reports = [os.path.join(FIXTURES_DIR, "llamacpp", name) for name in ("c1.json", "c4.json")]
        code, out, err = run_cli("compare", *reports, "--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m",
                                 "--price-per-hour", "0.1")
        self.assertEqual((code, err), (0, ""))
        line = next(line for line in out.splitlines() if line.startswith("cost per M output tokens"))
        self.assertTrue(line.startswith("cost per M output tokens at $0.10/h (cpu-2vcpu), measured / predicted: "
                                        "concurrency 1 $"), line)
        self.assertNotIn("cost per M", run_cli("compare", *reports, "--hardware", "cpu-2vcpu")[1])  # no price

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_compare_takes_the_model_the_server_loaded_and_says_when_the_hardware_is_the_default(self):
        report = os.path.join(FIXTURES_DIR, "llamacpp", "c1.json")  # llama.cpp's model_path: .../gemma-3-270m-q4_k_m.gguf
        lines = run_cli("compare", report)[1].splitlines()
        self.assertTrue(lines[0].startswith("compare gemma-3-270m-q4_k_m on h100-sxm-80gb (llama.cpp slots: "), lines[0])
        self.assertEqual(lines[1], "no --hardware given: the default h100-sxm-80gb's price, memory and roofline "
                                   "stand in for the server's where the measurement is silent")
        lines = run_cli("compare", report, "--hardware", "cpu-2vcpu", "--model", "smollm2-135m-q8_0")[1].splitlines()
        self.assertTrue(lines[0].startswith("compare smollm2-135m-q8_0 on cpu-2vcpu ("), lines[0])
        self.assertFalse(any(line.startswith("no --hardware") for line in lines))


ROUTER_LOADS = (("--rate", "40"), ("--concurrency", "24"))


def router_cases():
    """Every router under each load (bench.py check runs them all)."""
    return [(router, load) for router in main.ROUTERS for load in ROUTER_LOADS]


def suite_router_cases():
    """The suite's share of router_cases: every router, under the loads in turn."""
    return [(router, ROUTER_LOADS[index % len(ROUTER_LOADS)]) for index, router in enumerate(main.ROUTERS)]


def engines_disagree(router, load):
    """Where the fast engine's figures differ from the step engine's behind router under load."""
    flags = ("--requests", "150", "--replicas", "3", "--router", router, "--prefix-caching", *load)
    fast, step = run_json("simulate", *flags), run_json("simulate", *flags, "--engine", "step")
    pairs = [(f"summary.{name}", fast["summary"][name], step["summary"][name])
             for name in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms")]
    pairs += [(f"engine.{key}", fast["engine"][key], step["engine"][key])
              for key in ("num_steps", "num_preemptions", "prefix_hit_tokens", "max_batch_seqs")]
    found = [f"{name}: {a!r} != {b!r}" for name, a, b in pairs if a != b]
    itl = (fast["summary"]["itl_ms"]["mean"], step["summary"]["itl_ms"]["mean"])
    if round(itl[0] - itl[1], 9) != 0:  # assertAlmostEqual's places=9
        found.append(f"summary.itl_ms.mean: {itl[0]!r} != {itl[1]!r}")
    return [f"--router {router} {' '.join(load)}: {difference}" for difference in found]


class ReplicasTest(unittest.TestCase):

    def run_router(self, router):
        return run_json("simulate", "--trace", TWO_PREFIXES, "--replicas", "4", "--prefix-caching",
                        "--router", router)

    def test_prefix_affinity_keeps_each_prefix_on_one_replica_and_hits_more(self):
        # 16 requests, each with one of two 1,024-token prefixes, 19,721 prompt tokens in all.
        # Round-robin gives every replica both prefixes: 8 first sightings, 8 x 1,024 hits.
        # Affinity sends each prefix to the replica that cached it: 2 first sightings, 14 x 1,024.
        spread, affine = self.run_router("round-robin"), self.run_router("prefix-affinity")
        self.assertEqual((spread["engine"]["prefix_hit_tokens"], spread["engine"]["prefix_query_tokens"]),
                         (8_192, 19_721))
        self.assertEqual((affine["engine"]["prefix_hit_tokens"], affine["engine"]["prefix_query_tokens"]),
                         (14_336, 19_721))
        self.assertEqual([replica["num_requests"] for replica in spread["replicas"]["per_replica"]], [4, 4, 4, 4])
        self.assertEqual([replica["num_requests"] for replica in affine["replicas"]["per_replica"]], [8, 8, 0, 0])
        self.assertEqual((spread["replicas"]["request_imbalance"], affine["replicas"]["request_imbalance"]), (1.0, 2.0))

    def test_least_loaded_uses_an_idle_fleet_in_turn(self):
        router, schedulers = main.Router("least-loaded"), [new_scheduler(main.SchedulerConfig(), 64)
                                                           for _ in range(3)]
        request = main.Request(0, 8, 4)
        self.assertEqual([router.choose(request, schedulers) for _ in range(4)], [0, 1, 2, 0])
        schedulers[0].add(main.Request(1, 8, 4))
        self.assertEqual(router.choose(request, schedulers), 1)  # 0 has one waiting; 1 was chosen before 2

    def test_vllms_data_parallel_balancer_weighs_a_waiting_request_four_times_a_running_one(self):
        router, schedulers = main.Router("vllm-dp"), [new_scheduler(main.SchedulerConfig(), 64) for _ in range(3)]
        schedulers[0].running = [main.Request(1, 8, 4)] * 3   # 3 running: score 3
        schedulers[1].add(main.Request(2, 8, 4))              # 1 waiting: score 4
        schedulers[2].running = [main.Request(3, 8, 4)] * 3   # 3 running: score 3, a tie
        self.assertEqual(router.choose(main.Request(0, 8, 4), schedulers), 0)  # the first rank of the lowest
        schedulers[0].add(main.Request(4, 8, 4))              # 3 running + 1 waiting: score 7
        self.assertEqual(router.choose(main.Request(0, 8, 4), schedulers), 2)

    def test_one_replica_is_the_single_engine_run(self):
        flags = ("--rate", "20", "--requests", "200", "--prefix-caching")
        single = run_json("simulate", *flags)
        routed = run_json("simulate", *flags, "--replicas", "1", "--router", "prefix-affinity")
        self.assertEqual(single["summary"], routed["summary"])
        self.assertEqual(single["engine"], routed["engine"])

    def test_step_and_fast_engines_agree_behind_every_router(self):
        """Each router under one load or the other; bench.py check runs each under both."""
        cases = suite_router_cases()
        self.assertEqual({router for router, _ in cases}, set(main.ROUTERS))
        self.assertEqual({load for _, load in cases}, set(ROUTER_LOADS))
        self.assertEqual([difference for case in cases for difference in engines_disagree(*case)], [])

    def test_replicas_with_disaggregation_exit_2(self):
        code, out, err = run_cli("simulate", "--rate", "1", "--replicas", "2", "--disaggregate")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--replicas with --disaggregate", err)


if __name__ == "__main__":
    unittest.main()
