"""Run a bench script's child under callgrind and read back its dumps.

Shared by the callgrind_*.py scripts: each child calls ctypes' `getpid` at its markers,
and `--dump-before=ffi_call` turns each marker into one dump, so the totals of the dumps
are the instructions between markers."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def callgrind_totals(
    script: str, child_args: list[str], tree: str | None, folder: str
) -> list[int]:
    """Run `script child_args...` under callgrind (the package of `tree` first on the path,
    when given) and return the instruction total of each dump, in order."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "callgrind.out")
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=ffi_call",
            f"--callgrind-out-file={out}",
            sys.executable,
            os.path.abspath(script),
            *child_args,
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"failed:\n{done.stderr[-3000:]}")
    # The child says which package it imported: a tree that did not shadow the installed
    # one would measure the wrong code.
    print(
        tree or "(installed)",
        ":",
        *(x for x in done.stderr.splitlines() if "criogen_graph from" in x),
    )
    totals = []
    n = 1
    while os.path.exists(f"{out}.{n}"):
        with open(f"{out}.{n}") as f:
            found = re.search(r"^totals: (\d+)", f.read(), re.M)
        assert found, f"{out}.{n}"
        totals.append(int(found.group(1)))
        n += 1
    return totals
