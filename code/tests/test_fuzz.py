"""Seeded fuzz: odd flags, files, reports, scrapes and server answers never crash or hang servesim.

Every case must end, in bounded time, with an exit code right for it, no traceback or
internal-error line, exactly one stderr line when it exits 2, and the API key nowhere
in the output (see fuzz_cases.py). The suite runs a share of the 300 cases, every family
among them; `python3 code/bench.py check` runs all 300, and `python3 code/bench.py fuzz
--cases N --seed S` runs more of the same.
"""

import json
import os
import tempfile
import unittest

import fuzz_cases
from support import FIXTURES_DIR, ScratchTest, main, run_json

NUM_CASES = 300  # the whole set, which bench.py check runs
SEED = 20261201
SUITE_SHARE = 5  # the suite runs every fifth case, and the first of each family


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


def suite_share(cases):
    """The cases the suite runs: every SUITE_SHARE-th, and the first of each family."""
    firsts = {}
    for index, case in enumerate(cases):
        firsts.setdefault(case.family, index)
    return [case for index, case in enumerate(cases) if index % SUITE_SHARE == 0 or firsts[case.family] == index]


class FuzzTest(ScratchTest):

    def test_no_case_crashes_hangs_exits_wrongly_or_shows_the_key(self):
        cases = suite_share(fuzz_cases.generate(SEED, NUM_CASES, *reference_reports()))
        failures = [problem for case in cases for problem in problems_of(case)]
        self.assertEqual(failures, [], "\n".join(failures[:20]))

    def test_the_suites_share_holds_every_family(self):
        cases = fuzz_cases.generate(SEED, NUM_CASES, *reference_reports())
        share = suite_share(cases)
        self.assertEqual({case.family for case in share}, {case.family for case in cases})
        self.assertLess(len(share), NUM_CASES // 2)  # a share: bench.py check runs the rest

    def test_the_families_are_all_there(self):
        families = {case.family.split()[0] for case in fuzz_cases.generate(SEED, NUM_CASES, *reference_reports())}
        self.assertTrue({"server", "discovery", "flags", "trace", "gguf", "hf", "hardware", "step", "report",
                         "scrape", "refused", "odd", "inference-perf"} <= families, families)


if __name__ == "__main__":
    unittest.main()
