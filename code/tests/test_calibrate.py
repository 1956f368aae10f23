"""compare and calibrate on reports the simulator writes itself, with known hardware."""

import json
import os
import tempfile
import unittest
from unittest import mock

from support import ScratchTest, main, run_cli, simulation_report, synthetic_requests

KNOWN = main.Hardware("known", memory_gib=16, bandwidth_gbs=30, tflops=0.2, mfu=1.0, mbu=1.0,
                      step_overhead_ms=3.0, reserve_gib=0.5)
MODEL = main.MODELS["smollm2-135m-q8_0"]
FLAGS = ("--model", "smollm2-135m-q8_0", "--kv-tokens", "4096", "--max-num-seqs", "8")


def simulated_report(concurrency, prompt_tokens=40, output_tokens=64, num_requests=8, hardware=KNOWN):
    """A loadgen-shaped report of a run the simulator made on known hardware."""
    plan = main.plan_capacity(hardware, MODEL, kv_tokens=4096)
    requests = synthetic_requests(num_requests, (prompt_tokens,) * 2, (output_tokens,) * 2, seed=0)
    scheduler = main.Scheduler(main.SchedulerConfig(max_num_seqs=8), plan.num_blocks)
    report = simulation_report(scheduler, hardware, MODEL, requests, concurrency)
    settings = {"url": "simulated", "model": MODEL.name, "mode": "closed", "concurrency": concurrency, "rate": None,
                "num_requests": num_requests, "max_tokens": output_tokens, "ignore_eos": True, "seed": 0}
    return {"settings": settings, "summary": report["summary"],
            "server": {"mean_batch": report["engine"]["mean_batch_seqs"]}}


