"""profile, --step-profile and --scheduler llamacpp: step costs measured on the server itself."""

import dataclasses
import json
import math
import os
import random
import signal
import time
import unittest
from unittest import mock

from fake_engine import FakeEngine
from fake_server import FakeServer
from virtual_time import FRONT_END_S, VirtualTime
from support import FIXTURES_DIR, ScratchTest, main, new_scheduler, run_cli, run_json, start_interruptible
from test_fast_engine import differences

DECODE_MS = {1: 9.0, 2: 19.0, 3: 31.0, 4: 27.0}  # not monotone: CPU matrix kernels tile
QUICK_DECODE_MS = {1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}  # for tests that send many requests and read no step
PREFILL_MS_PER_TOKEN = 0.02                        # 2 ms per 100 tokens
OVERLAP_MS = 4.0  # what a prefill beside decodes saves: half the 400-token prompt's 8 ms
EXACT = 1e-6  # ms: in virtual time a profile reads the fake's steps to the float
GEMMA = ("--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m")


def virtual_profile(engine, *argv, send_gap_s=0.0):
    """profile --json --quiet of engine in virtual time (see virtual_time.py); it must exit 0
    and print nothing on stderr."""
    with VirtualTime(engine, send_gap_s):
        code, out, err = run_cli("profile", "--url", engine.url, *argv, "--json", "--quiet")
    if (code, err) != (0, ""):
        raise AssertionError(f"exit {code}: {err}")
    return json.loads(out)


class ProfileOfAKnownServerTest(ScratchTest):
    """One profile of a fake server whose steps cost a known, non-monotone table, taken in
    virtual time: what it measures is the fake's table itself, however loaded the machine."""

    @classmethod
    def setUpClass(cls):
        cls.engine = FakeEngine(DECODE_MS, PREFILL_MS_PER_TOKEN, mixed_overlap_ms=OVERLAP_MS).__enter__()
        cls.path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__", "known.profile.json")
        os.makedirs(os.path.dirname(cls.path), exist_ok=True)
        # no context point (ContextCostTest measures one)
        with VirtualTime(cls.engine):
            cls.code, cls.out, cls.err = run_cli("profile", "--url", cls.engine.url, "--output-tokens", "12",
                                                 "--repeat", "2", "--prefill-tokens", "100,200,400,800",
                                                 "--context-tokens", "0", "--out", cls.path)
        with open(cls.path, encoding="utf-8") as handle:
            cls.profile = json.load(handle)

    @classmethod
    def tearDownClass(cls):
        cls.engine.__exit__(None, None, None)
        os.remove(cls.path)

    def test_it_exits_0_and_reports_progress_per_point_on_stderr(self):
        self.assertEqual(self.code, 0, self.err)
        self.assertEqual(len([line for line in self.err.splitlines() if line.startswith("profile: ")]), 4 * 2 + 4 + 1)
        self.assertIn(f"wrote {self.path}; use it with --step-profile {self.path}", self.out)

    def test_every_decode_point_is_recovered_exactly(self):
        measured = {point["batch"]: point["step_ms"] for point in self.profile["decode"]}
        self.assertEqual(sorted(measured), [1, 2, 3, 4])  # the four slots /props reports
        for batch, truth in DECODE_MS.items():
            self.assertAlmostEqual(measured[batch], truth, delta=EXACT)

    def test_every_prefill_point_and_the_front_end_are_recovered_exactly(self):
        self.assertEqual(len(self.profile["prefill"]), 4)
        for point in self.profile["prefill"]:
            truth = PREFILL_MS_PER_TOKEN * point["prompt_tokens"]
            self.assertAlmostEqual(point["step_ms"], truth, delta=EXACT)
            self.assertAlmostEqual(point["ttft_ms"], truth + FRONT_END_S * 1000, delta=EXACT)  # TTFT also pays it
        self.assertAlmostEqual(self.profile["request_overhead_ms"], FRONT_END_S * 1000, delta=EXACT)

    def test_a_prefill_beside_decodes_costs_what_it_adds_to_their_step(self):
        (point,) = self.profile["mixed"]
        decoding = {p["batch"]: p["step_ms"] for p in self.profile["decode"]}[point["decode_batch"]]
        truth = DECODE_MS[3] + PREFILL_MS_PER_TOKEN * point["prompt_tokens"] - OVERLAP_MS
        self.assertEqual((point["decode_batch"], point["num_steps"]), (3, 1))  # one step carried both
        self.assertAlmostEqual(decoding + point["added_ms"], truth, delta=EXACT)
        self.assertAlmostEqual(self.profile["mixed_overlap_ms"], OVERLAP_MS, delta=EXACT)

    def test_each_point_carries_its_repeats_and_range(self):
        for points, runs in ((self.profile["decode"], 2), (self.profile["prefill"], 5)):  # prefills are cheap
            for point in points:
                self.assertEqual(len(point["repeats_ms"]), runs)
            self.assertLessEqual(point["min_ms"], point["step_ms"])
            self.assertLessEqual(point["step_ms"], point["max_ms"])

    def test_the_server_and_the_machine_are_named(self):
        server = self.profile["server"]
        self.assertEqual((server["kind"], server["slots"], server["slot_context_tokens"], server["model"]),
                         ("llama.cpp", 4, 4096, "fake-engine"))
        self.assertTrue(self.profile["machine"]["cpu"])
        self.assertTrue(self.profile["complete"])

    def test_prompts_prefilled_in_one_step_give_the_batched_prefill_factor(self):
        # sent at once, each batch's prompts are admitted in one step, which costs what one
        # prompt as long as all of them costs: a factor of 1
        self.assertEqual(self.profile["prefill_batch_factors"],
                         [{"num_prompts": n, "factor": 1.0} for n in (2, 3, 4)])
        self.assertEqual([note for note in self.profile["notes"] if "prefilled in one step" in note], [])

    def test_prompts_that_were_not_prefilled_in_one_step_give_no_batched_prefill_factor(self):
        # sent 1 ms apart, the first prompt starts a step alone and the rest join over later steps
        profile = virtual_profile(self.engine, "--output-tokens", "12", "--repeat", "1", "--prefill-tokens", "100",
                                  "--context-tokens", "0", send_gap_s=0.001)
        self.assertEqual(profile["prefill_batch_factors"], [])
        self.assertEqual([note for note in profile["notes"] if "were never prefilled in one step" in note],
                         [f"decode batch {n}: its prompts were never prefilled in one step, so what {n} prompts "
                          f"together cost was not measured" for n in (2, 3, 4)])

    def test_simulate_with_the_profile_reproduces_the_tpot_at_each_batch_within_3_percent(self):
        for batch, truth in DECODE_MS.items():
            report = run_json("simulate", "--step-profile", self.path, *GEMMA, "--concurrency", str(batch),
                              "--requests", str(2 * batch), "--prompt-tokens", "32", "--output-tokens", "16")
            self.assertEqual(report["settings"]["scheduler"]["scheduler"], "llamacpp")  # the profile's server
            self.assertAlmostEqual(report["summary"]["tpot_ms"]["p50"], truth, delta=0.03 * truth)
            self.assertEqual(report["engine"]["cost_model"]["num_steps_outside"], 0)


def write_profile(test, decode, prefill, overlap_ms=0.0, context_tokens=0.0, overhead_ms=0.0, name="p.json",
                  server=None):
    return test.write(name, {
        "servesim_step_profile": 1, "server": server or {"kind": "vllm"}, "machine": {"cpu": "test"},
        "date": "2026-12-01",
        "decode": [{"batch": b, "step_ms": ms} for b, ms in decode],
        "prefill": [{"prompt_tokens": n, "step_ms": ms} for n, ms in prefill],
        "mixed_overlap_ms": overlap_ms, "decode_context_tokens": context_tokens, "request_overhead_ms": overhead_ms})


class WarmUpTest(ScratchTest):

    def test_profile_sends_its_largest_batch_of_short_requests_before_its_first_point(self):
        # a llama-server just started prefilled no prompts sent together in the first profile after it
        with FakeEngine(QUICK_DECODE_MS, PREFILL_MS_PER_TOKEN) as engine:
            code, _, err = run_cli("profile", "--url", engine.url, "--output-tokens", "6", "--repeat", "1",
                                   "--prefill-tokens", "100", "--context-tokens", "0", "--quiet")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(engine.max_tokens_asked[:6], [4, 4, 4, 4, 6, 6])  # four slots warmed; batch 1, batch 2


