"""The fast engine (runs of decode steps at once) gives every figure the step engine gives.

Seeded random workloads over every mode: prefix caching, preemption (small caches),
chunked prefill on and off, the tokens-in-flight cap, llama.cpp's slots, a step profile,
tensor parallelism, disaggregation, replicas behind each router, production trace slices,
open and closed loop; and one in ten loaded (dozens decoding, a request arriving at nearly
every step), where the fast engine keeps the decoding requests as one group. Each runs with
--engine step (the reference) and --engine fast; the two --json reports must agree: counts
exactly, times to 1e-9 relative. The suite runs the share of the 300 workloads that shows
every mode three times (suite_cases); `python3 code/bench.py check` runs them all (all_cases).
"""

import dataclasses
import json
import math
import os
import random
import tempfile
import unittest
from unittest import mock

from support import FIXTURES_DIR, main, run_cli

NUM_WORKLOADS = 300  # the whole set, which bench.py check runs
SUITE_COVERAGE = 3   # the suite's share shows each of MODES (and a loaded run) this many times
MODES = ("--prefix-caching", "--no-chunked-prefill", "--max-tokens-in-flight", "--disaggregate",
         "--tensor-parallel-size", "--pipeline-parallel-size", "--enable-expert-parallel", "--trace", "mooncake",
         "--rate", "--burstiness 0.3", "--concurrency", "--step-profile", "--kv-tokens 512", "--replicas",
         "round-robin", "least-loaded", "prefix-affinity", "vllm-dp", "--request-timeout", "--no-async-scheduling",
         "--speculative-config", "eagle", "ngram", "draft_model", "--acceptance-rate 0 ", "--acceptance-rate 1 ",
         "--kv-offloading-size", "--hardware-file", "qwen3-30b-a3b", "cpu-4vcpu", "--scheduler sglang",
         "--step-cost kernels", "--long-prefill-token-threshold")
L4_8B = (main.HARDWARE["l4-24gb"], main.MODELS["llama-3.1-8b"])
PROFILE = os.path.join(FIXTURES_DIR, "llamacpp", "profile.json")
TRACES = [os.path.join(FIXTURES_DIR, name) for name in ("burst.jsonl", "mixed.jsonl", "burst.jsonl", "mixed.jsonl",
                                                         "mooncake_conversation_first500.jsonl")]
# An H100 that prices decode attention's arithmetic (each process writes its own copy; removed at exit)
_SCRATCH = tempfile.TemporaryDirectory()
ATTENTION_H100 = os.path.join(_SCRATCH.name, "h100-attention.json")
with open(ATTENTION_H100, "w") as _handle:
    json.dump(dataclasses.asdict(dataclasses.replace(main.HARDWARE["h100-sxm-80gb"], attention_efficiency=0.04)),
              _handle)


def loaded_workload(rng, seed):
    """A run with dozens of requests decoding and one arriving at nearly every step: what
    the fast engine keeps as a DecodeCohort, falling back when a step may preempt."""
    argv = ["simulate", "--requests", str(rng.randint(30, 80)), "--seed", str(seed),
            "--prompt-tokens", rng.choice(("20-400", "8-40", "500-3000")),
            "--output-tokens", rng.choice(("1-100", "60-300", "2-20")),
            *rng.choice((["--hardware", "l4-24gb"], ["--hardware", "h100-sxm-80gb"],
                         ["--hardware-file", ATTENTION_H100])),
            "--model", "llama-3.1-8b",
            "--block-size", rng.choice(("1", "4", "16")), "--max-num-seqs", rng.choice(("16", "64", "256")),
            "--max-num-batched-tokens", rng.choice(("64", "512", "8192")),
            "--kv-tokens", rng.choice(("4096", "12000", "30000"))]
    if rng.random() < 0.3:  # shared system prompts, cached (in blocks of 16: one-token blocks are slow to cache)
        argv[argv.index("--block-size") + 1] = "16"
        argv += ["--trace", TRACES[1], "--limit", str(rng.randint(30, 80)), "--prefix-caching",
                 "--time-scale", rng.choice(("0.05", "0.3"))]
    else:
        argv += (["--rate", rng.choice(("40", "400"))] if rng.random() < 0.6
                 else ["--concurrency", str(rng.randint(16, 128))])
    if rng.random() < 0.2:
        argv += ["--replicas", "2"]
    if rng.random() < 0.2:
        argv += ["--request-timeout", rng.choice(("1", "5"))]
    return with_server_features(rng, argv, loaded=True)


