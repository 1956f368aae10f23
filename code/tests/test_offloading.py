"""A host tier for the KV cache: blocks the device evicted, kept by key and loaded back over PCIe."""

import os
import unittest

from support import FIXTURES_DIR, main, make_request, make_scheduler, run_cli, run_json, step

DOCUMENTS = os.path.join(FIXTURES_DIR, "documents.jsonl")


class HostTierTest(unittest.TestCase):

    def test_the_least_recently_stored_key_goes_first(self):
        host = main.HostTier(3)
        host.store(["a", "b"])
        host.store(["c", "d"])
        self.assertEqual((list(host.keys), host.num_stored, host.num_evicted, host.num_removed),
                         (["b", "c", "d"], 4, 1, 1))

    def test_lookup_counts_the_leading_keys_held(self):
        host = main.HostTier(8)
        host.store(["a", "b", "d"])
        self.assertEqual([host.lookup(keys) for keys in (["a", "b", "c", "d"], ["b"], ["c", "a"], [])], [2, 1, 0, 0])

    def test_take_and_discard_remove_keys_and_count_them(self):
        host = main.HostTier(8)
        host.store(["a", "b", "c"])
        host.take(["a", "b"])
        host.discard(["c", "z"])  # a key not held is not counted
        self.assertEqual((list(host.keys), host.num_loaded, host.num_removed), ([], 2, 3))


class SchedulerHostTierTest(unittest.TestCase):

    def test_a_prefix_evicted_to_host_is_loaded_back_into_new_blocks_and_leaves_the_host(self):
        scheduler = make_scheduler(num_blocks=6, block_size=4, prefix_caching=True, kv_offloading_blocks=8)
        scheduler.add(make_request(0, prompt_tokens=17, max_tokens=1, prefix="doc", prefix_tokens=16))
        self.assertEqual(step(scheduler), [(0, 17)])  # 5 blocks, the 4 of the prefix entered; it finishes
        scheduler.add(make_request(1, prompt_tokens=21, max_tokens=1, prefix="other", prefix_tokens=20))
        self.assertEqual(step(scheduler), [(1, 21)])  # its 6 blocks evict the 4 of "doc" (to host)
        self.assertEqual(list(scheduler.host.keys), [("doc", 3), ("doc", 2), ("doc", 1), ("doc", 0)])
        scheduler.add(make_request(2, prompt_tokens=17, max_tokens=1, prefix="doc", prefix_tokens=16))
        self.assertEqual(step(scheduler), [(2, 1)])  # 4 blocks loaded back: only the last token is computed
        self.assertEqual((scheduler.num_blocks_to_load, scheduler.num_prefix_hit_tokens), (4, 16))
        self.assertFalse(set(scheduler.host.keys) & set(scheduler.pool.cached))
        self.assertEqual(sorted(key for key in scheduler.pool.cached if key[0] == "doc"),
                         [("doc", 0), ("doc", 1), ("doc", 2), ("doc", 3)])


class OffloadingAcceptanceTest(unittest.TestCase):
    """48 documents of 6,000 tokens read round robin at 4 req/s, Llama-3.1-8B on an H100 at
    --gpu-memory-utilization 0.3 (the device's KV holds about nine of them)."""

    @classmethod
    def setUpClass(cls):
        base = ["simulate", "--trace", DOCUMENTS, "--prefix-caching", "--no-sensitivity"]
        cls.small = run_json(*base, "--gpu-memory-utilization", "0.3")
        cls.offloaded = run_json(*base, "--gpu-memory-utilization", "0.3", "--kv-offloading-size", "40")
        cls.roomy = run_json(*base, "--gpu-memory-utilization", "0.9")

    def test_the_device_holds_about_nine_documents(self):
        self.assertEqual(round(self.small["capacity"]["num_kv_tokens"] / 6000), 9)

    def test_the_host_tier_serves_most_prefixes(self):
        self.assertGreaterEqual(self.offloaded["engine"]["prefix_hit_rate"], 0.5)
        self.assertLess(self.small["engine"]["prefix_hit_rate"], 0.01)

    def test_ttft_p50_is_at_most_a_fifth_and_above_the_run_that_fits(self):
        ttft = {name: run["summary"]["ttft_ms"]["p50"] for name, run in
                (("small", self.small), ("offloaded", self.offloaded), ("roomy", self.roomy))}
        self.assertLessEqual(ttft["offloaded"], ttft["small"] / 5, ttft)
        self.assertGreater(ttft["offloaded"], ttft["roomy"], ttft)

    def test_the_report_gives_hits_per_tier_bytes_and_time(self):
        figures = self.offloaded["engine"]["kv_offloading"]
        block_bytes = 16 * self.offloaded["capacity"]["kv_bytes_per_token"]
        self.assertEqual(figures["host_blocks"], int(40 * 2 ** 30 // block_bytes))
        self.assertEqual(figures["host_hit_tokens"] + figures["device_hit_tokens"],
                         self.offloaded["engine"]["prefix_hit_tokens"])
        self.assertEqual(figures["bytes_loaded"], figures["blocks_loaded"] * block_bytes)
        self.assertAlmostEqual(figures["load_s"], figures["bytes_loaded"] / 64e9)  # PCIe 5.0 x16
        self.assertEqual(self.offloaded["summary"]["output_tokens"], self.small["summary"]["output_tokens"])


class OffloadingFlagsTest(unittest.TestCase):

    def test_offloading_that_cannot_be_modelled_exits_2_naming_the_flag(self):
        base = ["simulate", "--concurrency", "1", "--requests", "1"]
        cases = ((["--kv-offloading-size", "4"], "--kv-offloading-size: the host tier keeps blocks by their prefix"),
                 (["--kv-offloading-size", "4", "--prefix-caching", "--hardware", "cpu-4vcpu", "--model",
                   "smollm2-135m-q8_0"], "--kv-offloading-size: cpu-4vcpu names no host link; give --host-link-gbs"),
                 (["--host-link-gbs", "25"], "--host-link-gbs: give --kv-offloading-size too"),
                 (["--kv-offloading-size", "0.0001", "--prefix-caching"], "expected room for 1 to"),
                 (["--kv-offloading-size", "4", "--scheduler", "llamacpp"],
                  "--kv-offloading-size with --scheduler llamacpp"))
        for extra, expected in cases:
            with self.subTest(extra=extra):
                code, out, err = run_cli(*base, *extra)
                self.assertEqual((code, out), (2, ""))
                self.assertIn(expected, err)

    def test_host_link_gbs_sets_the_load_time(self):
        report = run_json("simulate", "--trace", DOCUMENTS, "--limit", "60", "--prefix-caching", "--no-sensitivity",
                          "--gpu-memory-utilization", "0.3", "--kv-offloading-size", "40", "--host-link-gbs", "16")
        figures = report["engine"]["kv_offloading"]
        self.assertEqual(figures["host_link_gbs"], 16)
        self.assertAlmostEqual(figures["load_s"], figures["bytes_loaded"] / 16e9)
        self.assertGreater(figures["blocks_loaded"], 0)


if __name__ == "__main__":
    unittest.main()