class ProfileRoundsTest(ScratchTest):
    """--step-profile A,B,C: profiles taken between rounds of runs, priced by their median."""

    def rounds(self):
        context = dict(context_tokens=1000.0)  # decodes measured with more context than the runs below hold
        return ",".join([
            write_profile(self, [(1, 10.0), (2, 14.0), (4, 30.0)], [(100, 20.0)], overhead_ms=3.0, name="r1.json",
                          **context),
            write_profile(self, [(1, 12.0), (3, 32.0), (4, 34.0)], [(100, 24.0), (300, 60.0)], overhead_ms=5.0,
                          name="r2.json", **context),
            write_profile(self, [(1, 11.0), (2, 20.0), (4, 26.0)], [(100, 22.0)], overhead_ms=4.0, name="r3.json",
                          **context)])

    def test_each_point_is_the_median_of_the_profiles_read_at_its_size(self):
        profile = main.read_step_profiles(self.rounds())
        # batch 2: 14, 22 (halfway from 12 to 32), 20; batch 3: 22 (halfway from 14 to 30), 32, 23
        self.assertEqual([(batch, round(s * 1000, 9)) for batch, s in profile.decode],
                         [(1, 11.0), (2, 20.0), (3, 23.0), (4, 30.0)])
        # one token: each profile's batch-1 step; 300 tokens: the one profile that reached it
        self.assertEqual([(tokens, round(s * 1000, 9)) for tokens, s in profile.prefill],
                         [(1, 11.0), (100, 22.0), (300, 60.0)])
        self.assertEqual((round(profile.request_overhead_s * 1000, 9), profile.path.count(",")), (4.0, 2))

    def test_simulate_prices_steps_from_the_median_profile(self):
        listed = self.rounds().replace(",", ", ")  # a space after each comma, as people type lists
        report = run_json("simulate", "--step-profile", listed, "--concurrency", "1", "--requests", "2",
                          "--prompt-tokens", "100", "--output-tokens", "3")
        self.assertAlmostEqual(report["summary"]["ttft_ms"]["p50"], 4.0 + 22.0)
        self.assertAlmostEqual(report["summary"]["tpot_ms"]["p50"], 11.0)

    def test_prompts_prefilled_together_cost_the_median_of_the_profiles_that_measured_it(self):
        def with_factor(name, factor, prompt_ms=20.0):
            path = write_profile(self, [(1, 10.0), (4, 30.0)], [(100, prompt_ms), (400, 80.0)], name=name)
            with open(path) as file:
                data = json.load(file)
            if factor is not None:  # batch 4's four 100-token prompts, prefilled together
                data["decode"][1]["prefill_tokens"] = 400
                data["prefill_batch_factors"] = [{"num_prompts": 4, "factor": factor}]
            return self.write(name, data)
        # four prompts together: factor x 80 ms; each past the first adds (that - (4 x 20 - 3 x 10) ms) / 3
        dear, cheap, unseen, even = (with_factor(f"{n}.json", f) for n, f in
                                     (("dear", 1.3), ("cheap", 0.7), ("unseen", None), ("even", 1.0)))
        # a probe of one prompt that hit a slow moment: 35 ms, not 20; the step of four is still 80 ms
        slow = with_factor("slow.json", 1.0, prompt_ms=35.0)
        for paths, extra_ms in (((dear, unseen), 18.0),  # a profile that saw no such step says nothing
                                ((dear, cheap, even), 10.0),
                                # the table's median (20 ms) and the step's (80 ms): 10 ms, where the
                                # median of each profile's own figure, 10, -10 and 2 ms, would give 2
                                ((even, slow, cheap), 10.0)):
            ((num_prompts, extra_s),) = main.read_step_profiles(",".join(paths)).extra_prompt_s
            self.assertEqual((num_prompts, round(extra_s * 1000, 9)), (4, extra_ms))

    def test_profiles_of_another_server_are_refused(self):
        first = write_profile(self, [(1, 10.0)], [(100, 20.0)], name="vllm.json")
        other = write_profile(self, [(1, 10.0)], [(100, 20.0)], name="llama.json", server={"kind": "llama.cpp"})
        self.assert_usage_error(["simulate", "--step-profile", f"{first},{other}", "--concurrency", "1"],
                                f"--step-profile {other}: a server other than {first}'s (kind llama.cpp, not vllm)")

    def test_an_empty_name_in_the_list_is_refused(self):
        path = write_profile(self, [(1, 10.0)], [(100, 20.0)])
        self.assert_usage_error(["simulate", "--step-profile", f"{path},", "--concurrency", "1"],
                                f"--step-profile {path},: an empty file name in the list (FILE[,FILE...])")

    def test_one_profile_whose_name_holds_a_comma_is_read_whole(self):
        path = write_profile(self, [(1, 10.0)], [(100, 20.0)], name="before,after.json")
        self.assertEqual(main.read_step_profiles(path).decode, ((1, 0.010),))


