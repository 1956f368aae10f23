"""The README works in a fresh clone: every servesim command it shows runs as shown.

The repository's files are copied to a scratch folder with nothing beside it (no
../shared), and every `python3 code/main.py ...` line of the README's fenced blocks runs
there in order, in process, so a report one example writes (`> c1.json`) is there for
the next. A line shown with `$ ` must print exactly the lines under it; a line without
one must succeed. Commands that talk to a server (`--url http://...`) run against a
stdlib fake server in its place, and `--requests` is cut to 4 for them.
"""

import ast
import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest

from fake_server import FakeServer, counting_chat, word_tokens
from support import REPO_DIR, main

README = os.path.join(REPO_DIR, "README.md")


def examples():
    """(command, expected output lines or None) for each servesim line of the README."""
    with open(README, encoding="utf-8") as handle:
        blocks = re.findall(r"```\n(.*?)```", handle.read(), flags=re.S)
    found = []
    for block in blocks:
        output = None  # the expected lines of the block's current `$ ` example
        for line in block.splitlines():
            if line.startswith("$ "):
                output = [] if line.startswith("$ python3 code/main.py ") else None
                found.append((line[2:], output))  # another program's `$ ` line is not run here
            elif line.startswith("python3 code/main.py "):
                found.append((line, None))
            elif output is not None:
                output.append(line)
    for _, output in found:
        while output and not output[-1]:
            output.pop()  # the blank line between two examples
    return [(command, output) for command, output in found if command.startswith("python3 code/main.py ")]


def tracked_files():
    """The files a clone has: git's list where git answers, else everything but caches."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_DIR, capture_output=True, text=True, check=True)
        return [path for path in listed.stdout.splitlines() if os.path.exists(os.path.join(REPO_DIR, path))]
    except (OSError, subprocess.CalledProcessError):
        return [os.path.relpath(os.path.join(root, name), REPO_DIR)
                for root, dirs, names in os.walk(REPO_DIR) if ".git" not in root and "__pycache__" not in root
                for name in names]


def split_command(command, url):
    """argv without `python3 code/main.py`, the file stdout goes to, the expected-status echo."""
    echo = command.endswith('; echo "exit $?"')
    argv = shlex.split(command.replace('; echo "exit $?"', ""))[2:]
    out = None
    if ">" in argv:
        index = argv.index(">")
        argv, out = argv[:index], argv[index + 1]
    if any(arg.startswith("http://") for arg in argv):
        argv = [url if arg.startswith("http://") else arg for arg in argv]
        if "--requests" in argv:
            argv[argv.index("--requests") + 1] = "4"
    return argv, out, echo


class ReadmeTest(unittest.TestCase):

    def test_the_readme_has_examples_to_check(self):
        shown = [command for command, output in examples() if output is not None]
        self.assertGreaterEqual(len(shown), 15)

    def test_no_example_reads_files_beside_the_repository(self):
        for command, _ in examples():
            self.assertNotIn("../", command)

    def test_every_example_runs_as_shown_in_a_fresh_clone(self):
        with tempfile.TemporaryDirectory() as scratch:
            clone = os.path.join(scratch, "servesim")
            for path in tracked_files():
                os.makedirs(os.path.dirname(os.path.join(clone, path)), exist_ok=True)
                shutil.copy(os.path.join(REPO_DIR, path), os.path.join(clone, path))
            here = os.getcwd()
            os.chdir(clone)
            try:
                with FakeServer(chat=counting_chat(), tokenizer=word_tokens) as server:
                    for command, expected in examples():
                        with self.subTest(command=command):
                            self.run_example(command, expected, server.url)
            finally:
                os.chdir(here)

    def run_example(self, command, expected, url):
        argv, out_path, echo = split_command(command, url)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main.main(argv)
        if out_path:
            with open(out_path, "w", encoding="utf-8") as handle:
                handle.write(out.getvalue())
        printed = (out.getvalue() + err.getvalue()).splitlines()
        if echo:
            printed.append(f"exit {code}")
        if expected is None or argv[0] == "loadgen":  # a fake server's figures are not the README's
            self.assertEqual(code, 0, err.getvalue())
        else:
            self.assertEqual(printed, expected)


def banner_sections(path):
    """(name, first line, last line) of each banner section of a source file: a name line
    between two lines of '=' comments."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    starts = [(lines[index][2:], index) for index in range(1, len(lines) - 1)
              if lines[index - 1].startswith("# ====") and lines[index + 1].startswith("# ====")]
    return [(name, start, (starts[number + 1][1] if number + 1 < len(starts) else len(lines)) - 1)
            for number, (name, start) in enumerate(starts)]


def layout_sections():
    """The section names of the README's Layout table, in order."""
    with open(README, encoding="utf-8") as handle:
        layout = handle.read().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| .+ \|$", layout, flags=re.M)
    return [row for row in rows if row != "Section"]


class LayoutTest(unittest.TestCase):
    MAIN = os.path.join(REPO_DIR, "code", "main.py")

    def test_the_layout_names_every_section_of_main_py_in_order(self):
        self.assertEqual(layout_sections(), [name for name, _, _ in banner_sections(self.MAIN)])

    def test_no_section_holds_more_than_a_sixth_of_main_py(self):
        sections = banner_sections(self.MAIN)
        total = sections[-1][2] + 1
        self.assertEqual([name for name, first, last in sections if last - first + 1 > total / 6], [])

    def test_no_function_of_main_py_is_over_60_lines(self):
        with open(self.MAIN, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60]
        self.assertEqual(long, [])


if __name__ == "__main__":
    unittest.main()
