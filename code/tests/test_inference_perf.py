"""inference-perf run folders as the measured side: the workload rebuilt from config.yaml,
compared stage by stage, and the hardware figures fitted back from runs servesim made itself.

Each folder here is written the way inference-perf writes one (results/config.yaml in
PyYAML's block style, a lifecycle metrics file per stage, the summary with the server's
prompt_len) beside the exp-config.yaml of the campaign that ran it, from a simulation on
known hardware, so that a prediction on that hardware must reproduce it.
"""

import dataclasses
import json
import os
import random
import unittest
from unittest import mock

from support import FIXTURES_DIR, ScratchTest, main, run_cli, run_json

KNOWN = dataclasses.replace(main.HARDWARE["h100-sxm-80gb"], name="known", mbu=0.8, mfu=0.6, step_overhead_ms=0.3,
                            layer_overhead_us=30.0, allreduce_latency_us=15.0, link_efficiency=0.3,
                            request_overhead_ms=4.0, attention_efficiency=0.0)
BASE = dataclasses.replace(main.HARDWARE["h100-sxm-80gb"], mbu=0.75, mfu=0.6, step_overhead_ms=1.0,
                           layer_overhead_us=0.0, allreduce_latency_us=0.0, link_efficiency=1.0,
                           request_overhead_ms=0.0, attention_efficiency=0.0)
SMALL = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
         "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "torch_dtype": "bfloat16"}
DEEP = dict(SMALL, hidden_size=4096, intermediate_size=11008, num_hidden_layers=40, num_key_value_heads=8)
MHA = dict(DEEP, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32)  # the batch shows in its KV

CONFIG = """api:
  type: completion
  streaming: true
data:
  type: shared_prefix
  path: null
  shared_prefix:
    num_groups: 4
    num_prompts_per_group: 5
    system_prompt_len: 100
    question_len: 300
    output_len: {output}
load:
  type: {load_type}
  interval: 1.0
  stages:
{stages}
  request_timeout: {timeout}
server:
  type: vllm
  model_name: org/{model}
  ignore_eos: true
"""


def stage_metrics(figures, summary):
    """A stage's lifecycle metrics file as inference-perf writes it (seconds), from a simulated summary."""
    def spread(name):
        stats = summary[f"{name}_ms"]
        return {"mean": stats["mean"] / 1000, "median": stats["p50"] / 1000, "p90": stats["p90"] / 1000,
                "p99": stats["p99"] / 1000}
    return {"load_summary": {"count": summary["num_requests"], "requested_rate": figures["rate"]},
            "successes": {"count": summary["num_completed"],
                          "latency": {"time_to_first_token": spread("ttft"), "request_latency": spread("e2e")},
                          "throughput": {"requests_per_sec": summary["req_per_s"]}},
            "failures": {"count": summary["num_failed"]}}


def write_run(directory, name, model, config, tp, stages, hardware=KNOWN, load_type="constant", timeout="null",
              output=40):
    """An inference-perf run folder whose measurements are a simulation of its workload on hardware."""
    folder = os.path.join(directory, name)
    os.makedirs(os.path.join(folder, "results"))
    os.makedirs(os.path.join(directory, "models", model), exist_ok=True)
    with open(os.path.join(directory, "models", model, "config.json"), "w") as handle:
        json.dump(config, handle)
    keys = ("num_requests", "concurrency_level") if load_type == "concurrent" else ("rate", "duration")
    stage_text = "\n".join(f"  - {keys[0]}: {first}\n    {keys[1]}: {second}" for first, second in stages)
    results = os.path.join(folder, "results")
    with open(os.path.join(results, "config.yaml"), "w") as handle:
        handle.write(CONFIG.format(load_type=load_type, stages=stage_text, timeout=timeout, model=model, output=output))
    with open(os.path.join(folder, "exp-config.yaml"), "w") as handle:
        handle.write(f"model: org/{model}\ntensor_parallelism: {tp}\nmax_model_len: 4096\n"
                     f"max_num_batched_tokens: 2048\nmax_num_seqs: 128\napp: inference-perf\n")
    with open(os.path.join(results, "summary_lifecycle_metrics.json"), "w") as handle:
        points = {"min": 420, "p25": 425, "median": 430, "p75": 435, "max": 440}
        json.dump({"successes": {"prompt_len": dict(points, mean=430)}}, handle)
    for index in range(len(stages)):  # placeholders, so that the folder reads as a run before it is measured
        with open(os.path.join(results, f"stage_{index}_lifecycle_metrics.json"), "w") as handle:
            json.dump({"successes": {"count": 0}}, handle)
    run = main.read_inference_perf(folder)
    spec = spec_for(os.path.join(directory, "models", model, "config.json"), tp, hardware)
    for index, stage in enumerate(main.predict_inference_perf(run, spec)):
        with open(os.path.join(results, f"stage_{index}_lifecycle_metrics.json"), "w") as handle:
            json.dump(stage_metrics({"rate": stages[index][0]}, stage["summary"]), handle)
    return folder


def spec_for(model_file, tp, hardware):
    flags = main.EngineArgs(model_file=model_file, tensor_parallel_size=tp, max_num_seqs=128,
                            max_num_batched_tokens=2048)
    spec = main.build_engine_spec(flags, server={"kind": "vllm", "prefix_caching": True})
    return dataclasses.replace(spec, plan=spec.plan.on(hardware))