class ProfileCostTest(ScratchTest):
    """How a step is priced from a table, with literal numbers."""

    H100, LLAMA = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]

    def cost(self, **kwargs):
        path = write_profile(self, [(1, 10.0), (2, 14.0), (4, 30.0)], [(100, 20.0), (300, 60.0)], **kwargs)
        return main.ProfileCost(main.read_step_profile(path), main.RooflineCost(self.H100, self.LLAMA))

    def test_decode_steps_are_piecewise_linear_in_the_batch(self):
        cost = self.cost()
        self.assertAlmostEqual(cost.step_s(2, 0, 2, 2, 0), 0.014)
        self.assertAlmostEqual(cost.step_s(3, 0, 3, 3, 0), 0.022)  # halfway from 14 to 30 ms

    def test_prefill_steps_are_piecewise_linear_in_tokens_from_a_one_token_step(self):
        cost = self.cost()
        self.assertAlmostEqual(cost.step_s(200, 200, 1, 0, 0), 0.040)
        self.assertAlmostEqual(cost.step_s(1, 1, 1, 0, 0), 0.010)   # one token: the batch-1 decode step
        self.assertAlmostEqual(cost.step_s(50.5, 50, 1, 0, 0), 0.015)  # halfway from 1 to 100 tokens

    def test_a_step_with_both_costs_their_sum_less_the_measured_overlap(self):
        cost = self.cost(overlap_ms=5.0, context_tokens=500.0)
        self.assertAlmostEqual(cost.step_s(102, 2000, 3, 2, 1000), 0.014 + 0.020 - 0.005)

    def test_a_step_with_both_never_costs_less_than_either_alone(self):
        cost = self.cost(overlap_ms=25.0, context_tokens=500.0)
        self.assertAlmostEqual(cost.step_s(102, 2000, 3, 2, 1000), 0.020)  # the 100-token prefill alone
        self.assertAlmostEqual(cost.step_s(11, 2000, 5, 4, 2000), 0.030)   # the 4 decodes alone

    def test_several_prompts_without_a_measured_factor_cost_each_alone_less_the_shared_fixed_cost(self):
        cost = self.cost()
        self.assertAlmostEqual(cost.step_s(200, 200, 2, 0, 0, 2), 2 * 0.020 - 0.010)
        self.assertAlmostEqual(cost.step_s(300, 300, 3, 0, 0, 3), 3 * 0.020 - 2 * 0.010)

    def test_a_chunk_after_earlier_context_costs_extending_the_prompt_plus_a_steps_fixed_cost(self):
        cost = self.cost()
        self.assertAlmostEqual(cost.step_s(100, 100, 0, 0, 0, 1), 0.020)  # a fresh 100-token prompt
        self.assertAlmostEqual(cost.step_s(100, 200, 1, 0, 0, 1), 0.040 - 0.020 + 0.010)  # after 100 tokens
        self.assertAlmostEqual(cost.step_s(200, 400, 2, 0, 0, 2), 2 * 0.030 - 0.010)  # two such, one fixed cost
        self.assertAlmostEqual(cost.step_s(100, 350, 1, 0, 0, 1), 0.020)  # 350 tokens: past the table, not charged

    def test_a_prefill_beside_decodes_is_taken_to_save_or_add_at_most_the_decoders_own_step(self):
        self.assertEqual([main.capped_overlap_ms(overlap, 31.0) for overlap in (-45.0, -4.0, 12.5, 45.0)],
                         [-31.0, -4.0, 12.5, 31.0])
        self.assertEqual(main.capped_overlap_ms(45.0, None), 45.0)

    def test_a_capped_prefill_beside_decodes_is_noted_the_way_it_was_measured(self):
        profiler = object.__new__(main.Profiler)  # only its notes are used here
        profiler.notes = []
        self.assertEqual([profiler._overlap_ms(-174.51, 50.06), profiler._overlap_ms(60.0, 50.06)], [-50.06, 50.06])
        self.assertEqual(profiler.notes, [
            "a prefill beside decodes measured 174.51 ms dearer than alone, more than the decodes' own 50.06 ms step: "
            "taken as 50.06 ms dearer",
            "a prefill beside decodes measured 60.00 ms cheaper than alone, more than the decodes' own 50.06 ms step: "
            "taken as 50.06 ms cheaper"])

    def test_context_beyond_what_the_profile_measured_costs_what_the_profile_measured_a_token_to_add(self):
        path = write_profile(self, [(1, 10.0), (2, 14.0), (4, 30.0)], [(100, 20.0)], context_tokens=100.0)
        with open(path) as handle:
            data = json.load(handle)
        data["context_ms_per_token"] = 0.002
        path = self.write("p.json", data)
        cost = main.ProfileCost(main.read_step_profile(path), main.RooflineCost(self.H100, self.LLAMA))
        self.assertAlmostEqual(cost.step_s(2, 2000, 2, 2, 2000), 0.014 + 1800 * 0.000002)

    def test_context_beyond_what_the_profile_measured_pays_the_rooflines_kv_read(self):
        cost = self.cost(context_tokens=100.0)
        read_s = 2 * 900 * self.LLAMA.kv_bytes_per_token / (self.H100.bandwidth_gbs * 1e9 * self.H100.mbu)
        self.assertAlmostEqual(cost.step_s(2, 2000, 2, 2, 2000), 0.014 + read_s)
        self.assertAlmostEqual(cost.step_s(2, 150, 2, 2, 150), 0.014)  # less than measured: no discount

    def test_a_step_outside_the_table_is_priced_by_the_roofline_and_counted(self):
        cost = self.cost()
        self.assertEqual(cost.step_s(5, 500, 5, 5, 500), main.step_seconds(self.H100, self.LLAMA, 5, 500, 5))
        self.assertEqual(cost.step_s(400, 400, 1, 0, 0), main.step_seconds(self.H100, self.LLAMA, 400, 400, 1, 1, 1, 0, 0))
        report = cost.describe()
        self.assertEqual((report["num_steps"], report["num_steps_outside"]), (2, 2))
        self.assertIn("2 of 2 steps lay outside it (up to 5 decoding, 400 prefill tokens) and were priced by the "
                      "roofline of h100-sxm-80gb", report["text"])

    def test_the_front_end_time_delays_every_request_before_the_engine_sees_it(self):
        path = write_profile(self, [(1, 10.0)], [(100, 20.0)], overhead_ms=3.0, context_tokens=1000.0)
        report = run_json("simulate", "--step-profile", path, "--concurrency", "1", "--requests", "2",
                          "--prompt-tokens", "100", "--output-tokens", "3")
        self.assertAlmostEqual(report["summary"]["ttft_ms"]["p50"], 3.0 + 20.0)
        self.assertAlmostEqual(report["summary"]["tpot_ms"]["p50"], 10.0)
        self.assertAlmostEqual(report["summary"]["e2e_ms"]["p50"], 3.0 + 20.0 + 2 * 10.0)

    def test_a_measured_batch_factor_is_what_each_prompt_past_the_first_adds(self):
        path = write_profile(self, [(1, 10.0), (4, 30.0)], [(100, 20.0), (400, 80.0)])
        with open(path) as file:
            data = json.load(file)
        data["decode"][1]["prefill_tokens"] = 400  # batch 4's four 100-token prompts, prefilled together
        data["prefill_batch_factors"] = [{"num_prompts": 4, "factor": 0.8}]
        profile = main.read_step_profile(self.write("f.json", data))
        # together 0.8 x 80 = 64 ms; alone, sharing one fixed cost, 4 x 20 - 3 x 10 = 50 ms: 14 ms over 3 prompts
        ((num_prompts, extra_s),) = profile.extra_prompt_s
        self.assertEqual(num_prompts, 4)
        self.assertAlmostEqual(extra_s, 0.014 / 3)
        cost = main.ProfileCost(profile, main.RooflineCost(self.H100, self.LLAMA))
        self.assertAlmostEqual(cost.step_s(400, 400, 4, 0, 0, 4), 0.064)  # the measured step itself
        self.assertAlmostEqual(cost.step_s(400, 400, 2, 0, 0, 2), 2 * 0.040 - (0.010 - 0.014 / 3))  # 200 tokens each
        self.assertAlmostEqual(cost.step_s(400, 400, 1, 0, 0, 1), 0.080)
        del data["decode"][1]["prefill_tokens"]  # a factor whose prompts are not known says nothing
        self.assertEqual(main.read_step_profile(self.write("g.json", data)).extra_prompt_s, ())

    def test_a_bad_profile_is_one_line_naming_the_field(self):
        path = write_profile(self, [(1, -3.0)], [])
        self.assert_usage_error(("simulate", "--step-profile", path, "--concurrency", "1"),
                                f"--step-profile {path}: decode[0].step_ms must be a positive number, got -3.0")
        self.assert_usage_error(("simulate", "--step-profile", self.write("q.json", [1]), "--concurrency", "1"),
                                "the top level must be a JSON object")


def settle(points, timings):
    profiler = main.Profiler(None, {}, "m", None, print)
    profiler.prefill = [dict(prompt_tokens=n, ttft_ms=ttft, server_prompt_ms=server if timings else None,
                             **main.point_summary([(server if timings else ttft) / 1000]))
                        for n, ttft, server in points]
    return profiler.split_prefill_ttfts(), [point["step_ms"] for point in profiler.prefill]


class PrefillSplitTest(unittest.TestCase):
    """A TTFT is the server's prefill step plus a fixed front-end time; how they are told apart."""

    def test_with_the_servers_own_prompt_time_the_rest_is_front_end(self):
        overhead, steps = settle([(100, 23.0, 20.0), (300, 64.0, 60.0)], timings=True)
        self.assertEqual((overhead, steps), (3.0, [20.0, 60.0]))  # the median of 3 and 4 ms: the lower, by nearest rank

    def test_without_it_the_intercept_of_ttft_against_length_is_the_front_end(self):
        overhead, steps = settle([(100, 23.0, None), (200, 43.0, None), (300, 63.0, None)], timings=False)
        self.assertAlmostEqual(overhead, 3.0)
        self.assertEqual([round(step, 6) for step in steps], [20.0, 40.0, 60.0])

    def sample_of(self, first_token_times_s, prompt_ms):
        """decode_sample's verdict on four requests sent at 0 whose first tokens came at
        first_token_times_s, then every 35 ms; the cheapest decode step measured 14 ms."""
        records = []
        for index, first_s in enumerate(first_token_times_s):
            record = main.MeasuredRequest(index, sent_s=0.0, prompt_tokens=63, output_tokens=8)
            record.token_times = [first_s + 0.035 * step for step in range(8)]
            record.timings = None if prompt_ms is None else {"prompt_ms": prompt_ms[index]}
            records.append(record)
        settings = main.ProfileSettings(batches=(4,), prefill_tokens=(64,), prompt_tokens=63, output_tokens=8,
                                        repeat=1, budget_s=60.0, timeout_s=10.0)
        profiler = main.Profiler(None, {}, "m", settings, print)
        profiler.load = lambda bodies, concurrency, scrape=False: (records, None)
        return profiler.decode_sample(4, 0.014)["ttft_s"]

    def test_first_tokens_of_one_step_may_come_slot_by_slot_within_half_the_prompt_time(self):
        # llama-server samples slot by slot: one step's four first tokens came 3 ms apart each,
        # more than half the 14 ms batch-1 step, far less than half its 472 ms prompt time
        together = (0.480, 0.483, 0.486, 0.489)
        self.assertAlmostEqual(self.sample_of(together, [472.3, 472.6, 473.0, 481.9]), 0.483)  # the median, by nearest rank
        self.assertIsNone(self.sample_of(together, None))  # without the server's word, 9 ms is too far
        # prefilled in two steps: the later ones' first tokens a whole (140 ms) step later
        self.assertIsNone(self.sample_of((0.140, 0.280, 0.283, 0.286), [140.0, 140.0, 140.0, 140.0]))

    def test_the_steady_gaps_are_those_while_every_request_decodes(self):
        early, late = main.MeasuredRequest(0), main.MeasuredRequest(1)
        early.token_times, late.token_times = [0.0, 1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.5, 4.5]
        # all decode from 1.5 s (the second's first token) to 4 s (the first's last): 2-3, 3-4 and 1.5-2.5, 2.5-3.5
        self.assertEqual(main.decoding_gaps_s([early, late]), [1.0, 1.0, 1.0, 1.0])
        late.token_times = [4.5, 5.0]
        self.assertEqual(main.decoding_gaps_s([early, late]), [])  # they never decode together