class CalibrateTest(ScratchTest):

    def calibrate(self, *concurrencies):
        paths = [self.write(f"c{c}.json", simulated_report(c)) for c in concurrencies]
        return run_cli("calibrate", *paths, *FLAGS, "--hardware", "cpu-4vcpu", "--json")

    def assert_recovered(self, fitted):
        for name in ("bandwidth_gbs", "tflops", "step_overhead_ms"):
            self.assertAlmostEqual(fitted[name] / getattr(KNOWN, name), 1.0, delta=0.05, msg=name)

    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as directory:
            paths = []
            for concurrency in (1, 8):
                paths.append(os.path.join(directory, f"c{concurrency}.json"))
                with open(paths[-1], "w", encoding="utf-8") as handle:
                    json.dump(simulated_report(concurrency), handle)
            cls.fit = run_cli("calibrate", *paths, *FLAGS, "--hardware", "cpu-4vcpu", "--json")

    def test_two_reports_recover_the_hardware_that_made_them(self):
        code, out, err = self.fit
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assert_recovered(report["hardware"])
        self.assertEqual([(r["concurrency"], r["figure"]) for r in report["residuals"]],
                         [(1, "tpot p50"), (1, "ttft p50"), (8, "tpot p50")])
        self.assertTrue(all(abs(r["error"]) < 0.01 for r in report["residuals"]))

    def test_more_reports_are_a_least_squares_fit(self):
        code, out, _ = self.calibrate(1, 2, 8)
        self.assertEqual(code, 0)
        self.assert_recovered(json.loads(out)["hardware"])

    def test_the_fit_keeps_memory_and_reserve_of_the_base_and_folds_in_mfu_and_mbu(self):
        hardware = json.loads(self.fit[1])["hardware"]
        self.assertEqual((hardware["memory_gib"], hardware["reserve_gib"], hardware["mfu"], hardware["mbu"]),
                         (16.0, 0.5, 1.0, 1.0))
        self.assertEqual(hardware["name"], "cpu-4vcpu-calibrated")

    def test_out_writes_a_hardware_file_that_every_subcommand_loads(self):
        paths = [self.write(f"c{c}.json", simulated_report(c)) for c in (1, 8)]
        out_path = os.path.join(self.directory, "fitted.json")
        code, out, _ = run_cli("calibrate", *paths, *FLAGS, "--hardware", "cpu-4vcpu", "--name", "my-cpu",
                               "--out", out_path)
        with open(out_path, encoding="utf-8") as handle:
            self.assertEqual(json.load(handle)["name"], "my-cpu")
        self.assertEqual(code, 0)
        self.assertIn(f"wrote {out_path}", out)
        self.assertTrue(out.splitlines()[1].startswith('Hardware("my-cpu", memory_gib=16, bandwidth_gbs='))
        code, out, _ = run_cli("capacity", "--hardware-file", out_path, "--model", "smollm2-135m-q8_0")
        self.assertEqual(code, 0)
        self.assertIn("capacity smollm2-135m-q8_0 on my-cpu", out)

    def test_one_report_exits_2(self):
        code, out, err = self.calibrate(4)
        self.assertEqual((code, out), (2, ""))
        self.assertIn("calibrate needs at least two loadgen reports", err)

    def test_holding_a_figure_calibrate_does_not_know_exits_2(self):
        paths = [self.write(f"c{c}.json", simulated_report(c)) for c in (1, 8)]
        code, out, err = run_cli("calibrate", *paths, *FLAGS, "--hold", "memory,speed")
        self.assertEqual((code, out), (2, ""))
        self.assertEqual(err.splitlines()[-1], "servesim: error: argument --hold: expected figures from memory, "
                         "compute, attention, step_overhead_ms, layer_overhead_us, allreduce_latency_us, link, "
                         "request_overhead_ms, separated by commas, got 'memory,speed'")

    def test_holding_every_figure_the_runs_can_tell_apart_exits_2(self):
        paths = [self.write(f"c{c}.json", simulated_report(c)) for c in (1, 8)]
        code, out, err = run_cli("calibrate", *paths, *FLAGS, "--hardware", "cpu-4vcpu", "--hold",
                                 "step_overhead_ms,memory,compute")
        self.assertEqual((code, out, err), (2, "", "servesim: error: --hold step_overhead_ms,memory,compute: leaves "
                                                   "nothing to fit; these runs can tell apart memory, compute, "
                                                   "step_overhead_ms\n"))

    def test_reports_at_the_same_concurrency_exit_2(self):
        paths = [self.write(f"r{i}.json", simulated_report(4)) for i in range(2)]
        code, _, err = run_cli("calibrate", *paths, *FLAGS)
        self.assertEqual(code, 2)
        self.assertIn("every report ran at concurrency 4; calibrate needs two different concurrencies", err)

    def test_a_report_without_tpot_exits_2(self):
        paths = [self.write("c1.json", simulated_report(1, output_tokens=1)), self.write("c8.json", simulated_report(8))]
        code, _, err = run_cli("calibrate", *paths, *FLAGS)
        self.assertEqual(code, 2)
        self.assertIn("c1.json: no TPOT (requests of 1 output token)", err)

    def test_a_report_with_nothing_completed_exits_2(self):
        empty = simulated_report(1)
        empty["summary"]["num_completed"] = 0
        code, _, err = run_cli("calibrate", self.write("empty.json", empty), self.write("c8.json", simulated_report(8)),
                               *FLAGS)
        self.assertEqual(code, 2)
        self.assertIn("empty.json: no request completed", err)

    def test_a_report_that_completed_more_requests_than_it_sent_exits_2(self):
        report = simulated_report(1)
        completed = report["summary"]["num_completed"]
        report["summary"]["num_requests"] = 0
        code, _, err = run_cli("calibrate", self.write("odd.json", report), self.write("c8.json", simulated_report(8)),
                               *FLAGS)
        self.assertEqual((code, err.splitlines()), (2, [
            f"servesim: error: {self.directory}/odd.json: summary.num_completed {completed:,} exceeds "
            f"summary.num_requests 0; expected at most as many completed as sent"]))

    def test_a_report_asking_for_more_requests_than_any_run_holds_exits_2(self):
        report = simulated_report(1)
        report["summary"]["num_requests"] = 10 ** 30
        path = self.write("huge.json", report)
        code, _, err = run_cli("compare", path, *FLAGS)
        self.assertEqual((code, err), (2, f"servesim: error: {path}: summary.num_requests must be at most 10,000,000, "
                                          f"got {10 ** 30:,}\n"))

    def test_a_report_without_a_tpot_p50_exits_2_naming_it(self):
        report = simulated_report(1)
        report["summary"]["tpot_ms"] = {}
        path = self.write("no-p50.json", report)
        code, _, err = run_cli("calibrate", path, self.write("c8.json", simulated_report(8)), *FLAGS)
        self.assertEqual((code, err), (2, f"servesim: error: {path}: summary.tpot_ms.p50 is missing; calibrate fits "
                                          f"the TPOT of every report\n"))

    def test_an_open_loop_report_is_fitted_on_its_own_schedule(self):
        report = simulated_report(1)
        report["settings"].update(mode="open", rate=2.0)
        code, out, err = run_cli("calibrate", self.write("open.json", report), self.write("c8.json", simulated_report(8)),
                                 *FLAGS, "--json")
        self.assertEqual((code, err), (0, ""))
        self.assertEqual([(r["concurrency"], r["figure"]) for r in json.loads(out)["residuals"]],
                         [(None, "tpot p50"), (None, "ttft p50"), (8, "tpot p50")])

    def test_a_file_that_is_not_a_report_exits_2(self):
        path = self.write("other.json", {"hello": 1})
        code, _, err = run_cli("calibrate", path, path, *FLAGS)
        self.assertEqual(code, 2)
        self.assertIn("not a loadgen --json report", err)

    def test_a_bad_hardware_file_names_the_field(self):
        path = self.write("hw.json", {"name": "x", "memory_gib": 16, "bandwidth_gbs": -1})
        code, _, err = run_cli("capacity", "--hardware-file", path)
        self.assertEqual(code, 2)
        self.assertIn(f"--hardware-file {path}: bandwidth_gbs must be a positive number, got -1", err)


