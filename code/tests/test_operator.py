"""What an operator of vLLM, SGLang or llama.cpp types, taken as they mean it."""

import dataclasses
import json
import os
import shlex
import shutil
import tempfile
import unittest
from unittest import mock

from support import FIXTURES_DIR, main, run_cli, run_json


class DurationTest(unittest.TestCase):

    def test_a_plain_rate_for_a_duration_sends_as_many_requests_as_arrive_in_it(self):
        report = run_json("simulate", "--rate", "8", "--duration-s", "60", "--requests", "3", "--no-sensitivity")
        arrivals = report["settings"]["arrivals"]
        self.assertEqual(arrivals, {"mode": "poisson", "rate": 8.0, "duration_s": 60.0})
        expected = len(list(main.SyntheticWorkload(0, (256, 1024), (64, 256), 0, schedule=((0.0, 8.0),),
                                                   duration_s=60.0)))
        self.assertEqual(report["settings"]["num_requests"], expected)  # --requests 3 is not what is sent
        self.assertGreater(expected, 8 * 60 * 0.8)
        self.assertLess(expected, 8 * 60 * 1.2)

    def test_the_text_report_says_for_how_long(self):
        code, out, err = run_cli("simulate", "--rate", "4", "--duration-s", "30", "--no-sensitivity")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("poisson arrivals 4 req/s for 30 s", out.splitlines()[0])

    def test_without_a_duration_a_rate_sends_the_requests_asked_for(self):
        report = run_json("simulate", "--rate", "8", "--requests", "30", "--no-sensitivity")
        self.assertEqual(report["settings"]["arrivals"], {"mode": "poisson", "rate": 8.0})
        self.assertEqual(report["settings"]["num_requests"], 30)


if __name__ == "__main__":
    unittest.main()


class SweepVerdictTest(unittest.TestCase):

    def test_with_objectives_the_sweep_table_shows_goodput_and_the_verdict_its_json_has(self):
        argv = ("sweep", "--concurrency", "1,256", "--requests", "128", "--slo-ttft-ms", "200", "--slo-tpot-ms", "15")
        code, out, err = run_cli(*argv)
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        self.assertTrue(lines[1].split()[-2:] == ["goodput", "slo"], lines[1])
        runs = run_json(*argv)["runs"]
        for line, run in zip(lines[2:4], runs):
            good = run["summary"]["goodput"]
            self.assertEqual(line.split()[-2:], [f"{good['req_per_s']:.2f}", "met" if good["meets"] else "missed"])
        self.assertEqual([line.split()[-1] for line in lines[2:4]], ["met", "missed"])
        self.assertIn("goodput: req/s of requests that met ttft <= 200 ms, tpot <= 15 ms; slo: met or missed at p95",
                      lines)

    def test_without_objectives_the_sweep_table_has_no_verdict(self):
        code, out, _ = run_cli("sweep", "--concurrency", "1", "--requests", "8")
        self.assertNotIn("goodput", out)
        self.assertNotIn(" slo", out.splitlines()[1])


class CompareWidthTest(unittest.TestCase):
    RUNS = ("c1", "c2", "c3", "c4", "c4-again", "c8")

    def assert_fits(self, out):
        wide = [line for line in out.splitlines() if len(line) > main.TEXT_WIDTH]
        self.assertEqual(wide, [])

    def test_compare_of_loadgen_reports_fits_in_120_columns_every_figure_still_shown(self):
        folder = os.path.join(FIXTURES_DIR, "llamacpp")
        argv = ["compare", "--step-profile", os.path.join(folder, "profile.json"), "--hardware", "cpu-2vcpu",
                "--model", "gemma-3-270m-q4_k_m", *(os.path.join(folder, name + ".json") for name in self.RUNS)]
        code, out, err = run_cli(*argv)
        self.assertEqual((code, err), (0, ""))
        self.assert_fits(out)
        titles = [line.split("|") for line in out.splitlines() if "measured" in line or "error" in line]
        self.assertEqual([[part.strip() for part in title] for title in titles if len(title) == 2],
                         [["measured", "predicted"], ["error", "noise"]])
        self.assertIn("at concurrency 1 the server decoded", out)  # the note, wrapped, still there

    def test_compare_of_several_inference_perf_runs_fits_in_120_columns(self):
        gpu = os.path.join(FIXTURES_DIR, "gpu")
        code, out, err = run_cli("compare", os.path.join(gpu, "h100", "llama-3-1-70b-tp4-codegen"),
                                 os.path.join(gpu, "h100", "llama-3-1-70b-tp4-general-lite"),
                                 "--hardware", "h100-sxm-80gb", "--model-dir", gpu, "--no-sensitivity")
        self.assertEqual((code, err), (0, ""))
        self.assert_fits(out)
        for figure in ("ttft mean", "ttft p50", "e2e mean", "tpot mean", "out tok/s", "failed share"):
            self.assertIn(figure, out)
        self.assertEqual(sum(line.startswith("run ") for line in out.splitlines()), 3)  # keys repeated per table