class SlotSchedulerTest(unittest.TestCase):
    """llama.cpp's slots: a fixed context each, no paging, no preemption."""

    def scheduler(self, slots=4, ctx_tokens=4096):
        config = main.SchedulerConfig(max_num_seqs=slots, max_num_batched_tokens=2048, block_size=16,
                                      scheduler="llamacpp")
        return new_scheduler(config, ctx_tokens // 16)

    def test_a_prompt_that_fits_the_cache_but_not_a_slot_is_refused_as_llama_cpp_refuses_it(self):
        scheduler = self.scheduler()
        request = main.Request(0, 1024, 8)  # a 1,024-token slot cannot hold a 1,024-token prompt
        self.assertFalse(scheduler.add(request))
        self.assertEqual(request.error_kind, "slot-context")
        self.assertEqual(request.error, "prompt of 1,024 tokens does not fit a 1,024-token slot (llama.cpp: HTTP 400 "
                                        "exceed_context_size_error)")
        self.assertTrue(scheduler.add(main.Request(1, 1023, 8)))

    def test_prompt_and_output_over_a_slot_are_cut_at_its_end(self):
        scheduler = self.scheduler()
        request = main.Request(0, 924, 200)
        self.assertTrue(scheduler.add(request))
        self.assertEqual((request.max_tokens, scheduler.num_cut), (100, 1))  # 924 + 100 = the 1,024-token slot

    def test_the_fifth_request_waits_for_a_slot(self):
        requests = [main.Request(index, 40, 4) for index in range(5)]
        engine = main.simulate(self.scheduler(), main.HARDWARE["cpu-2vcpu"], main.MODELS["gemma-3-270m-q4_k_m"],
                               requests)
        self.assertEqual(engine.max_batch_seqs, 4)
        first_done = min(r.token_times[-1] for r in requests[:4])
        self.assertEqual(requests[4].scheduled_s, first_done)
        self.assertTrue(all(r.scheduled_s == 0.0 for r in requests[:4]))

    def test_nothing_is_ever_preempted(self):
        for seed in range(100):
            rng = random.Random(seed)
            scheduler = self.scheduler(slots=rng.randint(1, 6), ctx_tokens=rng.choice((512, 1024, 1000)))
            requests = [main.Request(index, rng.randint(1, 400), rng.randint(1, 150), rng.uniform(0, 2))
                        for index in range(20)]
            engine = main.simulate(scheduler, main.HARDWARE["cpu-2vcpu"], main.MODELS["gemma-3-270m-q4_k_m"],
                                   requests)
            self.assertEqual(engine.scheduler.num_preemptions, 0)
            for request in requests:
                if request.error_kind == "slot-context":
                    self.assertGreaterEqual(request.prompt_tokens, scheduler.slot_tokens)
                    continue
                self.assertEqual((request.error, request.generated), (None, request.max_tokens))
                self.assertLessEqual(request.prompt_tokens + request.generated, scheduler.slot_tokens)

    def test_the_scheduler_cannot_be_combined_with_modes_llama_cpp_lacks(self):
        code, _, err = run_cli("simulate", "--scheduler", "llamacpp", "--prefix-caching", "--concurrency", "1")
        self.assertEqual(code, 2)
        self.assertIn("--prefix-caching with --scheduler llamacpp", err)


def loadgen_report(concurrency, tpot_ms, server="llama.cpp"):
    """A closed-loop loadgen --json report of 8 requests (40 prompt, 16 output tokens)."""
    summary = {"num_requests": 8, "num_completed": 8, "prompt_tokens": 8 * 40, "output_tokens": 8 * 16,
               "output_tok_per_s": 100.0, "ttft_ms": {"p50": 50.0}, "tpot_ms": {"p50": tpot_ms}}
    return {"settings": {"url": "http://h", "mode": "closed", "concurrency": concurrency, "max_tokens": 16,
                         "ignore_eos": True}, "summary": summary, "server": {"server": server, "mean_batch": 1.0}}


class CompareWithLlamaCppReportsTest(ScratchTest):

    def report(self, concurrency, tpot_ms, server="llama.cpp"):
        return loadgen_report(concurrency, tpot_ms, server)

    def test_compare_replays_a_llama_cpp_report_with_llama_cpps_scheduling(self):
        path = self.write("c1.json", self.report(1, 20.0))
        code, out, err = run_cli("compare", path, *GEMMA, "--kv-tokens", "4096", "--max-num-seqs", "4")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("(llama.cpp slots: 4 of 1,024 tokens, batch 2,048)", out.splitlines()[0])
        vllm = self.write("v1.json", self.report(1, 20.0, server="vllm"))
        self.assertIn("(4,096 KV tokens, max-num-seqs 4)", run_cli("compare", vllm, *GEMMA, "--kv-tokens", "4096",
                                                                   "--max-num-seqs", "4")[1].splitlines()[0])

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_repeated_runs_give_one_row_with_their_median_and_spread_beside_the_error(self):
        paths = [self.write(f"r{index}.json", self.report(1, tpot)) for index, tpot in enumerate((20.0, 22.0))]
        result = run_json("compare", *paths, *GEMMA, "--kv-tokens", "4096", "--max-num-seqs", "4")
        (row,) = result["rows"]
        self.assertEqual(row["num_runs"], 2)
        self.assertEqual(row["measured"]["tpot p50"], 20.0)  # the one median (nearest rank): the lower of two
        self.assertAlmostEqual(row["spread"]["tpot p50"], 2.0 / 20.0)
        self.assertAlmostEqual(row["error"]["tpot p50"], (row["predicted"]["tpot p50"] - 20.0) / 20.0)
        text = run_cli("compare", *paths, *GEMMA, "--kv-tokens", "4096", "--max-num-seqs", "4")[1].splitlines()
        self.assertEqual(text[1].split(), ["measured", "|", "predicted", "|", "error", "|", "noise"])
        self.assertRegex(text[-2], r"^median \|error\|: out tok/s [+-]?\d+% \(noise 0%\), ttft p50 \d+% \(noise 0%\), "
                                   r"tpot p50 \d+% \(noise 10%\)$")

    def test_repeated_runs_replayed_from_their_own_sends_are_predicted_by_the_median_of_their_replays(self):
        paths = []
        for index, gap_s in enumerate((0.5, 2.0, 4.0)):  # the same command; the server kept each client waiting longer
            report = self.report(1, 20.0)
            report["requests"] = [{"sent_s": n * gap_s, "prompt_tokens": 40, "output_tokens": 16, "error": None}
                                  for n in range(8)]
            paths.append(self.write(f"r{index}.json", report))
        flags = (*GEMMA, "--kv-tokens", "4096", "--max-num-seqs", "4", "--price-per-hour", "1")
        alone = [run_json("compare", path, *flags)["rows"][0] for path in paths]
        (row,) = run_json("compare", *paths, *flags)["rows"]
        rates = [single["predicted"]["out tok/s"] for single in alone]
        self.assertEqual(len(set(rates)), 3)  # each replay spreads its requests over its own time
        self.assertEqual(row["predicted"]["out tok/s"], sorted(rates)[1])
        prices = sorted(single["usd_per_million_output_tokens"]["predicted"] for single in alone)
        self.assertEqual(row["usd_per_million_output_tokens"]["predicted"], prices[1])

    def test_with_more_clients_than_slots_recorded_sends_keep_their_order_but_the_loop_stays_closed(self):
        def predicted(concurrency, gap_s):
            report = self.report(concurrency, 20.0)
            report["requests"] = [{"sent_s": n * gap_s, "prompt_tokens": 40, "output_tokens": 16, "error": None}
                                  for n in range(8)]
            path = self.write(f"c{concurrency}-{gap_s}.json", report)
            return run_json("compare", path, *GEMMA, "--kv-tokens", "4096", "--max-num-seqs", "4")["rows"][0]["predicted"]
        # a slow measured server: each request sent a second after the one before it
        self.assertEqual(predicted(8, 1.0), predicted(8, 0.0))
        self.assertNotEqual(predicted(4, 1.0), predicted(4, 0.0))

    def test_runs_of_one_command_are_one_row_when_the_server_counted_a_token_more(self):
        first, second = loadgen_report(2, 20.0), loadgen_report(2, 22.0)
        first["settings"]["prompt_tokens"] = second["settings"]["prompt_tokens"] = 32
        second["summary"]["prompt_tokens"] = 8 * 41  # the same command; its random words tokenized longer
        other = loadgen_report(2, 20.0)
        other["settings"]["prompt_tokens"] = 64
        other["summary"]["prompt_tokens"] = 8 * 80
        paths = [self.write(f"{name}.json", report) for name, report in (("a", first), ("b", second), ("c", other))]
        rows = run_json("compare", *paths, *GEMMA, "--kv-tokens", "4096", "--max-num-seqs", "4")["rows"]
        self.assertEqual([(row["num_runs"], row["prompt_tokens"]) for row in rows], [(2, 40), (1, 80)])

    def test_a_hand_edited_setting_that_is_a_list_is_a_workload_of_its_own(self):
        edited, plain = loadgen_report(2, 20.0), loadgen_report(2, 20.0)
        edited["settings"]["prompt_tokens"], plain["settings"]["prompt_tokens"] = [1, 2], 32
        paths = [self.write(f"{name}.json", report) for name, report in (("e", edited), ("p", plain))]
        rows = run_json("compare", *paths, *GEMMA, "--kv-tokens", "4096", "--max-num-seqs", "4")["rows"]
        self.assertEqual([row["num_runs"] for row in rows], [1, 1])


def vllm_bench_result(**changes):
    """A `vllm bench serve --save-result` JSON: 40 prompts of 1,024 tokens, 128 out, 4 at a time."""
    result = {"date": "20261201-120000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
              "num_prompts": 40, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 4, "duration": 12.0,
              "completed": 40, "total_input_tokens": 40 * 1024, "total_output_tokens": 40 * 128,
              "request_throughput": 3.3, "output_throughput": 426.7, "total_token_throughput": 3840.0,
              "mean_ttft_ms": 30.0, "median_ttft_ms": 28.5, "p99_ttft_ms": 60.0, "mean_tpot_ms": 9.1,
              "median_tpot_ms": 9.0, "p99_tpot_ms": 9.9, "median_itl_ms": 8.9, "median_e2el_ms": 1170.0}
    result.update(changes)
    return result


class RecordedSendsTest(ScratchTest):
    """How a closed loop's recorded sends become the simulated arrivals."""

    @staticmethod
    def report(kind, sent_s, shared_prefix_tokens=0):
        records = [{"sent_s": s, "prompt_tokens": 200, "output_tokens": 8, "error": None} for s in sent_s]
        return {"settings": {"server_info": {"kind": kind}, "prompt_tokens": 100,
                             "shared_prefix_tokens": shared_prefix_tokens}, "requests": records}

    def test_sends_within_the_burst_time_of_their_bursts_first_are_one_burst(self):
        sends = main.recorded_sends(self.report("llama.cpp", [10.0, 10.001, 10.014, 10.016, 10.2]), 0.015)
        self.assertEqual([round(r.arrival_s, 6) for r in sends], [0.0, 0.0, 0.0, 0.016, 0.2])

    def test_without_a_burst_time_sends_a_millisecond_apart_keep_their_own_times(self):
        sends = main.recorded_sends(self.report("vllm", [10.0, 10.001, 10.004, 10.2]))
        self.assertEqual([round(r.arrival_s, 6) for r in sends], [0.0, 0.001, 0.004, 0.2])

    def test_llama_cpps_burst_time_is_one_decode_step_of_one_sequence_and_vllms_none(self):
        # a client whose answer ended a step after the others' sends a step later; llama-server
        # still takes it into their batch, vLLM starts a step on the first request it sees
        path = write_profile(self, [(1, 15.0), (2, 19.0)], [(100, 40.0)], server={"kind": "llama.cpp"})
        spec = main.build_engine_spec(main.engine_args(main.build_parser("compare").parse_args(
            ["compare", "r.json", "--step-profile", path, *GEMMA])))
        self.assertAlmostEqual(main.send_burst_s(self.report("llama.cpp", [0.0]), spec), 0.015)
        self.assertEqual(main.send_burst_s(self.report("vllm", [0.0]), spec), 0.0)

    def test_a_shared_prefix_is_replayed_as_many_tokens_as_the_server_counted_for_it(self):
        report = self.report("vllm", [0.0, 0.5], shared_prefix_tokens=60)
        requests = main.with_shared_prefix(main.recorded_sends(report), report)
        self.assertEqual([(r.prefix_tokens, r.prompt_tokens) for r in requests], [(120, 200), (120, 200)])
        self.assertEqual(len({r.prefix for r in requests}), 1)


class VllmBenchResultTest(ScratchTest):
    """compare and calibrate read a vllm bench serve result as they read a loadgen report."""

    H100 = ("--hardware", "h100-sxm-80gb", "--model", "llama-3.1-8b")

    def test_an_unbounded_rate_with_a_concurrency_cap_is_a_closed_loop_of_that_many(self):
        path = self.write("vllm.json", vllm_bench_result())
        (row,) = run_json("compare", path, *self.H100)["rows"]
        self.assertEqual((row["concurrency"], row["rate"], row["num_requests"], row["prompt_tokens"],
                          row["output_tokens"]), (4, None, 40, 1024, 128))
        self.assertEqual(row["measured"], {"out tok/s": 426.7, "ttft p50": 28.5, "tpot p50": 9.0, "batch": None})
        self.assertTrue(run_cli("compare", path, *self.H100)[1].startswith(
            "compare llama-3.1-8b on h100-sxm-80gb (447,952 KV tokens, max-num-seqs 256) with vllm bench serve; "))

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_without_a_model_flag_the_report_says_which_preset_stood_in_for_the_servers_model(self):
        path = self.write("vllm.json", vllm_bench_result())
        code, out, err = run_cli("compare", path, "--hardware", "h100-sxm-80gb")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out.splitlines()[1], "meta-llama/Llama-3.1-8B-Instruct served the run; with no --model-dir, "
                                              "--model-file or --model the preset llama-3.1-8b stands in for it")
        self.assertEqual(run_json("compare", path, *self.H100)["notes"], [])

    def test_results_of_different_lengths_are_different_rows(self):
        short = self.write("short.json", vllm_bench_result())
        long = self.write("long.json", vllm_bench_result(total_input_tokens=40 * 4096))
        rows = run_json("compare", short, long, *self.H100)["rows"]
        self.assertEqual([(row["num_runs"], row["prompt_tokens"]) for row in rows], [(1, 1024), (1, 4096)])

    def test_a_finite_rate_is_an_open_loop_at_that_rate(self):
        report = main.from_vllm_bench(vllm_bench_result(request_rate=2.5, max_concurrency=None), "r.json")
        self.assertEqual((report["settings"]["mode"], report["settings"]["rate"], report["settings"]["concurrency"]),
                         ("open", 2.5, None))

    def test_an_open_loop_under_a_concurrency_cap_never_runs_more_at_once(self):
        spec = main.EngineSpec(main.plan_capacity(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]),
                               main.SchedulerConfig())
        batches = [main.predict_loadgen_run(main.from_vllm_bench(vllm_bench_result(
            request_rate=20.0, max_concurrency=cap), "r.json"), spec)["engine"]["max_batch_seqs"] for cap in (None, 2)]
        self.assertEqual(batches[1], 2)  # each request waits for one of the two in flight to end
        self.assertGreater(batches[0], 10)  # 20 req/s of 1.2 s requests, uncapped
        capped = main.from_vllm_bench(vllm_bench_result(request_rate=20.0, max_concurrency=3), "r.json")
        step_engine = dataclasses.replace(spec, fast=False)
        self.assertEqual(differences(main.predict_loadgen_run(capped, step_engine),
                                     main.predict_loadgen_run(capped, spec)), [])  # figure by figure

    def test_saved_lengths_are_the_lengths_predicted(self):
        inputs, outputs = [100 + index for index in range(40)], [10 + index % 7 for index in range(40)]
        report = main.from_vllm_bench(vllm_bench_result(input_lens=inputs, output_lens=outputs,
                                                        total_input_tokens=sum(inputs),
                                                        total_output_tokens=sum(outputs)), "r.json")
        self.assertEqual(report["request_lengths"], list(zip(inputs, outputs)))
        spec = main.EngineSpec(main.plan_capacity(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]),
                               main.SchedulerConfig())
        summary = main.predict_loadgen_run(report, spec)["summary"]
        self.assertEqual((summary["prompt_tokens"], summary["output_tokens"]), (sum(inputs), sum(outputs)))
        partial = main.from_vllm_bench(vllm_bench_result(input_lens=inputs[:39], output_lens=outputs[:39],
                                                         completed=39), "r.json")
        self.assertEqual(partial["request_lengths"], [])  # a failed request's lengths are unknown: the means stand

    def test_saved_start_times_are_the_arrivals_predicted(self):
        def result(starts, queued=None):
            return main.from_vllm_bench(vllm_bench_result(
                request_rate=4.0, max_concurrency=None, input_lens=[1024] * 40, output_lens=[128] * 40,
                start_times=starts, queue_times=queued if queued is not None else [0.0] * 40), "r.json")
        spread = result([50.0 + 0.25 * index for index in range(40)], [0.1] + [None] * 39)
        # the first arrived at 49.9 (sent at 50.0 after 0.1 s waiting for a slot), the next at 50.25
        self.assertEqual([round(offset, 6) for offset in spread["request_offsets"][:3]], [0.0, 0.35, 0.6])
        spec = main.EngineSpec(main.plan_capacity(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]),
                               main.SchedulerConfig())
        ttft_p50 = [main.predict_loadgen_run(report, spec)["summary"]["ttft_ms"]["p50"]
                    for report in (spread, result([50.0] * 40))]
        self.assertGreater(ttft_p50[1], 3 * ttft_p50[0])  # all sent at once queue behind each other's prefills
        self.assertEqual(result([50.0] * 39)["request_offsets"], [])  # not one per request: the rate draws them

    def test_runs_at_one_rate_but_of_another_cap_or_burstiness_are_rows_of_their_own(self):
        paths = [self.write(f"r{index}.json", vllm_bench_result(request_rate=20.0, **changes)) for index, changes in
                 enumerate(({"max_concurrency": None}, {"max_concurrency": 2}, {"max_concurrency": None,
                                                                                "burstiness": 0.5}))]
        rows = run_json("compare", *paths, *self.H100, "--no-sensitivity")["rows"]
        self.assertEqual([(row["num_runs"], row["max_in_flight"], row["burstiness"]) for row in rows],
                         [(1, None, 1.0), (1, 2, 1.0), (1, None, 0.5)])
        lines = run_cli("compare", *paths, *self.H100, "--no-sensitivity")[1].splitlines()
        self.assertEqual([line.strip().split("  ")[0] for line in lines[3:6]],
                         ["rate 20", "rate 20 (at most 2)", "rate 20 (burstiness 0.5)"])

    def test_a_ramped_rate_is_an_open_loop_that_speeds_up_as_it_ramped(self):
        ramped = vllm_bench_result(num_prompts=200, completed=200, max_concurrency=None, ramp_up_strategy="linear",
                                   ramp_up_start_rps=1, ramp_up_end_rps=10)
        report = main.from_vllm_bench(ramped, "r.json")
        offsets = report["request_offsets"]
        self.assertEqual((report["settings"]["mode"], len(offsets), offsets == sorted(offsets)), ("open", 200, True))
        first, last = offsets[19] - offsets[0], offsets[-1] - offsets[-20]
        self.assertGreater(first, 3 * last)  # 19 gaps at ~1.5 req/s against 19 at ~9.5
        self.assertAlmostEqual(report["settings"]["rate"], 200 / offsets[-1])
        exponential = main.from_vllm_bench(dict(ramped, ramp_up_strategy="exponential"), "r.json")["request_offsets"]
        self.assertGreater(exponential[-1], offsets[-1])  # the same two ends, more of the way slow
        for changes, message in (({"ramp_up_strategy": "steps"}, "ramp_up_strategy must be linear or exponential"),
                                 ({"ramp_up_start_rps": 0}, "ramp_up_start_rps and ramp_up_end_rps must be positive")):
            with self.assertRaises(main.UsageError) as caught:
                main.from_vllm_bench(dict(ramped, **changes), "r.json")
            self.assertIn(f"r.json: {message}", str(caught.exception))

    def test_a_result_that_does_not_fit_exits_2_naming_the_field(self):
        for changes, message in (({"request_rate": "fast"}, "request_rate must be a positive number or \"inf\""),
                                 ({"completed": "all"}, "completed must be an integer >= 0, got 'all'"),
                                 ({"num_prompts": 10}, "num_prompts must be from 1 to 10,000,000 and at least completed"),
                                 ({"input_lens": 3.5}, "input_lens must be a list of integers, got 3.5"),
                                 ({"burstiness": 0}, "burstiness must be a positive number, got 0")):
            path = self.write("bad.json", vllm_bench_result(**changes))
            code, _, err = run_cli("compare", path, *self.H100)
            self.assertEqual(code, 2)
            self.assertIn(f"{path}: {message}", err)


