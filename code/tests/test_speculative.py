"""Speculative decoding: drafts verified k + 1 at a time, the draws, their cost and their counters."""

import json
import os
import tempfile
import unittest

from support import main, make_request, make_scheduler, run_cli, run_json, step

EAGLE_K3 = ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}', "--acceptance-rate", "0.7"]


def run_at(concurrency, *extra):
    """Llama-3.1-8B on an H100, 512-token prompts, 256 output tokens, one round of clients."""
    return run_json("simulate", "--concurrency", concurrency, "--requests", concurrency, "--prompt-tokens", "512",
                    "--output-tokens", "256", "--no-sensitivity", *extra)


class DraftVerifierTest(unittest.TestCase):

    def test_an_acceptance_of_0_accepts_nothing_and_of_1_every_draft(self):
        never, always = main.DraftVerifier(3, 0.0, 1), main.DraftVerifier(3, 1.0, 1)
        self.assertEqual([never.accept(3) for _ in range(5)], [0] * 5)
        self.assertEqual([always.accept(3), always.accept(2), always.accept(0)], [3, 2, 0])
        self.assertEqual((always.num_drafts, always.num_draft_tokens, always.num_accepted_tokens,
                          always.accepted_per_position), (3, 5, 5, [2, 2, 1]))

    def test_the_mean_tokens_per_step_is_the_geometric_series(self):
        verifier = main.DraftVerifier(3, 0.7, 7)
        num_steps = 40000
        tokens = sum(verifier.accept(3) + 1 for _ in range(num_steps))
        expected = main.tokens_per_verify_step(0.7, 3)
        self.assertAlmostEqual(expected, (1 - 0.7 ** 4) / 0.3)
        self.assertLess(abs(tokens / num_steps - expected), 0.03)  # about 7 standard errors
        # the i-th draft is accepted P^(i+1) of the time
        for position, share in enumerate(count / num_steps for count in verifier.accepted_per_position):
            self.assertLess(abs(share - 0.7 ** (position + 1)), 0.02, position)

    def test_the_same_seed_draws_the_same_runs(self):
        first, second = main.DraftVerifier(4, 0.6, 11), main.DraftVerifier(4, 0.6, 11)
        self.assertEqual([first.accept(4) for _ in range(50)], [second.accept(4) for _ in range(50)])

    def test_no_token_past_the_last_is_drafted(self):
        verifier = main.DraftVerifier(5, 0.9, 0)
        request = make_request(max_tokens=10)
        request.generated = 7
        self.assertEqual(verifier.num_to_draft(request), 2)  # tokens 9 and 10; the 8th comes from the target
        request.generated = 9
        self.assertEqual(verifier.num_to_draft(request), 0)


class TokensBetweenTest(unittest.TestCase):

    def test_tokens_that_arrive_together_are_spread_over_the_gap(self):
        self.assertEqual(main.tokens_between(1.0, 2.0, 4), [1.25, 1.5, 1.75, 2.0])
        self.assertEqual(main.tokens_between(1.0, 2.0, 1), [2.0])


