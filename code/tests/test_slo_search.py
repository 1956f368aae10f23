"""SLOs, goodput and search: the most load that meets the SLO."""

import json
import os
import tempfile
import unittest

from support import FIXTURES_DIR, main, run_cli, run_json


def measured(request_id, ttft_ms, tpot_ms, num_tokens=5, sent_s=0.0):
    """A finished request with a known TTFT and TPOT."""
    first = sent_s + ttft_ms / 1000
    times = [first + index * tpot_ms / 1000 for index in range(num_tokens)]
    return main.MeasuredRequest(request_id, sent_s=sent_s, chunk_times=list(times), token_times=times,
                                prompt_tokens=10, output_tokens=num_tokens)


def four_and_a_failure():
    records = [measured(0, 100, 10), measured(1, 300, 20), measured(2, 500, 30), measured(3, 700, 40)]
    failed = main.MeasuredRequest(4, sent_s=0.0)
    failed.fail("http 503", "overloaded")
    return records + [failed]


class GoodputTest(unittest.TestCase):

    def test_goodput_counts_requests_meeting_every_objective_worked_by_hand(self):
        summary = main.summarize(four_and_a_failure(), main.Slo(ttft_ms=400, tpot_ms=25))
        good = summary["goodput"]
        # Requests 0 and 1 meet both; 2 and 3 miss both; 4 failed. The span runs from the
        # first send (0 s) to the last token (0.7 s + 4 x 40 ms = 0.86 s).
        self.assertEqual((good["num_met"], good["attainment"]), (2, 0.4))
        self.assertAlmostEqual(good["req_per_s"], 2 / 0.86)
        # p95 of five values is the fifth: the failure, counted as infinitely slow.
        self.assertEqual(good["p95_ms"], {"ttft_ms": float("inf"), "tpot_ms": float("inf")})
        self.assertFalse(good["meets"])

    def test_the_percentile_decides_whether_the_run_meets_the_slo(self):
        good = main.summarize(four_and_a_failure(), main.Slo(ttft_ms=600, tpot_ms=35, percentile=50))["goodput"]
        # p50 of five is the third: TTFT 500 ms, TPOT 30 ms, both within.
        self.assertAlmostEqual(good["p50_ms"]["ttft_ms"], 500.0)
        self.assertAlmostEqual(good["p50_ms"]["tpot_ms"], 30.0)
        self.assertTrue(good["meets"])

    def test_attainment_judges_the_share_of_requests_as_distserve_does(self):
        slo = main.Slo(ttft_ms=400, tpot_ms=25, attainment=40)
        self.assertTrue(main.summarize(four_and_a_failure(), slo)["goodput"]["meets"])
        slo = main.Slo(ttft_ms=400, tpot_ms=25, attainment=41)
        self.assertFalse(main.summarize(four_and_a_failure(), slo)["goodput"]["meets"])

    def test_a_one_token_answer_has_no_tpot_to_miss(self):
        good = main.summarize([measured(0, 100, 0, num_tokens=1)], main.Slo(ttft_ms=200, tpot_ms=1))["goodput"]
        self.assertEqual(good["num_met"], 1)

    def test_simulate_prints_goodput_and_the_verdict(self):
        code, out, _ = run_cli("simulate", "--concurrency", "4", "--requests", "16", "--slo-ttft-ms", "1000",
                               "--slo-tpot-ms", "20")
        lines = [line for line in out.splitlines() if not line.startswith(("mean step", "step cost"))]
        self.assertRegex(lines[-3], r"^goodput 16/16 requests met ttft <= 1000 ms, tpot <= 20 ms \(100\.0%\): "
                                    r"\d+\.\d\d req/s$")
        self.assertRegex(lines[-2], r"^slo met at p95: ttft p95 \d+\.\d ms, tpot p95 \d+\.\d ms$")
        self.assertTrue(lines[-1].startswith("steps priced by the roofline of h100-sxm-80gb at efficiencies fitted to "))

    def test_sweep_and_simulate_json_carry_goodput_on_one_code_path(self):
        report = run_json("sweep", "--concurrency", "1,4", "--requests", "8", "--slo-ttft-ms", "1000",
                          "--slo-attainment", "90")
        for run in report["runs"]:
            self.assertEqual(run["summary"]["goodput"]["criterion"], "attainment >= 90%")

    def test_slo_flags_that_cannot_work_exit_2(self):
        for argv, fragment in ((("--slo-attainment", "90"), "give the objectives too"),
                               (("--slo-ttft-ms", "9", "--slo-percentile", "90", "--slo-attainment", "90"),
                                "not allowed with"),
                               (("--slo-ttft-ms", "9", "--slo-percentile", "0"), "a percentile in (0, 100]")):
            code, _, err = run_cli("simulate", "--concurrency", "1", "--requests", "2", *argv)
            self.assertEqual(code, 2, argv)
            self.assertIn(fragment, err)