def sglang_bench_result(**changes):
    """One line of `python -m sglang.bench_serving --output-file`: the run of vllm_bench_result,
    as SGLang saves it (no num_prompts or model, e2e_latency, an infinite rate as a number)."""
    result = {"backend": "sglang-oai", "dataset_name": "random", "request_rate": math.inf, "max_concurrency": 4,
              "random_input_len": 1024, "random_output_len": 128, "duration": 12.0, "completed": 40,
              "total_input_tokens": 40 * 1024, "total_output_tokens": 40 * 128, "request_throughput": 3.3,
              "output_throughput": 426.7, "mean_e2e_latency_ms": 1180.0, "median_e2e_latency_ms": 1170.0,
              "p99_e2e_latency_ms": 1300.0, "mean_ttft_ms": 30.0, "median_ttft_ms": 28.5, "p99_ttft_ms": 60.0,
              "mean_tpot_ms": 9.1, "median_tpot_ms": 9.0, "p99_tpot_ms": 9.9, "mean_itl_ms": 9.0,
              "median_itl_ms": 8.9, "p99_itl_ms": 12.0, "concurrency": 3.9}
    result.update(changes)
    return result


class SglangBenchResultTest(ScratchTest):
    """compare reads SGLang's bench_serving results, and files of several results, one a line."""

    H100 = VllmBenchResultTest.H100

    def test_an_sglang_result_reads_as_the_same_run_saved_by_vllm(self):
        sglang = main.measured_report(sglang_bench_result(), "s.jsonl")
        vllm = main.measured_report(vllm_bench_result(backend="sglang-oai", model_id=None, mean_e2el_ms=1180.0,
                                                      p99_e2el_ms=1300.0, mean_itl_ms=9.0, p99_itl_ms=12.0,
                                                      total_token_throughput=None), "v.json")
        self.assertEqual((sglang["settings"], sglang["summary"]), (vllm["settings"], vllm["summary"]))
        self.assertEqual((sglang["source"], sglang["settings"]["server_info"], sglang["summary"]["e2e_ms"]),
                         ("sglang bench_serving", {"kind": "sglang"}, {"mean": 1180.0, "p50": 1170.0, "p99": 1300.0}))

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_without_a_model_flag_the_report_says_the_result_names_no_model(self):
        path = self.write("one.jsonl", json.dumps(sglang_bench_result()))
        code, out, err = run_cli("compare", path, "--hardware", "h100-sxm-80gb")
        self.assertEqual((code, err, out.splitlines()[1]), (0, "", (
            "the run does not name the model served; with no --model-dir, --model-file or --model the preset "
            "llama-3.1-8b stands in for it")))

    def test_its_details_count_the_requests_sent_and_give_their_lengths(self):
        inputs, outputs = [1024] * 39 + [1000], [128] * 39 + [0]  # the last one failed
        report = main.measured_report(sglang_bench_result(input_lens=inputs, output_lens=outputs, completed=39,
                                                          errors=[""] * 39 + ["timeout"]), "s.jsonl")
        self.assertEqual((report["summary"]["num_requests"], report["summary"]["num_completed"]), (40, 39))
        inputs = [1000 + index for index in range(40)]
        whole = main.measured_report(sglang_bench_result(input_lens=inputs, output_lens=[128] * 40,
                                                         total_input_tokens=sum(inputs)), "s.jsonl")
        self.assertEqual(whole["request_lengths"], [(prompt, 128) for prompt in inputs])

    def test_a_file_of_results_one_a_line_is_a_row_each_named_by_its_line(self):
        lines = [json.dumps(sglang_bench_result(max_concurrency=n)) for n in (1, 4)]
        path = self.write("sweep.jsonl", "\n".join(lines))
        rows = run_json("compare", path, *self.H100)["rows"]
        self.assertEqual([row["concurrency"] for row in rows], [1, 4])
        self.assertTrue(run_cli("compare", path, *self.H100)[1].startswith(
            "compare llama-3.1-8b on h100-sxm-80gb (447,952 KV tokens, max-num-seqs 256) with sglang bench_serving; "))
        broken = self.write("broken.jsonl", lines[0] + "\n" + lines[1][:-1] + "\n")
        code, _, err = run_cli("compare", broken, *self.H100)
        self.assertEqual(code, 2)
        self.assertIn(f"{broken}:2: not JSON (", err)

    def test_vllm_bench_serves_appended_results_are_read_the_same_way(self):
        path = self.write("appended.json", json.dumps(vllm_bench_result()) + "\n" +
                               json.dumps(vllm_bench_result(max_concurrency=8)))
        self.assertEqual([(name, report["settings"]["concurrency"]) for name, report in main.read_measured_runs(path)],
                         [(f"{path}:1", 4), (f"{path}:2", 8)])
        pretty = self.write("pretty.json", "{\n  \"completed\": 4,\n")  # one JSON value, cut short
        code, _, err = run_cli("compare", pretty, *self.H100)
        self.assertEqual(code, 2)
        self.assertIn(f"{pretty}: not JSON (", err)