class WorkloadTest(ScratchTest):

    def setUp(self):
        super().setUp()
        self.folder = write_run(self.directory, "small-run", "small", SMALL, 1, [(2, 20), (6, 20)])
        self.run = main.read_inference_perf(self.folder)

    def test_the_config_names_the_stages_the_generator_and_the_clients_patience(self):
        run = self.run
        self.assertEqual((run["kind"], run["stages"], run["load_type"], run["timeout_s"]),
                         ("shared_prefix", [(2, 20), (6, 20)], "constant", 300.0))
        self.assertEqual((run["lengths"]["groups"], run["lengths"]["prompts_per_group"], run["lengths"]["output"][2]),
                         (4, 5, 40))
        self.assertEqual(main.read_inference_perf(os.path.join(self.folder, "results"))["stages"], run["stages"])

    def swept(self, sweep):
        """This run's config.yaml as a load sweep wrote it: the sweep in place of the stages it generated."""
        config = os.path.join(self.folder, "results", "config.yaml")
        with open(config) as handle:
            text = handle.read()
        start, end = text.index("  stages:\n"), text.index("  request_timeout:")
        with open(config, "w") as handle:
            handle.write(text[:start] + "  stages: []\n  sweep:\n" + sweep + text[end:])

    def test_a_sweeps_stages_are_the_rates_its_stage_files_requested_for_its_stage_duration(self):
        expected = run_json("compare", self.folder, "--hardware-file", self.write("known.json", dataclasses.asdict(KNOWN)),
                            "--model-dir", os.path.join(self.directory, "models"), "--no-sensitivity")["rows"]
        self.swept("    type: linear\n    timeout: 60\n    num_stages: 2\n    stage_duration: 20\n"
                   "    saturation_percentile: 95\n")
        self.assertEqual(main.read_inference_perf(self.folder)["stages"], [(2, 20), (6, 20)])
        rows = run_json("compare", self.folder, "--hardware-file", self.write("known.json", dataclasses.asdict(KNOWN)),
                        "--model-dir", os.path.join(self.directory, "models"), "--no-sensitivity")["rows"]
        self.assertEqual([row["predicted"] for row in rows], [row["predicted"] for row in expected])

    def test_a_sweep_without_a_stage_duration_takes_each_stages_send_duration(self):
        for index, sent_s in enumerate((19.5, 19.9)):
            path = os.path.join(self.folder, "results", f"stage_{index}_lifecycle_metrics.json")
            with open(path) as handle:
                stage = json.load(handle)
            stage["load_summary"]["send_duration"] = sent_s
            with open(path, "w") as handle:
                json.dump(stage, handle)
        self.swept("    type: geometric\n    num_stages: 2\n")
        self.assertEqual(main.read_inference_perf(self.folder)["stages"], [(2, 19.5), (6, 19.9)])

    def test_a_constant_load_sends_rate_times_duration_requests_filling_the_stage(self):
        offsets = main.inference_perf_arrivals("constant", 6, 20, random.Random(1))
        self.assertEqual(len(offsets), 120)
        self.assertAlmostEqual(offsets[-1], 20.0, places=9)
        self.assertEqual(offsets, sorted(offsets))

    def test_a_poisson_load_draws_each_seconds_count(self):
        offsets = main.inference_perf_arrivals("poisson", 50, 40, random.Random(2))
        self.assertEqual(len(offsets), 2000)
        per_second = [sum(1 for x in offsets if second <= x < second + 1) for second in range(39)]
        self.assertGreater(max(per_second) - min(per_second), 10)  # Poisson counts, not 50 every second
        self.assertAlmostEqual(offsets[-1], 40, delta=2)

    def test_requests_cycle_through_the_prompts_and_a_group_shares_its_system_prompt(self):
        stage = main.inference_perf_stages(self.run)[0]
        self.assertEqual(len(stage), 40)
        first, again = stage[0], stage[20]  # 20 prompts: request 20 repeats request 0's
        self.assertEqual((first.prompt_tokens, first.prefix_blocks), (again.prompt_tokens, again.prefix_blocks))
        keys = [main.prefix_block_keys(request, 16) for request in stage[:20]]
        groups = {}
        for request, request_keys in zip(stage[:20], keys):
            groups.setdefault(request.prefix_blocks[0], []).append(request_keys)
        self.assertEqual(len(groups), 4)
        for members in groups.values():  # the system prompt's 6 whole blocks (100 x 1.075 tokens) are shared
            self.assertEqual(len({tuple(member[:6]) for member in members}), 1)
            self.assertEqual(len({tuple(member[6:8]) for member in members}), len(members))
        lengths = sorted(request.prompt_tokens for request in stage[:20])  # the server's counts, by quantile
        self.assertEqual((lengths[0], lengths[-1], len(set(lengths)) > 10), (420, 440, True))

    def test_stages_run_one_after_another_the_cache_carried_over(self):
        spec = spec_for(os.path.join(self.directory, "models", "small", "config.json"), 1, KNOWN)
        first, second = main.predict_inference_perf(self.run, spec)
        self.assertEqual(first["summary"]["num_completed"], 40)
        self.assertGreater(second["engine"]["prefix_hit_rate"], first["engine"]["prefix_hit_rate"])

    def test_a_stages_engine_means_are_over_its_own_steps(self):
        folder = write_run(self.directory, "ramp", "small", SMALL, 1, [(1, 5), (40, 5)], output=200)
        spec = spec_for(os.path.join(self.directory, "models", "small", "config.json"), 1, KNOWN)
        for stage in main.predict_inference_perf(main.read_inference_perf(folder), spec):
            engine = stage["engine"]  # each decoding sequence is a token of its step, 400 or more of context
            self.assertGreaterEqual(engine["mean_batch_tokens"], engine["mean_batch_seqs"])
            self.assertGreater(engine["mean_context_tokens"], 400 * engine["mean_batch_seqs"])

    def rewrite_config(self, *replacements):
        path = os.path.join(self.folder, "results", "config.yaml")
        with open(path) as handle:
            text = handle.read()
        for old, new in replacements:
            self.assertIn(old, text)
            text = text.replace(old, new)
        with open(path, "w") as handle:
            handle.write(text)

    def test_newer_configs_name_the_groups_by_their_aliases_and_write_lengths_as_distributions(self):
        self.rewrite_config(("num_groups: 4", "num_unique_system_prompts: 4"),
                            ("num_prompts_per_group: 5", "num_users_per_system_prompt: 5"),
                            ("question_len: 300", "question_len:\n      min: 280\n      max: 320\n      mean: 300\n"
                                                  "      variance: 100\n      type: uniform"),
                            ("output_len: 40", "output_len: 40\n    output_distribution:\n      min: 40\n"
                                               "      max: 40\n      mean: 40\n      std_dev: 0\n      type: fixed"))
        lengths = main.read_inference_perf(self.folder)["lengths"]
        self.assertEqual((lengths["groups"], lengths["prompts_per_group"]), (4, 5))
        self.assertEqual((lengths["question"], lengths["output"]),
                         ((280, 320, 300, 10.0, "uniform"), (40, 40, 40, 0, "fixed")))
        rng = random.Random(3)
        draws = [main._clipped_normal(rng, *lengths["question"]) for _ in range(200)]
        self.assertEqual((min(draws) >= 280, max(draws) <= 320, len(set(draws)) > 20), (True, True, True))

    def test_a_length_distribution_of_an_unknown_shape_exits_2_naming_it(self):
        self.rewrite_config(("question_len: 300", "question_len:\n      mean: 300\n      type: bimodal"))
        self.assert_usage_error(("compare", self.folder), "data.shared_prefix.question_len.type must be one of normal",
                                "got 'bimodal'")

    def test_a_length_past_ten_million_tokens_exits_2_naming_it(self):
        self.rewrite_config(("question_len: 300", "question_len: 1e9"))
        self.assert_usage_error(("compare", self.folder), "data.shared_prefix.question_len must be a number >= 0 "
                                "and at most 10,000,000, got 1000000000.0")

    def test_a_number_too_large_for_a_float_exits_2_naming_it(self):
        self.rewrite_config(("  - rate: 2\n", "  - rate: " + "9" * 400 + "\n"))
        self.assert_usage_error(("compare", self.folder), "load.stages[0].rate must be a positive number, got 999")

    def test_a_dataset_without_measured_lengths_exits_2_naming_it(self):
        self.rewrite_config(("type: shared_prefix", "type: shareGPT"))
        self.assert_usage_error(("compare", self.folder),
                                "data.type 'shareGPT' is a dataset servesim rebuilds from the lengths the run measured",
                                "no prompt_tokens (or prompt_len) and output_tokens (or output_len)")

    def test_a_dataset_is_rebuilt_from_the_prompt_and_output_lengths_the_run_measured(self):
        self.rewrite_config(("type: shared_prefix", "type: shareGPT"))
        summary = os.path.join(self.folder, "results", "summary_lifecycle_metrics.json")
        with open(summary) as handle:
            data = json.load(handle)
        data["successes"]["output_len"] = {"min": 10, "p25": 50, "median": 120, "p75": 200, "max": 400, "mean": 130}
        with open(summary, "w") as handle:
            json.dump(data, handle)
        run = main.read_inference_perf(self.folder)
        self.assertEqual((run["kind"], run["lengths"]["output"][2]), ("shareGPT", 130))
        requests = main.inference_perf_stages(run)[0]
        outputs, prompts = [r.max_tokens for r in requests], [r.prompt_tokens for r in requests]
        self.assertEqual((min(outputs) >= 10, max(outputs) <= 400, min(prompts) >= 420, max(prompts) <= 440),
                         (True, True, True, True))
        self.assertEqual({r.prefix_tokens for r in requests}, {0})  # no shared prefix is made up

    def rewrite_json(self, name, change):
        path = os.path.join(self.folder, "results", name)
        with open(path) as handle:
            data = json.load(handle)
        change(data)
        with open(path, "w") as handle:
            json.dump(data, handle)

    def newer_summary(self, data):
        """The summary as newer inference-perf writes it: the server's counts as prompt_tokens
        and output_tokens (totals beside the distribution), the client's output_len apart."""
        del data["successes"]["prompt_len"]
        data["successes"].update(
            prompt_tokens={"total": 9000, "cached": 4000, "uncached": 5000, "min": 500, "median": 600, "max": 700,
                           "mean": 600},
            output_tokens={"total": 3000, "min": 20, "median": 30, "max": 40, "mean": 30},
            output_len={"min": 15, "median": 24, "max": 33, "mean": 24})

    def test_newer_summaries_give_a_dataset_the_servers_prompt_and_output_counts(self):
        self.rewrite_config(("type: shared_prefix", "type: shareGPT"))
        self.rewrite_json("summary_lifecycle_metrics.json", self.newer_summary)
        run = main.read_inference_perf(self.folder)
        self.assertEqual((run["prompt_mean"], run["lengths"]["output"], run["outputs_measured"]),
                         (600, (20, 40, 30, 0.0, "fixed"), True))
        requests = main.inference_perf_stages(run)[0]
        self.assertEqual((min(r.prompt_tokens for r in requests) >= 500, max(r.prompt_tokens for r in requests) <= 700,
                          min(r.max_tokens for r in requests) >= 20, max(r.max_tokens for r in requests) <= 40),
                         (True, True, True, True))

    def test_without_ignore_eos_a_generators_outputs_are_the_lengths_the_server_counted(self):
        self.rewrite_json("summary_lifecycle_metrics.json", self.newer_summary)
        self.assertEqual(main.read_inference_perf(self.folder)["outputs_measured"], False)  # ignore_eos: exactly 40
        self.rewrite_config(("ignore_eos: true", "ignore_eos: false"))
        run = main.read_inference_perf(self.folder)
        self.assertEqual(run["outputs_measured"], True)
        self.assertEqual(max(r.max_tokens for r in main.inference_perf_stages(run)[0]) <= 40, True)

    def test_the_time_per_output_token_divides_by_the_servers_count_where_the_stage_gives_it(self):
        stage = {"successes": {"count": 10, "latency": {"time_to_first_token": {"mean": 0.1},
                                                        "request_latency": {"mean": 2.55}},
                               "throughput": {"requests_per_sec": 2.0}}}
        older = main._stage_figures(main.JsonObject(stage, "stage"), 40)
        self.assertEqual((round(older["tpot mean"], 3), older["out tok/s"]), (62.821, 80.0))  # 2450 ms / 39
        stage["successes"]["output_tokens"] = {"total": 500, "min": 40, "median": 50, "max": 60, "mean": 50}
        newer = main._stage_figures(main.JsonObject(stage, "stage"), 40)
        self.assertEqual((newer["tpot mean"], newer["out tok/s"]), (50.0, 100.0))  # 2450 ms / 49

    def test_a_run_that_did_not_stream_is_compared_and_fitted_on_its_request_latency(self):
        stage = {"successes": {"count": 10, "latency": {"time_to_first_token": None, "request_latency": {"mean": 2.55}},
                               "throughput": {"requests_per_sec": 2.0}}}
        figures = main._stage_figures(main.JsonObject(stage, "stage"), 40)
        self.assertEqual((figures["ttft mean"], figures["ttft p50"], figures["tpot mean"], figures["e2e mean"]),
                         (None, None, None, 2550.0))
        streamed = dict(figures, **{"ttft mean": 100.0, "tpot mean": 62.8})
        self.assertEqual(main.inference_perf_points({"measured": [figures, streamed]}),
                         [("stage 0 e2e mean", 2550.0), ("stage 1 tpot mean", 62.8), ("stage 1 ttft mean", 100.0)])

    def test_a_missing_stage_file_exits_2_naming_it(self):
        os.remove(os.path.join(self.folder, "results", "stage_1_lifecycle_metrics.json"))
        self.assert_usage_error(("compare", self.folder), "stage_1_lifecycle_metrics.json: missing")

    def test_a_folder_without_the_first_stage_file_is_not_taken_for_a_report(self):
        os.remove(os.path.join(self.folder, "results", "stage_0_lifecycle_metrics.json"))
        for command in ("compare", "calibrate"):
            self.assert_usage_error((command, self.folder), f"{self.folder}: a folder, but not an inference-perf run "
                                    "(no config.yaml with stage_0_lifecycle_metrics.json in it or in its results/)")

    def test_a_file_of_a_run_given_for_the_run_asks_for_its_folder(self):
        results = os.path.join(self.folder, "results")
        self.assert_usage_error(("compare", os.path.join(results, "config.yaml")),
                                f"config.yaml: one file of an inference-perf run; give the run's folder, {results}")

    def test_a_config_in_flow_style_wrapped_over_lines_reads_as_its_block_style(self):
        path = os.path.join(self.folder, "results", "config.yaml")
        with open(path) as handle:
            block = handle.read()
        flow = block.replace("  shared_prefix:\n    num_groups: 4\n    num_prompts_per_group: 5\n"
                             "    system_prompt_len: 100\n    question_len: 300\n    output_len: 40\n",
                             "  shared_prefix: {num_groups: 4, num_prompts_per_group: 5, 'system_prompt_len': 100,\n"
                             "    question_len: 300, output_len: 40}\n")
        flow = flow.replace("  stages:\n  - rate: 2\n    duration: 20\n  - rate: 6\n    duration: 20\n",
                            "  stages: [{rate: 2, duration: 20}, {rate: 6,\n      duration: 20}]  # two stages\n")
        self.assertEqual(flow.count("{"), 3)
        with open(path, "w") as handle:
            handle.write(flow)
        self.assertEqual(main.read_inference_perf(self.folder), self.run)
        self.assertEqual(main._yaml_scalar('{x-a: "b, c", url: http://h:80/v1, n: [1, 2,]}', "f"),
                         {"x-a": "b, c", "url": "http://h:80/v1", "n": [1, 2]})
        items = os.path.join(self.directory, "items.yaml")
        with open(items, "w") as handle:
            handle.write("a:\n- b: [1,\n    2]\n  note: a [plain\n- c\n")
        self.assertEqual(main.read_yaml_file(items, "items.yaml"), {"a": [{"b": [1, 2], "note": "a [plain"}, "c"]})

    def test_an_unclosed_flow_collection_exits_2_naming_its_line(self):
        path = os.path.join(self.folder, "results", "config.yaml")
        with open(path, "a") as handle:
            handle.write("metrics: {type: prometheus\n")
        with open(path) as handle:
            line = handle.read().count("\n")
        self.assert_usage_error(("compare", self.folder), f"config.yaml:{line}: an unclosed {{ in")

    def test_yaml_servesim_cannot_read_exits_2_naming_the_line(self):
        path = os.path.join(self.folder, "results", "config.yaml")
        with open(path, "a") as handle:
            handle.write("anchors: &default\n")
        self.assert_usage_error(("compare", self.folder), "config.yaml:", "&default")