class TitledTablesTest(unittest.TestCase):

    def test_groups_past_the_width_go_to_a_table_below_with_the_keys_repeated(self):
        groups = [(name, ("a" * 20, "b" * 20), [["1", "2"]]) for name in ("one", "two", "three")]
        with mock.patch.object(main, "TEXT_WIDTH", 100):
            lines = main.titled_tables(["key"], [["k"]], groups)
        self.assertEqual([line.split("|")[0].strip() for line in lines if not line.lstrip().startswith(("key", "k "))],
                         ["one", "three"])
        self.assertEqual(sum(line.startswith("key") for line in lines), 2)
        self.assertTrue(all(len(line) <= 100 for line in lines))

    def test_a_group_wider_than_the_width_still_gets_a_table_of_its_own(self):
        groups = [("wide", ("x" * 150,), [["1"]])]
        with mock.patch.object(main, "TEXT_WIDTH", 100):
            lines = main.titled_tables(["key"], [["k"]], groups)
        self.assertEqual(len(lines), 3)

    def test_prose_wraps_at_the_width_its_later_lines_indented(self):
        with mock.patch.object(main, "TEXT_WIDTH", 20):
            self.assertEqual(main.wrapped(["one two three four five six seven"]),
                             ["one two three four", "  five six seven"])


def hub_cache(root, model_id, config, snapshot="abc123", main_ref=True):
    """A Hugging Face hub cache folder as the hub lays it out, holding model_id's config."""
    folder = os.path.join(root, "models--" + model_id.replace("/", "--"))
    os.makedirs(os.path.join(folder, "snapshots", snapshot), exist_ok=True)
    with open(os.path.join(folder, "snapshots", snapshot, "config.json"), "w") as handle:
        json.dump(config, handle)
    if main_ref:
        os.makedirs(os.path.join(folder, "refs"), exist_ok=True)
        with open(os.path.join(folder, "refs", "main"), "w") as handle:
            handle.write(snapshot)


SMALL_CONFIG = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
                "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 1000, "torch_dtype": "bfloat16"}


class ModelNamesTest(unittest.TestCase):
    # Published totals (model cards, as the hub shows them) of ids built in
    PUBLISHED_B = {"meta-llama/Llama-3.1-8B-Instruct": 8.0, "meta-llama/Llama-3.1-70B-Instruct": 70.0,
                   "meta-llama/Llama-3.1-405B": 405.0, "meta-llama/Llama-3.2-1B-Instruct": 1.23,
                   "meta-llama/Llama-3.2-3B-Instruct": 3.21, "Qwen/Qwen2.5-7B-Instruct": 7.61,
                   "Qwen/Qwen2.5-3B-Instruct": 3.09, "deepseek-ai/DeepSeek-V3": 671.0, "openai/gpt-oss-120b": 117.0,
                   "openai/gpt-oss-20b": 21.0}

    def setUp(self):
        self.scratch = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.scratch)

    def test_an_id_in_a_hub_cache_resolves_to_its_config(self):
        hub_cache(self.scratch, "acme/tiny-7", SMALL_CONFIG)
        with mock.patch.dict(os.environ, {"HF_HUB_CACHE": self.scratch}):
            model = main.model_by_name("acme/tiny-7")
        self.assertEqual((model.layers, model.kv_heads, model.hidden_size, model.vocab_size), (4, 2, 512, 1000))

    def test_the_snapshot_refs_main_names_wins_over_a_newer_one(self):
        hub_cache(self.scratch, "acme/tiny-7", SMALL_CONFIG, snapshot="aaa")
        hub_cache(self.scratch, "acme/tiny-7", dict(SMALL_CONFIG, num_hidden_layers=9), snapshot="zzz", main_ref=False)
        with mock.patch.dict(os.environ, {"HF_HUB_CACHE": self.scratch}):
            self.assertEqual(main.model_by_name("acme/tiny-7").layers, 4)

    def test_hf_home_holds_the_hub_cache_when_hf_hub_cache_is_unset(self):
        hub_cache(os.path.join(self.scratch, "hub"), "acme/tiny-7", SMALL_CONFIG)
        environ = {key: value for key, value in os.environ.items() if key != "HF_HUB_CACHE"}
        with mock.patch.dict(os.environ, dict(environ, HF_HOME=self.scratch), clear=True):
            self.assertEqual(main.model_by_name("acme/tiny-7").layers, 4)

    def test_a_model_folder_resolves_to_its_config(self):
        with open(os.path.join(self.scratch, "config.json"), "w") as handle:
            json.dump(SMALL_CONFIG, handle)
        self.assertEqual(main.model_by_name(self.scratch).layers, 4)

    def test_every_built_in_id_and_alias_sizes_and_is_found_whatever_its_case(self):
        for model_id in list(main.BUILTIN_MODEL_CONFIGS) + list(main.BUILTIN_MODEL_ALIASES):
            with self.subTest(model_id=model_id), mock.patch.dict(os.environ, {"HF_HUB_CACHE": self.scratch}):
                model = main.model_by_name(model_id.upper())
                self.assertGreater(model.params, 1e8)
                self.assertEqual(model.name, model_id.split("/")[-1].lower())

    def test_built_in_ids_size_within_two_percent_of_their_published_parameter_counts(self):
        for model_id, billions in self.PUBLISHED_B.items():
            with self.subTest(model_id=model_id):
                self.assertAlmostEqual(main.model_by_name(model_id).params / 1e9, billions, delta=billions * 0.02)

    def test_gemma_ties_its_head_to_its_embeddings_unless_its_config_says_otherwise(self):
        config = dict(SMALL_CONFIG, model_type="gemma2")
        tied = main.model_from_config_data(config, "test", "g")
        untied = main.model_from_config_data(dict(config, tie_word_embeddings=False), "test", "g")
        self.assertEqual(untied.params - tied.params, 1000 * 512)

    def test_an_unknown_id_exits_2_naming_where_it_looked(self):
        with mock.patch.dict(os.environ, {"HF_HUB_CACHE": self.scratch}):
            code, out, err = run_cli("capacity", "--model", "acme/nothing-here")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("--model acme/nothing-here: not a preset", err)
        self.assertIn(self.scratch, err)
        self.assertEqual(len(err.splitlines()), 1)

    def test_simulate_takes_an_id_as_vllm_serve_does(self):
        report = run_json("simulate", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "4",
                          "--rate", "2", "--requests", "20", "--no-sensitivity")
        self.assertEqual(report["settings"]["model"], "llama-3.1-70b-instruct")
        self.assertEqual(report["capacity"]["tensor_parallel_size"], 4)


