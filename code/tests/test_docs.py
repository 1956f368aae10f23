"""Every servesim command in the runbook runs as written (against a fake server).

The commands of outputs/skill-llm-serving-tuning.md run in order in a scratch folder, so
the reports one command writes are there for the next. Only what a real server would make
slow is shortened: its URL becomes the fake server's, --requests becomes 4, and
--scrape-interval becomes 10 ms.
"""

import contextlib
import io
import json
import os
import re
import shlex
import tempfile
import time
import unittest

from fake_server import FakeServer, chunk
from support import REPO_DIR, main

RUNBOOK = os.path.join(REPO_DIR, "outputs", "skill-llm-serving-tuning.md")
PROMPT = os.path.join(REPO_DIR, "outputs", "prompt-explain-serving-metrics.md")
SCRAPE = ('vllm:num_requests_running{model_name="m"} 3\nvllm:num_requests_waiting{model_name="m"} 0\n'
          'vllm:kv_cache_usage_perc{model_name="m"} 0.2\nvllm:num_preemptions_total{model_name="m"} 0\n')


def documented_commands(path):
    """The `python3 code/main.py ...` lines of the fenced blocks of a markdown file."""
    with open(path, encoding="utf-8") as handle:
        blocks = re.findall(r"```\n(.*?)```", handle.read(), flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("python3 code/main.py ")]


def paced_stream(handler, body):
    """A short answer, a token every 2 ms, so TPOT and TTFT are positive."""
    handler.start_stream()
    for index in range(6):
        handler.write_chunk(f"data: {json.dumps(chunk(f' w{index}'))}\n\n".encode())
        time.sleep(0.002)
    handler.write_chunk(f"data: {json.dumps(chunk(finish='length', usage=(40, 6)))}\n\ndata: [DONE]\n\n".encode())
    handler.end_stream()


def shortened(argv, url):
    argv = [url if arg == "http://127.0.0.1:8000" else arg for arg in argv]
    for flag, value in (("--requests", "4"), ("--scrape-interval", "0.01")):
        if flag in argv and argv[0] in ("loadgen", "explain"):
            argv[argv.index(flag) + 1] = value
    return argv


class RunbookTest(unittest.TestCase):

    def test_the_runbook_has_a_command_for_every_step(self):
        commands = documented_commands(RUNBOOK)
        subcommands = {shlex.split(command)[2] for command in commands}
        self.assertTrue({"capacity", "simulate", "explain", "loadgen", "compare", "calibrate", "sweep"} <= subcommands)

    def test_every_runbook_command_runs_as_written(self):
        with FakeServer(chat=paced_stream, metrics=[SCRAPE]) as server, tempfile.TemporaryDirectory() as scratch:
            here = os.getcwd()
            os.chdir(scratch)
            try:
                for command in documented_commands(RUNBOOK):
                    argv = shlex.split(command)[2:]
                    target = None
                    if ">" in argv:
                        target = argv[argv.index(">") + 1]
                        argv = argv[:argv.index(">")]
                    out, err = io.StringIO(), io.StringIO()
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                        code = main.main(shortened(argv, server.url))
                    self.assertEqual(code, 0, f"{command}\n{err.getvalue()}")
                    if target:
                        with open(target, "w", encoding="utf-8") as handle:
                            handle.write(out.getvalue())
            finally:
                os.chdir(here)

    def test_the_prompts_worked_examples_are_what_explain_prints_for_their_inputs(self):
        with open(PROMPT, encoding="utf-8") as handle:
            text = handle.read()
        self.assertEqual(text.count("## Worked example"), 2)
        before, after, answer_1, report, answer_2 = re.findall(r"```\n(.*?)```", text, flags=re.S)
        runs = (({"before.prom": before, "after.prom": after}, answer_1,
                 ["before.prom", "after.prom", "--hardware", "l4-24gb", "--model", "llama-3.1-8b",
                  "--max-num-seqs", "256", "--shared-prefix-tokens", "1000"]),
                ({"c8.json": report}, answer_2,
                 ["c8.json", "--hardware", "cpu-2vcpu", "--model", "gemma-3-270m-q4_k_m", "--kv-tokens", "4096",
                  "--max-num-seqs", "4", "--max-num-batched-tokens", "2048"]))
        for files, answer, argv in runs:
            with tempfile.TemporaryDirectory() as scratch:
                here = os.getcwd()
                os.chdir(scratch)
                try:
                    for name, content in files.items():
                        with open(name, "w", encoding="utf-8") as handle:
                            handle.write(content)
                    out = io.StringIO()
                    with contextlib.redirect_stdout(out):
                        self.assertEqual(main.main(["explain", *argv]), 0)
                finally:
                    os.chdir(here)
            self.assertEqual(out.getvalue(), answer)


if __name__ == "__main__":
    unittest.main()
