"""What happens to a request on its way through a GPU server beside the step itself: vLLM's
async scheduling (a step is scheduled while the one before runs) and a client that gives up.

A hardware whose every step costs one second (a fixed overhead, the model too small to read)
makes the times literal.
"""

import unittest

from support import main, new_scheduler, run_cli, run_json

SECOND = main.Hardware("one-second-steps", memory_gib=16, bandwidth_gbs=1e9, tflops=1e9, mfu=1.0, mbu=1.0,
                       step_overhead_ms=1000.0, reserve_gib=0.0)
TINY = main.ModelSpec("tiny", params=1, layers=1, kv_heads=1, head_dim=1, bytes_per_param=1, kv_dtype_bytes=1)


def engine(async_scheduling, fast=False, num_blocks=100):
    config = main.SchedulerConfig(block_size=4, async_scheduling=async_scheduling)
    if fast:
        return main.FastEngine(main.Scheduler, config, num_blocks, SECOND, TINY)
    return main.Engine(new_scheduler(config, num_blocks), SECOND, TINY)


def first_token_s(request):
    return request.token_times[0] if request.token_times else request.first_token_s


class AsyncSchedulingTest(unittest.TestCase):

    def run_two(self, async_scheduling, fast=False):
        """A decodes from 0; B arrives half way through A's first step."""
        a, b = main.Request(0, 3, 10, 0.0), main.Request(1, 3, 2, 0.5)
        main.run_engine(engine(async_scheduling, fast), [a, b])
        return a, b

    def test_without_it_a_request_arriving_during_a_step_joins_the_next(self):
        _, b = self.run_two(False)
        self.assertAlmostEqual(b.scheduled_s, 1.0, places=6)
        self.assertAlmostEqual(first_token_s(b) - b.sent_s, 1.5, places=6)

    def test_with_it_the_next_step_was_already_scheduled_so_it_joins_the_one_after(self):
        for fast in (False, True):
            a, b = self.run_two(True, fast)
            self.assertAlmostEqual(b.scheduled_s, 2.0, places=6)
            self.assertAlmostEqual(first_token_s(b) - b.sent_s, 2.5, places=6)
            self.assertAlmostEqual(first_token_s(a), 1.0, places=6)  # the first request found the engine idle

    def test_an_idle_engine_or_one_with_nothing_left_running_admits_at_once(self):
        a, b = main.Request(0, 3, 1, 0.0), main.Request(1, 3, 1, 0.5)  # a ends with its first step
        main.run_engine(engine(True), [a, b])
        self.assertAlmostEqual(b.scheduled_s, 1.0, places=6)

    def test_vllm_scheduling_has_it_by_default_llama_cpp_does_not(self):
        vllm = run_json("simulate", "--concurrency", "1", "--requests", "2")["settings"]["scheduler"]
        llama = run_json("simulate", "--concurrency", "1", "--requests", "2", "--scheduler", "llamacpp",
                         "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096")
        off = run_json("simulate", "--concurrency", "1", "--requests", "2", "--no-async-scheduling")
        self.assertEqual([vllm["async_scheduling"], llama["settings"]["scheduler"]["async_scheduling"],
                          off["settings"]["scheduler"]["async_scheduling"]], [True, False, False])
        code, _, err = run_cli("simulate", "--concurrency", "1", "--scheduler", "llamacpp", "--async-scheduling",
                               "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--kv-tokens", "4096")
        self.assertEqual(code, 2)
        self.assertIn("--async-scheduling with --scheduler llamacpp", err)


class TimeoutTest(unittest.TestCase):

    def run_closed(self, timeout_s, fast=False):
        requests = [main.Request(index, 3, 10) for index in range(3)]
        run = engine(False, fast)
        totals = main.RunTotals()
        main.run_engine(run, requests, 1, None, totals.add, timeout_s)
        return requests, run, totals.summary(run.token_log)

    def test_a_request_past_the_clients_patience_is_aborted_and_its_blocks_freed_at_once(self):
        for fast in (False, True):
            requests, run, summary = self.run_closed(4.5, fast)
            self.assertEqual([r.error_kind for r in requests], ["timeout"] * 3)
            # each aborted at the first step boundary past its deadline, its client sending the next then
            self.assertEqual([r.sent_s for r in requests], [0.0, 4.5, 9.0])
            self.assertEqual([r.generated for r in requests], [5, 4, 5])
            self.assertEqual(run.scheduler.pool.free_count(), 100)
            self.assertEqual((summary["num_failed"], summary["num_completed"], summary["errors"]),
                             (3, 0, {"timeout": 3}))

    def test_a_patient_client_sees_every_request_finish(self):
        requests, _, summary = self.run_closed(100.0)
        self.assertEqual((summary["num_completed"], [r.error for r in requests]), (3, [None] * 3))

    def test_simulate_reports_the_failed_share_of_an_overloaded_run(self):
        report = run_json("simulate", "--rate", "32", "--requests", "400", "--prompt-tokens", "1000",
                          "--output-tokens", "20", "--request-timeout", "2", "--no-sensitivity")
        summary = report["summary"]
        self.assertGreater(summary["errors"]["timeout"], 100)
        self.assertGreater(summary["num_completed"], 50)
        self.assertEqual(summary["num_completed"] + summary["num_failed"], 400)
        self.assertEqual(report["settings"]["request_timeout_s"], 2.0)
        self.assertLessEqual(summary["e2e_ms"]["max"], 2000.0)


class SensitivityTest(unittest.TestCase):
    """How far a prediction moves with every step 5% cheaper and 5% dearer."""

    BASE = {"ttft mean": 100.0, "e2e mean": 1000.0, "failed share": 0.0}

    def bands(self, cheaper, dearer, base=None):
        return main.sensitivity(base or self.BASE, dict(self.BASE, **cheaper), dict(self.BASE, **dearer))

    def test_a_band_under_a_quarter_of_the_figure_says_nothing(self):
        bands = self.bands({"ttft mean": 90.0, "e2e mean": 950.0}, {"ttft mean": 114.0, "e2e mean": 1060.0})
        self.assertEqual((bands["ttft mean"]["band"], bands["note"]), (0.24, None))
        self.assertAlmostEqual(bands["e2e mean"]["band"], 0.11)

    def test_a_wide_band_is_said_in_words_whichever_way_it_moves(self):
        # past saturation dearer steps fail the slowest requests, so the successes' TTFT may fall
        bands = self.bands({"ttft mean": 130.0}, {"ttft mean": 90.0})
        self.assertAlmostEqual(bands["ttft mean"]["band"], 0.4)
        self.assertEqual(bands["note"], "near saturation: a step cost 5% off either way moves TTFT by 40%; trust this "
                                        "prediction only as far as the step cost is known")

    def test_a_failed_share_that_moves_more_than_ten_points_is_said_too(self):
        bands = self.bands({"failed share": 0.0}, {"failed share": 0.26}, dict(self.BASE, **{"failed share": 0.147}))
        self.assertEqual(bands["failed share"], {"step_cost_minus_5pct": 0.0, "step_cost_plus_5pct": 0.26, "band": 0.26})
        self.assertEqual(bands["note"], "near saturation: a step cost 5% off either way moves the failed share from 0% "
                                        "to 26%; trust this prediction only as far as the step cost is known")
        self.assertIsNone(self.bands({"failed share": 0.05}, {"failed share": 0.14})["note"])  # 9 points


if __name__ == "__main__":
    unittest.main()
