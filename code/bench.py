#!/usr/bin/env python3
"""servesim benchmarks: how fast the simulator runs on this machine (prints figures).

Speed targets live here, not in the unit tests, because wall time on a shared
machine is noise to a test. Each figure is the median of --repeat runs, with the
spread (min-max) so the noise is visible.

    python3 code/bench.py            # all benchmarks
    python3 code/bench.py sweep      # one of: sweep, poisson

sweep    the lesson's Step 9 sweep: H100, 256 requests, concurrency 1,8,32,128,256
poisson  20,000 Poisson requests on H100 at 30 req/s (about 100 running at a time)
traces   the two production traces of ../shared/data, whole: Azure 2023 conversations
         (19,366 requests) on Llama 3.1 8B / H100, and Mooncake conversations (12,031
         requests, prompts of 12,000 tokens on average) with prefix caching at a third
         of its speed; wall time and peak memory of each run, in its own process
fuzz     (only when named) --cases N seeded fuzz cases (--seed S) of the fuzz test's families:
         tracebacks, hangs, wrong exit codes, the API key shown; exits 1 if any
loadgen  loadgen's timing accuracy against a stub server in its own process that
         streams 256 tokens, one every 5 ms, and stamps its send time in each event
         (perf_counter is CLOCK_MONOTONIC on Linux, so comparable across processes);
         at concurrency 1, 64 and 256: receive-minus-send error and measured ITL
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
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
    return requests, main.simulate(scheduler, plan.hardware, plan.model, requests, concurrency)


def bench_sweep(repeat):
    def run():
        return [simulate_once(concurrency, None, 256) for concurrency in (1, 8, 32, 128, 256)]
    median, low, high, results = timed(run, repeat)
    tokens = sum(sum(r.generated for r in requests) for requests, _ in results)
    steps = sum(engine.num_steps for _, engine in results)
    print(f"sweep    {median:.3f} s wall (min {low:.3f}, max {high:.3f}, {repeat} runs); "
          f"{steps:,} steps, {tokens / median:,.0f} simulated output tok per wall s")


def bench_poisson(repeat):
    median, low, high, (requests, engine) = timed(lambda: simulate_once(None, 30.0, 20_000), repeat)
    tokens = sum(r.generated for r in requests)
    report = engine.report()
    print(f"poisson  {median:.3f} s wall (min {low:.3f}, max {high:.3f}, {repeat} runs); "
          f"{engine.num_steps:,} steps, mean batch {report['mean_batch_seqs']:.1f}, "
          f"{tokens / median:,.0f} simulated output tok per wall s")


STUB_TOKENS = 256
STUB_GAP_S = 0.005


async def _stub_stream(reader, writer):
    """One connection: read a POST, then stream STUB_TOKENS events on an absolute schedule."""
    import asyncio
    headers = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in headers.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    head = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}], "t": '
    start = time.perf_counter()
    for index in range(STUB_TOKENS):
        delay = start + index * STUB_GAP_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        # NOTE: stamp as late as possible: the error measured runs from here to the client.
        writer.write(head + repr(time.perf_counter()).encode() + b"}\n\n")
    tail = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": STUB_TOKENS}}
    writer.write(b"data: " + json.dumps(tail).encode() + b"\n\ndata: [DONE]\n\n")
    await writer.drain()
    writer.close()


def run_stub_server() -> int:
    """The stub server process: one asyncio thread (so it costs the client little CPU);
    prints its port, serves until killed."""
    import asyncio

    async def serve():
        server = await asyncio.start_server(_stub_stream, "127.0.0.1", 0, backlog=1024)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(serve())
    return 0


def _percentile(sorted_values, pct):
    return sorted_values[min(len(sorted_values) - 1, int(pct / 100 * len(sorted_values)))]


def loadgen_accuracy_once(endpoint, concurrency):
    """One closed-loop run of 2 x concurrency stub streams: (errors ms, ITL ms, failures)."""
    errors_ms, lock = [], threading.Lock()

    def on_event(at, event):
        if "t" in event:
            with lock:
                errors_ms.append((at - event["t"]) * 1000)

    bodies = [main.chat_body("stub", "hi", STUB_TOKENS, True, 0.0)] * concurrency * 2
    plan = main.LoadPlan(endpoint, bodies, {"Content-Type": "application/json"}, 0, concurrency, None, 120.0)
    with main.LoadRun(plan, on_event=on_event) as run:
        run.start()
        run.wait()
    itl_ms = sorted((b - a) * 1000 for r in run.records for a, b in zip(r.token_times, r.token_times[1:]))
    return sorted(errors_ms), itl_ms, [r.error for r in run.records if r.error is not None]


def bench_loadgen(repeat):
    sys.setswitchinterval(main.LOADGEN_SWITCH_INTERVAL_S)  # as loadgen sets it
    stub = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_stub"], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = main.Endpoint.parse(f"http://127.0.0.1:{int(stub.stdout.readline())}")
        for concurrency in (1, 64, 256):
            figures = {"error p50": [], "error p99": [], "itl p50": [], "itl p99": []}
            failures = []
            for _ in range(repeat):
                errors_ms, itl_ms, failed = loadgen_accuracy_once(endpoint, concurrency)
                failures += failed
                for name, values in (("error", errors_ms), ("itl", itl_ms)):
                    figures[f"{name} p50"].append(_percentile(values, 50))
                    figures[f"{name} p99"].append(_percentile(values, 99))
            parts = [f"{name} {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
                     for name, values in figures.items()]
            print(f"loadgen  c={concurrency:<3} {2 * concurrency} streams x {STUB_TOKENS} tokens, {repeat} runs, "
                  f"{len(failures)} failed; ms, median (min-max) of runs: " + ", ".join(parts))
    finally:
        stub.kill()
        stub.wait()


DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
TRACE_RUNS = (
    ("azure", ["--trace", os.path.join(DATA_DIR, "azure_conv_2023.csv")]),
    ("mooncake", ["--trace", os.path.join(DATA_DIR, "mooncake_conversation.jsonl"), "--prefix-caching",
                  "--time-scale", "3"]),
)


def bench_traces(repeat):
    import resource
    for name, argv in TRACE_RUNS:
        if not os.path.exists(argv[1]):
            print(f"traces   {name}: {argv[1]} not found, skipped")
            continue
        command = [sys.executable, os.path.abspath(main.__file__), "simulate", *argv, "--json"]
        start = time.perf_counter()
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # largest child so far
        report = json.loads(out)
        summary, engine = report["summary"], report["engine"]
        print(f"traces   {name}: {summary['num_requests']:,} requests in {wall:.1f} s wall, peak RSS <= "
              f"{peak_mib:.0f} MiB; {engine['num_steps']:,} steps, {summary['output_tokens'] / wall:,.0f} simulated "
              f"output tok per wall s; TTFT p50 {summary['ttft_ms']['p50']:.1f} ms p99 {summary['ttft_ms']['p99']:.1f} "
              f"ms, TPOT p50 {summary['tpot_ms']['p50']:.1f} ms, {summary['output_tok_per_s']:.1f} output tok/s, "
              f"kv peak {engine['kv_peak']:.1%}, preemptions {engine['num_preemptions']}, prefix hits "
              f"{engine['prefix_hit_rate']:.1%}")


def bench_fuzz(num_cases, seed):
    """The fuzz test's families, as many cases as asked: what went wrong, by kind."""
    import tempfile
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
    import fuzz_cases
    import test_fuzz
    counts = {"traceback": 0, "hung": 0, "exit": 0, "stderr": 0, "key": 0}
    start = time.perf_counter()
    cases = fuzz_cases.generate(seed, num_cases, *test_fuzz.reference_reports())
    with tempfile.TemporaryDirectory() as directory:
        for case in cases:
            for problem in fuzz_cases.run_case(main, case, directory)[0]:
                kind = next((kind for kind, words in (("traceback", "traceback"), ("hung", "hung"),
                                                      ("stderr", "stderr lines"), ("key", "API key"))
                             if words in problem), "exit")
                counts[kind] += 1
                print(f"fuzz     {case.describe()[:160]}: {problem[:200]}")
    print(f"fuzz     seed {seed}: {len(cases):,} cases in {time.perf_counter() - start:.1f} s: "
          f"{counts['traceback']} tracebacks, {counts['hung']} hangs, {counts['exit']} wrong exits, "
          f"{counts['stderr']} exit-2 with more than one stderr line, {counts['key']} with the API key shown")
    return 1 if any(counts.values()) else 0


BENCHMARKS = {"sweep": bench_sweep, "poisson": bench_poisson, "traces": bench_traces, "loadgen": bench_loadgen}


def main_bench(argv=None) -> int:
    if argv is None and sys.argv[1:] == ["_stub"]:
        return run_stub_server()
    parser = argparse.ArgumentParser(description="servesim benchmarks")
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per benchmark (default 5)")
    parser.add_argument("--cases", type=int, default=1000, help="fuzz: cases to run (default 1000)")
    parser.add_argument("--seed", type=int, default=1, help="fuzz: the seed of the cases (default 1)")
    args = parser.parse_args(argv)
    if args.names == ["fuzz"]:
        return bench_fuzz(args.cases, args.seed)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; expected {', '.join(BENCHMARKS)}")
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} cpus")
    for name in args.names or BENCHMARKS:
        BENCHMARKS[name](args.repeat if name == "sweep" else max(1, (args.repeat + 1) // 2))
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
