#!/usr/bin/env python3
"""servesim benchmarks: how fast the simulator runs on this machine (prints figures).

Speed targets live here, not in the unit tests, because wall time on a shared
machine is noise to a test. Each figure is the median of its runs, with the spread
(min-max) so the noise is visible: --repeat runs of the in-process sweep, half as
many (rounded up) of every other benchmark, whose runs are longer.

    python3 code/bench.py            # all benchmarks
    python3 code/bench.py sweep      # one of: sweep, poisson

Every simulation benchmark runs both engines, the step engine (the reference) and the
fast one, and prints their figures side by side with the ratio.

sweep    the Step 9 sweep in process: H100, 256 requests, concurrency 1,8,32,128,256
poisson  20,000 Poisson requests on H100 at 30 req/s (about 100 running at a time)
traces   the production traces (SERVESIM_TRACES or ../shared/data; else the slices in
         code/fixtures): Azure 2023 conversations (19,366 requests) on Llama 3.1 8B / H100,
         Mooncake conversations (12,031 requests, prompts of 12,000 tokens on average)
         with prefix caching at real speed and at a third of it; wall time and peak
         memory of each run, in its own process
jobs     sweep --jobs 1 against --jobs 2 over 8 points, beside two copies of a CPU-bound
         loop in two processes against one after the other (what a second core gives here)
million  (only when named) 1,000,000 Poisson requests at 30 req/s with the fast engine
         (--step: the step engine too, once; at 14 s per 20,000 requests here, expect a
         quarter of an hour and gigabytes of per-token lists)
day      (only when named) a day of autoscaling: 24 h of --rate-schedule 0:2,21600:8,43200:16,64800:4
         (about 650,000 requests of 1,000 + 200 tokens) on Llama 3.1 8B / H100, 1 to 8 replicas
         scaled on 48 running each, the fast engine in a process of its own: wall time, peak
         memory, the replicas it used and the day's bill
fuzz     (only when named) --cases N seeded fuzz cases (--seed S) of the fuzz test's families:
         tracebacks, hangs, wrong exit codes, the API key shown; exits 1 if any
check    (only when named) the whole seeded sets the unit tests run a share of: every
         fast-engine workload against the step engine (300, and a fifth of them with each
         shortcut off), the fuzz test's 300 cases, both engines behind every router under
         each load, the scheduler's invariants over 2,500 random cases, a RunPool beside a
         BlockPool over 400 random lives; prints each set's count and what failed, and
         exits 1 if anything did (a case past 60 s counts as hung). A test, not a figure:
         it is here because the whole sets take a minute where the suite takes seconds
loadgen  loadgen's timing accuracy against a stub server in its own process that
         streams 256 tokens, one every 5 ms, and stamps its send time in each event
         (perf_counter is CLOCK_MONOTONIC on Linux, so comparable across processes);
         at concurrency 1, 64 and 256: receive-minus-send error and measured ITL
"""

import argparse
import contextlib
import heapq
import io
import itertools
import json
import os
import selectors
import signal
import socket
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


ENGINES = ("step", "fast")


