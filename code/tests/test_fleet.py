"""A fleet over time: rate schedules, autoscaling, replica failures, and pipeline, expert
and data parallelism."""

import math
import random
import unittest

from support import ScratchTest, main, run_cli, run_json
from test_fast_engine import differences

SMALL = ["--hardware", "h100-sxm-80gb", "--model", "llama-3.1-8b", "--prompt-tokens", "200-1000",
         "--output-tokens", "20-120", "--no-sensitivity"]


def parse(*argv):
    """simulate's parsed flags (for building engines and fleets in process)."""
    return main.build_parser().parse_args(["simulate", *map(str, argv)])


def fleet_run(policy, num_requests=300, rate=20.0, seed=0, router="least-loaded", timeout_s=None, argv=()):
    """A Fleet of policy over seeded requests: (the fleet, the requests, each request's finishes)."""
    args = parse("--rate", rate, *SMALL, *argv)
    spec = main.build_engine_spec(main.engine_args(args))
    requests = list(main.SyntheticWorkload(num_requests, (200, 1000), (20, 120), seed, rate))
    finishes = {}
    fleet = main.Fleet(spec.engine, main.Router(router), policy)
    fleet.run(requests, None, timeout_s, done=lambda request: finishes.__setitem__(
        request.request_id, finishes.get(request.request_id, 0) + 1))
    return fleet, requests, finishes


class RateScheduleTest(ScratchTest):

    def test_each_stretch_sends_at_its_own_rate_and_none_after_the_duration(self):
        schedule = ((0.0, 2.0), (100.0, 10.0), (200.0, 0.0), (300.0, 5.0))
        workload = main.SyntheticWorkload(0, (10, 10), (5, 5), 7, schedule=schedule, duration_s=400.0)
        arrivals = [request.arrival_s for request in workload]
        self.assertEqual(len(arrivals), len(workload))
        self.assertEqual(arrivals, sorted(arrivals))
        counts = [sum(start <= at < start + 100 for at in arrivals) for start in (0, 100, 200, 300)]
        for count, expected in zip(counts, (200, 1000, 0, 500)):  # Poisson: within five standard deviations
            self.assertLessEqual(abs(count - expected), 5 * math.sqrt(expected) + 1e-9, counts)
        self.assertLess(max(arrivals), 400.0)

    def test_a_seed_gives_the_same_requests_and_another_seed_others(self):
        def arrivals(seed):
            return [(r.arrival_s, r.prompt_tokens) for r in main.SyntheticWorkload(
                0, (10, 100), (5, 5), seed, schedule=((0.0, 3.0),), duration_s=50.0)]
        self.assertEqual(arrivals(1), arrivals(1))
        self.assertNotEqual(arrivals(1), arrivals(2))

    def test_simulate_runs_the_schedule_and_reports_it(self):
        report = run_json("simulate", "--rate-schedule", "0:1,30:4", "--duration-s", "60", *SMALL)
        arrivals = report["settings"]["arrivals"]
        self.assertEqual((arrivals["mode"], arrivals["schedule"], arrivals["duration_s"]),
                         ("schedule", [[0.0, 1.0], [30.0, 4.0]], 60.0))
        self.assertEqual(report["summary"]["num_completed"], report["settings"]["num_requests"])
        code, out, _ = run_cli("simulate", "--rate-schedule", "0:1,30:4", "--duration-s", "60", *SMALL)
        self.assertIn("poisson arrivals over 60 s at 1 req/s from 0 s, 4 req/s from 30 s", out.splitlines()[0])

    def test_bad_schedules_exit_2_naming_the_flag(self):
        for schedule in ("0:2,0:3", "5:2", "0:-1", "0:0,10:0", "0:2,x", "0:2;10:3", "0:inf"):
            with self.subTest(schedule=schedule):
                self.assert_usage_error(["simulate", "--rate-schedule", schedule, "--duration-s", "60"],
                                        "--rate-schedule", "START_S:RATE")
        self.assert_usage_error(["simulate", "--rate-schedule", "0:2"], "--duration-s")
        self.assert_usage_error(["simulate", "--rate-schedule", "0:2,100:4", "--duration-s", "50"],
                                "--duration-s 50", "last start, 100 s")
        self.assert_usage_error(["simulate", "--concurrency", "2", "--duration-s", "50"], "--duration-s",
                                "give --rate or --rate-schedule")
        self.assert_usage_error(["simulate", "--rate", "20", "--duration-s", "1e9"], "--rate 20 over --duration-s",
                                "at most 10,000,000")
        self.assert_usage_error(["simulate", "--rate-schedule", "0:10", "--duration-s", "1e9"],
                                "about 10,000,000,000 requests", "at most 10,000,000")