def workload(seed):
    """The argv of one seeded random simulate run (without --engine and --json)."""
    rng = random.Random(seed)
    if seed % 10 == 9:
        return loaded_workload(rng, seed)
    argv = ["simulate", "--requests", str(rng.randint(4, 16)), "--seed", str(seed),
            "--prompt-tokens", rng.choice(("20-400", "100", "500-3000", "8-40")),
            "--output-tokens", rng.choice(("1-100", "48", "2-20", "60-120"))]
    if rng.random() < 0.25:
        trace, limit = rng.choice(TRACES), rng.randint(4, 16)
        argv += ["--trace", trace, "--limit", str(min(limit, 8) if "mooncake" in trace else limit),  # 12k-token prompts
                 "--time-scale", rng.choice(("0.2", "1", "3"))]
    elif rng.random() < 0.5:
        argv += ["--rate", rng.choice(("0.5", "4", "40")), "--burstiness", rng.choice(("1", "0.3"))]
    else:
        argv += ["--concurrency", str(rng.randint(1, 12))]
    mode = rng.random()
    if mode < 0.15:
        argv += ["--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m", "--step-profile", PROFILE,
                 "--kv-tokens", rng.choice(("4096", "2048"))]
        return argv  # llama.cpp's slots, from the profile
    argv += rng.choice((["--hardware", "l4-24gb", "--model", "llama-3.1-8b"],
                        ["--hardware", "h100-sxm-80gb", "--model", "llama-3.1-8b"],
                        ["--hardware", "h100-sxm-80gb", "--model", "qwen3-30b-a3b"],  # experts: a step reads some
                        ["--hardware-file", ATTENTION_H100, "--model", "llama-3.1-8b"],  # decode attention priced
                        ["--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0"]))
    argv += [
             "--block-size", rng.choice(("4", "16")), "--max-num-seqs", str(rng.choice((2, 8, 64))),
             "--max-num-batched-tokens", rng.choice(("64", "512", "8192"))]
    argv += ["--kv-tokens", rng.choice(("512", "2048", "12000", "30000"))]  # small caches preempt
    for flag, share in (("--prefix-caching", 0.5), ("--no-chunked-prefill", 0.15)):
        if rng.random() < share:
            argv.append(flag)
    if "--no-chunked-prefill" in argv:
        argv[argv.index("--max-num-batched-tokens") + 1] = "8192"
    elif random.Random(-seed).random() < 0.2:  # NOTE: its own draw, so that the other workloads stay as they were
        argv += ["--long-prefill-token-threshold", random.Random(-seed).choice(("32", "300"))]
    if "--max-tokens-in-flight" not in argv and random.Random(seed + 2000).random() < 0.15:
        argv += ["--scheduler", "sglang"]  # prefill steps or decode steps, never both
    if "cpu" not in argv[argv.index("--model") - 1] and random.Random(seed + 1000).random() < 0.3:
        argv += ["--step-cost", "kernels"]  # every kernel term: the GPUs' tables, CUDA graphs' padding
    if rng.random() < 0.15:
        argv += ["--max-tokens-in-flight", str(rng.choice((500, 3000)))]
    elif rng.random() < 0.15:
        argv += ["--disaggregate", "--kv-link-gbs", rng.choice(("1", "25")), "--disaggregate-min-prompt-tokens",
                 rng.choice(("0", "200"))]
    if rng.random() < 0.15:  # tensor parallelism, pipeline stages (micro-batches in flight), or both
        argv += rng.choice((["--tensor-parallel-size", "2"], ["--pipeline-parallel-size", "2"],
                            ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]))
        if "qwen3-30b-a3b" in argv and "--tensor-parallel-size" in argv and rng.random() < 0.5:
            argv.append("--enable-expert-parallel")
    if "--disaggregate" not in argv and rng.random() < 0.2:
        argv += ["--replicas", rng.choice(("2", "3")), "--router", rng.choice(main.ROUTERS)]
    if rng.random() < 0.3:
        argv.append("--no-async-scheduling")
    if "--disaggregate" not in argv and rng.random() < 0.2:  # clients that give up mid-run
        argv += ["--request-timeout", rng.choice(("0.5", "3"))]
    return argv if "--disaggregate" in argv else with_server_features(rng, argv)


