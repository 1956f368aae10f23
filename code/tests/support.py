"""Shared test helpers: import main, run the CLI in process, small factories."""

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

CODE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(CODE_DIR)
FIXTURES_DIR = os.path.join(CODE_DIR, "fixtures")
if CODE_DIR not in sys.path:
    sys.path.insert(0, CODE_DIR)

import main  # noqa: E402  (the path above makes it importable)

# NOTE: a test that runs past this fails instead of hanging the suite (a scheduler that never
# admits its head loops for ever); the slowest test takes about a tenth of it.
TEST_TIME_LIMIT_S = int(os.environ.get("SERVESIM_TEST_TIME_LIMIT_S", "120"))


class TestTimeout(BaseException):
    """A test ran past TEST_TIME_LIMIT_S. NOTE: not an Exception, so that main()'s net for
    an internal error (a test runs the CLI in process) does not catch it and run on."""


def _limited_run(run):
    """TestCase.run, with SIGALRM raising TestTimeout in the test once the limit passes
    (where there is SIGALRM and the test runs on the main thread)."""
    def limited(self, result=None):
        if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
            return run(self, result)

        def expire(signum, frame):
            raise TestTimeout(f"{self.id()} ran past {TEST_TIME_LIMIT_S} s")
        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(TEST_TIME_LIMIT_S)
        try:
            return run(self, result)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    limited.time_limited = True
    return limited


if not getattr(unittest.TestCase.run, "time_limited", False):
    unittest.TestCase.run = _limited_run(unittest.TestCase.run)


def connected_pair():
    """Two ends of a TCP connection on 127.0.0.1: (the client's, the server's)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    return client, server


@contextlib.contextmanager
def kernel_stamping():
    """A connected pair whose client end the kernel has stamped a packet for: (client end,
    server end, a stamped Receiver of the client end); None where the kernel stamps none
    (only Linux on x86_64 and arm64 does).

    NOTE: the kernel starts stamping a moment after the first socket asks (a deferred
    switch, later still on a loaded machine) and stops a moment after the last one closes:
    while this pair is open, every socket that asks has its packets stamped at once."""
    client, server = connected_pair()
    with client, server:
        receiver = main.Receiver(client, time.perf_counter, stamped=True)
        stamped = False
        if main.enable_kernel_stamps(client):
            for _ in range(100):
                server.sendall(b"x")
                time.sleep(0.02)
                if receiver.recv()[2] is not None:
                    stamped = True
                    break
        yield (client, server, receiver) if stamped else None


def run_cli(*argv):
    """Run main(argv) in process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.main([str(arg) for arg in argv])
    return code, out.getvalue(), err.getvalue()


