"""Shared test helpers: import main, run the CLI in process, small factories."""

import contextlib
import io
import json
import os
import sys

CODE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(CODE_DIR)
FIXTURES_DIR = os.path.join(CODE_DIR, "fixtures")
if CODE_DIR not in sys.path:
    sys.path.insert(0, CODE_DIR)

import main  # noqa: E402  (the path above makes it importable)


def run_cli(*argv):
    """Run main(argv) in process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.main([str(arg) for arg in argv])
    return code, out.getvalue(), err.getvalue()


def run_json(*argv):
    """Run a subcommand with --json and return the parsed report (exit code must be 0)."""
    code, out, err = run_cli(*argv, "--json")
    if code != 0:
        raise AssertionError(f"exit {code}: {err}")
    return json.loads(out)


def make_request(request_id=0, prompt_tokens=8, max_tokens=4, arrival_s=0.0, prefix=None,
                 prefix_tokens=0):
    return main.Request(request_id, prompt_tokens, max_tokens, arrival_s, prefix, prefix_tokens)


def make_pool(num_blocks=11):
    return main.BlockPool(num_blocks)


def make_scheduler(num_blocks=11, block_size=4, max_num_seqs=256, max_num_batched_tokens=64,
                   chunked_prefill=True, prefix_caching=False, max_model_len=None, max_tokens_in_flight=None):
    config = main.SchedulerConfig(max_num_seqs, max_num_batched_tokens, block_size,
                                  chunked_prefill, prefix_caching, max_model_len, max_tokens_in_flight)
    return main.new_scheduler(config, num_blocks)


def step(scheduler, now_s=0.0):
    """One schedule + update; returns the batch as (request_id, tokens) pairs."""
    batch = scheduler.schedule(now_s)
    scheduler.update(batch, now_s + 1.0)
    return [(request.request_id, num_tokens) for request, num_tokens in batch]


def write_file(directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