class SearchTest(unittest.TestCase):
    WORKLOAD = ("--hardware", "l4-24gb", "--prompt-tokens", "500-1500", "--output-tokens", "50-150",
                "--requests", "120", "--seed", "3")
    SLO = ("--slo-ttft-ms", "1500", "--slo-tpot-ms", "110")

    def test_search_finds_a_rate_that_meets_the_slo_while_ten_percent_more_does_not(self):
        result = run_json("search", *self.WORKLOAD, *self.SLO)
        rate = result["max_load"]
        self.assertIsNotNone(rate)
        self.assertTrue(result["run"]["summary"]["goodput"]["meets"])
        self.assertLessEqual(result["first_failing_load"] / rate, 1.01)
        at = run_json("simulate", *self.WORKLOAD, *self.SLO, "--rate", rate)
        above = run_json("simulate", *self.WORKLOAD, *self.SLO, "--rate", rate * 1.1)
        self.assertTrue(at["summary"]["goodput"]["meets"])
        self.assertFalse(above["summary"]["goodput"]["meets"])

    def test_search_is_reproducible(self):
        first = run_cli("search", *self.WORKLOAD, *self.SLO, "--json")
        self.assertEqual(first, run_cli("search", *self.WORKLOAD, *self.SLO, "--json"))

    def test_search_by_concurrency_gives_a_client_count(self):
        result = run_json("search", *self.WORKLOAD, *self.SLO, "--by", "concurrency")
        clients = result["max_load"]
        self.assertEqual(clients, int(clients))
        self.assertEqual(result["first_failing_load"], clients + 1)
        self.assertEqual(result["run"]["settings"]["arrivals"], {"mode": "closed", "concurrency": int(clients)})

    def test_search_on_a_trace_finds_a_speed_up(self):
        result = run_json("search", "--hardware", "l4-24gb", "--trace", os.path.join(FIXTURES_DIR, "burst.jsonl"),
                          "--prefix-caching", "--slo-ttft-ms", "3000", "--start-load", "0.25")
        self.assertEqual(result["by"], "trace speed-up")
        self.assertTrue(1.7 < result["max_load"] < 1.8)  # 48 requests in 2 s instead of 3.5
        self.assertTrue(result["run"]["summary"]["goodput"]["meets"])
        self.assertFalse(result["failing_run"]["summary"]["goodput"]["meets"])

    def test_search_says_what_gives_way_just_above_the_answer(self):
        code, out, _ = run_cli("search", *self.WORKLOAD, *self.SLO)
        self.assertEqual(code, 0)
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("search llama-3.1-8b on l4-24gb: the most load meeting TTFT p95 <= "
                                            "1500 ms and TPOT p95 <= 110 ms"))
        self.assertRegex(lines[1], r"^answer [\d.]+ req/s \(\d+ runs; [\d.]+ req/s fails\)$")
        self.assertTrue(any(line.startswith("what gives way at ") for line in lines))

    def test_search_without_objectives_exits_2(self):
        code, _, err = run_cli("search", *self.WORKLOAD)
        self.assertEqual(code, 2)
        self.assertIn("search: give the objectives", err)

    def test_a_trace_cannot_be_searched_by_concurrency(self):
        code, _, err = run_cli("search", "--trace", os.path.join(FIXTURES_DIR, "burst.jsonl"), "--by", "concurrency",
                               "--slo-ttft-ms", "1000")
        self.assertEqual(code, 2)
        self.assertIn("--by concurrency: a trace has its own arrivals", err)

    def test_the_bisection_brackets_then_narrows(self):
        calls = []

        def meets(load):
            calls.append(load)
            return load <= 7.3
        passing, failing, runs = main.search_max_load(meets, 1.0, tolerance=0.01)
        self.assertEqual(calls[:4], [1.0, 2.0, 4.0, 8.0])
        self.assertTrue(passing <= 7.3 < failing <= passing * 1.01)
        self.assertEqual(runs, len(calls))
        self.assertEqual(main.search_max_load(lambda load: load <= 5, 1.0, integer=True)[:2], (5.0, 6.0))
        self.assertEqual(main.search_max_load(lambda load: False, 4.0, integer=True)[:2], (None, 1.0))


if __name__ == "__main__":
    unittest.main()