def with_server_features(rng, argv, loaded=False):
    """argv with speculative decoding and a host tier for the KV cache, each in some runs
    (a drafter's KV shares the blocks: a cache fixed at 30,000 tokens becomes 12,000). A
    loaded run does not speculate: the fast engine takes its steps one by one then, which
    the small runs check as well in a fraction of the time."""
    argv = argv + server_features(rng, "--prefix-caching" in argv, not loaded)
    if "--speculative-config" in argv and "30000" in argv:
        argv[argv.index("30000")] = "12000"
    return argv


def server_features(rng, prefix_caching, speculating=True):
    """Speculative decoding (unless not speculating) and a host tier for the KV cache, each in some runs."""
    argv = []
    if rng.random() < 0.15 and speculating:
        method = rng.choice(("eagle", "ngram", "draft_model", "draft_model"))
        model = ', "model": "smollm2-135m-q8_0"' if method == "draft_model" else ""
        argv += ["--speculative-config", f'{{"method": "{method}", "num_speculative_tokens": {rng.randint(1, 5)}{model}}}',
                 "--acceptance-rate", rng.choice(("0", "0.5", "0.8", "1"))]
    if prefix_caching and rng.random() < 0.3:
        argv += ["--kv-offloading-size", rng.choice(("0.01", "0.1", "1")), "--host-link-gbs", "32"]
    return argv


def differences(reference, fast, path=""):
    """Where two reports differ: counts exactly, numbers to 1e-9 relative."""
    if isinstance(reference, dict) and isinstance(fast, dict):
        if reference.keys() != fast.keys():
            return [f"{path}: keys {sorted(reference.keys() ^ fast.keys())}"]
        return [d for key in reference for d in differences(reference[key], fast[key], f"{path}.{key}")]
    if isinstance(reference, list) and isinstance(fast, list) and len(reference) == len(fast):
        return [d for index, pair in enumerate(zip(reference, fast)) for d in differences(*pair, f"{path}[{index}]")]
    if isinstance(reference, float) and isinstance(fast, float):
        scale = max(abs(reference), abs(fast), 1e-12)
        return [] if abs(reference - fast) <= 1e-9 * scale else [f"{path}: {reference!r} != {fast!r}"]
    return [] if reference == fast else [f"{path}: {reference!r} != {fast!r}"]


def report(argv, engine):
    # NOTE: a sensitivity band's runs are the fast engine's in both, so they are left out here
    code, out, err = run_cli(*argv, "--engine", engine, "--json", "--no-sensitivity")
    return code, (json.loads(out) if code == 0 else err)


# The shortcuts a FastEngine and its scheduler take, each of which can be turned off alone
SWITCHES = {"cohorts": (main.FastEngine, "COHORTS"), "decode runs": (main.FastEngine, "DECODE_RUNS"),
            "remembered refusals": (main.Scheduler, "REMEMBER_REFUSALS"),
            "resumed lookups": (main.BlockPool, "RESUME_LOOKUPS")}


def compare_engines(seed, switched_off=None):
    """(the workload ran in both engines, what differs) for one seeded workload, with one
    of SWITCHES turned off in both engines when switched_off names it."""
    argv = workload(seed)
    owner, name = SWITCHES.get(switched_off, (None, None))
    if owner is not None:
        setattr(owner, name, False)
    try:
        (code, reference), (fast_code, fast) = report(argv, "step"), report(argv, "fast")
    finally:
        if owner is not None:
            setattr(owner, name, True)
    if (code, fast_code) != (0, 0):
        return False, [f"{' '.join(argv)}: exit {code} and {fast_code}: {reference} {fast}"]
    label = f" ({switched_off} off)" if switched_off else ""
    return True, [f"{' '.join(argv)}{label}: {d}" for d in differences(reference, fast)[:3]]


