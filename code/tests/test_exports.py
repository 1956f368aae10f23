"""Exports: a simulated run as vLLM's /metrics (explain reads it as a scrape), and per-request CSV."""

import csv
import json
import os
import unittest

from fake_server import FakeServer, counting_chat, word_tokens
from support import FIXTURES_DIR, ScratchTest, main, run_cli

BURST = os.path.join(FIXTURES_DIR, "burst.jsonl")


class PrometheusExportTest(ScratchTest):

    def simulate(self, *argv):
        prom = os.path.join(self.directory, "run.prom")
        code, out, err = run_cli("simulate", *argv, "--prometheus", prom, "--json")
        self.assertEqual((code, err), (0, ""))
        with open(prom, encoding="utf-8") as handle:
            return json.loads(out), handle.read(), prom

    def test_the_export_parses_back_with_a_count_per_request_and_the_engines_counters(self):
        report, text, _ = self.simulate("--hardware", "l4-24gb", "--trace", BURST, "--prefix-caching")
        samples = main.parse_prometheus(text)
        completed = report["summary"]["num_completed"]
        for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                     "request_time_per_output_token_seconds", "request_prompt_tokens"):
            self.assertEqual(main.metric_total(samples, f"vllm:{name}_count"), completed, name)
            buckets = [value for labels, value in samples[f"vllm:{name}_bucket"] if labels["le"] == "+Inf"]
            self.assertEqual(buckets, [completed], name)
        self.assertEqual(main.metric_total(samples, "vllm:inter_token_latency_seconds_count"),
                         report["summary"]["itl_ms"]["count"])
        engine = report["engine"]
        self.assertEqual(main.metric_total(samples, "vllm:num_preemptions_total"), engine["num_preemptions"])
        self.assertEqual(main.metric_total(samples, "vllm:prefix_cache_hits_total"), engine["prefix_hit_tokens"])
        self.assertEqual(main.metric_total(samples, "vllm:kv_cache_usage_perc"), engine["kv_peak"])
        self.assertEqual(main.metric_total(samples, "vllm:generation_tokens_total"), report["summary"]["output_tokens"])
        mean_ttft_s = main.metric_total(samples, "vllm:time_to_first_token_seconds_sum") / completed
        self.assertAlmostEqual(mean_ttft_s * 1000, report["summary"]["ttft_ms"]["mean"], places=6)

    def test_explain_on_the_export_names_the_budget_it_names_on_the_report(self):
        cases = (("--hardware", "l4-24gb", "--trace", BURST),                         # the KV cache fills
                 ("--concurrency", "256", "--requests", "512", "--max-num-seqs", "256"),  # past the compute knee
                 ("--rate", "1", "--requests", "40"))                                  # nothing binds
        for flags in cases:
            with self.subTest(flags=flags):
                report, _, prom = self.simulate(*flags)
                path = self.write("report.json", report)
                from_report = json.loads(run_cli("explain", path, "--json")[1])["binding"]["budget"]
                scheduler = report["settings"]["scheduler"]
                code, out, err = run_cli("explain", prom, "--hardware", report["settings"]["hardware"],
                                         "--model", report["settings"]["model"], "--max-num-seqs",
                                         scheduler["max_num_seqs"], "--max-num-batched-tokens",
                                         scheduler["max_num_batched_tokens"], "--json")
                self.assertEqual((code, err), (0, ""))
                self.assertEqual(json.loads(out)["binding"]["budget"], from_report)

    def test_every_exported_series_has_the_name_type_and_labels_of_a_real_vllm_scrape(self):
        # code/fixtures/vllm/metrics.prom: vLLM 0.32.0 for CPU serving Gemma 3 270M, scraped mid-run
        with open(os.path.join(FIXTURES_DIR, "vllm", "metrics.prom"), encoding="utf-8") as handle:
            real_text = handle.read()
        _, text, _ = self.simulate("--rate", "4", "--requests", "16", "--prefix-caching")

        def types(exposition):
            return dict(line.split()[2:4] for line in exposition.splitlines() if line.startswith("# TYPE "))
        real_types, real = types(real_text), main.parse_prometheus(real_text)
        exported = main.parse_prometheus(text)
        for name, kind in types(text).items():
            self.assertEqual(real_types.get(name), kind, name)
        for name, samples in exported.items():
            self.assertIn(name, real, name)
            real_labels = {key for labels, _ in real[name] for key in labels}
            for labels, _ in samples:
                self.assertEqual(set(labels), {key for key in labels if key in real_labels}, name)
                self.assertLessEqual({"engine", "model_name"}, set(labels), name)

    def test_explain_reads_a_real_vllm_scrape(self):
        code, out, err = run_cli("explain", os.path.join(FIXTURES_DIR, "vllm", "metrics.prom"), "--json")
        self.assertEqual((code, err), (0, ""))
        evidence = {name: fact["value"] for name, fact in json.loads(out)["evidence"].items()}
        self.assertEqual((evidence["max_running"], evidence["max_waiting"], evidence["preemptions"],
                          evidence["prefix_caching"], evidence["mean_output_tokens"]), (7, 0, 0, 1, 64))
        self.assertAlmostEqual(evidence["tpot_ms"], 51.07, places=2)  # vllm:request_time_per_output_token mean

    def test_without_prefix_caching_the_export_queries_nothing_as_vllm_does(self):
        _, text, _ = self.simulate("--rate", "2", "--requests", "8")
        self.assertEqual(main.metric_total(main.parse_prometheus(text), "vllm:prefix_cache_queries_total"), 0)

    def test_a_histogram_quantile_interpolates_within_its_bucket(self):
        scrape = main.parse_prometheus('h_bucket{le="1"} 2\nh_bucket{le="2"} 6\nh_bucket{le="+Inf"} 8\n')
        self.assertEqual(main.histogram_quantile(0.5, scrape, None, "h"), 1.5)   # rank 4: halfway through (1, 2]
        self.assertEqual(main.histogram_quantile(0.25, scrape, None, "h"), 1.0)  # rank 2: the top of [0, 1]
        self.assertEqual(main.histogram_quantile(0.99, scrape, None, "h"), 2.0)  # in +Inf: the highest bound


