"""The README works in a fresh clone: every command it shows runs as shown, or is one of the
few a user runs elsewhere, named and checked here; and it stays a manual, not a log.

Every line of the README's fenced blocks is accounted for:

- a block without a language tag holds commands, each alone on a line or after `$ `, and the
  output under a `$ ` command. A command is one of three kinds, and anything else fails:
  `python3 code/main.py ...` runs in a fresh clone (below); `python3 -m unittest discover -s
  code/tests -v` must be the project's test command, the one `.ci/run` runs (it is not run
  here: it is this suite); `bash code/live/NAME.sh` must name a script of the repository that
  bash runs (not run: it installs a server and measures it for minutes);
- a `json` block is a trace row: written to a file, `simulate --trace` must read it;
- a `text` block is text shown (the layout), and may hold no command.

No fenced block of the README mentions `../shared`: the README's commands run in a fresh clone,
and those that need the shared data beside it live in code/fixtures/gpu/README.md.

The servesim commands of the README and of the documents it moved its longer examples to
(code/fixtures/README.md, code/live/README.md) run in a scratch copy of the repository with
nothing beside it, in order, in process, so a report one example writes (`> c1.json`) is there
for the next. A line shown with `$ ` must print exactly the lines under it; a line without one
must succeed. Commands that talk to a server (`--url http://...`) run against a stdlib fake
server in its place, and `--requests` is cut to 4 for them.

The README has fewer than 900 lines, and every relative link in it (and in the documents it
links to for the evidence) points to a file that exists, and to a heading of it where it names
one.
"""

import argparse
import ast
import contextlib
import io
import json
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
# Where the README's longer examples went; their servesim commands run in the clone too.
EXAMPLE_DOCS = [os.path.join(REPO_DIR, "code", "fixtures", "README.md"),
                os.path.join(REPO_DIR, "code", "live", "README.md")]
# The documents the README sends its evidence to; their links are checked as the README's.
LINKED_DOCS = EXAMPLE_DOCS + [os.path.join(REPO_DIR, "code", "fixtures", "gpu", "README.md"),
                              os.path.join(REPO_DIR, "code", "fixtures", "kernels", "README.md")]
TEST_COMMAND = "python3 -m unittest discover -s code/tests -v"
MAX_README_LINES = 900


