"""Seeded fuzz: odd flags, files, reports, scrapes and server answers never crash or hang servesim.

Every case must end, in bounded time, with an exit code right for it, no traceback or
internal-error line, exactly one stderr line when it exits 2, and the API key nowhere
in the output (see fuzz_cases.py). `python3 code/bench.py fuzz --cases N --seed S`
runs more of the same.
"""

import json
import multiprocessing
import os
import tempfile
import unittest

import fuzz_cases
from support import FIXTURES_DIR, ScratchTest, main, run_json

NUM_CASES = 300
SEED = 20261201


def reference_reports():
    with open(os.path.join(FIXTURES_DIR, "llamacpp", "c4.json"), encoding="utf-8") as handle:
        loadgen = json.load(handle)
    simulate = run_json("simulate", "--concurrency", "2", "--requests", "4", "--prompt-tokens", "40",
                        "--output-tokens", "8")
    return loadgen, simulate


def problems_of(case):
    """What went wrong with one case, run in a scratch folder of its own."""
    with tempfile.TemporaryDirectory() as directory:
        return [f"{case.describe()}: {problem}" for problem in fuzz_cases.run_case(main, case, directory)[0]]


class FuzzTest(ScratchTest):

    def test_no_case_crashes_hangs_exits_wrongly_or_shows_the_key(self):
        cases = fuzz_cases.generate(SEED, NUM_CASES, *reference_reports())
        # NOTE: the cases are independent, so they run on every CPU (spawned: no fork of threads)
        with multiprocessing.get_context("spawn").Pool(min(4, os.cpu_count() or 1)) as pool:
            failures = [problem for found in pool.map(problems_of, cases, chunksize=10) for problem in found]
        self.assertEqual(failures, [], "\n".join(failures[:20]))

    def test_the_families_are_all_there(self):
        families = {case.family.split()[0] for case in fuzz_cases.generate(SEED, NUM_CASES, *reference_reports())}
        self.assertTrue({"server", "discovery", "flags", "trace", "gguf", "hf", "hardware", "step", "report",
                         "scrape", "refused", "odd", "inference-perf"} <= families, families)


if __name__ == "__main__":
    unittest.main()