class RequestCsvTest(ScratchTest):

    def read(self, path):
        with open(path, encoding="utf-8", newline="") as handle:
            return list(csv.reader(handle))

    def test_simulate_writes_a_row_per_request_with_units_in_the_header(self):
        path = os.path.join(self.directory, "requests.csv")
        code, out, err = run_cli("simulate", "--hardware", "l4-24gb", "--trace", BURST, "--prefix-caching",
                                 "--csv", path, "--json")
        report = json.loads(out)
        rows = self.read(path)
        self.assertEqual(rows[0], ["request_id", "arrival_s", "sent_s", "first_token_s", "last_token_s",
                                   "prompt_tokens", "cached_tokens", "output_tokens", "preemptions", "error_kind"])
        self.assertEqual(len(rows) - 1, report["summary"]["num_requests"])
        self.assertEqual(sum(int(row[7]) for row in rows[1:]), report["summary"]["output_tokens"])
        self.assertEqual(sum(int(row[6]) for row in rows[1:]), report["engine"]["prefix_hit_tokens"])
        self.assertEqual(sum(int(row[8]) for row in rows[1:]), report["engine"]["num_preemptions"])
        ttft_ms = sorted((float(row[3]) - float(row[2])) * 1000 for row in rows[1:])
        self.assertAlmostEqual(sum(ttft_ms) / len(ttft_ms), report["summary"]["ttft_ms"]["mean"], places=6)

    def test_the_published_columns_keep_their_names_and_places_new_ones_go_after(self):
        # NOTE: dashboards and notebooks read these by name and by place; a rename breaks them
        self.assertEqual(main.REQUEST_CSV_HEADER[:10], (
            "request_id", "arrival_s", "sent_s", "first_token_s", "last_token_s", "prompt_tokens", "cached_tokens",
            "output_tokens", "preemptions", "error_kind"))

    def test_a_request_its_client_gave_up_on_says_so_in_its_row(self):
        path = os.path.join(self.directory, "requests.csv")
        code, _, err = run_cli("simulate", "--rate", "30", "--requests", "200", "--prompt-tokens", "1000",
                               "--output-tokens", "20", "--request-timeout", "2", "--no-sensitivity", "--csv", path)
        self.assertEqual((code, err), (0, ""))
        kinds = [row[9] for row in self.read(path)[1:]]
        self.assertGreater(kinds.count("timeout"), 0)
        self.assertEqual(set(kinds), {"", "timeout"})

    def test_loadgen_writes_the_measured_requests(self):
        path = os.path.join(self.directory, "measured.csv")
        with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
            code, out, err = run_cli("loadgen", "--url", server.url, "--requests", "3", "--csv", path,
                                     "--scrape-interval", "0.05")
        self.assertEqual((code, err), (0, ""))
        rows = self.read(path)
        self.assertEqual([row[0] for row in rows[1:]], ["0", "1", "2"])
        self.assertEqual([row[7] for row in rows[1:]], ["3", "3", "3"])  # the fake answers three tokens
        self.assertEqual([row[8] for row in rows[1:]], ["", "", ""])     # a server's preemptions are unknown

    def test_an_unwritable_csv_exits_2(self):
        self.assert_usage_error(("simulate", "--rate", "1", "--requests", "2", "--csv", self.directory),
                                f"--csv {self.directory}: cannot write it")


if __name__ == "__main__":
    unittest.main()