class FleetTest(ScratchTest):

    def test_a_fleet_pinned_at_n_gives_every_figure_of_n_fixed_replicas(self):
        for seed, n, router, engine in ((0, 2, "round-robin", "fast"), (1, 3, "least-loaded", "fast"),
                                        (2, 2, "prefix-affinity", "step"), (3, 4, "least-loaded", "step")):
            with self.subTest(seed=seed, replicas=n, router=router, engine=engine):
                argv = ["simulate", "--rate", "30", "--requests", "120", "--seed", seed, "--router", router,
                        "--engine", engine, "--prefix-caching", "--shared-prefix-tokens", "256", *SMALL]
                fixed = run_json(*argv, "--replicas", n)
                pinned = run_json(*argv, "--min-replicas", n, "--max-replicas", n)
                self.assertEqual(pinned["fleet"]["timeline"], [[0.0, n]])
                self.assertEqual(set(pinned), set(fixed) | {"fleet"})
                for key in fixed:  # settings, summary, engine, every replica's own, the step cost, ...
                    self.assertEqual(differences(fixed[key], pinned[key]), [], key)

    def test_the_fast_engine_gives_every_figure_of_the_step_engine_in_a_fleet_that_scales_and_fails(self):
        for seed, extra in ((0, ["--fail-replica", "20:0", "--restart-s", "15"]),
                            (1, ["--scale-metric", "waiting", "--fail-replica", "30", "--no-retry"]),
                            (2, ["--min-replicas", "0", "--router", "prefix-affinity", "--prefix-caching",
                                 "--shared-prefix-tokens", "300"])):
            argv = ["simulate", "--rate-schedule", "0:2,40:30,80:1", "--duration-s", "150", "--seed", seed,
                    "--max-replicas", "4", "--scale-target", "4", "--scale-up-delay-s", "10", "--scale-period-s", "5",
                    "--scale-down-delay-s", "20", "--router", "least-loaded", *extra, *SMALL]
            with self.subTest(seed=seed):
                step, fast = run_json(*argv, "--engine", "step"), run_json(*argv, "--engine", "fast")
                self.assertGreater(len(fast["fleet"]["timeline"]), 2)
                self.assertEqual(differences(step, fast), [])

    def test_a_failed_replicas_requests_are_retried_elsewhere_and_none_is_lost(self):
        report = run_json("simulate", "--rate", "8", "--requests", "1600", "--replicas", "2", "--fail-replica",
                          "100:0", "--restart-s", "30", *SMALL)
        fleet, summary = report["fleet"], report["summary"]
        self.assertGreater(fleet["retried"], 0)
        self.assertEqual((fleet["lost"], summary["num_completed"], summary["num_failed"]), (0, 1600, 0))
        self.assertEqual(fleet["timeline"][:3], [[0.0, 2], [100.0, 1], [130.0, 2]])
        self.assertEqual(fleet["failures"][0]["replica"], 0)
        self.assertEqual(fleet["failures"][0]["replacement"], 2)

    def test_without_retry_a_failed_replicas_requests_fail_with_the_reason(self):
        report = run_json("simulate", "--rate", "8", "--requests", "800", "--replicas", "2", "--fail-replica",
                          "50", "--restart-s", "10", "--no-retry", *SMALL)
        fleet, summary = report["fleet"], report["summary"]
        self.assertGreater(fleet["lost"], 0)
        self.assertEqual((fleet["retried"], summary["num_failed"]), (0, fleet["lost"]))
        self.assertEqual(summary["errors"], {"replica-failed": fleet["lost"]})

    def test_requests_wait_at_the_router_while_no_replica_is_up(self):
        policy = main.FleetPolicy(1, 1, 1, failures=((5.0, 0),), restart_s=20.0)
        fleet, requests, finishes = fleet_run(policy, num_requests=200, rate=10.0)
        self.assertEqual(fleet.timeline, [[0.0, 1], [5.0, 0], [25.0, 1]])
        waited = [r for r in requests if 5.0 <= r.sent_s < 25.0]
        self.assertTrue(waited)
        self.assertTrue(all(r.first_token_s >= 25.0 for r in waited))
        self.assertEqual(set(finishes.values()), {1})

    def test_a_failure_that_finds_no_replica_serving_is_said_and_changes_nothing(self):
        policy = main.FleetPolicy(2, 2, 2, failures=((10.0, 5), (1e6, None)))
        fleet, requests, finishes = fleet_run(policy, num_requests=100, rate=10.0)
        self.assertEqual(fleet.failures, [{"at_s": 10.0, "replica": 5, "skipped": "not serving then"},
                                          {"at_s": 1e6, "replica": None, "skipped": "after the run ended"}])
        self.assertEqual((fleet.timeline, fleet.num_retried), ([[0.0, 2]], 0))

    def test_a_replacement_that_starts_at_once_leaves_the_timeline_as_it_was(self):
        policy = main.FleetPolicy(2, 2, 2, failures=((3.0, 1),), restart_s=0.0)
        fleet, requests, finishes = fleet_run(policy, num_requests=100, rate=10.0)
        self.assertEqual(fleet.timeline, [[0.0, 2]])
        self.assertGreater(fleet.num_retried, 0)
        self.assertEqual((fleet.state[1], fleet.failures[0]["replacement"]), ("down", 2))
        self.assertEqual(set(finishes.values()), {1})

    def test_the_scaler_adds_replicas_under_load_serving_only_once_up_and_drains_them_after_the_window(self):
        policy = main.FleetPolicy(1, 6, 1, "running", 8.0, scale_up_delay_s=40.0, scale_down_delay_s=60.0,
                                  period_s=15.0)
        args = parse("--rate", "1", *SMALL)
        spec = main.build_engine_spec(main.engine_args(args))
        workload = main.SyntheticWorkload(0, (200, 1000), (20, 120), 3, schedule=((0.0, 2.0), (120.0, 25.0),
                                                                                 (240.0, 1.0)), duration_s=500.0)
        requests = list(workload)
        fleet = main.Fleet(spec.engine, main.Router("least-loaded"), policy)
        fleet.run(requests)
        counts = [count for _, count in fleet.timeline]
        self.assertGreater(max(counts), 1)
        self.assertEqual(counts[-1], 1)
        self.assertGreater(fleet.num_scale_ups, 0)
        self.assertEqual(fleet.num_scale_downs, fleet.num_scale_ups)
        first_rise_s = next(at_s for at_s, count in fleet.timeline if count > 1)
        self.assertGreaterEqual(first_rise_s, 120.0 + 40.0)  # asked for once the load came, up 40 s later
        for request in requests:
            index = fleet.replica_of[request]
            self.assertGreaterEqual(request.received_s, fleet.started_s[index] + (40.0 if index else 0.0))

    def test_a_fleet_that_may_scale_to_zero_does_when_idle_and_a_late_request_waits_for_its_cold_start(self):
        policy = main.FleetPolicy(0, 2, 1, "running", 8.0, scale_up_delay_s=40.0, scale_down_delay_s=60.0)
        spec = main.build_engine_spec(main.engine_args(parse("--rate", "1", *SMALL)))
        requests = list(main.SyntheticWorkload(0, (200, 1000), (20, 120), 5, schedule=(
            (0.0, 2.0), (60.0, 0.0), (1000.0, 2.0)), duration_s=1100.0))
        fleet = main.Fleet(spec.engine, main.Router("least-loaded"), policy)
        fleet.run(requests)
        zero_s = next(at_s for at_s, count in fleet.timeline if count == 0)
        self.assertTrue(120.0 <= zero_s < 1000.0, fleet.timeline)  # idle past the window, then none paid for
        late = min((r for r in requests if r.arrival_s >= 1000.0), key=lambda r: r.arrival_s)
        self.assertGreaterEqual(late.first_token_s - late.sent_s, 40.0)  # it waited for a replica to start
        self.assertTrue(all(r.error is None and r.generated == r.max_tokens for r in requests))
        self.assertLess(fleet.replica_seconds(), 0.5 * 1100.0)

    def test_the_scaler_at_most_doubles_or_adds_four_an_evaluation(self):
        policy = main.FleetPolicy(1, 20, 1, "waiting", 1.0, scale_up_delay_s=100.0, period_s=5.0)
        fleet, requests, finishes = fleet_run(policy, num_requests=300, rate=1000.0, argv=("--max-num-seqs", "2"))
        asked_at = [at_s for at_s in fleet.started_s if at_s > 0]
        self.assertEqual([asked_at.count(at_s) for at_s in (5.0, 10.0, 15.0)], [4, 5, 10])  # 1 -> 5 -> 10 -> 20
        self.assertEqual(set(finishes.values()), {1})

    def test_invariants_hold_over_many_random_fleets(self):
        """No request lost or served twice, across scale-downs, failures, retries and timeouts."""
        seen = {"retried": 0, "lost": 0, "scale_ups": 0, "scale_downs": 0, "timeouts": 0}
        for seed in range(40):
            rng = random.Random(seed)
            low = rng.randint(0, 2)
            policy = main.FleetPolicy(
                low, rng.randint(max(low, 1), 4), max(low, 1), rng.choice(main.SCALE_METRICS),
                rng.choice((0.3, 0.6)) if seed % 3 == 2 else rng.choice((2.0, 6.0, 20.0)),
                scale_up_delay_s=rng.choice((0.0, 5.0, 30.0)), scale_down_delay_s=rng.choice((0.0, 20.0)),
                period_s=rng.choice((1.0, 5.0)),
                failures=tuple(sorted((rng.uniform(0, 20), rng.choice((None, 0, 1, 2))) for _ in range(rng.randint(0, 3)))),
                restart_s=rng.choice((0.0, 3.0, 15.0)), retry=rng.random() < 0.7)
            if seed % 3 == 2:
                policy = main.FleetPolicy(**dict(main.asdict(policy), scale_metric="kv-usage"))
            timeout_s = rng.choice((None, None, 8.0))
            argv = ["--kv-tokens", rng.choice(("4096", "30000")), "--max-num-seqs", rng.choice(("4", "64"))]
            fleet, requests, finishes = fleet_run(policy, rng.randint(20, 120), rng.choice((4.0, 15.0, 40.0)), seed,
                                                  rng.choice(main.ROUTERS), timeout_s, argv)
            with self.subTest(seed=seed, policy=policy, timeout_s=timeout_s):
                self.assertEqual(sorted(finishes), [r.request_id for r in requests])
                self.assertEqual(set(finishes.values()), {1})  # each request done exactly once
                for request in requests:
                    if request.error is None:
                        self.assertEqual(request.generated, request.max_tokens)
                    else:
                        self.assertIn(request.error_kind, ("replica-failed", "timeout"))
                self.assertEqual(sum(r.num_retries for r in requests), fleet.num_retried)
                self.assertEqual(fleet.num_lost, sum(r.error_kind == "replica-failed" for r in requests))
                if policy.retry:
                    self.assertEqual(fleet.num_lost, 0)
                for engine in fleet.engines:  # no block held once the run is over
                    self.assertFalse(engine.scheduler.has_work())
                    self.assertEqual(engine.scheduler.pool.free_count(), engine.scheduler.pool.num_blocks)
                times = [at_s for at_s, _ in fleet.timeline]
                self.assertEqual(times, sorted(times))
                self.assertTrue(all(0 <= count <= policy.max_replicas for _, count in fleet.timeline))
                self.assertTrue(all(stopped is not None and stopped >= started
                                    for started, stopped in zip(fleet.started_s, fleet.stopped_s)))
            for name, count in (("retried", fleet.num_retried), ("lost", fleet.num_lost),
                                ("scale_ups", fleet.num_scale_ups), ("scale_downs", fleet.num_scale_downs),
                                ("timeouts", sum(r.error_kind == "timeout" for r in requests))):
                seen[name] += count
        self.assertTrue(all(seen.values()), seen)  # the seeds reach every path

    def test_bad_fleet_flags_exit_2_naming_the_flag(self):
        self.assert_usage_error(["simulate", "--rate", "2", "--max-replicas", "3"], "--scale-target")
        self.assert_usage_error(["simulate", "--rate", "2", "--min-replicas", "3"], "--min-replicas", "--max-replicas")
        self.assert_usage_error(["simulate", "--rate", "2", "--min-replicas", "0", "--fail-replica", "5"],
                                "--min-replicas 0", "--max-replicas")
        self.assert_usage_error(["simulate", "--rate", "2", "--max-replicas", "2", "--replicas", "3",
                                 "--scale-target", "4"], "min <= replicas <= max")
        self.assert_usage_error(["simulate", "--rate", "2", "--fail-replica", "x"], "--fail-replica", "AT_S")
        self.assert_usage_error(["simulate", "--rate", "2", "--max-replicas", "2", "--scale-metric", "kv-usage",
                                 "--scale-target", "80"], "--scale-target 80", "0 to 1")
        self.assert_usage_error(["simulate", "--rate", "2", "--fail-replica", "5", "--data-parallel-size", "2"],
                                "--data-parallel-size")
        self.assert_usage_error(["simulate", "--rate", "2", "--max-replicas", "2", "--scale-target", "4",
                                 "--scale-period-s", "0.001"], "--scale-period-s", "at most once a second")
        self.assert_usage_error(["simulate", "--rate", "2", "--max-replicas", "2", "--scale-target", "4",
                                 "--scale-up-delay-s", "1e9"], "--scale-up-delay-s", "at most 86,400")