def simulated_vllm_bench(concurrency, num_requests=8):
    """A `vllm bench serve --save-result` JSON of a closed loop the simulator ran on known hardware."""
    summary = simulated_report(concurrency, num_requests=num_requests)["summary"]
    return {"backend": "vllm", "num_prompts": num_requests, "completed": summary["num_completed"],
            "request_rate": "inf", "max_concurrency": concurrency, "burstiness": 1.0,
            "total_input_tokens": summary["prompt_tokens"], "total_output_tokens": summary["output_tokens"],
            "output_throughput": summary["output_tok_per_s"],
            **{f"{kind}_{name}_ms": summary[f"{figure}_ms"][key] for name, figure in (("ttft", "ttft"), ("tpot", "tpot"))
               for kind, key in (("mean", "mean"), ("median", "p50"), ("p99", "p99"))}}


class VllmBenchCalibrateTest(ScratchTest):

    def test_vllm_bench_results_recover_the_hardware_that_made_them(self):
        paths = [self.write(f"bench-c{c}.json", simulated_vllm_bench(c)) for c in (1, 8)]
        code, out, err = run_cli("calibrate", *paths, *FLAGS, "--hardware", "cpu-4vcpu", "--no-async-scheduling",
                                 "--json")
        self.assertEqual((code, err), (0, ""))
        fitted = json.loads(out)["hardware"]
        for name in ("bandwidth_gbs", "tflops", "step_overhead_ms"):
            self.assertAlmostEqual(fitted[name] / getattr(KNOWN, name), 1.0, delta=0.05, msg=name)
        self.assertEqual(json.loads(out)["notes"], [])  # --model named the model fitted

    def test_a_fit_to_a_preset_no_flag_named_says_so_under_its_first_line(self):
        served = [dict(simulated_vllm_bench(c), model_id="org/served") for c in (1, 8)]
        code, out, err = run_cli("calibrate", *[self.write(f"b{c}.json", r) for c, r in zip((1, 8), served)],
                                 "--hardware", "h100-sxm-80gb", "--hold", "compute,step_overhead_ms", "--jobs", "1")
        self.assertEqual((code, err), (0, ""))
        self.assertTrue(out.splitlines()[0].startswith("calibrated h100-sxm-80gb-calibrated for llama-3.1-8b from 2 runs"))
        self.assertEqual(out.splitlines()[1], "org/served served the run; with no --model-dir, --model-file or "
                                              "--model the preset llama-3.1-8b stands in for it")


class CompareTest(ScratchTest):

    @mock.patch.object(main, "TEXT_WIDTH", 10 ** 6)  # one line per table row and note
    def test_a_report_compared_with_the_hardware_that_made_it_has_no_error(self):
        paths = [self.write(f"c{concurrency}.json", simulated_report(concurrency)) for concurrency in (1, 8)]
        hardware_path = self.write("known.json", {name: getattr(KNOWN, name) for name in main.HARDWARE_FIELDS})
        code, out, err = run_cli("compare", *paths, *FLAGS, "--hardware-file", hardware_path)
        report = json.loads(run_cli("compare", *paths, *FLAGS, "--hardware-file", hardware_path, "--json")[1])
        self.assertEqual((code, err), (0, ""))
        lines = out.splitlines()
        self.assertEqual(lines[0], "compare smollm2-135m-q8_0 on known (4,096 KV tokens, max-num-seqs 8) "
                                   "with loadgen at simulated; times in ms")
        self.assertEqual(lines[1].split(), ["measured", "|", "predicted", "|", "error"])
        self.assertEqual(lines[3].split()[-3:], ["+0%", "+0%", "+0%"])
        row = report["rows"][1]
        self.assertEqual((row["concurrency"], row["prompt_tokens"], row["output_tokens"]), (8, 40, 64))
        self.assertEqual(row["measured"], row["predicted"])


if __name__ == "__main__":
    unittest.main()
