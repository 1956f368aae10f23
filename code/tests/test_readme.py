"""The README's examples are what the commands print today.

Every fenced block that starts with `$ python3 code/main.py ...` is run in process from
the repository root and its output compared line for line, unless it needs a server,
a file that is not in the repository, or a production trace from ../shared/data (those
runs take seconds to minutes; code/bench.py traces times them).
"""

import contextlib
import io
import os
import re
import shlex
import unittest

from support import REPO_DIR, main

README = os.path.join(REPO_DIR, "README.md")


def examples():
    """(command, expected output lines) for each example in the README."""
    with open(README, encoding="utf-8") as handle:
        blocks = re.findall(r"```\n(.*?)```", handle.read(), flags=re.S)
    found = []
    for block in blocks:
        command, output = None, []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command:
                    found.append((command, output))
                command, output = line[2:], []
            elif command:
                output.append(line)
        if command:
            found.append((command, output))
    for _, output in found:
        while output and not output[-1]:
            output.pop()  # the blank line between two examples
    return [(command, output) for command, output in found if command.startswith("python3 code/main.py ")]


def runnable(argv):
    if any(arg.startswith("http") for arg in argv) or argv[0] in ("loadgen", "compare", "calibrate"):
        return False
    files = [arg for arg in argv if re.search(r"\.(jsonl|csv|json|prom|gguf)$", arg)]
    return all(os.path.exists(os.path.join(REPO_DIR, path)) and "shared/data" not in path for path in files)


class ReadmeTest(unittest.TestCase):

    def test_the_readme_has_examples_to_check(self):
        self.assertGreaterEqual(sum(runnable(shlex.split(command)[2:]) for command, _ in examples()), 8)

    def test_every_runnable_example_prints_what_the_readme_shows(self):
        here = os.getcwd()
        os.chdir(REPO_DIR)
        try:
            for command, expected in examples():
                echo_status = command.endswith('; echo "exit $?"')
                argv = shlex.split(command.replace('; echo "exit $?"', ""))[2:]
                if not runnable(argv):
                    continue
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = main.main(argv)
                printed = (out.getvalue() + err.getvalue()).splitlines()
                if echo_status:
                    printed.append(f"exit {code}")
                with self.subTest(command=command):
                    self.assertEqual(printed, expected)
        finally:
            os.chdir(here)


if __name__ == "__main__":
    unittest.main()