class DayTest(ScratchTest):

    # L4s of four sequences each: a replica serves about 1.5 req/s, the peak needs four
    DAY = ["--hardware", "l4-24gb", "--tensor-parallel-size", "1", "--replicas", "1", "--max-num-seqs", "4",
           "--rate-schedule", "0:0.5,200:4,400:0.5", "--duration-s", "600", "--prompt-tokens", "500",
           "--output-tokens", "20", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "80", "--slo-attainment", "90",
           "--scale-up-delay-s", "2", "--scale-period-s", "2", "--scale-down-delay-s", "60", "--jobs", "1"]

    def test_plan_sizes_a_fixed_fleet_for_the_peak_and_finds_autoscaling_cheaper_over_the_day(self):
        day = run_json("plan", *self.DAY, "--scale-target", "1,2")["day"]
        (configuration,) = day["configurations"]
        fixed = configuration["candidates"][0]
        self.assertEqual((fixed["kind"], fixed["max_replicas"]), ("fixed", configuration["fixed_peak_replicas"]))
        self.assertGreater(configuration["fixed_peak_replicas"], 1)
        self.assertTrue(fixed["meets"])
        self.assertEqual([row["scale_target"] for row in configuration["candidates"][1:]], [1.0, 2.0])
        answer = day["answer"]
        self.assertEqual((answer["kind"], answer["fixed"]), ("autoscaling", fixed))
        self.assertTrue(answer["meets"])
        self.assertLess(answer["usd_per_day"], fixed["usd_per_day"])
        self.assertEqual(answer["usd_per_day"],
                         min(row["usd_per_day"] for row in configuration["candidates"] if row["meets"]))
        self.assertRegex(main.format_day_plan(day)[-1],
                         r"^answer: autoscaling on running (1|2) per replica of l4-24gb, max-num-seqs 4, [a-z0-9 ,-]+: "
                         r"\$[0-9.,]+ a day, [0-9]+% less than its fixed fleet of [0-9]+ sized for the peak")

    def test_plan_over_a_schedule_tries_every_configuration_and_says_why_one_is_skipped(self):
        day = run_json("plan", "--model", "llama-3.1-70b", "--hardware", "h100-sxm-80gb", "--tensor-parallel-size",
                       "1,2", "--replicas", "1", "--rate-schedule", "0:1", "--duration-s", "60", "--prompt-tokens",
                       "500", "--output-tokens", "20", "--slo-ttft-ms", "2000", "--scale-target", "4",
                       "--jobs", "1")["day"]
        self.assertEqual([c["point_text"] for c in day["configurations"]],
                         ["2 x h100-sxm-80gb, max-num-seqs 256, max-num-batched-tokens 8192, prefix caching off"])
        (reason,) = day["skipped"].values()
        self.assertIn("llama-3.1-70b does not fit on h100-sxm-80gb", reason)
        self.assertEqual((day["answer"]["kind"], day["answer"]["fixed_peak_replicas"]), ("fixed", 1))

    def test_plan_says_when_more_replicas_no_longer_help(self):
        code, out, _ = run_cli("plan", "--hardware", "l4-24gb", "--tensor-parallel-size", "1", "--replicas", "1",
                               "--rate-schedule", "0:1", "--duration-s", "30", "--prompt-tokens", "500",
                               "--output-tokens", "20", "--slo-ttft-ms", "1", "--jobs", "1")
        self.assertEqual(code, 1)
        self.assertIn("more replicas do not help", out)
        self.assertEqual(out.splitlines()[-1], "no fleet tried met the SLO over the whole day")

    def test_search_scales_every_rate_of_the_schedule(self):
        result = run_json("search", "--rate-schedule", "0:1,60:2", "--duration-s", "120", "--hardware", "l4-24gb",
                          "--prompt-tokens", "500", "--output-tokens", "20", "--max-num-seqs", "4", "--slo-ttft-ms",
                          "1000", "--jobs", "1", "--tolerance", "0.05")
        self.assertEqual(result["by"], "schedule multiple")
        run = result["run"]["settings"]["arrivals"]
        self.assertEqual((run["mode"], run["rate_scale"]), ("schedule", result["max_load"]))
        self.assertGreater(result["first_failing_load"], result["max_load"])
        expected = (1 * 60 + 2 * 60) * result["max_load"]  # every stretch's rate times the load
        self.assertLess(abs(result["run"]["settings"]["num_requests"] - expected), 5 * math.sqrt(expected))

    def test_the_html_page_charts_the_replicas_up_and_each_hour(self):
        page = self.write("fleet.html", "")
        code, _, err = run_cli("simulate", "--rate-schedule", "0:0.2,3500:2", "--duration-s", "3700",
                               "--min-replicas", "1", "--max-replicas", "4", "--scale-target", "2",
                               "--scale-up-delay-s", "30", "--slo-ttft-ms", "300", "--html", page, *SMALL)
        self.assertEqual((code, err), (0, ""))
        with open(page, encoding="utf-8") as handle:
            html = handle.read()
        self.assertIn("Replicas up", html)
        self.assertIn("SLO attainment by hour", html)


