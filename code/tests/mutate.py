"""A small mutation run over the scheduler's memo of refusals and the pools' lookups.

    python3 code/tests/mutate.py            # every mutant
    python3 code/tests/mutate.py keys budget

Each mutant is one edit of code/main.py, made in a copy of code/ in a temporary folder;
the scheduler, pool and fast-engine tests then run against the copy, each run limited in
time (a mutant that never admits the queue's head would loop: the suite's own time limit,
set low here, turns that into a failure, and the first failure ends the run). A mutant is killed when the tests fail. It prints one line per
mutant and exits 1 if any survived. Not part of the suite (its name is not test_*.py).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CODE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ["test_scheduler", "test_scheduler_invariants", "test_block_pool", "test_run_pool", "test_fast_engine"]
RUN_LIMIT_S = 600
TEST_LIMIT_S = "20"  # each test's own limit in the copy (the slowest takes about 2 s): a loop fails fast

# name -> (the text in main.py, what the mutant has instead); each text occurs once
REFUSAL = ("refused[0] is request\n                and refused[1] == self.pool.num_freed\n"
           "                and refused[2] == self.pool.num_entered and budget >= refused[3]\n"
           "                and refused[4] == self._host_removed())")
MUTANTS = {
    "request": (REFUSAL, REFUSAL.replace("refused[0] is request", "True")),
    "freed": (REFUSAL, REFUSAL.replace("refused[1] == self.pool.num_freed", "True")),
    "keys": (REFUSAL, REFUSAL.replace("refused[2] == self.pool.num_entered", "True")),
    "budget": (REFUSAL, REFUSAL.replace("budget >= refused[3]", "True")),
    "budget-reversed": (REFUSAL, REFUSAL.replace("budget >= refused[3]", "budget <= refused[3]")),
    "host-removals": (REFUSAL, REFUSAL.replace("refused[4] == self._host_removed()", "True")),
    "always": (REFUSAL, "True)"),
    "resume-past-evictions": ("if evicted is not None and hit_keys.isdisjoint(evicted):",
                              "if evicted is not None:"),
    "block-pool-freed-uncounted": ("        self.num_freed += len(backwards)\n", ""),
    "block-pool-entered-uncounted": ("        self.num_entered += len(cached) - num_keys\n", ""),
    "run-pool-freed-uncounted": ("            self.num_freed += count\n", ""),
    "run-pool-entered-uncounted": ("        self.num_entered += hi - lo\n", ""),
    "preempt-the-oldest": ("self._preempt(running.pop())", "self._preempt(running.pop(0))"),
    "release-head-first": ("shared, backwards = self.shared, list(reversed(blocks))",
                           "shared, backwards = self.shared, list(blocks)"),
}


def run_mutant(name: str, old: str, new: str) -> str:
    """'killed by TEST', 'survived' or 'hung' for one mutant (old == new: the code as it is)."""
    with tempfile.TemporaryDirectory() as folder:
        copy = os.path.join(folder, "code")
        shutil.copytree(CODE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
        path = os.path.join(copy, "main.py")
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        if text.count(old) != 1:
            raise SystemExit(f"mutate.py: mutant {name}: its text is in main.py {text.count(old)} times, not once")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text.replace(old, new))
        try:
            done = subprocess.run([sys.executable, "-m", "unittest", "-f", *TESTS], cwd=os.path.join(copy, "tests"),
                                  capture_output=True, text=True, timeout=RUN_LIMIT_S,
                                  env=dict(os.environ, SERVESIM_TEST_TIME_LIMIT_S=TEST_LIMIT_S))
        except subprocess.TimeoutExpired:
            return "hung"
        if done.returncode == 0:
            return "survived"
        failed = re.search(r"^(?:FAIL|ERROR): (\w+)", done.stderr, re.MULTILINE)
        return f"killed by {failed.group(1) if failed else 'an import error'}"


def main(argv=None) -> int:
    names = (sys.argv[1:] if argv is None else argv) or list(MUTANTS)
    unknown = [name for name in names if name not in MUTANTS]
    if unknown:
        print(f"mutate.py: unknown mutant {unknown[0]!r}; expected one of {', '.join(MUTANTS)}", file=sys.stderr)
        return 2
    if run_mutant("none", REFUSAL, REFUSAL) != "survived":
        print("mutate.py: the tests fail on main.py as it is; fix that first", file=sys.stderr)
        return 1
    survived = 0
    for name in names:
        start_s = time.perf_counter()
        outcome = run_mutant(name, *MUTANTS[name])
        survived += not outcome.startswith("killed")
        print(f"{name:30} {time.perf_counter() - start_s:5.1f} s  {outcome}", flush=True)
    print(f"{len(names) - survived} of {len(names)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
