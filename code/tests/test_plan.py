"""plan: the cheapest configuration that meets the SLO, run here or on a batch system."""

import glob
import json
import os
import unittest

from support import ScratchTest, main, run_cli

# Llama 3.1 8B at 6 req/s (80 seeded requests) on three GPUs x TP 1,2 x 1,2 replicas: 12 points.
GRID = ("plan", "--model", "llama-3.1-8b", "--hardware", "l4-24gb,l40s-48gb,h100-sxm-80gb",
        "--tensor-parallel-size", "1,2", "--replicas", "1,2", "--rate", "6", "--requests", "80",
        "--slo-ttft-ms", "400", "--slo-tpot-ms", "20", "--quiet")


_RUNS = {}


def run_plan(*extra):
    """The plan's output with extra flags (each asked once per test run: a plan takes a second)."""
    if extra not in _RUNS:
        code, out, err = run_cli(*GRID, *extra)
        if code != 0:
            raise AssertionError(f"exit {code}: {err}")
        _RUNS[extra] = out
    return _RUNS[extra]


class PlanAnswerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.report = json.loads(run_plan("--jobs", "2", "--json"))

    def cost(self, entry):
        return entry["result"]["summary"]["cost"]["usd_per_million_output_tokens"]

    def test_the_answer_meets_the_slo_and_every_cheaper_point_misses_it(self):
        points = self.report["points"]
        answer = points[self.report["answer"]]
        self.assertEqual(answer["point"], {"hardware": "h100-sxm-80gb", "tensor_parallel_size": 1, "replicas": 1,
                                           "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                                           "prefix_caching": False, "disaggregate": False, "quantization": None})
        self.assertTrue(answer["meets"])
        cheaper = [entry for entry in points if self.cost(entry) < self.cost(answer)]
        # L40S TP 1 ($1.40/h, TPOT p95 39 ms), L4 TP 1 (overloaded) and L4 TP 2 ($1.42/h, TPOT 74 ms)
        self.assertEqual(sorted((entry["point"]["hardware"], entry["point"]["tensor_parallel_size"],
                                 entry["point"]["replicas"]) for entry in cheaper),
                         [("l4-24gb", 1, 1), ("l4-24gb", 2, 1), ("l40s-48gb", 1, 1)])
        self.assertFalse(any(entry["meets"] for entry in cheaper))
        next_cheaper = points[self.report["next_cheaper"]]
        self.assertEqual(self.cost(next_cheaper), max(self.cost(entry) for entry in cheaper))
        self.assertGreater(next_cheaper["result"]["summary"]["goodput"]["p95_ms"]["tpot_ms"], 20)

    def test_the_front_holds_no_point_another_beats_on_cost_and_latency(self):
        points = self.report["points"]

        def key(entry):
            figures = entry["result"]["summary"]["goodput"]["p95_ms"]
            return (self.cost(entry), figures["ttft_ms"], figures["tpot_ms"])
        front = self.report["pareto_front"]
        self.assertEqual([points[index]["point"]["hardware"] for index in front][:2], ["l40s-48gb", "h100-sxm-80gb"])
        for index in front:
            self.assertFalse(any(all(o <= k for o, k in zip(key(other), key(points[index])))
                                 and key(other) != key(points[index]) for other in points))
        dominated = [entry for entry in points if entry["index"] not in front]
        self.assertTrue(all(any(all(o <= k for o, k in zip(key(points[i]), key(entry))) for i in front)
                            for entry in dominated))

    def test_a_point_whose_one_sequence_step_takes_the_tpot_objective_is_bound_by_its_bandwidth(self):
        # an L40S reads 16 GB of weights a step at 864 GB/s: 19 ms, against a 20 ms objective;
        # sharded over two it reads half; an H100 reads them in 5 ms
        budgets = {(entry["point"]["hardware"], entry["point"]["tensor_parallel_size"], entry["point"]["replicas"]):
                   entry["result"]["binding"]["budget"] for entry in self.report["points"] if entry["result"]}
        bandwidth = "memory bandwidth (the weights every step reads)"
        self.assertEqual((budgets[("l40s-48gb", 1, 1)], budgets[("l40s-48gb", 1, 2)]), (bandwidth, bandwidth))
        self.assertNotEqual(budgets[("l40s-48gb", 2, 1)], bandwidth)
        self.assertNotIn(bandwidth, [budget for (hardware, _, _), budget in budgets.items() if hardware == "h100-sxm-80gb"])

    def test_the_text_report_names_the_answer_and_the_point_just_cheaper(self):
        lines = run_plan().splitlines()
        self.assertEqual(lines[:3], [
            "plan llama-3.1-8b for poisson 6 req/s, 80 requests at 6.45 req/s; SLO ttft <= 400 ms, tpot <= 20 ms at p95",
            "12 points: 0 do not fit, 12 simulated, 6 meet the SLO",
            "answer: 1 replica of h100-sxm-80gb, max-num-seqs 256, max-num-batched-tokens 8192, prefix caching off"])
        self.assertTrue(lines[4].startswith("the next cheaper, 1 replica of l4-24gb,"), lines[4])


class PlanRunsAnywhereTest(ScratchTest):

    def test_jobs_1_and_jobs_2_print_the_same_bytes(self):
        self.assertEqual(run_plan("--jobs", "1", "--json"), run_plan("--jobs", "2", "--json"))

    def test_emit_then_job_then_collect_gives_the_local_answer(self):
        local = run_plan("--jobs", "2", "--json")
        folder = os.path.join(self.directory, "grid")
        os.makedirs(folder)
        self.write("grid/job-0099.json", "{}")  # an earlier, bigger plan's: cleared
        self.write("grid/job-0099.result.json", "{}")
        code, out, err = run_cli(*GRID, "--emit", folder)
        self.assertEqual((code, err), (0, ""))
        self.assertIn(f"wrote {folder}/plan.json and 12 jobs (job-0000.json .. job-0011.json)", out)
        jobs = sorted(glob.glob(os.path.join(folder, "job-*.json")))
        self.assertEqual(len(jobs), 12)
        for job in reversed(jobs):  # any order, any host
            code, out, err = run_cli("simulate", "--job", job)
            self.assertEqual((code, err), (0, ""))
            self.assertTrue(out.endswith(f"wrote {job[:-5]}.result.json\n"), out)
        code, out, err = run_cli("plan", "--collect", folder, "--json")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(out, local)

    def test_collect_before_every_job_ran_exits_2_naming_the_first_missing(self):
        folder = os.path.join(self.directory, "grid")
        run_cli(*GRID, "--emit", folder)
        run_cli("simulate", "--job", os.path.join(folder, "job-0000.json"))
        self.assert_usage_error(("plan", "--collect", folder),
                                f"--collect {folder}: 11 of 12 jobs have no result yet (first: job-0001.result.json)")

    def test_a_damaged_job_exits_2(self):
        folder = os.path.join(self.directory, "grid")
        run_cli(*GRID, "--emit", folder)
        path = os.path.join(folder, "job-0003.json")
        with open(path) as handle:
            job = json.load(handle)
        job["workload_zlib"] = "bm90IHpsaWI="  # base64 of "not zlib"
        broken = self.write("broken.json", job)
        self.assert_usage_error(("simulate", "--job", broken), f"--job {broken}: the workload is damaged")
        job["workload_zlib"] = main.encode_rows([[0, 40, 8, 0.0, None, 0, [], 0, None, 0, 0.0]])
        job["spec"]["scheduler"]["max_num_seqs"] = 0
        self.assert_usage_error(("simulate", "--job", self.write("zero.json", job)),
                                "spec.scheduler.max_num_seqs must be a positive integer, got 0")
        job["spec"]["scheduler"]["max_num_seqs"], job["spec"]["gpu_memory_utilization"] = 8, 1e308
        self.assert_usage_error(("simulate", "--job", self.write("huge.json", job)),
                                "spec.gpu_memory_utilization must be a number in (0, 1], got 1e+308")
        self.assert_usage_error(("simulate", "--job", self.write("other.json", {"format": "x"})),
                                "not a servesim plan job")

    def test_flags_beside_a_job_would_be_ignored_so_they_exit_2(self):
        folder = os.path.join(self.directory, "grid")
        run_cli(*GRID, "--emit", folder)
        job = os.path.join(folder, "job-0000.json")
        self.assert_usage_error(("simulate", "--job", job, "--requests", "3", "--prefix-caching"),
                                f"--job {job}: it holds every setting; drop --prefix-caching, --requests")


class PlanInputsTest(ScratchTest):

    def test_points_that_do_not_fit_are_skipped_saying_why(self):
        code, out, err = run_cli("plan", "--model", "llama-3.1-70b", "--hardware", "h100-sxm-80gb,l40s-48gb",
                                 "--tensor-parallel-size", "1", "--replicas", "1", "--rate", "1", "--requests", "10",
                                 "--slo-ttft-ms", "1000", "--quiet")
        self.assertEqual(code, 1)  # nothing fits
        self.assertIn("2 points: 2 do not fit, 0 simulated, 0 meet the SLO\n", out)
        self.assertIn("  h100-sxm-80gb tp 1 (1 point): llama-3.1-70b does not fit on h100-sxm-80gb: weights 141.20 GB",
                      out)
        self.assertIn("  l40s-48gb tp 1 (1 point): llama-3.1-70b does not fit on l40s-48gb", out)

    def test_a_cache_too_small_for_the_longest_request_does_not_fit(self):
        code, out, err = run_cli("plan", "--model", "llama-3.1-8b", "--hardware", "l4-24gb", "--tensor-parallel-size",
                                 "1", "--replicas", "1", "--rate", "1", "--requests", "4", "--prompt-tokens", "40000",
                                 "--output-tokens", "10", "--slo-ttft-ms", "1000", "--quiet")
        self.assertEqual(code, 1)
        self.assertIn("the longest request (40,010 tokens) needs 2,501 KV blocks, the cache has 1,941", out)

    def test_disaggregated_points_use_two_engines_of_the_point(self):
        report = json.loads(run_cli("plan", "--model", "llama-3.1-8b", "--hardware", "h100-sxm-80gb",
                                    "--tensor-parallel-size", "1", "--replicas", "1", "--disaggregate", "--rate", "4",
                                    "--requests", "40", "--slo-ttft-ms", "1000", "--quiet", "--json")[1])
        disaggregated = report["points"][1]
        self.assertEqual((disaggregated["point"]["disaggregate"], report["num_points"]), (True, 2))
        self.assertEqual(disaggregated["result"]["summary"]["cost"]["num_devices"], 2)

    def test_plan_needs_objectives_a_workload_and_prices(self):
        self.assert_usage_error(("plan", "--rate", "1"), "plan: give the objectives")
        self.assert_usage_error(("plan", "--slo-ttft-ms", "100"), "plan: give the workload at its target load")
        self.assert_usage_error(("plan", "--hardware", "cpu-4vcpu", "--rate", "1", "--slo-ttft-ms", "100"),
                                "--hardware cpu-4vcpu: no price per device-hour; give --price-per-hour")
        self.assert_usage_error(("plan", "--hardware", "h100,b200", "--rate", "1", "--slo-ttft-ms", "100"),
                                "--hardware: expected hardware presets separated by commas")


if __name__ == "__main__":
    unittest.main()