# The shape fields of real configs (public copies: AI21-Jamba-1.5-Mini in sdpython/experimental-experiment,
# falcon-mamba-7b and Nemotron-H-56B-Base-8K as the hub has them), a VLM's encoder and decoder
JAMBA = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 65536,
         "torch_dtype": "bfloat16", "num_experts": 16, "num_experts_per_tok": 2, "attn_layer_period": 8,
         "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 16,
         "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 256}
FALCON_MAMBA = {"architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba", "hidden_size": 4096,
                "num_hidden_layers": 64, "intermediate_size": 8192, "vocab_size": 65024, "torch_dtype": "bfloat16",
                "state_size": 16, "conv_kernel": 4, "expand": 16, "time_step_rank": 256}
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 8192,
              "num_hidden_layers": 118, "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 32768,
              "vocab_size": 131072, "torch_dtype": "bfloat16", "hybrid_override_pattern": "M-M-M-M*-" * 10,
              "mamba_num_heads": 256, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 256}


class ArchitecturesTest(unittest.TestCase):

    def write_config(self, config):
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        with open(os.path.join(folder, "config.json"), "w") as handle:
            json.dump(config, handle)
        return folder

    def test_a_model_with_mamba_or_linear_attention_layers_exits_2_naming_its_architecture(self):
        for config, architecture in ((JAMBA, "JambaForCausalLM"), (FALCON_MAMBA, "FalconMambaForCausalLM"),
                                     (NEMOTRON_H, "NemotronHForCausalLM")):
            with self.subTest(architecture=architecture):
                code, out, err = run_cli("capacity", "--model", self.write_config(config))
                self.assertEqual((code, out), (2, ""))
                self.assertIn(architecture, err)
                self.assertIn("state-space or linear-attention layers", err)
                self.assertEqual(len(err.splitlines()), 1)

    def test_a_linear_attention_layer_kind_is_refused_though_the_type_is_new(self):
        config = dict(SMALL_CONFIG, model_type="brand_new", layer_types=["linear_attention", "full_attention"] * 2)
        with self.assertRaises(main.UsageError) as caught:
            main.model_from_config_data(config, "test", "x")
        self.assertIn("layer_types 'linear_attention'", str(caught.exception))

    def test_an_attention_model_with_sliding_layers_is_not_refused(self):
        config = dict(SMALL_CONFIG, sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2)
        self.assertEqual(main.model_from_config_data(config, "test", "x").num_sliding_layers, 2)

    def test_a_vision_language_model_sizes_its_decoder_and_encoder_within_two_percent_of_the_published_total(self):
        published_b = {"meta-llama/Llama-3.2-11B-Vision-Instruct": 10.6, "Qwen/Qwen2.5-VL-7B-Instruct": 8.29,
                       "mistralai/Mistral-Small-3.1-24B-Instruct-2503": 24.0}
        for model_id, billions in published_b.items():
            with self.subTest(model_id=model_id):
                model = main.model_by_name(model_id)
                total = model.params + model.encoder_bytes / model.bytes_per_param
                self.assertAlmostEqual(total / 1e9, billions, delta=billions * 0.02)
                self.assertIn("vision encoder", model.unpriced)

    def test_the_encoder_is_held_in_memory_and_said_not_priced(self):
        code, out, err = run_cli("capacity", "--model", "Qwen/Qwen2.5-VL-7B-Instruct")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("not priced: the vision encoder (0.63 B params, held in the memory plan); each image's or clip's "
                      "encoding time is left out of every step", out)
        with_encoder = main.model_by_name("Qwen/Qwen2.5-VL-7B-Instruct")
        without = dataclasses.replace(with_encoder, encoder_bytes=0.0, unpriced="")
        hardware = main.HARDWARE["l4-24gb"]
        plans = [main.plan_capacity(hardware, model, 0.9, 16, None, 4096) for model in (with_encoder, without)]
        self.assertAlmostEqual(plans[1].kv_cache_bytes - plans[0].kv_cache_bytes, with_encoder.encoder_bytes,
                               delta=16 * with_encoder.kv_bytes_per_token)  # whole blocks

    def test_a_text_model_says_nothing_of_encoders(self):
        code, out, _ = run_cli("capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct")
        self.assertNotIn("not priced", out)
        self.assertNotIn("unpriced", json.dumps(run_json("capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct")))