class ServerFlagsTest(ScratchTest):
    """The flags vLLM and SGLang tell of themselves become the prediction's defaults."""

    SGLANG_INFO = {"version": "0.5.4", "max_running_requests": 48, "chunked_prefill_size": 4096,
                   "context_length": 8192, "page_size": 1, "disable_radix_cache": False,
                   "internal_states": [{"max_total_num_tokens": 300000}]}
    VLLM_METRICS = ('# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",cache_dtype="auto",'
                    'enable_prefix_caching="True",num_gpu_blocks="2000"} 1.0\n')

    def discover(self, **server):
        with FakeServer(**server) as fake:
            return main.discover_server(main.Endpoint.parse(fake.url), {}, 5.0)

    def test_sglang_server_info_gives_its_sequences_kv_pool_and_chunk(self):
        told = {"kind": "sglang", "build": "0.5.4", "max_num_seqs": 48, "kv_tokens": 300000,
                "max_num_batched_tokens": 4096, "max_model_len": 8192, "prefix_caching": True}
        self.assertEqual(self.discover(pages={"/server_info": self.SGLANG_INFO}), told)
        self.assertEqual(self.discover(pages={"/get_server_info": self.SGLANG_INFO}), told)  # its older name
        self.assertEqual(self.discover(pages={"/server_info": {"status": "ready"}, "/get_server_info": self.SGLANG_INFO}),
                         told)  # another program's /server_info is not SGLang's
        unset = dict(self.SGLANG_INFO, max_running_requests=None, chunked_prefill_size=-1, internal_states=[],
                     disable_radix_cache=None)
        self.assertEqual(self.discover(pages={"/get_server_info": unset}),
                         {"kind": "sglang", "build": "0.5.4", "max_model_len": 8192})

    def test_vllm_gives_its_context_and_the_kv_cache_its_metrics_label(self):
        models = {"/v1/models": {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]}}
        self.assertEqual(self.discover(pages=models, metrics=[self.VLLM_METRICS]),
                         {"kind": "vllm", "max_model_len": 4096, "kv_tokens": 32000, "block_size": 16,
                          "prefix_caching": True})
        self.assertEqual(self.discover(pages=models), {"kind": "vllm", "max_model_len": 4096})
        odd = self.VLLM_METRICS.replace('num_gpu_blocks="2000"', 'num_gpu_blocks="²"')
        self.assertEqual(self.discover(pages=models, metrics=[odd]), {"kind": "vllm", "max_model_len": 4096,
                                                                       "prefix_caching": True})

    def test_loadgen_names_the_settings_the_server_told(self):
        with FakeServer(pages={"/get_server_info": self.SGLANG_INFO}) as fake:
            code, out, err = run_cli("loadgen", "--url", fake.url, "--requests", "2", "--concurrency", "1")
        self.assertEqual((code, out.splitlines()[1]), (0, (
            "the server's own settings (sglang): max-num-seqs 48, 300,000 KV tokens, max-num-batched-tokens 4,096, "
            "max-model-len 8,192, prefix caching on")))

    def test_a_server_that_tells_nothing_or_nonsense_gives_nothing(self):
        self.assertEqual(self.discover(), {})
        self.assertEqual(self.discover(pages={"/get_server_info": [1, 2], "/props": {"total_slots": "four"}}), {})

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_compare_predicts_with_the_servers_flags_unless_a_flag_says_otherwise(self):
        report = loadgen_report(1, 20.0, server="sglang")
        report["settings"]["server_info"] = {"kind": "sglang", "max_num_seqs": 48, "kv_tokens": 300000,
                                             "max_num_batched_tokens": 4096, "prefix_caching": True}
        path = self.write("s1.json", report)
        result = run_json("compare", path, *GEMMA)
        self.assertEqual((result["capacity"]["num_kv_tokens"], result["scheduler"]["max_num_seqs"],
                          result["scheduler"]["max_num_batched_tokens"], result["scheduler"]["prefix_caching"],
                          result["scheduler"]["max_model_len"]), (300000, 48, 4096, True, None))
        report["settings"]["server_info"]["max_model_len"] = 8192
        told = run_json("compare", self.write("s2.json", report), *GEMMA)["scheduler"]["max_model_len"]
        self.assertEqual(told, 8192)
        lines = run_cli("compare", path, *GEMMA)[1].splitlines()
        self.assertIn("(300,000 KV tokens, max-num-seqs 48)", lines[0])
        self.assertEqual(lines[1], "the server's own settings (sglang): max-num-seqs 48, 300,000 KV tokens, "
                                   "max-num-batched-tokens 4,096, prefix caching on; the prediction takes them where "
                                   "no flag says otherwise")
        result = run_json("compare", path, *GEMMA, "--max-num-seqs", "8", "--kv-tokens", "8192", "--no-prefix-caching")
        self.assertEqual((result["capacity"]["num_kv_tokens"], result["scheduler"]["max_num_seqs"],
                          result["scheduler"]["prefix_caching"]), (8192, 8, False))