def simulate_once(concurrency, rate, num_requests, engine="fast"):
    plan = main.plan_capacity(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"])
    spec = main.EngineSpec(plan, main.SchedulerConfig(), fast=engine == "fast")
    requests = list(main.SyntheticWorkload(num_requests, (256, 1024), (64, 256), seed=0, rate=rate))
    return requests, main.run_engine(spec.engine(), requests, concurrency)


def side_by_side(name, medians, detail=""):
    """One line: each engine's median wall (and spread) and the ratio step / fast."""
    parts = [f"{engine} {median:.3f} s (min {low:.3f}, max {high:.3f})" for engine, (median, low, high) in medians.items()]
    ratio = medians["step"][0] / medians["fast"][0]
    print(f"{name:<8} {'; '.join(parts)}; fast is {ratio:.1f}x{detail}")


def bench_sweep(repeat):
    medians = {}
    for engine in ENGINES:
        def run():
            return [simulate_once(concurrency, None, 256, engine) for concurrency in (1, 8, 32, 128, 256)]
        median, low, high, results = timed(run, repeat)
        medians[engine] = (median, low, high)
    steps = sum(engine.num_steps for _, engine in results)
    side_by_side("sweep", medians, f" (the Step 9 sweep in process, {steps:,} steps)")


def bench_poisson(repeat):
    medians = {}
    for engine in ENGINES:
        median, low, high, (requests, result) = timed(lambda: simulate_once(None, 30.0, 20_000, engine), repeat)
        medians[engine] = (median, low, high)
    side_by_side("poisson", medians, f" (20,000 requests at 30 req/s, mean batch "
                                     f"{result.report()['mean_batch_seqs']:.1f}, {result.num_steps:,} steps)")


def run_child(argv):
    """main(argv) in a process of its own: (wall seconds, peak RSS MiB, its stdout)."""
    command = [sys.executable, os.path.abspath(__file__), "_child", json.dumps(argv)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    *output, figures = done.stdout.rstrip("\n").split("\n")
    wall, peak = json.loads(figures)
    return wall, peak, "\n".join(output)


def peak_rss_mib():
    """This process's peak resident memory. NOTE: Linux's VmHWM, where there is one: the
    rusage figure keeps the high-water mark of the process before its exec, so a child of
    a big benchmark process would report at least the parent's size."""
    import resource
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(argv):
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        main.main(argv)
    wall = time.perf_counter() - start
    print(out.getvalue().rstrip("\n"))
    print(json.dumps([wall, peak_rss_mib()]))
    return 0


def bench_process(name, argv, repeat, detail=""):
    """Both engines on argv, each run in its own process repeat times."""
    medians, peaks = {}, {}
    for engine in ENGINES:
        results = [run_child(argv + ["--engine", engine]) for _ in range(repeat)]
        walls = [wall for wall, _, _ in results]
        medians[engine] = (statistics.median(walls), min(walls), max(walls))
        peaks[engine] = max(peak for _, peak, _ in results)
    side_by_side(name, medians, f"; peak RSS step {peaks['step']:.0f} MiB, fast {peaks['fast']:.0f} MiB{detail}")


STUB_TOKENS = 256
STUB_GAP_S = 0.005


STUB_EVENT_HEAD = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}], "t": '
STUB_TAIL = (b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                                     "usage": {"prompt_tokens": 8, "completion_tokens": STUB_TOKENS}}).encode()
             + b"\n\ndata: [DONE]\n\n")
STUB_RESPONSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


class StubStream:
    """One connection to the stub: its request as read so far, then its answer's schedule."""

    def __init__(self, sock):
        self.sock, self.request, self.start_s, self.num_sent, self.outbox = sock, b"", None, 0, b""
        self.closed = False

    def has_request(self) -> bool:
        head, found, rest = self.request.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return found and len(rest) >= length