def modes_of(seed):
    """The MODES a workload shows, and "loaded" for one of the loaded ones."""
    argv = " ".join(workload(seed)) + " "
    return {mode for mode in MODES if mode in argv} | ({"loaded"} if seed % 10 == 9 else set())


def suite_seeds():
    """The suite's share of the workloads: in seed order, each one that shows a mode (or a
    loaded run) fewer than SUITE_COVERAGE of those before it showed."""
    counts = dict.fromkeys(MODES + ("loaded",), 0)
    seeds = []
    for seed in range(NUM_WORKLOADS):
        modes = modes_of(seed)
        if any(counts[mode] < SUITE_COVERAGE for mode in modes):
            seeds.append(seed)
            for mode in modes:
                counts[mode] += 1
    return seeds


def switched_off(seed):
    """Whether a workload also runs with each shortcut off: a fifth of them."""
    return seed % 5 == 0


def all_cases():
    """Every workload with every shortcut on, and a fifth of them with each one off."""
    cases = [(seed, None) for seed in range(NUM_WORKLOADS)]
    return cases + [(seed, switch) for switch in SWITCHES for seed in range(NUM_WORKLOADS) if switched_off(seed)]


def suite_cases():
    """The suite's share of all_cases: its workloads with every shortcut on, and those of
    them that run with the shortcuts off with each one off."""
    seeds = suite_seeds()
    return [(seed, None) for seed in seeds] + [(seed, switch) for switch in SWITCHES for seed in seeds
                                               if switched_off(seed)]


