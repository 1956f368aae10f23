"""Trace formats: the project's JSON Lines, the Azure and BurstGPT CSVs and the Mooncake JSON Lines."""

import gzip
import importlib
import json
import os
import tempfile
import unittest
from unittest import mock

from support import ScratchTest, main, make_scheduler, run_cli, run_json, step

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:56.0000000,91,16
"""


def mooncake_line(timestamp_ms, input_length, output_length, hash_ids):
    return json.dumps({"timestamp": timestamp_ms, "input_length": input_length, "output_length": output_length,
                       "hash_ids": hash_ids}) + "\n"


class TraceTest(ScratchTest):

    def test_azure_csv_arrivals_count_from_the_first_wall_clock_timestamp(self):
        requests = main.read_trace(self.write("azure.csv", AZURE))
        self.assertEqual([round(r.arrival_s, 7) for r in requests], [0.0, 4.314579, 4.541877, 9.31941])
        self.assertEqual([(r.prompt_tokens, r.max_tokens) for r in requests], [(374, 44), (396, 109), (879, 55), (91, 16)])

    def test_the_2024_azure_traces_utc_offsets_and_whole_seconds_read_as_utc(self):
        week = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,4808,10\n"
                "2024-05-10 00:00:01+00:00,110,27\n2024-05-10 01:00:01.5+01:00,200,5\n"
                "2024-05-09 23:00:02.25-01:00,300,9\n2024-05-10T00:00:03Z,40,2\n")
        requests = main.read_trace(self.write("week.csv", week))
        self.assertEqual([round(r.arrival_s, 6) for r in requests], [0.0, 0.99007, 1.49007, 2.24007, 2.99007])
        bad = self.write("bad.csv", week + "2024-05-10 00:00:04+0x:00,1,1\n")
        self.assert_usage_error(("simulate", "--trace", bad), f"--trace {bad}:7: TIMESTAMP must look like")

    def test_burstgpt_arrivals_are_its_seconds_and_its_columns_are_found_by_name(self):
        first = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,API log\n45.5,GPT-4,417,276,693,API log\n")
        requests = main.read_trace(self.write("BurstGPT_1.csv", first))
        self.assertEqual([(r.arrival_s, r.prompt_tokens, r.max_tokens) for r in requests],
                         [(0.0, 472, 18), (40.0, 1087, 230), (40.5, 417, 276)])
        third = ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "0,a1,1.5,ChatGPT,100,20,120,Conversation log\n")
        self.assertEqual([(r.prompt_tokens, r.max_tokens) for r in main.read_trace(self.write("b3.csv", third))],
                         [(100, 20)])
        failed = self.write("fails.csv", first + "50,ChatGPT,300,0,300,Conversation log\n")
        self.assert_usage_error(("simulate", "--trace", failed), f"--trace {failed}:5: Response tokens is 0, a request "
                                "that failed in the service traced; give BurstGPT's *_without_fails file")

    def test_a_file_is_parsed_once_for_each_text_it_holds_and_each_read_gets_its_own_requests(self):
        path, parsed = self.write("azure.csv", AZURE), []
        reader = main.TRACE_READERS["azure"]
        with mock.patch.dict(main.TRACE_READERS, azure=lambda lines, where: parsed.append(where) or reader(lines, where)):
            first, again = main.read_trace(path), main.read_trace(path, time_scale=2.0)
            self.write("azure.csv", AZURE.replace(",374,", ",375,"))
            changed = main.read_trace(path)
        self.assertEqual(len(parsed), 2)  # the second read found the first's rows; the edit was read anew
        self.assertEqual([r.arrival_s * 2 for r in first], [r.arrival_s for r in again])
        self.assertIsNot(first[0], again[0])
        self.assertEqual((first[0].prompt_tokens, changed[0].prompt_tokens), (374, 375))

    def test_time_scale_stretches_and_compresses_arrivals(self):
        path = self.write("azure.csv", AZURE)
        halved = main.read_trace(path, time_scale=0.5)
        self.assertAlmostEqual(halved[1].arrival_s, 4.314579 / 2)
        self.assertAlmostEqual(main.read_trace(path, time_scale=3.0)[3].arrival_s, 9.31941 * 3)

    def test_start_and_limit_take_a_slice_that_starts_at_zero(self):
        requests = main.read_trace(self.write("azure.csv", AZURE), start_s=4.0, limit=2)
        self.assertEqual([r.prompt_tokens for r in requests], [396, 879])
        self.assertEqual([round(r.arrival_s, 6) for r in requests], [0.0, 0.227298])

    def test_the_format_is_told_from_the_content_or_given(self):
        azure = self.write("trace.txt", AZURE)
        self.assertEqual(len(main.read_trace(azure)), 4)
        self.assertEqual(len(main.read_trace(azure, trace_format="azure")), 4)
        self.assert_usage_error(("simulate", "--trace", azure, "--trace-format", "mooncake"),
                                f"--trace {azure}:1: not JSON")

    def test_mooncake_timestamps_are_milliseconds_and_lengths_are_kept(self):
        path = self.write("mc.jsonl", mooncake_line(0, 1024, 10, [0, 1]) + mooncake_line(1500, 600, 5, [2, 3]))
        requests = main.read_trace(path)
        self.assertEqual([(r.arrival_s, r.prompt_tokens, r.max_tokens) for r in requests], [(0.0, 1024, 10), (1.5, 600, 5)])
        self.assertEqual((requests[0].prefix_tokens, requests[0].prefix_block_tokens), (1024, 512))

    def mooncake_hits(self, first_ids, second_ids, block_size=16):
        """Prompt tokens the second request finds cached after the first has run."""
        path = self.write("mc.jsonl", mooncake_line(0, 1024, 2, first_ids) + mooncake_line(10, 1024, 2, second_ids))
        first, second = main.read_trace(path)
        scheduler = make_scheduler(num_blocks=200, block_size=block_size, max_num_batched_tokens=4096,
                                   prefix_caching=True)
        scheduler.add(first)
        step(scheduler)
        scheduler.add(second)
        step(scheduler)
        return second.num_prefix_hit_tokens

    def test_mooncake_requests_with_a_common_hash_ids_head_share_it(self):
        self.assertEqual(self.mooncake_hits([7, 8], [7, 9]), 512)

    def test_mooncake_requests_with_different_heads_share_nothing_even_if_later_ids_match(self):
        self.assertEqual(self.mooncake_hits([7, 8], [6, 8]), 0)

    def test_mooncake_sharing_maps_onto_any_block_size(self):
        self.assertEqual(self.mooncake_hits([7, 8], [7, 9], block_size=48), 480)  # 10 whole blocks of 48 in 512
        self.assertEqual(self.mooncake_hits([7, 8], [7, 8]), 1008)  # all but the block with the last token

    def test_integer_trace_keys_pack_with_the_block_index_into_one_nonzero_integer(self):
        request = main.Request(0, 64, 1, prefix_tokens=64, prefix_blocks=(0, -5), prefix_block_tokens=32)
        base = main.PACKED_KEY_BASE
        self.assertEqual(main.prefix_block_keys(request, 16), [1, 2, -5 * base + 3, -5 * base + 4])
        self.assertEqual(main.prefix_block_keys(request, 48), [-5 * base + 1])  # its last token lies in trace block 1
        named = main.Request(0, 64, 1, prefix_tokens=32, prefix_blocks=("a", "b"), prefix_block_tokens=16)
        self.assertEqual(main.prefix_block_keys(named, 16), [("a", 0), ("b", 1)])

    def test_malformed_rows_exit_2_naming_file_and_line(self):
        bad_azure = self.write("bad.csv", AZURE + "2023-11-16 18:16:00.0,12,x\n")
        self.assert_usage_error(("simulate", "--trace", bad_azure), f"--trace {bad_azure}:6: GeneratedTokens must be "
                                                                    f"an integer >= 1, got 'x'")
        bad_time = self.write("time.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
        self.assert_usage_error(("simulate", "--trace", bad_time), f"--trace {bad_time}:2: TIMESTAMP must look like")
        for number, stamp in enumerate(("2023-11-16 18:15", "2023-11-16 18:15:60", "2023-11-16 18:15:46.5x",
                                        "\uff12023-11-16 18:15:46.5")):  # after a good row of the same minute
            late = self.write(f"late{number}.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                   f"2023-11-16 18:15:46.5,1,1\n{stamp},1,1\n")
            self.assert_usage_error(("simulate", "--trace", late), f"--trace {late}:3: TIMESTAMP must look like")
        bad_header = self.write("header.csv", "TIMESTAMP,Context,Generated\n")
        self.assert_usage_error(("simulate", "--trace", bad_header, "--trace-format", "azure"),
                                f"--trace {bad_header}:1: expected the header TIMESTAMP,ContextTokens,GeneratedTokens")
        bad_mooncake = self.write("bad.jsonl", mooncake_line(0, 10, 1, [1]) + '{"timestamp": 5, "input_length": 3}\n')
        self.assert_usage_error(("simulate", "--trace", bad_mooncake),
                                f"--trace {bad_mooncake}:2: missing output_length, hash_ids")
        ids = self.write("ids.jsonl", mooncake_line(0, 10, 1, ["a"]))
        self.assert_usage_error(("simulate", "--trace", ids), f"--trace {ids}:1: hash_ids must be a list of integers")

    def test_compressed_traces_and_a_byte_order_mark_read_as_the_plain_file(self):
        expected = [(r.arrival_s, r.prompt_tokens, r.max_tokens) for r in main.read_trace(self.write("a.csv", AZURE))]
        encoded = AZURE.replace("\n", "\r\n").encode()
        for name, module in (("a.csv.gz", "gzip"), ("a.csv.bz2", "bz2"), ("a.csv.xz", "lzma"), ("bom.csv", None)):
            with self.subTest(name):
                try:
                    data = importlib.import_module(module).compress(encoded) if module else b"\xef\xbb\xbf" + encoded
                except ImportError:
                    self.skipTest(f"this Python was built without {module}")
                requests = main.read_trace(self.write(name, data))
                self.assertEqual([(r.arrival_s, r.prompt_tokens, r.max_tokens) for r in requests], expected)
        mooncake = self.write("mc.jsonl", b"\xef\xbb\xbf" + mooncake_line(0, 1024, 10, [0, 1]).encode())
        self.assertEqual(main.read_trace(mooncake)[0].prefix_tokens, 1024)

    def test_a_truncated_archive_exits_2_naming_it(self):
        broken = self.write("cut.csv.gz", gzip.compress(AZURE.encode())[:40])
        self.assert_usage_error(("simulate", "--trace", broken), f"--trace {broken}: cannot read it (a broken gzip file:")

    def test_an_unknown_format_exits_2(self):
        self.assert_usage_error(("simulate", "--trace", self.write("x.txt", "hello\n")), "not a trace this reads")

    def test_a_start_after_the_last_request_exits_2(self):
        self.assert_usage_error(("simulate", "--trace", self.write("azure.csv", AZURE), "--start", "60"),
                                "no requests at or after --start 60 s")

    def test_simulate_replays_an_azure_trace(self):
        report = run_json("simulate", "--trace", self.write("azure.csv", AZURE), "--time-scale", "0.5")
        self.assertEqual((report["summary"]["num_completed"], report["summary"]["output_tokens"]), (4, 224))


class ArrivalTest(unittest.TestCase):

    def test_burstiness_keeps_the_rate_and_spreads_the_gaps(self):
        import random
        import statistics
        steady = main.arrival_offsets(5000, 10.0, 4.0, random.Random(1))
        bursty = main.arrival_offsets(5000, 10.0, 0.25, random.Random(1))
        for offsets in (steady, bursty):
            self.assertAlmostEqual(offsets[-1] / 4999, 0.1, delta=0.01)
        gaps = [[b - a for a, b in zip(offsets, offsets[1:])] for offsets in (steady, bursty)]
        # a gamma of shape k has a coefficient of variation of 1/sqrt(k)
        self.assertAlmostEqual(statistics.pstdev(gaps[0]) / statistics.mean(gaps[0]), 0.5, delta=0.05)
        self.assertAlmostEqual(statistics.pstdev(gaps[1]) / statistics.mean(gaps[1]), 2.0, delta=0.2)

    def test_burstiness_1_is_poisson_and_keeps_earlier_seeds(self):
        import random
        rng = random.Random(4)
        expected, at = [], 0.0
        for _ in range(5):
            expected.append(at)
            at += rng.expovariate(3.0)
        self.assertEqual(main.arrival_offsets(5, 3.0, 1.0, random.Random(4)), expected)

    def test_simulate_and_sweep_take_burstiness(self):
        bursty = run_json("simulate", "--rate", "20", "--requests", "64", "--burstiness", "0.2")
        steady = run_json("simulate", "--rate", "20", "--requests", "64")
        self.assertGreater(bursty["summary"]["queue_ms"]["p99"], steady["summary"]["queue_ms"]["p99"])
        report = run_json("sweep", "--rate", "5,20", "--requests", "32", "--burstiness", "0.5")
        self.assertEqual([run["settings"]["arrivals"]["rate"] for run in report["runs"]], [5.0, 20.0])


if __name__ == "__main__":
    unittest.main()
