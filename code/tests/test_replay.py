"""loadgen --trace: a trace replayed on a real (here: fake, recording) server, and predicted."""

import json
import os
import unittest
from unittest import mock

from fake_server import FakeServer, counting_chat, counting_completion, word_tokens
from support import LateClock, ScratchTest, kernel_stamping, main, new_scheduler, run_cli


def rows_text(rows):
    return "".join(json.dumps(row) + "\n" for row in rows)


def contents(body):
    return [message["content"] for message in body["messages"]]


class ReplayTest(ScratchTest):

    def loadgen(self, server, trace, *argv):
        code, out, err = run_cli("loadgen", "--url", server.url, "--trace", trace, "--scrape-interval", "0.05",
                                 "--json", *argv)
        self.assertEqual((code, err), (0, ""))
        return json.loads(out)

    def test_each_request_goes_out_at_its_trace_time_however_late_the_wake_ups(self):
        rows = [{"arrival_s": round(index * 0.025 + (index % 3) * 0.006, 3), "prompt_tokens": 60, "output_tokens": 3}
                for index in range(40)]  # 1 s of uneven gaps, each longer than a late wake-up
        trace = self.write("t.jsonl", rows_text(rows))
        # NOTE: an injected clock, on which every sleep ends 3 ms late: sends on the trace's
        # absolute schedule are each 3 ms late; sleeping from one send to the next would add them up
        late = LateClock(late_s=0.003)
        real_load_run = main.LoadRun

        def late_load_run(plan, clock=None, sleep=None, on_event=None):
            return real_load_run(plan, clock=late.clock, sleep=late.sleep, on_event=on_event)
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server, \
                mock.patch.object(main, "LoadRun", late_load_run):
            report = self.loadgen(server, trace, "--json-requests")
            prompts = [contents(body)[0] for body in server.bodies[-40:]]  # after the probes that sized the prompts
        records = report["requests"]
        origin = records[0]["scheduled_s"]
        self.assertEqual([round(record["scheduled_s"] - origin, 9) for record in records],
                         [row["arrival_s"] for row in rows])
        # the first is due at once: no sleep, so not late
        self.assertEqual([round(record["sent_s"] - record["scheduled_s"], 9) for record in records],
                         [0.0] + [0.003] * 39)
        lateness = report["send_lateness_ms"]
        self.assertEqual((lateness["count"], round(lateness["p50"], 9), round(lateness["max"], 9)), (40, 3.0, 3.0))
        self.assertEqual(len(set(prompts)), 40)  # every request reached the server, once

    def test_shared_blocks_are_the_same_bytes_and_what_follows_differs(self):
        rows = [{"arrival_s": index * 0.01, "prompt_tokens": 400, "output_tokens": 2,
                 "prefix": "system-" + "abab"[index], "prefix_tokens": 256} for index in range(4)]
        trace = self.write("t.jsonl", rows_text(rows))
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            # NOTE: a fixed seed: with fresh words each run, the word after a shared block matches by chance now and then
            report = self.loadgen(server, trace, "--seed", "7")
            prompts = [contents(body)[0] for body in server.bodies[-4:]]
        per_word = report["replay"]["prompt_text"]["tokens_per_word"]
        shared_words = round(256 / per_word)
        def leading_words_in_common(a, b):
            return len(os.path.commonprefix([a.split(), b.split()]))
        self.assertTrue(prompts[0].startswith(prompts[2][:len(" ".join(prompts[2].split()[:shared_words]))]))
        self.assertEqual(leading_words_in_common(prompts[0], prompts[2]), shared_words)  # both system-a
        self.assertEqual(leading_words_in_common(prompts[1], prompts[3]), shared_words)  # both system-b
        self.assertEqual(leading_words_in_common(prompts[0], prompts[1]), 0)  # a and b share nothing

    def test_mooncake_blocks_with_the_same_leading_ids_share_their_text_and_no_more(self):
        rows = [{"timestamp": 0, "input_length": 1500, "output_length": 2, "hash_ids": [7, 8, 9]},
                {"timestamp": 10, "input_length": 1500, "output_length": 2, "hash_ids": [7, 8, 5]}]
        trace = self.write("m.jsonl", rows_text(rows))
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            report = self.loadgen(server, trace, "--length-scale", "0.25", "--seed", "7")  # 512-token blocks: 128
            first, second = (contents(body)[0] for body in server.bodies[-2:])
        per_word = report["replay"]["prompt_text"]["tokens_per_word"]
        block_words = round(128 / per_word)
        self.assertEqual(len(os.path.commonprefix([first.split(), second.split()])), 2 * block_words)  # two blocks
        self.assertEqual(report["replay"]["num_length_changes"], 2)

    def test_prompt_tokens_come_within_2_percent_of_the_trace_where_the_server_tokenizes(self):
        rows = [{"arrival_s": index * 0.01, "prompt_tokens": 200 + 97 * index, "output_tokens": 2}
                for index in range(10)]
        trace = self.write("t.jsonl", rows_text(rows))
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            replay = self.loadgen(server, trace)["replay"]
        self.assertEqual(replay["prompt_text"]["source"], "/tokenize")
        self.assertAlmostEqual(replay["achieved_prompt_tokens"] / replay["wanted_prompt_tokens"], 1, delta=0.02)
        with FakeServer(chat=counting_chat()) as server:  # no /tokenize: two probes' usage
            replay = self.loadgen(server, trace)["replay"]
        self.assertEqual(replay["prompt_text"]["source"], "usage")
        self.assertAlmostEqual(replay["achieved_prompt_tokens"] / replay["wanted_prompt_tokens"], 1, delta=0.02)

    def test_a_conversation_turn_carries_the_answers_the_server_returned(self):
        rows = [{"arrival_s": 0.0, "prompt_tokens": 80, "output_tokens": 2, "conversation": "c", "turn": 1},
                {"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 2, "conversation": "c", "turn": 2,
                 "think_s": 0.1},
                {"arrival_s": 0.0, "prompt_tokens": 30, "output_tokens": 2, "conversation": "c", "turn": 3}]
        trace = self.write("c.jsonl", rows_text(rows))

        def chat(index, body):
            return counting_chat(answer=(f"answer-{index}", " ok"))
        with FakeServer(chat=chat, per_request=True, tokenizer=word_tokens) as server:
            report = self.loadgen(server, trace)
            bodies, received = server.bodies[-3:], server.received_s[-3:]
            first = len(server.bodies) - 3  # the index the fake answered the first turn with
        self.assertEqual([len(body["messages"]) for body in bodies], [1, 3, 5])
        self.assertEqual([message["role"] for message in bodies[2]["messages"]],
                         ["user", "assistant", "user", "assistant", "user"])
        self.assertEqual(bodies[1]["messages"][1]["content"], f"answer-{first} ok")
        self.assertEqual(bodies[2]["messages"][3]["content"], f"answer-{first + 1} ok")
        self.assertEqual(contents(bodies[2])[:3], contents(bodies[1]))
        self.assertGreaterEqual(received[1] - received[0], 0.1)  # think time after turn 1 ended
        replayed = report["replay"]["requests"]
        self.assertEqual([row[4] for row in replayed], ["conversation c"] * 3)
        self.assertEqual([row[5] for row in replayed], [row[1] for row in replayed])  # the prefix: all so far

    def test_a_conversation_over_completions_sends_the_whole_conversation_as_one_prompt(self):
        rows = [{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 2, "conversation": "c", "turn": 1},
                {"arrival_s": 0.0, "prompt_tokens": 20, "output_tokens": 2, "conversation": "c", "turn": 2}]
        trace = self.write("c.jsonl", rows_text(rows))
        with FakeServer(chat=counting_completion(answer=("the", " answer")), tokenizer=word_tokens) as server:
            self.loadgen(server, trace, "--endpoint", "/v1/completions")
            first, second = server.bodies[-2:]
        self.assertEqual(second["prompt"].split("\n")[:2], [first["prompt"], "the answer"])
        self.assertEqual(len(second["prompt"].split("\n")), 3)

    def test_compare_predicts_the_very_requests_that_were_sent(self):
        rows = [{"arrival_s": index * 0.02, "prompt_tokens": 120 + 10 * index, "output_tokens": 2,
                 "prefix": "sys", "prefix_tokens": 64} for index in range(6)]
        trace = self.write("t.jsonl", rows_text(rows))
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            report = self.loadgen(server, trace, "--json-requests")
        records = report["requests"]
        replayed = report["replay"]["requests"]
        origin = min(record["scheduled_s"] for record in records)
        for row, record, trace_row in zip(replayed, records, rows):
            self.assertEqual(row[:4], [record["request_id"], record["prompt_tokens"], record["output_tokens"],
                                       record["scheduled_s"] - origin])
            self.assertEqual(row[4:8], ["sys", 64, [], 0])
            self.assertAlmostEqual(row[3], trace_row["arrival_s"], places=9)
        path = self.write("replay.json", report)
        spec = main.build_engine_spec(main.EngineArgs(hardware="cpu-2vcpu", model="gemma-3-270m-q4_k_m",
                                                      prefix_caching=True))
        predicted = main.predict_loadgen_run(main.read_measured_runs(path)[0][1], spec)
        self.assertEqual(predicted["summary"]["prompt_tokens"], sum(record["prompt_tokens"] for record in records))
        self.assertEqual(predicted["summary"]["num_requests"], 6)
        self.assertEqual(predicted["engine"]["prefix_hit_tokens"], 5 * 64)  # each later request hits the 64 shared
        code, out, err = run_cli("compare", path, "--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("trace t.jsonl", out)
        code, out, err = run_cli("compare", path, "--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m",
                                 "--prefix-caching")
        share = 5 * 64 / sum(record["prompt_tokens"] for record in records)  # the simulator's, same requests
        self.assertIn(f"prefix cache hits, server / simulated for the same requests: trace t.jsonl unknown / "
                      f"{share:.1%}", out)  # the fake server exports no /metrics

    def test_workers_split_the_streams_and_merge_one_report(self):
        rows = [{"arrival_s": index * 0.01, "prompt_tokens": 50, "output_tokens": 3} for index in range(12)]
        trace = self.write("t.jsonl", rows_text(rows))
        with kernel_stamping() as stamped, FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            report = self.loadgen(server, trace, "--workers", "2", "--json-requests")
            received = len(server.bodies)
        self.assertEqual(report["summary"]["num_completed"], 12)
        self.assertEqual([record["request_id"] for record in report["requests"]], list(range(12)))
        self.assertEqual(received, 12 + 1)  # and the one chat that measured the template's tokens
        self.assertEqual(report["settings"]["workers"], 2)
        self.assertGreater(report["reader_round_ms"]["count"], 0)
        if stamped:  # the workers' kernel-stamped reads come back too
            self.assertGreater(report["reader_delay_ms"]["count"], 0)

    def test_max_context_cuts_long_requests_and_says_how_many(self):
        rows = [{"arrival_s": 0.0, "prompt_tokens": tokens, "output_tokens": 500} for tokens in (100, 2000, 900)]
        trace = self.write("t.jsonl", rows_text(rows))
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            report = self.loadgen(server, trace, "--max-context", "1024")
            bodies = server.bodies[-3:]
        self.assertEqual(report["replay"]["num_length_changes"], 2)
        self.assertEqual(sorted(body["max_tokens"] for body in bodies), [256, 256, 500])


class ConversationSimulationTest(ScratchTest):

    def test_each_turn_is_sent_after_the_last_ends_with_the_conversation_as_its_prefix(self):
        rows = [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 3, "conversation": "c", "turn": 1},
                {"arrival_s": 0.0, "prompt_tokens": 50, "output_tokens": 3, "conversation": "c", "turn": 2,
                 "think_s": 1.5},
                {"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 3, "conversation": "c", "turn": 3}]
        requests = main.read_trace(self.write("c.jsonl", rows_text(rows)))
        engine = main.simulate(new_scheduler(main.SchedulerConfig(prefix_caching=True), 1000),
                               main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"], requests)
        first, second, third = requests
        self.assertEqual([r.prompt_tokens for r in requests], [100, 100 + 3 + 50, 153 + 3 + 40])
        self.assertAlmostEqual(second.sent_s, first.token_times[-1] + 1.5, places=9)
        self.assertAlmostEqual(third.sent_s, second.token_times[-1], places=9)
        # turn 2 finds turn 1's 6 full blocks (96 tokens); turn 3 turn 2's 9 (144)
        self.assertEqual(engine.scheduler.num_prefix_hit_tokens, 96 + 144)

    def test_a_turn_given_twice_or_with_a_prefix_exits_2(self):
        twice = [{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "conversation": "c", "turn": 1}] * 2
        self.assert_usage_error(("simulate", "--trace", self.write("a.jsonl", rows_text(twice))),
                                "conversation 'c' has a turn twice ([1, 1])")
        prefixed = [{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "conversation": "c", "turn": 1,
                     "prefix": "p", "prefix_tokens": 2}]
        self.assert_usage_error(("simulate", "--trace", self.write("b.jsonl", rows_text(prefixed))),
                                "a conversation turn cannot name a prefix")


if __name__ == "__main__":
    unittest.main()