class FastEngineTest(unittest.TestCase):

    def test_every_figure_of_the_fast_engine_is_the_step_engines(self):
        """The suite's share (suite_cases); bench.py check runs every workload (all_cases)."""
        outcomes = [compare_engines(seed, switch) for seed, switch in suite_cases()]
        failures = [failure for _, found in outcomes for failure in found]
        self.assertEqual(failures, [], "\n".join(failures[:10]))
        self.assertEqual(sum(ran for ran, _ in outcomes), len(outcomes))

    def test_each_switch_turns_its_shortcut_off(self):
        def steps_taken(engine):
            engine.scheduler.add(main.Request(0, 10, 40))
            engine.scheduler.add(main.Request(1, 10, 40))
            calls = 0
            while engine.scheduler.has_work():
                engine.advance()
                calls += 1
            return calls
        config = main.SchedulerConfig(block_size=4)
        self.assertEqual(steps_taken(main.FastEngine(main.Scheduler, config, 1000, *L4_8B)), 2)  # prefill, a run
        for switch in ("COHORTS", "DECODE_RUNS"):
            with mock.patch.object(main.FastEngine, switch, False):
                self.assertEqual(steps_taken(main.FastEngine(main.Scheduler, config, 1000, *L4_8B)), 2, switch)
        with mock.patch.object(main.FastEngine, "COHORTS", False), \
                mock.patch.object(main.FastEngine, "DECODE_RUNS", False):
            self.assertEqual(steps_taken(main.FastEngine(main.Scheduler, config, 1000, *L4_8B)), 40)

    def test_the_workloads_cover_every_mode(self):
        argvs = [" ".join(workload(seed)) for seed in range(NUM_WORKLOADS)]
        for mode in ("--prefix-caching", "--no-chunked-prefill", "--max-tokens-in-flight", "--disaggregate",
                     "--tensor-parallel-size", "--trace", "--rate", "--concurrency", "--step-profile", "--kv-tokens 512",
                     "--replicas", "prefix-affinity", "--request-timeout", "--no-async-scheduling",
                     "--speculative-config", "draft_model", "--acceptance-rate 1", "--kv-offloading-size",
                     "--hardware-file"):
            self.assertGreaterEqual(sum(mode in argv for argv in argvs), 10, mode)
        self.assertEqual(sum(int(argv.split()[2]) >= 30 for argv in argvs), 30)  # the loaded ones

    def test_the_suites_share_shows_every_mode_three_times_and_is_part_of_the_whole_set(self):
        seeds = suite_seeds()
        shown = [mode for seed in seeds for mode in modes_of(seed)]
        for mode in MODES + ("loaded",):
            self.assertGreaterEqual(shown.count(mode), SUITE_COVERAGE, mode)
        self.assertLess(len(seeds), NUM_WORKLOADS // 4)  # a share: bench.py check runs the rest
        cases = suite_cases()
        self.assertLessEqual(set(cases), set(all_cases()))
        self.assertGreaterEqual(min(sum(switch == name for _, switch in cases) for name in SWITCHES), 5)

    def test_a_cohort_moves_its_decoding_requests_on_together_and_writes_them_back_exactly(self):
        def engine(fast, caching):
            config = main.SchedulerConfig(block_size=4, prefix_caching=caching)  # caching: a RunPool
            made = (main.FastEngine(main.Scheduler, config, 1000, *L4_8B) if fast
                    else main.Engine(main.Scheduler(config, 1000), *L4_8B))
            for request_id in range(3):
                made.scheduler.add(main.Request(request_id, 10, 20 + request_id))
            return made
        for caching in (False, True):
            fast, reference = engine(True, caching), engine(False, caching)
            self.assertEqual(fast.advance(), [])  # the prefill: all three sample their first token
            finished = fast.advance()  # steps 1-19 at once, the first member finishing in the last of them
            self.assertEqual(([request.request_id for request in finished], fast.num_steps,
                              len(fast.cohort.members)), ([0], 20, 2))
            for _ in range(20):
                reference.step()
            self.assertEqual((fast.clock_s, fast.scheduler.pool.free_count()),
                             (reference.clock_s, reference.scheduler.pool.free_count()))
            fast.cohort.materialize(fast.token_log)
            for request, twin in zip(fast.scheduler.running, reference.scheduler.running):
                self.assertEqual((request.computed, request.generated, len(request.blocks), request.last_token_s),
                                 (29, 20, 8, twin.token_times[-1]))
            self.assertEqual(fast.cohort.members, {})
            finished = [fast.advance() for _ in range(2)]
            self.assertEqual([[request.request_id for request in batch] for batch in finished], [[1], [2]])
            self.assertEqual(fast.num_steps, 22)

    def test_a_cohort_decodes_on_past_finishes_when_they_send_nothing(self):
        def engine():
            fast = main.FastEngine(main.Scheduler, main.SchedulerConfig(block_size=4), 1000, *L4_8B)
            for request_id in range(3):
                fast.scheduler.add(main.Request(request_id, 10, 20 + request_id))
            self.assertEqual(fast.advance(), [])  # the prefill
            return fast
        each, together = engine(), engine()
        one_by_one = [[request.request_id for request in each.advance(math.inf)] for _ in range(3)]
        at_once = [request.request_id for request in together.advance(math.inf, finishes_send=False)]
        self.assertEqual((one_by_one, at_once), ([[0], [1], [2]], [0, 1, 2]))
        self.assertEqual((together.num_steps, together.clock_s, together.busy_s),
                         (each.num_steps, each.clock_s, each.busy_s))
        self.assertEqual(together.num_steps, 22)

    def test_a_run_of_decode_steps_stops_before_the_step_whose_new_blocks_would_not_fit(self):
        # steps 1, 2, ... take 1, 0, 2, 0, 1, 0, 2 blocks (phase = step % 4): 6 fit in 5 free blocks
        self.assertEqual(main.FastEngine.steps_within([0, 1, 0, 2], 1, 5, 100), 6)
        self.assertEqual(main.FastEngine.steps_within([0, 1, 0, 2], 1, 5, 4), 4)
        self.assertEqual(main.FastEngine.steps_within([0, 1, 0, 2], 1, 5, math.inf), 6)
        self.assertEqual(main.FastEngine.steps_within([0, 1, 0, 2], 3, 1, 100), 0)  # step 3 takes 2
        self.assertEqual(main.FastEngine.steps_within([0, 0, 0, 0], 3, 0, math.inf), math.inf)

    def test_small_caches_do_preempt_in_both_engines(self):
        preempted = 0
        for seed in range(60):
            argv = workload(seed)
            if "--kv-tokens" in argv and "--disaggregate" not in argv:
                code, result = report(argv, "fast")
                preempted += code == 0 and result["engine"]["num_preemptions"] > 0
        self.assertGreater(preempted, 3)


if __name__ == "__main__":
    unittest.main()
