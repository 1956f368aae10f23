"""The summary of a run: weighted distributions, one pass over records, workloads made as they are sent."""

import gc
import random
import unittest

from support import main


def repeated(values, weights):
    return [value for value, weight in zip(values, weights) for _ in range(weight)]


class WeightedDistributionTest(unittest.TestCase):

    def test_a_value_counts_as_often_as_its_weight_and_a_weightless_one_not_at_all(self):
        stats = main.distribution_ms([0.005, 0.001, 0.002, 0.003], [0, 1, 3, 1])
        self.assertEqual(stats, {"count": 5, "mean": 2.0, "p50": 2.0, "p90": 3.0, "p95": 3.0, "p99": 3.0, "max": 3.0})

    def test_weighted_figures_are_those_of_the_list_with_each_value_repeated(self):
        for seed in range(300):
            rng = random.Random(seed)
            values = [rng.choice((rng.uniform(-2.0, 2.0), 0.0, 1e-300, 0.5, 1.5, 1e300))
                      for _ in range(rng.randint(1, 30))]
            weights = [rng.choice((0, 1, 2, 5)) for _ in values]
            weighted, plain = main.distribution_ms(values, weights), main.distribution_ms(repeated(values, weights))
            if plain["count"]:
                self.assertAlmostEqual(weighted.pop("mean"), plain.pop("mean"), delta=1e-9 * abs(plain["max"]) + 1e-12)
            self.assertEqual(weighted, plain, seed)

    def test_no_weight_at_all_gives_no_figures(self):
        self.assertEqual(main.distribution_ms([0.1, 0.2], [0, 0]),
                         {"count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "max": None})


def record(request_id, sent_s, first_s, last_s, output_tokens, error=None):
    request = main.Request(request_id, 100, output_tokens, sent_s)
    request.sent_s, request.scheduled_s, request.generated = sent_s, sent_s + 0.01, output_tokens
    request.token_times = [first_s + (last_s - first_s) * i / max(1, output_tokens - 1) for i in range(output_tokens)]
    request.error, request.error_kind = error, None if error is None else "kv-cache"
    return request


class RunTotalsTest(unittest.TestCase):

    def test_the_summary_does_not_depend_on_the_order_requests_are_added_in(self):
        rng = random.Random(3)
        records = [record(index, index * 0.1, index * 0.1 + rng.uniform(0.05, 0.5), index * 0.1 + rng.uniform(1, 3),
                          rng.randint(1, 40), "refused" if index % 7 == 3 else None) for index in range(60)]
        forward = main.summarize(records, main.Slo(ttft_ms=300, tpot_ms=60))
        self.assertEqual(main.summarize(records[::-1], main.Slo(ttft_ms=300, tpot_ms=60)), forward)
        self.assertEqual((forward["num_completed"], forward["num_failed"], forward["errors"]), (51, 9, {"kv-cache": 9}))

    def test_failed_records_are_kept_in_the_order_added(self):
        totals = main.run_totals([record(0, 0, 0.1, 0.2, 2, "no"), record(1, 0, 0.1, 0.2, 2), record(2, 0, 0, 0, 1, "no")])
        self.assertEqual([r.request_id for r in totals.failed], [0, 2])


class StreamedWorkloadTest(unittest.TestCase):

    def test_every_pass_over_a_synthetic_workload_makes_the_same_requests_afresh(self):
        workload = main.SyntheticWorkload(50, (10, 90), (1, 30), seed=7, rate=4.0)
        first, second = list(workload), list(workload)
        self.assertEqual(len(workload), 50)
        self.assertEqual([(r.request_id, r.prompt_tokens, r.max_tokens, r.arrival_s) for r in first],
                         [(r.request_id, r.prompt_tokens, r.max_tokens, r.arrival_s) for r in second])
        self.assertFalse(any(a is b for a, b in zip(first, second)))
        closed = list(main.SyntheticWorkload(50, (10, 90), (1, 30), seed=7))
        self.assertEqual([(r.prompt_tokens, r.max_tokens) for r in closed], [(r.prompt_tokens, r.max_tokens) for r in first])
        self.assertEqual({r.arrival_s for r in closed}, {0.0})

    def test_a_streamed_run_holds_only_the_requests_in_flight_and_reports_as_a_listed_one(self):
        workload = main.SyntheticWorkload(1500, (20, 200), (1, 40), seed=1, rate=50.0)
        spec = main.build_engine_spec(main.EngineArgs())
        live = []

        class Counting(main.RunTotals):
            def add(self, request):
                super().add(request)
                if request.request_id % 300 == 0:
                    live.append(sum(isinstance(thing, main.Request) for thing in gc.get_objects()))
        original, main.RunTotals = main.RunTotals, Counting
        try:
            streamed = main.run_and_report(spec.engine(), workload, slo=main.Slo(ttft_ms=100))
        finally:
            main.RunTotals = original
        self.assertEqual(len(live), 5)
        self.assertLess(max(live), 200)  # about 40 running and a few waiting, of 1,500
        self.assertEqual(main.run_and_report(spec.engine(), list(workload), slo=main.Slo(ttft_ms=100)), streamed)


if __name__ == "__main__":
    unittest.main()
