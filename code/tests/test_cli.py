"""Bad input exits 2 with one line naming the flag (or file:line) and what was expected."""

import unittest

from support import ScratchTest, main, run_json


class BadInputTest(ScratchTest):

    def test_concurrency_zero_exits_2(self):
        self.assert_usage_error(("simulate", "--concurrency", "0"),
                                "argument --concurrency: expected a positive integer, got '0'")

    def test_more_than_one_partial_prefill_exits_2_as_vllms_v1_engine_refuses_it(self):
        self.assert_usage_error(("simulate", "--rate", "1", "--requests", "4", "--max-num-partial-prefills", "2"),
                                "--max-num-partial-prefills 2: vLLM's V1 engine")

    def test_a_vllm_release_before_v1_or_not_a_release_exits_2(self):
        self.assert_usage_error(("simulate", "--rate", "1", "--vllm-version", "0.7.3"), "--vllm-version",
                                "V0 and its multi-step scheduling")
        self.assert_usage_error(("simulate", "--rate", "1", "--vllm-version", "latest"), "--vllm-version",
                                "expected a vLLM release such as 0.15.1")

    def test_non_numeric_flag_exits_2(self):
        self.assert_usage_error(("simulate", "--rate", "fast"), "--rate", "expected a positive number")
        self.assert_usage_error(("sweep", "--concurrency", "1,8", "--max-num-seqs", "many"), "--max-num-seqs")

    def test_negative_flags_exit_2(self):
        self.assert_usage_error(("simulate", "--rate", "-2"), "--rate")
        self.assert_usage_error(("capacity", "--block-size", "-16"), "--block-size")
        self.assert_usage_error(("capacity", "--gpu-memory-utilization", "1.5"),
                                "--gpu-memory-utilization", "(0, 1]")

    def test_a_range_with_min_above_max_exits_2(self):
        self.assert_usage_error(("simulate", "--concurrency", "1", "--prompt-tokens", "1024-256"),
                                "--prompt-tokens", "0 < LO <= HI", "'1024-256'")

    def test_a_bad_concurrency_list_exits_2(self):
        self.assert_usage_error(("sweep", "--concurrency", "1,0,8"), "--concurrency", "positive integers")
        self.assert_usage_error(("sweep", "--concurrency", "1,,8"), "--concurrency")

    def test_simulate_without_an_arrival_mode_exits_2(self):
        self.assert_usage_error(("simulate",), "--trace", "--rate", "--concurrency")

    def test_two_arrival_modes_exit_2(self):
        self.assert_usage_error(("simulate", "--rate", "2", "--concurrency", "4"), "not allowed with")

    def test_unknown_flag_and_command_exit_2(self):
        self.assert_usage_error(("simulate", "--rate", "2", "--concurency", "4"), "unrecognized arguments: --concurency 4")
        self.assert_usage_error(("simulat",), "simulat")

    def test_a_trace_line_that_is_not_json_names_file_and_line(self):
        path = self.write("t.jsonl",
                          '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n{oops\n')
        self.assert_usage_error(("simulate", "--trace", path), f"--trace {path}:2: not JSON")

    def test_a_trace_line_missing_a_field_names_file_line_and_field(self):
        path = self.write("t.jsonl", '\n{"arrival_s": 0, "prompt_tokens": 5}\n')
        self.assert_usage_error(("simulate", "--trace", path), f"--trace {path}:2: missing output_tokens")

    def test_a_trace_field_of_the_wrong_type_is_named(self):
        path = self.write("t.jsonl",
                          '{"arrival_s": 0, "prompt_tokens": "5", "output_tokens": 2}\n')
        self.assert_usage_error(("simulate", "--trace", path),
                                f"--trace {path}:1: prompt_tokens must be an integer >= 1, got '5'")
        path = self.write("u.jsonl",
                          '{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 2}\n')
        self.assert_usage_error(("simulate", "--trace", path), "arrival_s must be a number >= 0")

    def test_a_missing_trace_file_exits_2(self):
        self.assert_usage_error(("simulate", "--trace", "/nonexistent/t.jsonl"),
                                "--trace /nonexistent/t.jsonl: cannot read it")

    def test_an_empty_trace_exits_2(self):
        path = self.write("t.jsonl", "\n")
        self.assert_usage_error(("simulate", "--trace", path), "no requests")


class FlagSpellingTest(ScratchTest):

    def test_vllm_and_llama_cpp_spellings_set_the_same_knobs(self):
        def parsed(*flags):
            return vars(main.build_parser().parse_args(["simulate", "--concurrency", "1", *flags]))
        for flags, knob, value in ((("--enable-prefix-caching",), "prefix_caching", True),
                                   (("--no-enable-prefix-caching",), "prefix_caching", False),
                                   (("--no-enable-chunked-prefill",), "chunked_prefill", False),
                                   (("--ctx-size", "4096"), "kv_tokens", 4096),
                                   (("--num-gpu-blocks-override", "256"), "num_gpu_blocks_override", 256),
                                   (("--parallel", "4"), "max_num_seqs", 4),
                                   (("--batch-size", "512"), "max_num_batched_tokens", 512)):
            self.assertEqual(parsed(*flags)[knob], value, flags)


if __name__ == "__main__":
    unittest.main()


class VllmReleaseDefaultsTest(unittest.TestCase):
    """--vllm-version: vllm serve's defaults of a release, by GPU memory (vllm/engine/arg_utils.py)."""

    def defaults(self, version, hardware):
        found = main.vllm_release_defaults(version, main.HARDWARE[hardware])
        return found["max_num_seqs"], found["max_num_batched_tokens"], found["async_scheduling"]

    def test_each_release_sizes_the_step_by_the_gpu(self):
        self.assertEqual(self.defaults((0, 8), "l40s-48gb"), (1024, 2048, False))   # 0.8.0-0.8.3: seqs on any GPU
        self.assertEqual(self.defaults((0, 8), "h100-sxm-80gb"), (1024, 8192, False))
        self.assertEqual(self.defaults((0, 10), "a100-sxm-80gb"), (256, 2048, False))  # 0.9 on: not the A100
        self.assertEqual(self.defaults((0, 15), "h100-sxm-80gb"), (1024, 8192, True))  # async from 0.14
        self.assertEqual(self.defaults((0, 15), "b200-180gb"), (1024, 8192, True))
        self.assertEqual(self.defaults((0, 28), "b200-180gb"), (1024, 16384, True))   # 160 GiB and more, 0.28 on

    def test_a_release_turns_prefix_caching_on_and_a_flag_still_wins(self):
        settings = run_json("simulate", "--rate", "2", "--requests", "8", "--vllm-version", "0.15.1",
                            "--no-sensitivity")["settings"]["scheduler"]
        self.assertEqual((settings["max_num_seqs"], settings["prefix_caching"]), (1024, True))
        settings = run_json("simulate", "--rate", "2", "--requests", "8", "--vllm-version", "0.15.1", "--max-num-seqs",
                            "64", "--no-prefix-caching", "--no-sensitivity")["settings"]["scheduler"]
        self.assertEqual((settings["max_num_seqs"], settings["prefix_caching"]), (64, False))