ACCEPTANCE_VLLM = ("vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 --max-num-seqs 256 "
                   "--enable-prefix-caching --kv-cache-dtype fp8")


class ServerCommandTest(unittest.TestCase):
    # Each server's flag (its own documented spelling) and the servesim flags it stands for
    MAPPINGS = {
        "vllm": [("--tensor-parallel-size 2", ["--tensor-parallel-size", "2"]), ("-tp 2", ["--tensor-parallel-size", "2"]),
                 ("--pipeline-parallel-size 2", ["--pipeline-parallel-size", "2"]),
                 ("-pp 2", ["--pipeline-parallel-size", "2"]), ("--data-parallel-size 2", ["--data-parallel-size", "2"]),
                 ("--enable-expert-parallel", ["--enable-expert-parallel"]), ("-ep", ["--enable-expert-parallel"]),
                 ("--max-model-len 32k", ["--max-model-len", "32000"]), ("--max-model-len 32K", ["--max-model-len", "32768"]),
                 ("--max-model-len auto", []), ("--max-num-seqs 64", ["--max-num-seqs", "64"]),
                 ("--max-num-batched-tokens 4096", ["--max-num-batched-tokens", "4096"]),
                 ("--gpu-memory-utilization 0.8", ["--gpu-memory-utilization", "0.8"]),
                 ("--block-size 32", ["--block-size", "32"]), ("--num-gpu-blocks-override 100", ["--num-gpu-blocks-override", "100"]),
                 ("--kv-cache-dtype fp8_e5m2", ["--kv-cache-dtype", "fp8_e5m2"]), ("--kv-cache-dtype bfloat16", ["--kv-cache-dtype", "auto"]),
                 ("--dtype half", ["--dtype", "half"]), ("--quantization fp8", ["--quantization", "fp8"]),
                 ("-q awq", ["--quantization", "awq"]), ("--enable-prefix-caching", ["--prefix-caching"]),
                 ("--no-enable-prefix-caching", ["--no-prefix-caching"]), ("--disable-prefix-caching", ["--no-prefix-caching"]),
                 ("--no-enable-chunked-prefill", ["--no-chunked-prefill"]), ("--enable-chunked-prefill", []),
                 ("--long-prefill-token-threshold 512", ["--long-prefill-token-threshold", "512"]),
                 ("--async-scheduling", ["--async-scheduling"]), ("--no-async-scheduling", ["--no-async-scheduling"]),
                 ("--enforce-eager", ["--enforce-eager"]), ("--kv-offloading-size 64", ["--kv-offloading-size", "64"]),
                 ('--speculative-config {"method":"ngram","num_speculative_tokens":3}',
                  ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'])],
        "sglang": [("--tp-size 2", ["--tensor-parallel-size", "2"]), ("--tp 2", ["--tensor-parallel-size", "2"]),
                   ("--dp-size 2", ["--data-parallel-size", "2"]), ("--mem-fraction-static 0.8", ["--gpu-memory-utilization", "0.8"]),
                   ("--max-running-requests 64", ["--max-num-seqs", "64"]),
                   ("--chunked-prefill-size 4096", ["--max-num-batched-tokens", "4096"]),
                   ("--context-length 8192", ["--max-model-len", "8192"]), ("--kv-cache-dtype fp8_e4m3", ["--kv-cache-dtype", "fp8_e4m3"]),
                   ("--quantization fp8", ["--quantization", "fp8"]), ("--disable-radix-cache", ["--no-prefix-caching"]),
                   ("--page-size 16", ["--block-size", "16"])],
        "llama-server": [("-c 4096", ["--kv-tokens", "4096"]), ("--ctx-size 4096", ["--kv-tokens", "4096"]),
                         ("-np 4", ["--max-num-seqs", "4"]), ("--parallel 4", ["--max-num-seqs", "4"]),
                         ("-b 1024", ["--max-num-batched-tokens", "1024"]), ("-ub 256", ["--ubatch-size", "256"]),
                         ("--cache-type-k f16", [])],
    }
    HEADS = {"vllm": "vllm serve m", "sglang": "python -m sglang.launch_server --model-path m",
             "llama-server": "llama-server -m m.gguf"}

    def test_each_mapped_flag_becomes_the_servesim_flag_of_the_same_meaning(self):
        for engine, cases in self.MAPPINGS.items():
            for given, expected in cases:
                with self.subTest(engine=engine, flag=given):
                    flag, _, value = given.partition(" ")
                    command = main.server_command(engine, f"{self.HEADS[engine]} {flag} {shlex.quote(value)}"
                                                  if value else f"{self.HEADS[engine]} {flag}")
                    model_words = 4  # --scheduler S --model M
                    self.assertEqual(list(command.flags[model_words:]), expected)
                    self.assertEqual(command.not_modelled, ())

    def test_the_acceptance_command_runs_alone_and_says_what_it_took(self):
        code, out, err = run_cli("simulate", "--vllm", ACCEPTANCE_VLLM, "--rate", "10", "--requests", "500")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("from the vllm serve command: meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 "
                      "--max-num-seqs 256 --enable-prefix-caching --kv-cache-dtype fp8; where it is silent the run "
                      "took vLLM", out)
        report = run_json("simulate", "--vllm", ACCEPTANCE_VLLM, "--rate", "10", "--requests", "50", "--no-sensitivity")
        config, capacity = report["settings"]["scheduler"], report["capacity"]
        self.assertEqual((config["max_num_seqs"], config["prefix_caching"], capacity["tensor_parallel_size"]),
                         (256, True, 4))
        self.assertEqual(capacity["kv_bytes_per_token"], 2 * 80 * 2 * 128 * 1)  # a shard's 2 of 8 KV heads, FP8
        self.assertEqual(report["settings"]["model"], "llama-3.1-70b-instruct")

    def test_an_sglang_and_a_llama_server_command_run_with_their_own_schedulers(self):
        sglang = run_json("simulate", "--sglang", "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2 "
                          "--max-running-requests 64 --port 30000", "--rate", "4", "--requests", "20", "--no-sensitivity")
        self.assertEqual((sglang["settings"]["scheduler"]["scheduler"], sglang["settings"]["scheduler"]["max_num_seqs"]),
                         ("sglang", 64))
        self.assertEqual(sglang["server_command"]["ignored"], ["--port 30000"])
        gguf = os.path.join(FIXTURES_DIR, "..", "..", "code", "fixtures", "gpu", "Llama-3.1-8B-Instruct", "config.json")
        llama = run_json("simulate", "--llama-server", f"llama-server -m {gguf} -c 8192 -np 4 -ngl 99", "--hardware",
                         "l4-24gb", "--concurrency", "4", "--requests", "8", "--no-sensitivity")
        self.assertEqual((llama["settings"]["scheduler"]["scheduler"], llama["capacity"]["num_kv_tokens"]),
                         ("llamacpp", 8192))
        self.assertEqual(llama["server_command"]["not_simulated"], ["-ngl 99"])

    def test_other_launchers_and_environment_assignments_are_read_too(self):
        for text in ("CUDA_VISIBLE_DEVICES=0,1 vllm serve m -tp 2",
                     "python3 -m vllm.entrypoints.openai.api_server --model m -tp 2",
                     "docker run --gpus all -p 8000:8000 vllm/vllm-openai:latest --model m -tp 2"):
            with self.subTest(text=text):
                command = main.server_command("vllm", text)
                self.assertIn("--model", command.flags)
                self.assertEqual(command.flags[command.flags.index("--tensor-parallel-size") + 1], "2")

    def test_a_flag_the_server_does_not_have_exits_2_naming_it(self):
        for engine, text, flag in (("vllm", "vllm serve m --max-num-seq-s 3", "--max-num-seq-s"),
                                   ("sglang", "python -m sglang.launch_server --tpx 2", "--tpx"),
                                   ("llama-server", "llama-server -m m.gguf --frobnicate", "--frobnicate")):
            with self.subTest(engine=engine):
                code, out, err = run_cli("capacity", f"--{engine}", text)
                self.assertEqual((code, out), (2, ""))
                self.assertIn(f"--{engine}: {flag} is not a flag of {main.SERVER_COMMAND_NAMES[engine]}", err)

    def test_a_knob_set_by_the_command_and_a_flag_both_exits_2(self):
        code, _, err = run_cli("simulate", "--vllm", "vllm serve m --max-num-seqs 8", "--max-num-seqs", "16",
                               "--rate", "1")
        self.assertEqual(code, 2)
        self.assertIn("--max-num-seqs: given twice", err)

    def test_something_that_is_not_a_server_command_exits_2(self):
        code, _, err = run_cli("capacity", "--vllm", "python train.py --epochs 3")
        self.assertEqual(code, 2)
        self.assertIn("expected the server's command line, starting vllm serve", err)

    def test_vllm_takes_underscores_and_prefixes_llama_server_exact_names_only(self):
        self.assertIn("--max-num-seqs", main.server_command("vllm", "vllm serve m --max_num_seqs 8").flags)
        self.assertIn("--max-num-seqs", main.server_command("vllm", "vllm serve m --max-num-seq 8").flags)
        with self.assertRaises(main.UsageError):
            main.server_command("llama-server", "llama-server -m m.gguf --ctx 4096")

    def test_sglang_turns_chunked_prefill_off_with_minus_one_and_overlap_off_with_its_flag(self):
        command = main.server_command("sglang", "python -m sglang.launch_server --model-path m "
                                                "--chunked-prefill-size -1 --disable-overlap-schedule")
        self.assertEqual(command.flags[4:], ("--no-chunked-prefill", "--no-async-scheduling"))

    def test_a_vllm_command_takes_its_releases_memory_share_unless_told(self):
        for version, share in (("0.15", 0.9), ("0.20", 0.92)):
            with self.subTest(version=version):
                argv = main.with_server_command(["simulate", "--vllm", "vllm serve m", "--vllm-version", version],
                                                main.build_parser("simulate"))
                self.assertEqual(argv[argv.index("--gpu-memory-utilization") + 1], str(share))
        argv = main.with_server_command(["simulate", "--vllm", "vllm serve m", "--gpu-memory-utilization", "0.8"],
                                        main.build_parser("simulate"))
        self.assertEqual(argv.count("--gpu-memory-utilization"), 1)

    def test_flags_that_change_the_server_in_ways_not_simulated_are_listed_not_dropped(self):
        command = main.server_command("vllm", "vllm serve m --enable-lora --cpu-offload-gb 8 --port 8000 --host ::")
        self.assertEqual(command.not_modelled, ("--enable-lora", "--cpu-offload-gb 8"))
        self.assertEqual(command.ignored, ("--port 8000", "--host ::"))


class RunWarningsTest(unittest.TestCase):

    def warnings(self, *argv):
        return run_json("simulate", "--no-sensitivity", *argv).get("warnings", [])

    def test_closed_loop_clients_with_requests_of_one_length_are_warned_of_lockstep(self):
        found = self.warnings("--concurrency", "8", "--requests", "64", "--prompt-tokens", "500", "--output-tokens", "50")
        self.assertEqual(len(found), 1)
        self.assertIn("8 closed-loop clients sending requests of one length (500 + 50 tokens) move in lockstep", found[0])

    def test_a_run_of_few_requests_per_client_is_warned_of_its_first_wave(self):
        found = self.warnings("--concurrency", "16", "--requests", "32")
        self.assertEqual(found, ["32 requests for 16 clients: the first wave (every client starting at once) is a large "
                                 "share of the run; give --requests 64 or more"])

    def test_a_first_wave_past_the_kv_cache_is_warned_of(self):
        found = self.warnings("--hardware", "l4-24gb", "--concurrency", "64", "--requests", "256",
                              "--prompt-tokens", "2000-3000")
        self.assertEqual(len(found), 1)
        self.assertIn("the 64 clients' first requests alone need more KV cache than the", found[0])

    def test_an_ordinary_run_has_no_warning(self):
        for argv in (("--concurrency", "8", "--requests", "64"), ("--rate", "5", "--requests", "50"),
                     ("--concurrency", "1", "--requests", "4", "--prompt-tokens", "100", "--output-tokens", "10")):
            with self.subTest(argv=argv):
                self.assertEqual(self.warnings(*argv), [])
        code, out, _ = run_cli("simulate", "--concurrency", "8", "--requests", "64", "--no-sensitivity")
        self.assertNotIn("warning", out)


class PlanQuantizationTest(unittest.TestCase):

    def test_plan_puts_the_weights_format_on_its_grid_and_echoes_it(self):
        argv = ("plan", "--model", "llama-3.1-70b", "--hardware", "h100-sxm-80gb", "--tensor-parallel-size", "2",
                "--replicas", "1", "--quantization", "own,fp8", "--rate", "2", "--requests", "30",
                "--slo-ttft-ms", "5000", "--quiet")
        report = run_json(*argv)
        formats = [entry["point"]["quantization"] for entry in report["points"]]
        self.assertEqual(formats, [None, "fp8"])
        weights = [entry["result"]["summary"]["cost"]["usd_per_hour"] for entry in report["points"]]
        self.assertEqual(weights[0], weights[1])  # the same devices, priced alike
        code, out, err = run_cli(*argv)
        self.assertEqual((code, err), (0, ""))
        self.assertIn("weights", out.splitlines()[5])
        self.assertIn(", fp8 weights", out)

    def test_a_plan_without_the_axis_prints_as_before(self):
        code, out, _ = run_cli("plan", "--model", "llama-3.1-8b", "--hardware", "l4-24gb", "--tensor-parallel-size",
                               "1", "--replicas", "1", "--rate", "1", "--requests", "20", "--slo-ttft-ms", "5000",
                               "--quiet")
        self.assertNotIn("weights", out)

    def test_a_bad_format_on_the_grid_exits_2(self):
        code, _, err = run_cli("plan", "--quantization", "own,fp9", "--rate", "1", "--slo-ttft-ms", "100")
        self.assertEqual(code, 2)
        self.assertIn("--quantization", err)


def _sigint_ignored():
    import signal
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


class InterruptTest(unittest.TestCase):

    def test_worker_processes_ignore_ctrl_c_so_only_the_parent_reports(self):
        with main.Workers(2) as workers:
            self.assertEqual(workers.map(_sigint_ignored, [(), ()]), [True, True])

    def test_a_sweep_interrupted_prints_the_points_done_and_exits_130(self):
        real, calls = main.run_simulation, []

        def interrupted_on_the_third(run):
            calls.append(run)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real(run)
        with mock.patch.object(main, "run_simulation", interrupted_on_the_third):
            code, out, err = run_cli("sweep", "--concurrency", "1,2,4,8", "--requests", "16", "--jobs", "1")
        self.assertEqual(code, 130)
        self.assertEqual([line.split()[0] for line in out.splitlines()[2:4]], ["1", "2"])
        self.assertNotIn("          4 ", out)
        self.assertEqual(err, "servesim: interrupted after 2 of 4 points\n")


class UnmeasuredCostTest(unittest.TestCase):

    def spec(self, **changes):
        changes.setdefault("noisy", ())  # NOTE: the fixture's prefills were measured on a busy VM; see the tests below
        profile = main.read_step_profile(os.path.join(FIXTURES_DIR, "llamacpp", "profile.json"))
        spec = main.build_engine_spec(main.EngineArgs(hardware="cpu-2vcpu", model="gemma-3-270m-q4_k_m"))
        return dataclasses.replace(spec, step_profile=dataclasses.replace(profile, **changes))

    def row(self, concurrency, prompt_tokens, batch):
        return {"concurrency": concurrency, "prompt_tokens": prompt_tokens, "predicted": {"batch": batch},
                "trace": None}

    def test_prompts_longer_than_any_profiled_prefill_are_named(self):
        notes = main.unmeasured_cost_notes(self.spec(), [self.row(1, 63, 1.0), self.row(4, 2000, 4.0)])
        self.assertEqual(len(notes), 1)
        self.assertIn("TTFT rests on a prefill cost the step profile never measured at concurrency 4 (prompts of 2,000 "
                      "tokens; its longest, 543 tokens)", notes[0])

    def test_a_profile_that_measured_no_prefill_says_so(self):
        notes = main.unmeasured_cost_notes(self.spec(prefill=()), [self.row(1, 63, 1.0)])
        self.assertIn("none: the profile ran out of budget or skipped them", notes[0])

    def test_batches_past_the_profiles_largest_are_named(self):
        notes = main.unmeasured_cost_notes(self.spec(), [self.row(8, 63, 7.5)])
        self.assertEqual(notes, ["TPOT at concurrency 8 rests on decode batches past the profile's largest (4): its "
                                 "last step's cost carried on"])

    def test_a_workload_inside_the_profile_gets_no_note(self):
        self.assertEqual(main.unmeasured_cost_notes(self.spec(), [self.row(1, 63, 1.0), self.row(4, 500, 4.0)]), [])


class VllmDefaultsTest(unittest.TestCase):

    def test_the_offline_llm_class_takes_its_own_token_budgets(self):
        h100, b200, a100 = (main.HARDWARE[name] for name in ("h100-sxm-80gb", "b200-180gb", "a100-sxm-80gb"))
        cases = [((0, 15), h100, False, (1024, 8192)), ((0, 15), h100, True, (1024, 16384)),
                 ((0, 15), a100, False, (256, 2048)), ((0, 15), a100, True, (256, 8192)),
                 ((0, 28), b200, False, (1024, 16384)), ((0, 28), b200, True, (1024, 16384))]
        for version, hardware, offline, expected in cases:
            with self.subTest(version=version, hardware=hardware.name, offline=offline):
                found = main.vllm_release_defaults(version, hardware, offline)
                self.assertEqual((found["max_num_seqs"], found["max_num_batched_tokens"]), expected)

    def test_the_entry_point_flag_reaches_the_engine(self):
        report = run_json("simulate", "--rate", "2", "--requests", "10", "--vllm-version", "0.15",
                          "--vllm-entry-point", "llm", "--no-sensitivity")
        self.assertEqual(report["settings"]["scheduler"]["max_num_batched_tokens"], 16384)


class ServerTablesTest(unittest.TestCase):

    @staticmethod
    def fixture_script(folder, name):
        """A distill script of code/fixtures, imported."""
        import importlib.util
        spec = importlib.util.spec_from_file_location(name, os.path.join(FIXTURES_DIR, folder, name + ".py"))
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        return script

    def test_main_ships_the_tables_distilled_from_the_servers_own_parsers(self):
        distill = self.fixture_script("servers", "distill_options")
        shipped = {}
        for text in distill.tables().values():
            exec(text, shipped)
        self.assertEqual(shipped["VLLM_SERVE_OPTIONS"], main.VLLM_SERVE_OPTIONS)
        self.assertEqual(shipped["SGLANG_SERVER_OPTIONS"], main.SGLANG_SERVER_OPTIONS)

    def test_main_ships_the_model_configurations_distilled_from_their_public_copies(self):
        distill = self.fixture_script("models", "distill_builtin")
        shipped = {}
        exec("TABLE = {\n" + "".join(text for _, text in distill.entries()) + "}", shipped)
        self.assertEqual(shipped["TABLE"], main.BUILTIN_MODEL_CONFIGS)


class NoisyProfileTest(unittest.TestCase):
    spec, row = UnmeasuredCostTest.spec, UnmeasuredCostTest.row

    def test_a_profile_measured_on_a_busy_machine_says_which_steps_and_the_rows_on_them(self):
        noisy = (("decode", 3, 0.25), ("prefill", 543, 0.32))
        notes = main.unmeasured_cost_notes(self.spec(noisy=noisy), [self.row(1, 63, 1.0), self.row(3, 63, 2.7)])
        self.assertEqual(notes, ["the step profile measured decode batch 3 (repeats 25% apart), a prefill of 543 tokens "
                                 "(repeats 32% apart): the machine was not quiet, and the figures at concurrency 3 "
                                 "rest on those steps; profile again on a quiet machine, or in each round of the runs "
                                 "(--step-profile P1,P2,...)"])

    def test_a_profiles_noisy_points_are_read_from_its_repeats(self):
        profile = main.read_step_profile(os.path.join(FIXTURES_DIR, "llamacpp", "profile.json"))
        self.assertEqual([(kind, size) for kind, size, _ in profile.noisy],
                         [("prefill", 47), ("prefill", 287), ("prefill", 543)])
        self.assertTrue(all(spread > main.NOISY_SPREAD for _, _, spread in profile.noisy))
        combined = main.read_step_profiles(",".join([os.path.join(FIXTURES_DIR, "llamacpp", "profile.json")] * 2))
        self.assertEqual(combined.noisy, ())  # the median of several profiles is the remedy


class RemeasureTest(unittest.TestCase):

    def profiler(self, gaps):
        settings = main.ProfileSettings(batches=(1, 2), prefill_tokens=(), prompt_tokens=32, output_tokens=16,
                                        repeat=3, budget_s=1e9, timeout_s=10.0)
        profiler = main.Profiler(None, {}, "m", settings, lambda text: None, clock=lambda: 0.0)
        def sample(batch, fastest_s, prompt_tokens=None):
            return {"gap_s": gaps[batch].pop(0), "mean_batch": float(batch), "context": 40.0, "ttft_s": None,
                    "server_s": []}  # decode_sample's fields
        profiler.decode_sample = sample
        return profiler

    def test_a_decode_batch_whose_runs_lie_far_apart_is_run_again_and_a_steady_one_is_not(self):
        gaps = {1: [0.0100, 0.0101, 0.0099], 2: [0.020, 0.030, 0.021, 0.021, 0.022, 0.020]}
        profiler = self.profiler(gaps)
        profiler.measure_decodes([1, 2])
        counts = {point["batch"]: len(point["repeats_ms"]) for point in profiler.decode}
        self.assertEqual(counts, {1: 3, 2: 6})
        self.assertEqual(gaps, {1: [], 2: []})

    def test_the_budget_bounds_the_runs_again(self):
        gaps = {1: [0.0100, 0.0101, 0.0099], 2: [0.020, 0.030, 0.021, 0.021, 0.022, 0.020]}
        profiler = self.profiler(gaps)
        profiler.fits_budget = lambda what, estimate_s: "again" not in what
        profiler.measure_decodes([1, 2])
        self.assertEqual({point["batch"]: len(point["repeats_ms"]) for point in profiler.decode}, {1: 3, 2: 3})

    def test_a_prompt_length_whose_runs_lie_far_apart_is_sent_again(self):
        profiler = self.profiler({})
        times = {100: [0.10, 0.101, 0.099], 500: [0.50, 0.70, 0.52, 0.51, 0.50, 0.52]}
        profiler.prefill_sample = lambda tokens: (tokens, times[tokens].pop(0), None)
        samples = {tokens: [profiler.prefill_sample(tokens) for _ in range(3)] for tokens in times}
        profiler.reprefill_unstable(samples)
        self.assertEqual({tokens: len(runs) for tokens, runs in samples.items()}, {100: 3, 500: 6})