def fenced_blocks(path):
    """(language tag, lines) of each fenced block of a markdown file, in order."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    blocks, current, tag = [], None, None
    for line in lines:
        if current is None and line.startswith("```"):
            current, tag = [], line[3:].strip()
        elif current is not None and line.startswith("```"):
            blocks.append((tag, current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def fenced_commands(path):
    """Every command of a markdown file's untagged fenced blocks: the lines before a block's
    first `$ ` line, and each `$ ` line (the lines under one are its output)."""
    commands = []
    for tag, lines in fenced_blocks(path):
        if tag:
            continue
        shown = False
        for line in lines:
            if line.startswith("$ "):
                shown = True
                commands.append(line[2:])
            elif line.startswith("python3 code/main.py "):
                commands.append(line)
            elif line and not shown:
                commands.append(line)
    return commands


def examples(path=README):
    """(command, expected output lines or None) for each servesim line of a markdown file."""
    found = []
    for tag, lines in fenced_blocks(path):
        if tag:
            continue  # a file or text shown, not commands
        output = None  # the expected lines of the block's current `$ ` example
        for line in lines:
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


def subcommands():
    """The subcommands main's parser knows."""
    parser = main.build_parser()
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return sorted(actions[0].choices)


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors of a markdown file's headings (outside fenced blocks), repeats numbered."""
    with open(path, encoding="utf-8") as handle:
        text = re.sub(r"^```.*?^```", "", handle.read(), flags=re.S | re.M)
    seen, found = {}, set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def relative_links(path):
    """(target file, anchor or None) of each relative markdown link outside fenced blocks."""
    with open(path, encoding="utf-8") as handle:
        text = re.sub(r"^```.*?^```", "", handle.read(), flags=re.S | re.M)
    links = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        links.append((target, resolved, anchor or None))
    return links


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

    def test_the_readme_is_a_manual_under_900_lines(self):
        with open(README, encoding="utf-8") as handle:
            self.assertLess(len(handle.read().splitlines()), MAX_README_LINES)

    def test_the_readme_shows_every_subcommand(self):
        shown = {shlex.split(command)[2] for command, _ in examples()}
        self.assertEqual([name for name in subcommands() if name not in shown], [])

    def test_the_docs_have_examples_to_check(self):
        shown = [command for command, output in examples() if output is not None]
        moved = [command for path in EXAMPLE_DOCS for command, output in examples(path) if output is not None]
        self.assertGreaterEqual(len(shown), 10)
        self.assertGreaterEqual(len(shown) + len(moved), 30)

    def test_every_readme_command_is_one_a_user_runs_from_a_fresh_clone(self):
        with open(os.path.join(REPO_DIR, ".ci", "run"), encoding="utf-8") as handle:
            ci = handle.read()
        self.assertIn(TEST_COMMAND, ci)
        commands = fenced_commands(README)
        self.assertIn(TEST_COMMAND, commands)
        for command in commands:
            with self.subTest(command=command):
                if command.startswith("python3 code/main.py "):
                    continue  # run below
                if command.startswith("bash "):
                    script = shlex.split(command)[1]
                    self.assertRegex(script, r"^code/live/[\w-]+\.sh$")
                    self.assertTrue(os.path.isfile(os.path.join(REPO_DIR, script)), f"{script} is not a file")
                    with open(os.path.join(REPO_DIR, script), encoding="utf-8") as handle:
                        self.assertRegex(handle.readline(), r"^#!.*bash")
                    continue
                self.assertEqual(command, TEST_COMMAND)

    def test_every_tagged_block_of_the_readme_is_a_trace_row_or_text(self):
        for tag, lines in fenced_blocks(README):
            with self.subTest(tag=tag, first=lines[0] if lines else ""):
                self.assertIn(tag, ("", "json", "text"))
                if tag == "text":
                    self.assertEqual([line for line in lines if line.startswith(("$ ", "python3 ", "bash "))], [])
                if tag != "json":
                    continue
                with tempfile.TemporaryDirectory() as scratch:
                    trace = os.path.join(scratch, "trace.jsonl")
                    with open(trace, "w", encoding="utf-8") as handle:
                        handle.write("\n".join(json.dumps(json.loads(line)) for line in lines) + "\n")
                    out = io.StringIO()
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                        self.assertEqual(main.main(["simulate", "--trace", trace, "--no-sensitivity"]), 0)

    def test_no_readme_command_reads_files_beside_the_repository(self):
        for tag, lines in fenced_blocks(README):
            self.assertNotIn("../shared", "\n".join(lines))
        for path in [README] + EXAMPLE_DOCS:
            for command, _ in examples(path):
                self.assertNotIn("../", command)

    def test_every_relative_link_points_to_a_file_and_heading_that_exist(self):
        for path in [README] + LINKED_DOCS:
            for target, resolved, anchor in relative_links(path):
                with self.subTest(doc=os.path.relpath(path, REPO_DIR), link=target):
                    self.assertTrue(os.path.exists(resolved), resolved)
                    if anchor:
                        self.assertIn(anchor, anchors(resolved))

    def test_the_readme_links_the_evidence_it_moved(self):
        linked = {os.path.relpath(resolved, REPO_DIR) for _, resolved, _ in relative_links(README)}
        wanted = {os.path.relpath(path, REPO_DIR) for path in LINKED_DOCS}
        self.assertEqual(wanted - linked, set())

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
                    for path in [README] + EXAMPLE_DOCS:
                        for command, expected in examples(path):
                            with self.subTest(doc=os.path.relpath(path, REPO_DIR), command=command):
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