class ContextCostTest(ScratchTest):
    """What a token of context adds to a decode step, measured at the largest batch."""

    def test_profile_recovers_the_cost_of_context_and_simulate_charges_it(self):
        with FakeEngine(QUICK_DECODE_MS, context_us_per_token=20.0) as engine:
            profile = virtual_profile(engine, "--output-tokens", "12", "--repeat", "1", "--prefill-tokens", "100",
                                      "--context-tokens", "600")
        self.assertEqual((profile["context"]["batch"], profile["context"]["prompt_tokens"]), (4, 600))
        self.assertAlmostEqual(profile["context_ms_per_token"], 0.020, delta=EXACT)
        path = self.write("context.profile.json", profile)
        steps = [run_json("simulate", "--step-profile", path, *GEMMA, "--kv-tokens", "16384", "--max-num-seqs", "4",
                          "--prompt-tokens", str(prompt), "--output-tokens", "64", "--requests", "4",
                          "--concurrency", "4")["summary"]["tpot_ms"]["p50"] for prompt in (40, 1040)]
        self.assertAlmostEqual(steps[1] - steps[0], 4 * 1000 * 0.020, delta=1.0)  # 4 sequences, 1,000 more tokens each

    def test_a_vllm_servers_request_path_is_its_ttft_less_its_own_queue_and_prefill_time(self):
        with FakeEngine(QUICK_DECODE_MS, PREFILL_MS_PER_TOKEN, kind="vllm", request_path_ms=15.0) as engine:
            # one point: no intercept; the cap given, so no crowding probe
            profile = virtual_profile(engine, "--output-tokens", "8", "--repeat", "1", "--prefill-tokens", "400",
                                      "--context-tokens", "0", "--max-num-seqs", "4")
        # the fake's path and its HTTP; queue and prefill time are the histograms' in /metrics
        self.assertAlmostEqual(profile["request_overhead_ms"], 15.0 + FRONT_END_S * 1000, delta=EXACT)
        self.assertEqual(len(profile["prefill"]), 1)
        for point in profile["prefill"]:
            self.assertAlmostEqual(point["step_ms"], PREFILL_MS_PER_TOKEN * point["prompt_tokens"], delta=EXACT)

    def test_a_context_point_that_passes_the_servers_context_is_refused(self):
        with FakeEngine(DECODE_MS, slot_context_tokens=512) as engine:
            code, _, err = run_cli("profile", "--url", engine.url, "--output-tokens", "64", "--context-tokens", "500")
        self.assertEqual((code, err.strip()), (2, "servesim: error: --context-tokens 500: with --output-tokens 64 it passes "
                                                  "the server's 512-token context"))


