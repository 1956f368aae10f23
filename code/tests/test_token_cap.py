"""--max-tokens-in-flight (the lesson's Easy exercise): a cap on running requests' tokens."""

import json
import os
import unittest

from support import FIXTURES_DIR, main, make_request, make_scheduler, new_scheduler, run_cli, step

BURST = os.path.join(FIXTURES_DIR, "burst.jsonl")


def four_900_token_requests():
    return [main.Request(index, 900, 50, 0.0) for index in range(4)]


def run(cap):
    config = main.SchedulerConfig(max_tokens_in_flight=cap)
    plan = main.plan_capacity(main.HARDWARE["l4-24gb"], main.MODELS["llama-3.1-8b"])
    requests = four_900_token_requests()
    engine = main.simulate(new_scheduler(config, plan.num_blocks), plan.hardware, plan.model, requests)
    return engine, requests


class TokenCapTest(unittest.TestCase):

    def test_a_2000_token_cap_runs_two_of_four_900_token_requests_and_queues_the_others(self):
        engine, requests = run(2000)
        self.assertEqual(engine.max_batch_seqs, 2)
        queued = [request for request in requests if request.queue_s > 0]
        self.assertEqual([request.request_id for request in queued], [2, 3])
        self.assertTrue(all(request.generated == 50 for request in requests))

    def test_without_the_cap_all_four_run_at_once(self):
        engine, requests = run(None)
        self.assertEqual(engine.max_batch_seqs, 4)
        self.assertEqual([request.queue_s for request in requests], [0.0] * 4)

    def test_the_cap_counts_current_lengths_including_generated_tokens(self):
        scheduler = make_scheduler(num_blocks=40, max_tokens_in_flight=20)
        self.assertIsInstance(scheduler, main.TokenCapScheduler)
        scheduler.add(make_request(0, prompt_tokens=10, max_tokens=5))
        self.assertEqual(step(scheduler), [(0, 10)])         # length 11 after the first token
        scheduler.add(make_request(1, prompt_tokens=10, max_tokens=2))
        self.assertEqual(step(scheduler), [(0, 1)])          # 11 + 10 > 20: request 1 waits
        scheduler.waiting[0].prompt_tokens = 8               # 12 + 8 = 20 fits
        self.assertEqual(step(scheduler), [(0, 1), (1, 8)])

    def test_a_request_longer_than_the_cap_runs_alone(self):
        scheduler = make_scheduler(num_blocks=40, max_tokens_in_flight=8)
        scheduler.add(make_request(0, prompt_tokens=12, max_tokens=1))
        scheduler.add(make_request(1, prompt_tokens=4, max_tokens=1))
        self.assertEqual([step(scheduler), step(scheduler)], [[(0, 12)], [(1, 4)]])

    def test_sweep_shows_the_cap_removing_preemptions_on_the_burst_at_the_price_of_ttft(self):
        code, out, err = run_cli("sweep", "--hardware", "l4-24gb", "--trace", BURST,
                                 "--max-tokens-in-flight", "24000,1000000", "--json")
        self.assertEqual((code, err), (0, ""))
        capped, uncapped = json.loads(out)["runs"]
        self.assertEqual(capped["engine"]["num_preemptions"], 0)
        self.assertGreater(uncapped["engine"]["num_preemptions"], 0)
        self.assertGreater(capped["summary"]["ttft_ms"]["p50"], uncapped["summary"]["ttft_ms"]["p50"])
        self.assertEqual(capped["settings"]["scheduler"]["max_tokens_in_flight"], 24000)

    def test_sweep_table_has_a_column_for_the_cap(self):
        code, out, _ = run_cli("sweep", "--hardware", "l4-24gb", "--trace", BURST, "--max-tokens-in-flight", "24000")
        lines = out.splitlines()
        self.assertEqual(lines[0], f"sweep llama-3.1-8b on l4-24gb trace {BURST} (48 requests)")
        self.assertEqual(lines[1].split()[:3], ["trace", "tokens", "cap"])
        self.assertEqual(lines[2].split()[:2], ["trace", "24,000"])


if __name__ == "__main__":
    unittest.main()