class CompareTest(ScratchTest):

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_a_run_compared_on_the_hardware_that_made_it_has_no_error(self):
        folder = write_run(self.directory, "small-run", "small", SMALL, 1, [(2, 20), (6, 20)])
        hardware = self.write("known.json", {**dataclasses.asdict(KNOWN)})
        report = run_json("compare", folder, "--hardware-file", hardware, "--model-file",
                          os.path.join(self.directory, "models", "small", "config.json"), "--max-num-seqs", "128",
                          "--max-num-batched-tokens", "2048")
        rows = report["rows"]
        self.assertEqual([(row["run"], row["stage"], row["rate"]) for row in rows], [("small-run", 0, 2), ("small-run", 1, 6)])
        for row in rows:
            for label in ("ttft mean", "ttft p50", "e2e mean", "tpot mean", "out tok/s"):
                self.assertAlmostEqual(row["error"][label], 0.0, places=6, msg=label)
            self.assertEqual(set(row["measured"]) - {"batch"}, set(main.INFERENCE_PERF_LABELS))
            self.assertEqual(row["error"]["failed share"], 0.0)
            self.assertEqual(set(row["sensitivity"]), {"ttft mean", "e2e mean", "failed share", "note"})
        code, out, err = run_cli("compare", folder, "--hardware-file", hardware, "--model-file",
                                 os.path.join(self.directory, "models", "small", "config.json"), "--max-num-seqs",
                                 "128", "--max-num-batched-tokens", "2048", "--no-sensitivity")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("mean |error| over 2 stages: ttft mean 0.0%, ttft p50 0.0%, e2e mean 0.0%, tpot mean 0.0%, "
                      "out tok/s 0.0%; failed share within 0.0 points", out)

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_the_servers_cached_prompt_tokens_are_compared_with_the_simulated_hits_of_the_same_successes(self):
        folder = write_run(self.directory, "small-run", "small", SMALL, 1, [(2, 20), (6, 20)])
        model_file = os.path.join(self.directory, "models", "small", "config.json")
        shares = [stage["prefix_hit_rate"] for stage in
                  main.predict_inference_perf(main.read_inference_perf(folder), spec_for(model_file, 1, KNOWN))]
        self.assertEqual((0 < shares[0] < shares[1] < 1), True)  # 20 prompts cycled: repeats hit, more once warm
        for index, share in enumerate(shares):  # newer inference-perf's usage totals, as the server counted them
            path = os.path.join(folder, "results", f"stage_{index}_lifecycle_metrics.json")
            with open(path) as handle:
                stage = json.load(handle)
            stage["successes"]["prompt_tokens"] = {"total": 10_000, "cached": round(10_000 * share)}
            with open(path, "w") as handle:
                json.dump(stage, handle)
        flags = ("--hardware-file", self.write("known.json", dataclasses.asdict(KNOWN)), "--model-file", model_file,
                 "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--no-sensitivity")
        rows = run_json("compare", folder, *flags)["rows"]
        self.assertEqual([row["prefix_hit_rate"] for row in rows],
                         [{"measured": round(10_000 * share) / 10_000, "predicted": share} for share in shares])
        code, out, err = run_cli("compare", folder, *flags)
        self.assertIn(f"prefix cache hits of the successes' prompt tokens, server / simulated: small-run stage 0 "
                      f"{shares[0]:.1%} / {shares[0]:.1%}, small-run stage 1 {shares[1]:.1%} / {shares[1]:.1%}\n", out)

    def test_the_servers_batch_preemptions_and_prefix_hits_are_compared_where_inference_perf_scraped_them(self):
        folder = write_run(self.directory, "small-run", "small", SMALL, 1, [(2, 20), (6, 20)])
        model_file = os.path.join(self.directory, "models", "small", "config.json")
        stages = main.predict_inference_perf(main.read_inference_perf(folder), spec_for(model_file, 1, KNOWN))
        batches = [stage["engine"]["mean_batch_seqs"] for stage in stages]
        hits = [stage["engine"]["stage_prefix_hit_rate"] for stage in stages]
        before = {"prefix_query_tokens": 100, "prefix_hit_tokens": 20, "num_preemptions": 1}
        after = {"prefix_query_tokens": 300, "prefix_hit_tokens": 120, "num_preemptions": 4}
        self.assertEqual(main._stage_counts(before, after), {"stage_preemptions": 3, "stage_prefix_hit_rate": 0.5})
        self.assertEqual(0 < hits[0] < hits[1] < 1, True)  # the second stage finds the first's prompts cached
        for index, running in enumerate((batches[0], 0.0)):  # the second scrape never reached the server's gauges
            with open(os.path.join(folder, "results", f"stage_{index}_prometheus_metrics.json"), "w") as handle:
                json.dump({"benchmark_time_seconds": 0.0, "load_summary": {}, "failures": {},
                           "successes": {"num_requests_running": {"mean": running},
                                         "num_preemptions_total": {"mean": 3.0},
                                         "prefix_cache_hit_percent": {"mean": 40.0}}}, handle)
        flags = ("--hardware-file", self.write("known.json", dataclasses.asdict(KNOWN)), "--model-file", model_file,
                 "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--no-sensitivity")
        rows = run_json("compare", folder, *flags)["rows"]
        self.assertEqual([(row["measured"]["batch"], row.get("preemptions")) for row in rows],
                         [(batches[0], {"measured": 3.0, "predicted": 0}), (None, None)])
        self.assertEqual((rows[0]["predicted"]["batch"], rows[0]["server_prefix_hit_rate"]),
                         (batches[0], {"measured": 0.4, "predicted": hits[0]}))
        out = run_cli("compare", folder, *flags)[1]
        self.assertIn(f"mean running batch (the server's /metrics), server / simulated: small-run stage 0 "
                      f"{batches[0]:.1f} / {batches[0]:.1f}\npreemptions, server / simulated: small-run stage 0 3 / 0\n"
                      f"prefix cache hits of every admission (the server's /metrics), server / simulated: small-run "
                      f"stage 0 40.0% / {hits[0]:.1%}\n", out)

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_without_a_model_flag_the_report_says_which_preset_stood_in_for_the_runs_model(self):
        folder = write_run(self.directory, "small-run", "small", SMALL, 1, [(2, 5)], output=20)
        code, out, err = run_cli("compare", folder, "--no-sensitivity")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines()[2], "org/small served the run; with no --model-dir, --model-file or --model "
                                              "the preset llama-3.1-8b stands in for it")
        named = run_json("compare", folder, "--model-dir", os.path.join(self.directory, "models"), "--no-sensitivity")
        self.assertEqual((named["model"], named["notes"]), ("small", []))

    def test_runs_of_several_models_each_report_the_capacity_of_their_own_engine(self):
        folders = [write_run(self.directory, name, model, config, tp, [(2, 5)], output=20)
                   for name, model, config, tp in (("one", "mha", MHA, 1), ("two", "deep", DEEP, 2))]
        hardware = self.write("known.json", dataclasses.asdict(KNOWN))
        report = run_json("compare", *folders, "--model-dir", os.path.join(self.directory, "models"),
                          "--hardware-file", hardware, "--no-sensitivity")
        self.assertEqual([(row["run"], row["model"], row["capacity"]["model"], row["capacity"]["num_devices"])
                          for row in report["rows"]], [("one", "mha", "mha", 1), ("two", "deep", "deep", 2)])
        self.assertEqual((report["model"], report["capacity"]), (None, None))  # not the flags' default model
        alone = run_json("compare", folders[1], "--model-dir", os.path.join(self.directory, "models"),
                         "--hardware-file", hardware, "--no-sensitivity")
        self.assertEqual((alone["model"], alone["capacity"]), ("deep", alone["rows"][0]["capacity"]))

    def test_runs_find_their_models_in_whichever_model_dir_holds_them(self):
        folders = [write_run(self.directory, name, model, config, 1, [(2, 5)], output=20)
                   for name, model, config in (("one", "mha", MHA), ("two", "small", SMALL))]
        elsewhere = os.path.join(self.directory, "elsewhere")
        os.makedirs(elsewhere)
        os.rename(os.path.join(self.directory, "models", "small"), os.path.join(elsewhere, "small"))
        hardware = self.write("known.json", dataclasses.asdict(KNOWN))
        models = os.path.join(self.directory, "models")
        report = run_json("compare", *folders, "--model-dir", models, "--model-dir", elsewhere,
                          "--hardware-file", hardware, "--no-sensitivity")
        self.assertEqual([(row["run"], row["model"]) for row in report["rows"]], [("one", "mha"), ("two", "small")])
        code, _, err = run_cli("compare", *folders, "--model-dir", models, "--hardware-file", hardware)
        self.assertEqual(code, 2)
        self.assertIn(f"--model-dir {models}: no small/config.json there for {folders[1]}'s model 'org/small'", err)

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_a_published_stage_of_means_and_tails_alone_compares_those_and_shows_the_rest_unknown(self):
        folder = write_run(self.directory, "published", "small", SMALL, 1, [(2, 10)])
        where = os.path.join(folder, "results", "stage_0_lifecycle_metrics.json")
        with open(where) as handle:
            stage = json.load(handle)
        for spread in stage["successes"]["latency"].values():
            del spread["median"]
        del stage["successes"]["throughput"], stage["failures"]
        with open(where, "w") as handle:
            json.dump(stage, handle)
        flags = ["--hardware-file", self.write("known.json", dataclasses.asdict(KNOWN)),
                 "--model-file", os.path.join(self.directory, "models", "small", "config.json"), "--no-sensitivity"]
        report = run_json("compare", folder, *flags)
        (row,) = report["rows"]
        unknown = ("ttft p50", "e2e p50", "out tok/s", "failed share")
        self.assertEqual([row["measured"][label] for label in unknown], [None] * 4)
        self.assertEqual([row["error"][label] for label in unknown], [None] * 4)
        for label in ("ttft mean", "ttft p90", "e2e p99", "tpot mean"):
            self.assertAlmostEqual(row["error"][label], 0.0, places=6, msg=label)
        code, out, _ = run_cli("compare", folder, *flags)
        self.assertEqual(code, 0)
        self.assertEqual(out.splitlines()[3].split()[-2:], ["-", "0.0%"])  # failed: unknown, predicted none
        self.assertNotIn("failed share within", out)

    def test_a_concurrent_stage_is_a_closed_loop_of_its_clients(self):
        # the requests are queued within the stage's first second, so the clients are the limit
        folder = write_run(self.directory, "clients", "small", SMALL, 1, [(200, 4), (400, 8)], load_type="concurrent")
        run = main.read_inference_perf(folder)
        self.assertEqual((run["stages"], run["concurrency"]), ([(200.0, 1.0), (400.0, 1.0)], [4, 8]))
        hardware = self.write("known.json", dataclasses.asdict(KNOWN))
        report = run_json("compare", folder, "--hardware-file", hardware, "--model-file",
                          os.path.join(self.directory, "models", "small", "config.json"), "--no-sensitivity")
        self.assertEqual([(row["concurrency"], row["rate"], row["num_requests"]) for row in report["rows"]],
                         [(4, None, 200), (8, None, 400)])
        for row, clients in zip(report["rows"], (4, 8)):
            self.assertLessEqual(row["predicted"]["batch"], clients)
            self.assertGreater(row["predicted"]["batch"], clients * 0.8)
            self.assertAlmostEqual(row["error"]["e2e mean"], 0.0, places=6)
        code, out, _ = run_cli("compare", folder, "--hardware-file", hardware, "--model-file",
                               os.path.join(self.directory, "models", "small", "config.json"), "--no-sensitivity")
        self.assertEqual(code, 0)
        self.assertIn("c=8", out)

    def test_an_overloaded_run_is_predicted_overloaded_with_its_failed_share(self):
        folder = write_run(self.directory, "busy", "mha", MHA, 1, [(2, 10), (300, 10)], timeout="2.0", output=100)
        run = main.read_inference_perf(folder)
        self.assertEqual((run["timeout_s"], run["timeout_from"]), (2.0, "load.request_timeout"))
        spec = spec_for(os.path.join(self.directory, "models", "mha", "config.json"), 1, KNOWN)
        rows = main.predict_inference_perf_rows(run, spec, None, False)
        self.assertEqual(rows[0]["predicted"]["failed share"], 0.0)
        self.assertGreater(rows[1]["predicted"]["failed share"], 0.3)
        self.assertEqual(rows[1]["error"]["failed share"], 0.0)

    def test_an_overloaded_stage_spreads_its_successes_tokens_over_the_time_to_the_last_give_up(self):
        # as inference-perf does: from the stage's first send to the end of its last request, failed ones included
        folder = write_run(self.directory, "busy", "mha", MHA, 1, [(300, 10)], timeout="2.0", output=100)
        run = main.read_inference_perf(folder)
        spec = spec_for(os.path.join(self.directory, "models", "mha", "config.json"), 1, KNOWN)
        (stage,) = main.predict_inference_perf(run, spec)
        summary, sends = stage["summary"], [request.arrival_s for request in main.inference_perf_stages(run)[0]]
        self.assertGreater(summary["num_failed"], summary["num_requests"] // 2)
        self.assertAlmostEqual(summary["output_tokens"] / summary["output_tok_per_s"], max(sends) + 2.0 - min(sends),
                               places=6)

    def test_a_clients_end_is_its_last_token_its_give_up_or_its_refusal(self):
        done, lost, refused = main.Request(0, 10, 2), main.Request(1, 10, 2), main.Request(2, 10, 2)
        for request in (done, lost, refused):
            request.sent_s = 5.0
        done.token_times = [5.5, 6.0]
        lost.error_kind, lost.error = "timeout", "gave up"
        refused.error_kind, refused.error = "max-model-len", "too long"
        self.assertEqual([main.client_end_s(request, 3.0) for request in (done, lost, refused)], [6.0, 8.0, 5.0])


class PublishedRunTest(unittest.TestCase):
    """The published vLLM runs in fixtures/gpu, predicted by the presets fitted to them."""

    def test_the_a100_preset_predicts_a_run_it_was_fitted_to_within_15_percent(self):
        gpu = os.path.join(FIXTURES_DIR, "gpu")
        report = run_json("compare", os.path.join(gpu, "a100", "qwen3-14b-tp1-general-lite"), "--hardware",
                          "a100-sxm-80gb", "--model-dir", gpu, "--max-num-seqs", "128", "--max-num-batched-tokens",
                          "2048", "--max-model-len", "4096", "--no-sensitivity")
        self.assertEqual([(row["rate"], row["num_requests"]) for row in report["rows"]], [(2.5, 1500), (6.0, 3600)])
        for row in report["rows"]:
            for label in ("ttft mean", "e2e mean", "tpot mean"):
                self.assertLess(abs(row["error"][label]), 0.15, msg=(row["stage"], label))
            self.assertIsNone(row["measured"]["failed share"])  # not published


class FitTest(ScratchTest):

    def fit(self, runs, base=BASE):
        """calibrate --json on inference-perf runs written from KNOWN, from base (its replays
        on two processes: the fit is the same for any --jobs, and the suite is quicker).
        NOTE: stages of 20 and 80 requests: twice that fits no closer, at twice the time;
        decode attention (below) needs the longer runs to show."""
        folders = [write_run(self.directory, name, model, config, tp, [(2, 10), (40, 2)], output=100)
                   for name, model, config, tp in runs]
        code, out, err = run_cli("calibrate", *folders, "--model-dir", os.path.join(self.directory, "models"),
                                 "--hardware-file", self.write("base.json", dataclasses.asdict(base)), "--jobs", "2",
                                 "--json")
        self.assertEqual((code, err), (0, ""))
        return json.loads(out)

    def test_calibrate_recovers_the_memory_rate_and_request_path_that_made_a_run(self):
        report = self.fit([("one", "mha", MHA, 1)], dataclasses.replace(BASE, layer_overhead_us=KNOWN.layer_overhead_us))
        self.assertEqual(report["fitted"], ["memory", "compute", "step_overhead_ms", "request_overhead_ms"])
        fitted = report["hardware"]
        self.assertAlmostEqual(fitted["mbu"], KNOWN.mbu, delta=0.04)
        self.assertAlmostEqual(fitted["request_overhead_ms"], KNOWN.request_overhead_ms, delta=0.2)
        self.assertLess(max(abs(r["error"]) for r in report["residuals"]), 0.01)

    def test_runs_of_several_depths_and_tensor_parallelism_fit_every_term_to_their_figures(self):
        report = self.fit([("one", "mha", MHA, 1), ("two", "deep", DEEP, 2)])
        self.assertEqual(report["fitted"], ["memory", "compute", "step_overhead_ms", "layer_overhead_us",
                                            "allreduce_latency_us", "link", "request_overhead_ms"])
        self.assertEqual([r["figure"] for r in report["residuals"]][:4],
                         ["stage 0 tpot mean", "stage 0 ttft mean", "stage 1 tpot mean", "stage 1 ttft mean"])
        self.assertLess(max(abs(r["error"]) for r in report["residuals"]), 0.04)
        self.assertAlmostEqual(report["hardware"]["request_overhead_ms"], KNOWN.request_overhead_ms, delta=0.4)

    def test_a_held_figure_keeps_the_base_value_while_the_rest_fit_around_it(self):
        folder = write_run(self.directory, "two", "deep", DEEP, 2, [(2, 5), (40, 2)], output=60)
        base = dataclasses.replace(BASE, allreduce_latency_us=KNOWN.allreduce_latency_us)
        code, out, err = run_cli("calibrate", folder, "--model-dir", os.path.join(self.directory, "models"),
                                 "--hardware-file", self.write("base.json", dataclasses.asdict(base)),
                                 "--hold", "allreduce_latency_us", "--jobs", "2", "--json")
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assertEqual(report["fitted"], ["memory", "compute", "step_overhead_ms", "link", "request_overhead_ms"])
        self.assertEqual((report["held"], report["hardware"]["allreduce_latency_us"]),
                         (["allreduce_latency_us"], KNOWN.allreduce_latency_us))
        self.assertLess(max(abs(r["error"]) for r in report["residuals"]), 0.03)

    def test_calibrate_moves_decode_attention_from_its_prior_to_the_rate_that_made_the_runs(self):
        # an MHA model and one of 8 query heads to each KV head, whose attention costs 4x as much per byte of KV
        gqa = dict(MHA, num_key_value_heads=4)
        made_by = dataclasses.replace(KNOWN, attention_efficiency=0.02)
        folders = [write_run(self.directory, name, model, config, 1, [(2, 20), (12, 10)], hardware=made_by,
                             output=300) for name, model, config in (("one", "mha", MHA), ("two", "gqa", gqa))]
        prior = dataclasses.replace(KNOWN, attention_efficiency=0.05)
        code, out, err = run_cli("calibrate", *folders, "--model-dir", os.path.join(self.directory, "models"),
                                 "--hardware-file", self.write("prior.json", dataclasses.asdict(prior)), "--jobs",
                                 "2", "--json")
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assertEqual(report["fitted"],
                         ["memory", "compute", "attention", "step_overhead_ms", "request_overhead_ms"])
        self.assertAlmostEqual(report["hardware"]["attention_efficiency"], 0.02, delta=0.005)
        self.assertLess(max(abs(r["error"]) for r in report["residuals"]), 0.03)

    def test_one_model_at_short_and_long_contexts_tells_decode_attention_from_the_kv_read(self):
        gqa = dict(MHA, num_key_value_heads=4)
        made_by = dataclasses.replace(KNOWN, attention_efficiency=0.02)
        folders = [write_run(self.directory, name, "gqa", gqa, 1, [(2, 20), (8, 10)], hardware=made_by, output=output)
                   for name, output in (("short", 40), ("long", 1000))]
        code, out, err = run_cli("calibrate", *folders, "--model-dir", os.path.join(self.directory, "models"),
                                 "--hardware-file", self.write("prior.json", dataclasses.asdict(
                                     dataclasses.replace(KNOWN, attention_efficiency=0.05))), "--jobs", "2", "--json")
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assertAlmostEqual(report["hardware"]["attention_efficiency"], 0.02, delta=0.006)
        self.assertLess(max(abs(r["error"]) for r in report["residuals"]), 0.02)


if __name__ == "__main__":
    unittest.main()