class SequenceCapProbeTest(ScratchTest):
    """vLLM states no --max-num-seqs: profile finds it by crowding the server."""

    def test_profile_finds_a_vllm_servers_sequence_cap_and_compare_simulates_it(self):
        with FakeEngine(QUICK_DECODE_MS, slots=3, kind="vllm") as engine:
            profile = virtual_profile(engine, "--endpoint", "/v1/completions", "--output-tokens", "6", "--repeat", "1",
                                      "--prefill-tokens", "100,200")
            path = self.write("vllm.profile.json", profile)
            report = self.write("c4.json", run_json("loadgen", "--url", engine.url, "--endpoint", "/v1/completions",
                                                    "--requests", "6", "--concurrency", "4", "--max-tokens", "6",
                                                    "--quiet"))
        self.assertEqual((profile["server"]["kind"], profile["server"]["max_num_seqs"]), ("vllm", 3))
        self.assertEqual([point["batch"] for point in profile["decode"]], [1, 2, 3])
        self.assertEqual(profile["settings"]["cap_probe_requests"], 32)
        result = run_json("compare", report, "--step-profile", path, *GEMMA)
        self.assertEqual(result["scheduler"]["max_num_seqs"], 3)
        self.assertEqual(run_json("compare", report, "--step-profile", path, *GEMMA, "--max-num-seqs", "2")[
            "scheduler"]["max_num_seqs"], 2)

    def test_a_server_that_states_its_slots_is_not_crowded(self):
        with FakeEngine(DECODE_MS, slots=2) as engine:
            profile = virtual_profile(engine, "--output-tokens", "4", "--repeat", "1", "--prefill-tokens", "100")
        self.assertEqual((profile["settings"]["cap_probe_requests"], "max_num_seqs" in profile["server"]), (0, False))
        self.assertEqual([point["batch"] for point in profile["decode"]], [1, 2])


class ProfileStopsTest(ScratchTest):

    def test_ctrl_c_keeps_the_points_measured_and_exits_130(self):
        path = os.path.join(self.directory, "partial.json")
        with FakeEngine(DECODE_MS) as engine:
            child = start_interruptible("profile", "--url", engine.url, "--output-tokens", "40", "--repeat", "1",
                                        "--out", path)
            first = child.stderr.readline()
            child.send_signal(signal.SIGINT)
            _, err = child.communicate(timeout=60)
        self.assertTrue(first.startswith("profile: decode batch 1 (run 1 of 1): "), first)
        self.assertEqual(child.returncode, 130, err)
        with open(path, encoding="utf-8") as handle:
            profile = json.load(handle)
        self.assertFalse(profile["complete"])
        self.assertGreaterEqual(len(profile["decode"]), 1)
        self.assertIn("interrupted: the points above were measured, the rest were not", profile["notes"])

    def test_the_budget_skips_the_points_it_cannot_fit_and_says_so(self):
        with FakeEngine(DECODE_MS) as engine:
            result = virtual_profile(engine, "--output-tokens", "8", "--repeat", "1", "--prefill-tokens", "100",
                                     "--budget-s", "0.2")
        # the warm-up and batch 1 take 0.15 s of the fake's steps; batch 2 would take 0.11 s more
        self.assertEqual([point["batch"] for point in result["decode"]], [1])
        self.assertEqual([note for note in result["notes"] if note.startswith("decode batch") and "(run" in note],
                         [f"decode batch {batch} (run 1) skipped: it would pass --budget-s 0.2" for batch in (2, 3, 4)])


if __name__ == "__main__":
    unittest.main()


class ProfileDriftNoteTest(ScratchTest):
    """compare reads a single client's decode against the step profile's batch-1 step."""

    PROFILE = os.path.join(FIXTURES_DIR, "llamacpp", "profile.json")
    RUN = os.path.join(FIXTURES_DIR, "llamacpp", "c1.json")

    @staticmethod
    def drift(notes):
        """compare's notes but the one on the profile's noisy steps (the fixture's prefills were measured on a busy VM)."""
        return [note for note in notes if not note.startswith("the step profile measured")]

    def profile_with_batch_1_at(self, step_ms):
        with open(self.PROFILE, encoding="utf-8") as handle:
            profile = json.load(handle)
        profile["decode"][0]["step_ms"] = step_ms
        return self.write("p.json", profile)

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_a_single_client_decoding_off_its_profile_is_named_with_both_figures(self):
        report = run_json("compare", self.RUN, "--step-profile", self.PROFILE, *GEMMA)
        self.assertEqual(self.drift(report["notes"]), [
            "at concurrency 1 the server decoded 7% slower than the step profile prices it (26.9 against 25.0 ms "
            "a token), where one sequence's step is what a profile measures: most likely the machine's speed moved "
            "between the profile and the runs, and the other rows carry the same gap; a profile in each round of "
            "the runs, passed together (--step-profile P1,P2,...), shares the drift"])
        self.assertIn(report["notes"][0], run_cli("compare", self.RUN, "--step-profile", self.PROFILE, *GEMMA)[1])

    def test_a_single_client_within_five_percent_of_its_profile_is_not_remarked_on(self):
        path = self.profile_with_batch_1_at(26.0)  # the run decoded 26.9 ms a token
        self.assertEqual(self.drift(run_json("compare", self.RUN, "--step-profile", path, *GEMMA)["notes"]), [])

    def test_with_profiles_from_every_round_the_note_offers_no_more_profiles(self):
        report = run_json("compare", self.RUN, "--step-profile", f"{self.PROFILE},{self.PROFILE}", *GEMMA)
        self.assertTrue(report["notes"][0].endswith("than the step profiles price it (26.9 against 25.0 ms a token), "
                                                    "where one sequence's step is what a profile measures: most "
                                                    "likely the machine's speed moved during the runs, and the "
                                                    "other rows carry the same gap"), report["notes"])

    def test_a_run_of_several_clients_alone_says_nothing_of_drift(self):
        path = os.path.join(FIXTURES_DIR, "llamacpp", "c2.json")
        self.assertEqual(self.drift(run_json("compare", path, "--step-profile", self.PROFILE, *GEMMA)["notes"]), [])
