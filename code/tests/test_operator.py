"""What an operator of vLLM, SGLang or llama.cpp types, taken as they mean it."""

import unittest

from support import main, run_cli, run_json


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