def wait_until(condition, timeout_s=30.0):
    """Poll condition() until it holds (True) or timeout_s passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class LateClock:
    """An injected clock for a LoadRun: it moves only when the code under test sleeps, and
    each sleep ends late_s late (a loaded machine's late wake-up, the same every time)."""

    def __init__(self, late_s=0.0):
        self.now, self.late_s = 0.0, late_s

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds + self.late_s


# main.py's entry with another grace after Ctrl-C (main.INTERRUPT_GRACE_S, which finish_in_flight reads)
WITH_GRACE = ("import sys; sys.path.insert(0, {code!r}); import main; main.INTERRUPT_GRACE_S = {grace_s!r}; "
              "sys.exit(main.main())")


def start_interruptible(*argv, grace_s=None):
    """main.py argv in a child process (pipes for stdout and stderr) that SIGINT reaches as
    Ctrl-C, even when this suite itself ignores SIGINT (a background job of a script does):
    a child inherits an ignored signal, and Python then leaves it ignored. grace_s, when
    given, is how long loadgen's streams in flight get after the first Ctrl-C."""
    entry = ([os.path.join(CODE_DIR, "main.py")] if grace_s is None
             else ["-c", WITH_GRACE.format(code=CODE_DIR, grace_s=float(grace_s))])
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, *entry, *map(str, argv)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def run_json(*argv):
    """Run a subcommand with --json and return the parsed report (exit code must be 0)."""
    code, out, err = run_cli(*argv, "--json")
    if code != 0:
        raise AssertionError(f"exit {code}: {err}")
    return json.loads(out)


def new_scheduler(config, num_blocks, extend=None):
    """The scheduler a configuration asks for, over a BlockPool (as the step engine keeps it);
    extend(that class), when given, returns the subclass to build instead."""
    scheduler_class = main.configured_scheduler(config)
    return (extend(scheduler_class) if extend else scheduler_class)(config, num_blocks)


def synthetic_requests(num_requests, prompt_tokens, output_tokens, seed, rate=None, burstiness=1.0):
    """A SyntheticWorkload's requests as a list."""
    return list(main.SyntheticWorkload(num_requests, prompt_tokens, output_tokens, seed, rate, burstiness))


def simulation_report(scheduler, hardware, model, requests, concurrency=None, slo=None, cost=None):
    """Simulate requests on the step engine: what it saw, the summary and the rejections."""
    return main.run_and_report(main.Engine(scheduler, hardware, model, cost), requests, concurrency, slo)


def records_from_report(report):
    """The per-request records of a loadgen --json --json-requests report."""
    return [main.MeasuredRequest(**{name: entry.get(name) for name in main.REQUEST_FIELDS if name in entry})
            for entry in report["requests"]]


def free_blocks(pool):
    """A BlockPool's free list, front (least recently released) first."""
    return list(pool.free)


def ref_counts(pool):
    """The reference count of each block a BlockPool has in use."""
    return {block: pool.shared.get(block, 1) for block in range(pool.num_blocks) if block not in pool.free}


def keys_held(pool):
    """The content key of each block of a BlockPool that carries one."""
    return dict(pool.key_of)


def make_request(request_id=0, prompt_tokens=8, max_tokens=4, arrival_s=0.0, prefix=None,
                 prefix_tokens=0):
    return main.Request(request_id, prompt_tokens, max_tokens, arrival_s, prefix, prefix_tokens)


def make_pool(num_blocks=11):
    return main.BlockPool(num_blocks)


def make_scheduler(num_blocks=11, block_size=4, max_num_seqs=256, max_num_batched_tokens=64,
                   chunked_prefill=True, prefix_caching=False, max_model_len=None, max_tokens_in_flight=None,
                   extend=None, **features):
    """A scheduler over a BlockPool; features: SchedulerConfig's speculative decoding and
    host-tier fields (num_speculative_tokens, acceptance_rate, kv_offloading_blocks, ...)."""
    config = main.SchedulerConfig(max_num_seqs, max_num_batched_tokens, block_size,
                                  chunked_prefill, prefix_caching, max_model_len, max_tokens_in_flight, **features)
    return new_scheduler(config, num_blocks, extend)


def step(scheduler, now_s=0.0):
    """One schedule + update; returns the batch as (request_id, tokens) pairs."""
    batch = scheduler.schedule(now_s)
    scheduler.update(batch, now_s + 1.0)
    return [(request.request_id, num_tokens) for request, num_tokens in batch]


class ScratchTest(unittest.TestCase):
    """A test case with a scratch folder, a file writer and the bad-input check."""

    def setUp(self):
        scratch = tempfile.TemporaryDirectory()
        self.addCleanup(scratch.cleanup)
        self.directory = scratch.name

    def write(self, name, content):
        """Write text, bytes, or anything else as JSON, to name in the scratch folder."""
        path = os.path.join(self.directory, name)
        if isinstance(content, bytes):
            with open(path, "wb") as handle:
                handle.write(content)
        else:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def assert_usage_error(self, argv, *fragments):
        """The command exits 2 with one line on stderr that names each fragment."""
        code, out, err = run_cli(*argv)
        self.assertEqual(code, 2, err)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertTrue(err.startswith("servesim: error: "), err)
        self.assertNotIn("Traceback", err)
        for fragment in fragments:
            self.assertIn(fragment, err)