class StubServer:
    """The stub server: one thread, a selector and a heap of the events due, so that it
    costs the client under test little CPU (an asyncio stub took twice as much: 0.8 of a
    CPU at 256 streams). Each stream gets STUB_TOKENS events STUB_GAP_S apart on an
    absolute schedule from when its request was read, each stamped with perf_counter()
    the moment before it is sent."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.due, self.order = [], itertools.count()  # heap of (perf_counter() due, order, stream)

    def serve_forever(self) -> None:
        while True:
            timeout = max(0.0, self.due[0][0] - time.perf_counter()) if self.due else 0.05
            for key, mask in self.selector.select(timeout):
                if key.data is None:
                    self._accept()
                elif mask & selectors.EVENT_WRITE:
                    self._flush(key.data)
                else:
                    self._read(key.data)
            self._send_due()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.selector.register(sock, selectors.EVENT_READ, StubStream(sock))

    def _read(self, stream) -> None:
        try:
            data = stream.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(stream)
            return
        stream.request += data
        if stream.start_s is None and stream.has_request():
            self._write(stream, STUB_RESPONSE_HEAD)
            stream.start_s = time.perf_counter()
            heapq.heappush(self.due, (stream.start_s, next(self.order), stream))

    def _send_due(self) -> None:
        while self.due and self.due[0][0] <= time.perf_counter():
            stream = heapq.heappop(self.due)[2]
            if stream.closed:  # its client hung up meanwhile
                continue
            # NOTE: stamp as late as possible: the error measured runs from here to the client.
            self._write(stream, STUB_EVENT_HEAD + repr(time.perf_counter()).encode() + b', "i": '
                        + str(stream.num_sent).encode() + b"}\n\n")
            stream.num_sent += 1
            if stream.num_sent < STUB_TOKENS:
                heapq.heappush(self.due, (stream.start_s + stream.num_sent * STUB_GAP_S, next(self.order), stream))
            else:
                self._write(stream, STUB_TAIL)
                if not stream.outbox:
                    self._close(stream)

    def _write(self, stream, data: bytes) -> None:
        """Send data, or keep it (after what is already kept) until the socket takes more."""
        if not stream.outbox:
            try:
                data = data[stream.sock.send(data):]
            except BlockingIOError:
                pass
            except OSError:
                return
            if data:
                self.selector.modify(stream.sock, selectors.EVENT_WRITE, stream)
        stream.outbox += data

    def _flush(self, stream) -> None:
        try:
            stream.outbox = stream.outbox[stream.sock.send(stream.outbox):]
        except BlockingIOError:
            return
        except OSError:
            stream.outbox = b""
        if not stream.outbox:
            if stream.num_sent == STUB_TOKENS:
                self._close(stream)
            else:
                self.selector.modify(stream.sock, selectors.EVENT_READ, stream)

    def _close(self, stream) -> None:
        """Close a stream for good (once: a client that hangs up early stops its schedule)."""
        if stream.closed:
            return
        stream.closed = True
        self.selector.unregister(stream.sock)
        stream.sock.close()


def run_stub_server() -> int:
    """The stub server process: prints its port, serves until killed."""
    server = StubServer()
    print(server.listener.getsockname()[1], flush=True)
    server.serve_forever()
    return 0


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
                    figures[f"{name} p50"].append(main.percentile(values, 50))
                    figures[f"{name} p99"].append(main.percentile(values, 99))
            parts = [f"{name} {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
                     for name, values in figures.items()]
            print(f"loadgen  c={concurrency:<3} {concurrency} streams at once, {2 * concurrency} requests x {STUB_TOKENS} "
                  f"tokens, {repeat} runs, {len(failures)} failed; ms, median (min-max) of runs: " + ", ".join(parts))
    finally:
        stub.kill()
        stub.wait()


class StampErrors:
    """on_event for loadgen runs on the stub: the time each event was read less the time
    the stub stamped it (ms). Picklable, so each --workers process keeps its own copy."""

    def __init__(self):
        self.errors_ms, self.first_ms = [], []  # every event's error; the first token's (TTFT's)

    def __call__(self, at, event):
        if "t" in event:
            self.errors_ms.append((at - event["t"]) * 1000)
            if event.get("i") == 0:
                self.first_ms.append((at - event["t"]) * 1000)


def loadgen_workers_once(endpoint, concurrency, num_workers):
    """One closed-loop run of 2 x concurrency stub streams over num_workers processes:
    (first-token error p50, every-event error p99 in ms, failures, every-event error p50),
    the error being read time less the stub's stamp (so the stub's own lateness under load
    is left out)."""
    bodies = [main.chat_body("stub", "hi", STUB_TOKENS, True, 0.0)] * concurrency * 2
    plan = main.LoadPlan(endpoint, bodies, {"Content-Type": "application/json"}, 0, concurrency, None, 120.0)
    collector = StampErrors()
    run = main.ProcessLoadRun(plan, num_workers, collector) if num_workers > 1 else main.LoadRun(plan, on_event=collector)
    try:
        run.start()
        run.wait()
    finally:
        run.close()
    copies = run.event_copies if num_workers > 1 else [collector]
    errors_ms = sorted(error for copy in copies for error in copy.errors_ms)
    first_ms = sorted(error for copy in copies for error in copy.first_ms)
    return (main.percentile(first_ms, 50), main.percentile(errors_ms, 99),
            [r.error for r in run.records if r.error is not None], main.percentile(errors_ms, 50))


def bench_workers(repeat):
    """loadgen --workers: the timestamp error at 256 and 512 clients, 1 and 2 processes."""
    sys.setswitchinterval(main.LOADGEN_SWITCH_INTERVAL_S)
    stub = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_stub"], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = main.Endpoint.parse(f"http://127.0.0.1:{int(stub.stdout.readline())}")
        for concurrency in (256, 512):
            for num_workers in (1, 2):
                runs = [loadgen_workers_once(endpoint, concurrency, num_workers) for _ in range(repeat)]
                ttft, p99, every = [run[0] for run in runs], [run[1] for run in runs], [run[3] for run in runs]
                failed = sum(len(run[2]) for run in runs)
                print(f"workers  c={concurrency:<3} --workers {num_workers}: {concurrency} streams at once, "
                      f"{2 * concurrency} requests x {STUB_TOKENS} tokens, {repeat} runs, {failed} failed; "
                      f"timestamp error, ms, median (min-max) of runs: "
                      f"first token p50 {statistics.median(ttft):.2f} ({min(ttft):.2f}-{max(ttft):.2f}), every "
                      f"token p50 {statistics.median(every):.2f} ({min(every):.2f}-{max(every):.2f}), p99 "
                      f"{statistics.median(p99):.2f} ({min(p99):.2f}-{max(p99):.2f})")
    finally:
        stub.kill()
        stub.wait()


DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
def trace_runs():
    """The production traces, whole when they are beside the repository (SERVESIM_TRACES or
    ../shared/data), else the slices in code/fixtures."""
    folder = os.environ.get("SERVESIM_TRACES") or DATA_DIR
    azure, mooncake = (os.path.join(folder, "azure_conv_2023.csv"), os.path.join(folder, "mooncake_conversation.jsonl"))
    if not (os.path.exists(azure) and os.path.exists(mooncake)):
        fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
        print(f"traces   the whole traces are not in {folder}; timing the slices in code/fixtures")
        azure = os.path.join(fixtures, "azure_conv_2023_first2000.csv")
        mooncake = os.path.join(fixtures, "mooncake_conversation_first500.jsonl")
    # NOTE: --no-sensitivity: the band's two extra runs would triple what is timed, not the engine
    return (("azure", ["simulate", "--trace", azure, "--no-sensitivity"]),
            ("mooncake", ["simulate", "--trace", mooncake, "--prefix-caching", "--no-sensitivity"]),
            ("mooncake", ["simulate", "--trace", mooncake, "--prefix-caching", "--time-scale", "3", "--no-sensitivity"]))


def bench_traces(repeat):
    for name, argv in trace_runs():
        shown = [arg for arg in argv[3:] if arg != "--no-sensitivity"]
        bench_process(name, argv, repeat, f" ({' '.join(shown) or 'real speed'})")


def bench_million(repeat, with_step):
    """1,000,000 Poisson requests at 30 req/s (about 100 running) in processes of their own:
    the fast engine repeat times, the step engine once when asked (it keeps every token's time)."""
    argv = ["simulate", "--rate", "30", "--requests", "1000000", "--no-sensitivity"]
    for engine, runs in (("fast", repeat), ("step", 1 if with_step else 0)):
        results = [run_child(argv + ["--engine", engine]) for _ in range(runs)]
        if results:
            walls = [wall for wall, _, _ in results]
            print(f"million  {engine}: {statistics.median(walls):.1f} s wall ({min(walls):.1f}-{max(walls):.1f}, "
                  f"{runs} runs), peak RSS {max(peak for _, peak, _ in results):.0f} MiB")


DAY_ARGV = ["simulate", "--rate-schedule", "0:2,21600:8,43200:16,64800:4", "--duration-s", "86400",
            "--prompt-tokens", "1000", "--output-tokens", "200", "--min-replicas", "1", "--max-replicas", "8",
            "--scale-metric", "running", "--scale-target", "48", "--scale-up-delay-s", "120", "--no-sensitivity",
            "--json"]


def bench_day(repeat):
    """DAY_ARGV in processes of its own, repeat times: wall, memory, and what the fleet did."""
    results = [run_child(DAY_ARGV) for _ in range(repeat)]
    walls = [wall for wall, _, _ in results]
    report = json.loads(results[-1][2])
    fleet, requests = report["fleet"], report["settings"]["num_requests"]
    print(f"day      {requests:,} requests over 24 h: {statistics.median(walls):.1f} s wall "
          f"({min(walls):.1f}-{max(walls):.1f}, {repeat} runs, {requests / statistics.median(walls):,.0f} requests/s), "
          f"peak RSS {max(peak for _, peak, _ in results):.0f} MiB; up to {fleet['max_replicas']} replicas, "
          f"{fleet['replica_hours']:.1f} replica-hours ({fleet['replica_hours'] / (8 * 24):.0%} of 8 fixed), "
          f"${fleet['cost']['usd']:,.2f} for the day")


def spin(num_loops):
    """A CPU-bound loop of the interpreter's own, for the machine's parallel ceiling."""
    total = 0
    for i in range(num_loops):
        total += i
    return total


def parallel_ceiling(repeat, num_loops=3_000_000):
    """How much faster two processes run two copies of spin() than one process runs them
    one after the other (2.0 on two free cores; less where the cores are shared)."""
    import multiprocessing
    ratios = []
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(spin, [1, 1])  # both workers started before the clock does
        for _ in range(repeat):
            start = time.perf_counter()
            spin(num_loops)
            spin(num_loops)
            serial = time.perf_counter() - start
            start = time.perf_counter()
            pool.map(spin, [num_loops, num_loops], chunksize=1)
            ratios.append(serial / (time.perf_counter() - start))
    return statistics.median(ratios), min(ratios), max(ratios)


def bench_jobs(repeat):
    """sweep --jobs 1 against --jobs 2 over 8 points, in processes of their own, beside
    what two processes gain on this machine at all."""
    argv = ["sweep", "--requests", "2048", "--concurrency", "1,2,4,8,16,32,64,128"]
    walls = {jobs: statistics.median(run_child(argv + ["--jobs", str(jobs)])[0] for _ in range(repeat))
             for jobs in (1, 2)}
    ceiling = parallel_ceiling(repeat)
    print(f"jobs     sweep of 8 points: --jobs 1 {walls[1]:.2f} s, --jobs 2 {walls[2]:.2f} s: "
          f"{walls[1] / walls[2]:.2f}x; two copies of a CPU-bound loop in 2 processes: {ceiling[0]:.2f}x "
          f"(min {ceiling[1]:.2f}, max {ceiling[2]:.2f}): what a second core gives here now")


def tests_importable():
    """code/tests on the path, so that fuzz and check run the tests' own generators and comparisons."""
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def bench_fuzz(num_cases, seed):
    """The fuzz test's families, as many cases as asked: what went wrong, by kind."""
    import tempfile
    tests_importable()
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
                # NOTE: to the real stdout: a hung case's thread, still running, puts back the
                # sys.stdout it found (another case's capture) whenever it ends
                print(f"fuzz     {case.describe()[:160]}: {problem[:200]}", file=sys.__stdout__, flush=True)
    print(f"fuzz     seed {seed}: {len(cases):,} cases in {time.perf_counter() - start:.1f} s: "
          f"{counts['traceback']} tracebacks, {counts['hung']} hangs, {counts['exit']} wrong exits, "
          f"{counts['stderr']} exit-2 with more than one stderr line, {counts['key']} with the API key shown",
          file=sys.__stdout__)
    return 1 if any(counts.values()) else 0


CASE_LIMIT_S = 60  # a check's case past this has hung (the slowest takes about a second)


class CaseTimeout(BaseException):
    """A check's case ran past CASE_LIMIT_S (not an Exception: main()'s net would take it)."""


class Limited:
    """function(*case) in a pool's worker, stopped by an alarm past CASE_LIMIT_S (a scheduler
    that never admits its head loops for ever): then hung(case) is its outcome."""

    def __init__(self, function, hung):
        self.function, self.hung = function, hung

    def __call__(self, *case):
        if not hasattr(signal, "SIGALRM"):
            return self.function(*case)

        def expire(signum, frame):
            raise CaseTimeout
        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(CASE_LIMIT_S)
        try:
            return self.function(*case)
        except CaseTimeout:
            return self.hung(case)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


def in_processes(function, hung, cases):
    """Limited(function, hung)(*case) for every case, on every CPU (spawned: no fork of threads)."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(min(4, os.cpu_count() or 1)) as pool:
        return pool.starmap(Limited(function, hung), cases, chunksize=10)


def workload_hung(case):
    import test_fast_engine
    seed, switch = case
    return False, [f"{' '.join(test_fast_engine.workload(seed))}{f' ({switch} off)' if switch else ''}: "
                   f"ran past {CASE_LIMIT_S} s"]


def fuzz_case_hung(case):
    return [f"{case[0].describe()}: ran past {CASE_LIMIT_S} s"]


def check_fast_engine():
    """Every fast-engine workload against the step engine: (cases, what differs)."""
    import test_fast_engine
    cases = test_fast_engine.all_cases()
    outcomes = in_processes(test_fast_engine.compare_engines, workload_hung, cases)
    failures = [failure for _, found in outcomes for failure in found]  # a run that failed says so
    num_off = sum(switch is not None for _, switch in cases)
    return (f"{len(cases)} fast-engine workloads against the step engine ({len(cases) - num_off} with every shortcut "
            f"on, {num_off} with one off)"), failures


def check_fuzz():
    """The fuzz test's cases, all of them: (cases, what went wrong)."""
    import fuzz_cases
    import test_fuzz
    cases = fuzz_cases.generate(test_fuzz.SEED, test_fuzz.NUM_CASES, *test_fuzz.reference_reports())
    failures = [problem for found in in_processes(test_fuzz.problems_of, fuzz_case_hung, [(case,) for case in cases])
                for problem in found]
    return f"{len(cases)} fuzz cases (seed {test_fuzz.SEED})", failures


def check_routers():
    """Both engines behind every router under each load: (cases, what differs)."""
    import test_deployment
    cases = test_deployment.router_cases()
    return (f"{len(cases)} router and load pairs in both engines",
            [difference for case in cases for difference in test_deployment.engines_disagree(*case)])


def assertion_failures(cases, run):
    """run(test, *case) for every case, test a TestCase whose assertions raise: what failed."""
    import unittest
    test, failures = unittest.TestCase(), []
    for case in cases:
        try:
            run(test, *case)
        except AssertionError as error:
            failures.append(f"{case}: {str(error)[:300]}")
    return failures


def check_scheduler_invariants():
    """The scheduler's invariants after every step of every random case: (cases, what broke)."""
    import test_scheduler_invariants
    checker = test_scheduler_invariants.SchedulerInvariantTest("run_case")  # its checks, outside a test run
    seeds = range(test_scheduler_invariants.NUM_SEEDS)
    return (f"{len(seeds)} random schedulers checked after every step",
            assertion_failures([(seed,) for seed in seeds], lambda _, seed: checker.run_case(seed)))


def check_run_pool():
    """A RunPool against a BlockPool over every random life: (cases, what differs)."""
    import test_run_pool
    cases = [(seed, racing) for racing in (False, True) for seed in test_run_pool.lives(racing)]
    return (f"{len(cases)} random lives of a RunPool beside a BlockPool",
            assertion_failures(cases, test_run_pool.live))


CHECKS = (check_fast_engine, check_fuzz, check_routers, check_scheduler_invariants, check_run_pool)


def bench_check() -> int:
    """Every CHECKS set: its count and what failed; 1 if anything did."""
    tests_importable()
    num_failed = 0
    for check in CHECKS:
        start = time.perf_counter()
        what, failures = check()
        num_failed += len(failures)
        print(f"check    {what}: {'ok' if not failures else f'{len(failures)} FAILED'} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
        for failure in failures[:20]:
            print(f"check      {failure[:400]}", flush=True)
    print(f"check    {'all passed' if not num_failed else f'{num_failed} failures'}")
    return 1 if num_failed else 0


BENCHMARKS = {"sweep": bench_sweep, "poisson": bench_poisson, "traces": bench_traces, "jobs": bench_jobs,
              "loadgen": bench_loadgen, "workers": bench_workers}


def main_bench(argv=None) -> int:
    if argv is None and sys.argv[1:] == ["_stub"]:
        return run_stub_server()
    if argv is None and sys.argv[1:2] == ["_child"]:
        return child_main(json.loads(sys.argv[2]))
    parser = argparse.ArgumentParser(description="servesim benchmarks")
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per benchmark (default 5)")
    parser.add_argument("--cases", type=int, default=1000, help="fuzz: cases to run (default 1000)")
    parser.add_argument("--seed", type=int, default=1, help="fuzz: the seed of the cases (default 1)")
    parser.add_argument("--step", action="store_true", help="million: the step engine too, once")
    args = parser.parse_args(argv)
    if args.names == ["fuzz"]:
        return bench_fuzz(args.cases, args.seed)
    if args.names == ["check"]:
        return bench_check()
    if args.names == ["million"]:
        bench_million(max(1, (args.repeat + 1) // 2), args.step)
        return 0
    if args.names == ["day"]:
        bench_day(max(1, (args.repeat + 1) // 2))
        return 0
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; expected {', '.join(BENCHMARKS)}")
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} cpus")
    for name in args.names or BENCHMARKS:
        BENCHMARKS[name](args.repeat if name == "sweep" else max(1, (args.repeat + 1) // 2))
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