class SchedulerSpeculationTest(unittest.TestCase):

    def test_a_decode_verifies_its_drafts_and_keeps_only_the_accepted_tokens_blocks(self):
        scheduler = make_scheduler(num_blocks=20, block_size=4, speculative_method="ngram", num_speculative_tokens=3,
                                   acceptance_rate=0.0)
        scheduler.add(make_request(0, prompt_tokens=7, max_tokens=10))
        self.assertEqual(step(scheduler), [(0, 7)])          # the prompt; the first token sampled
        request = scheduler.running[0]
        self.assertEqual((request.computed, len(request.blocks)), (7, 2))
        self.assertEqual(step(scheduler), [(0, 4)])          # the last token and 3 drafts: positions 7-10
        # every draft rejected: one new token, the drafts' block (positions 8-10 reach block 3) freed
        self.assertEqual((request.generated, request.computed, len(request.blocks)), (2, 8, 2))
        self.assertEqual(scheduler.pool.free_count(), 18)
        self.assertEqual(scheduler.drafts.num_draft_tokens, 3)

    def test_every_accepted_draft_is_a_token_and_output_lengths_never_change(self):
        scheduler = make_scheduler(num_blocks=20, block_size=4, speculative_method="ngram", num_speculative_tokens=3,
                                   acceptance_rate=1.0)
        scheduler.add(make_request(0, prompt_tokens=7, max_tokens=10))
        batches = [step(scheduler, float(index)) for index in range(4)]
        # the prompt (token 1), two verify steps of 3 drafts (tokens 2-5, 6-9), then a plain decode: the last
        # token is the target's own, so nothing is drafted for it
        self.assertEqual(batches, [[(0, 7)], [(0, 4)], [(0, 4)], [(0, 1)]])
        drafts = scheduler.drafts
        self.assertEqual((drafts.num_drafts, drafts.num_draft_tokens, drafts.num_accepted_tokens), (2, 6, 6))
        self.assertFalse(scheduler.has_work())
        self.assertEqual(scheduler.pool.free_count(), 20)


class SpeculationAcceptanceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.runs = {(concurrency, speculating): run_at(concurrency, *(EAGLE_K3 if speculating else ()))
                    for concurrency in (1, 128) for speculating in (False, True)}

    def gain(self, concurrency):
        return (self.runs[concurrency, False]["summary"]["tpot_ms"]["p50"]
                / self.runs[concurrency, True]["summary"]["tpot_ms"]["p50"])

    def test_eagle_k3_at_0_7_speeds_up_a_lone_request_1_6_to_2_6_times(self):
        self.assertTrue(1.6 <= self.gain(1) <= 2.6, self.gain(1))

    def test_the_gain_is_lower_at_concurrency_128(self):
        self.assertLess(self.gain(128), self.gain(1))
        self.assertGreater(self.gain(128), 1.0)

    def test_output_tokens_are_the_same_with_and_without(self):
        for concurrency in (1, 128):
            self.assertEqual(self.runs[concurrency, True]["summary"]["output_tokens"],
                             self.runs[concurrency, False]["summary"]["output_tokens"])

    def test_the_report_gives_tokens_per_step_and_acceptance(self):
        figures = self.runs[1, True]["engine"]["speculative"]
        self.assertEqual((figures["method"], figures["num_speculative_tokens"], figures["acceptance_rate"]),
                         ("eagle", 3, 0.7))
        # every token after the first: a verify step's accepted drafts and its own token, or a plain decode
        # (when one token is left, nothing is drafted)
        self.assertIn(figures["num_accepted_tokens"] + figures["num_drafts"], (254, 255))
        self.assertEqual(figures["tokens_per_verify_step"], 1 + figures["num_accepted_tokens"] / figures["num_drafts"])
        self.assertEqual(figures["measured_acceptance"], figures["num_accepted_tokens"] / figures["num_draft_tokens"])
        self.assertGreater(figures["draft_s"], 0)

    def test_replicas_that_drafted_nothing_add_nothing_to_the_fleets_figures(self):
        report = run_json("simulate", "--replicas", "2", "--requests", "1", "--concurrency", "1", "--output-tokens", "64",
                          "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}', "--no-sensitivity")
        idle, busy = sorted((replica["engine"]["speculative"] for replica in report["replicas"]["per_replica"]),
                            key=lambda figures: figures["num_drafts"])
        self.assertEqual((idle["num_drafts"], idle["measured_acceptance"]), (0, None))
        merged = report["engine"]["speculative"]
        self.assertEqual((merged["num_drafts"], merged["num_accepted_tokens"]), (busy["num_drafts"],
                                                                               busy["num_accepted_tokens"]))
        self.assertEqual(merged["measured_acceptance"], busy["measured_acceptance"])

    def test_the_eagle_head_and_its_kv_take_room_from_the_cache(self):
        plain, eagle = (self.runs[1, speculating]["capacity"] for speculating in (False, True))
        self.assertEqual(eagle["drafter"], "eagle head of llama-3.1-8b")
        self.assertEqual(eagle["draft_weight_bytes"], 8.03e9 / 32 * 2)
        self.assertEqual(eagle["draft_kv_bytes_per_token"], plain["kv_bytes_per_token"] / 32)
        self.assertLess(eagle["num_blocks"], plain["num_blocks"])


class SpeculationMetricsTest(unittest.TestCase):

    def test_prometheus_writes_vllms_counters_and_explain_reads_them(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "run.prom")
            report = run_json("simulate", "--concurrency", "2", "--requests", "4", "--output-tokens", "50",
                              "--prometheus", path, *EAGLE_K3)
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            figures = report["engine"]["speculative"]
            labels = 'engine="0",model_name="llama-3.1-8b"'
            for name, key in (("drafts", "num_drafts"), ("draft_tokens", "num_draft_tokens"),
                              ("accepted_tokens", "num_accepted_tokens")):
                self.assertIn(f"vllm:spec_decode_num_{name}_total{{{labels}}} {figures[key]}\n", text)
            for position, count in enumerate(figures["accepted_per_position"]):
                self.assertIn(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{position}"}} '
                              f"{count}\n", text)
            code, out, err = run_cli("explain", path, "--hardware", "h100-sxm-80gb", "--model", "llama-3.1-8b",
                                     "--json")
        self.assertEqual(code, 0, err)
        verdict = json.loads(out)["speculation"]
        self.assertTrue(verdict["pays"])
        self.assertIn(f"{1 + figures['num_accepted_tokens'] / figures['num_drafts']:.2f} tokens per verify step",
                      verdict["lines"][0])

    def test_explain_says_speculation_no_longer_pays_past_the_knee(self):
        evidence = main.Evidence()
        for name, value in (("spec_drafts", 1000), ("spec_draft_tokens", 3000), ("spec_accepted_tokens", 600),
                            ("max_running", 256), ("mean_prompt_tokens", 100)):
            evidence.put(name, value, name)
        plan = main.plan_capacity(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"])
        verdict = main.speculation_verdict(evidence, plan)
        self.assertFalse(verdict["pays"])
        self.assertTrue(verdict["lines"][1].startswith("no longer pays: 256 sequences verify 1,024 tokens a step"))


class SpeculativeFlagsTest(unittest.TestCase):

    def test_bad_speculative_settings_exit_2_naming_the_field(self):
        base = ["simulate", "--concurrency", "1", "--requests", "1"]
        cases = (
            (["--speculative-config", "{eagle}"], "--speculative-config: expected a JSON object"),
            (["--speculative-config", "[1]"], "--speculative-config: expected a JSON object"),
            (["--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}'], "method"),
            (["--speculative-config", '{"method": "eagle"}'], "num_speculative_tokens"),
            (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 33}'], "at most 32"),
            (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2, "disable_by_batch_size": 8}'],
             "'disable_by_batch_size' is not modelled"),
            (["--speculative-config", '{"method": "draft_model", "num_speculative_tokens": 2}'], "model"),
            (["--speculative-config", '{"method": "draft_model", "num_speculative_tokens": 2, "model": "nope"}'],
             "--speculative-config model nope: not a preset"),
            (["--acceptance-rate", "0.5"], "--acceptance-rate: give --speculative-config too"),
            (EAGLE_K3[:2] + ["--acceptance-rate", "1.5"], "argument --acceptance-rate"),
            (EAGLE_K3 + ["--scheduler", "llamacpp"], "--speculative-config with --scheduler llamacpp"),
            (EAGLE_K3 + ["--disaggregate"], "--speculative-config with --disaggregate"),
        )
        for extra, expected in cases:
            with self.subTest(extra=extra):
                code, out, err = run_cli(*base, *extra)
                self.assertEqual((code, out), (2, ""))
                self.assertIn(expected, err)
                self.assertEqual(err.count("\n"), 1)


if __name__ == "__main__":
    unittest.main()
