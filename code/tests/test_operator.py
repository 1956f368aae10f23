"""What an operator of vLLM, SGLang or llama.cpp types, taken as they mean it."""

import os
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
