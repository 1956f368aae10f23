#!/usr/bin/env python3
"""servesim benchmarks: how fast the simulator runs on this machine (prints figures).

Speed targets live here, not in the unit tests, because wall time on a shared
machine is noise to a test. Each figure is the median of --repeat runs, with the
spread (min-max) so the noise is visible.

    python3 code/bench.py            # all benchmarks
    python3 code/bench.py sweep      # one of: sweep, poisson

sweep    the lesson's Step 9 sweep: H100, 256 requests, concurrency 1,8,32,128,256
poisson  20,000 Poisson requests on H100 at 30 req/s (about 100 running at a time)
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import main  # noqa: E402


def timed(run, repeat):
    """Run run() repeat times; return (median seconds, min, max, last result)."""
    times = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times), result


def simulate_once(concurrency, rate, num_requests):
    plan = main.plan_capacity(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"])
    scheduler = main.Scheduler(main.SchedulerConfig(), plan.num_blocks)
    requests = main.synthetic_requests(num_requests, (256, 1024), (64, 256), seed=0, rate=rate)
    return main.simulate(scheduler, plan.hardware, plan.model, requests, concurrency)


def bench_sweep(repeat):
    def run():
        return [simulate_once(concurrency, None, 256) for concurrency in (1, 8, 32, 128, 256)]
    median, low, high, results = timed(run, repeat)
    tokens = sum(sum(r.generated for r in result.requests) for result in results)
    steps = sum(result.num_steps for result in results)
    print(f"sweep    {median:.3f} s wall (min {low:.3f}, max {high:.3f}, {repeat} runs); "
          f"{steps:,} steps, {tokens / median:,.0f} simulated output tok per wall s")


def bench_poisson(repeat):
    median, low, high, result = timed(lambda: simulate_once(None, 30.0, 20_000), repeat)
    tokens = sum(r.generated for r in result.requests)
    report = result.engine_report()
    print(f"poisson  {median:.3f} s wall (min {low:.3f}, max {high:.3f}, {repeat} runs); "
          f"{result.num_steps:,} steps, mean batch {report['mean_batch_seqs']:.1f}, "
          f"{tokens / median:,.0f} simulated output tok per wall s")


BENCHMARKS = {"sweep": bench_sweep, "poisson": bench_poisson}


def main_bench(argv=None) -> int:
    parser = argparse.ArgumentParser(description="servesim benchmarks")
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per benchmark (default 5)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; expected {', '.join(BENCHMARKS)}")
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} cpus")
    for name in args.names or BENCHMARKS:
        BENCHMARKS[name](args.repeat if name == "sweep" else max(1, args.repeat // 2))
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