class ParallelismTest(ScratchTest):

    def test_deepseek_v3_fits_16_h100s_at_tp_8_pp_2_with_about_42_gb_each_where_tp_8_alone_does_not(self):
        code, _, err = run_cli("capacity", "--model", "deepseek-v3", "--tensor-parallel-size", "8")
        self.assertEqual(code, 1)
        self.assertIn("(--tensor-parallel-size 8 --pipeline-parallel-size 2 is the smallest that fits)", err)
        plan = run_json("capacity", "--model", "deepseek-v3", "--tensor-parallel-size", "8",
                        "--pipeline-parallel-size", "2")["capacity"]
        self.assertEqual((plan["num_devices"], plan["pipeline_parallel_size"]), (16, 2))
        self.assertAlmostEqual(plan["weight_bytes"] / 1e9, 42, delta=1.5)
        report = run_json("simulate", "--model", "deepseek-v3", "--tensor-parallel-size", "8",
                          "--pipeline-parallel-size", "2", "--rate", "2", "--requests", "40", "--no-sensitivity")
        self.assertEqual(report["summary"]["num_completed"], 40)
        self.assertEqual(report["summary"]["cost"]["num_devices"], 16)

    def test_a_pipeline_step_is_the_whole_models_step_plus_the_hand_overs(self):
        hardware, model = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        whole, staged = model.sharded(2), model.sharded(2, 2)  # 32 layers: two even stages
        self.assertEqual((staged.layers, staged.pipeline_parallel_size), (16, 2))
        self.assertAlmostEqual(staged.weight_bytes, whole.weight_bytes / 2)
        for num_tokens, context in ((1, 500), (64, 40_000), (2048, 2048)):
            hand_overs = main.pipeline_seconds(hardware, staged, num_tokens)
            self.assertGreater(hand_overs, 0)
            self.assertAlmostEqual(main.step_seconds(hardware, staged, num_tokens, context),
                                   main.step_seconds(hardware, whole, num_tokens, context) + hand_overs, places=12)
        within = main.pipeline_seconds(hardware, model.sharded(4, 2), 100)   # 8 devices: one server's NVLink
        across = main.pipeline_seconds(hardware, model.sharded(8, 2), 100)   # 16: over the NIC
        self.assertGreater(across, within)

    def test_the_hand_overs_and_all_to_alls_cost_what_their_bytes_and_latency_add_up_to(self):
        hardware = main.HARDWARE["h100-sxm-80gb"]  # 7.3 us per collective; NIC 50 GB/s, NVLink 450, at 0.25
        # TP 8 x PP 2 is 16 devices, two servers: one hand-over of 100 x 4,096 x 2 bytes over the NIC
        self.assertAlmostEqual(main.pipeline_seconds(hardware, main.MODELS["llama-3.1-8b"].sharded(8, 2), 100) * 1e6,
                               7.3 + 100 * 4096 * 2 / (50e9 * 0.25) * 1e6, places=6)  # 72.84 us
        # Qwen3-30B-A3B, experts over TP 2: 48 layers x (dispatch + combine) of 8 tokens x 8 experts x
        # 2,048 x 2 bytes, half of them leaving the device, over NVLink
        self.assertAlmostEqual(main.all_to_all_seconds(hardware, main.MODELS["qwen3-30b-a3b"].sharded(2, 1, 2), 8) * 1e6,
                               2 * 48 * (7.3 + 8 * 8 * 2048 * 2 / 2 / (450e9 * 0.25) * 1e6), places=6)  # 812.6 us

    def test_pipelined_sequences_go_as_micro_batches_that_win_back_compute_but_not_the_weight_read(self):
        hardware, model = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        whole, staged = model.sharded(1), model.sharded(1, 2)
        prefill = (8192, 8192, 4, 1, 4)  # four prompts of 2,048 tokens: compute-bound
        self.assertLess(main.step_seconds(hardware, staged, *prefill), 0.6 * main.step_seconds(hardware, whole, *prefill))
        # four decoding sequences: each pass reads its stage's weights, so the two micro-batches read
        # them twice, and the weight read is not won back; their KV reads (and FLOPs) split
        decode_whole, decode_staged = (main.step_cost_terms(hardware, spec, 4, 4, 4000) for spec in (whole, staged))
        self.assertAlmostEqual(decode_staged["weights_ms"], decode_whole["weights_ms"])
        self.assertAlmostEqual(decode_staged["kv_reads_ms"], decode_whole["kv_reads_ms"] / 2)
        self.assertEqual((decode_staged["bound"], decode_staged["micro_batches"]), ("memory", 2))
        self.assertEqual([main.step_cost_terms(hardware, staged, seqs, seqs, 100)["pipeline_bubble"]
                          for seqs in (1, 2, 8)], [0.5, 0.0, 0.0])
        self.assertNotIn("pipeline_bubble", main.step_cost_terms(hardware, whole, 1, 1, 100))

    def test_expert_parallelism_trades_the_expert_all_reduces_for_all_to_alls(self):
        hardware, model = main.HARDWARE["h100-sxm-80gb"], main.MODELS["qwen3-30b-a3b"]
        tp, ep = model.sharded(2), model.sharded(2, 1, 2)
        self.assertAlmostEqual(ep.weight_bytes, tp.weight_bytes)  # the same bytes, held as whole experts
        self.assertEqual(main.all_to_all_seconds(hardware, tp, 8), 0.0)
        self.assertGreater(main.all_to_all_seconds(hardware, ep, 8), 0.0)
        per_allreduce = main.allreduce_seconds(hardware, tp, 8) / (2 * tp.layers)
        self.assertAlmostEqual(main.allreduce_seconds(hardware, ep, 8),
                               per_allreduce * (2 * ep.layers - ep.num_moe_layers))
        over_dp = model.sharded(2, 1, 4)  # TP 2 x DP 2: each device's experts run both ranks' tokens
        self.assertAlmostEqual(over_dp.weight_bytes * 4, (model.params - model.routed_params) * 2 * model.bytes_per_param
                               + model.routed_params * model.bytes_per_param)
        self.assertAlmostEqual(over_dp.step_weight_bytes(4) - (over_dp.params - over_dp.routed_params) * 2,
                               over_dp.distinct_experts(8) * over_dp.expert_params * over_dp.num_moe_layers * 2)
        plan = run_json("capacity", "--model", "qwen3-30b-a3b", "--tensor-parallel-size", "2",
                        "--data-parallel-size", "2", "--enable-expert-parallel")["capacity"]
        self.assertEqual(plan["expert_parallel_size"], 4)

    def test_expert_parallelism_over_data_parallel_ranks_runs_their_tokens_through_the_experts_only(self):
        hardware, model = main.HARDWARE["h100-sxm-80gb"], main.MODELS["qwen3-30b-a3b"]
        tp, over_dp = model.sharded(2), model.sharded(2, 1, 4)  # experts over TP 2 x DP 2
        dense = lambda spec: 2 * (spec.body_params - spec.num_experts_per_tok * spec.expert_params  # noqa: E731
                                  * spec.num_moe_layers) * 8 / main.flop_rate(hardware, spec)
        # the dense part (attention, shared weights) is this rank's 8 tokens alone, as under TP
        self.assertAlmostEqual(dense(over_dp), dense(tp))
        experts = lambda spec: main.compute_seconds(hardware, spec, 8, 0) - dense(spec)  # noqa: E731
        # the experts run both ranks' 16 tokens, each device holding half the experts TP would: the same FLOPs
        self.assertAlmostEqual(experts(over_dp), experts(tp))

    def test_expert_parallelism_without_experts_or_a_second_device_exits_2(self):
        self.assert_usage_error(["capacity", "--model", "llama-3.1-8b", "--tensor-parallel-size", "2",
                                 "--enable-expert-parallel"], "--enable-expert-parallel", "no routed experts")
        self.assert_usage_error(["capacity", "--model", "qwen3-30b-a3b", "--enable-expert-parallel"],
                                "--enable-expert-parallel", "--data-parallel-size")

    def test_data_parallel_ranks_are_engines_behind_one_endpoint(self):
        argv = ["simulate", "--rate", "20", "--requests", "100", "--router", "least-loaded", *SMALL]
        replicas = run_json(*argv, "--replicas", "2")
        ranks = run_json(*argv, "--data-parallel-size", "2")
        self.assertEqual(differences(replicas["summary"], ranks["summary"]), [])
        self.assertEqual(ranks["settings"]["num_engines"], 2)
        code, out, _ = run_cli(*argv, "--data-parallel-size", "2")
        self.assertIn("on 2 engines (1 x data parallel 2) of h100-sxm-80gb routed least-loaded,", out.splitlines()[0])


if __name__ == "__main__":
    unittest.main()
