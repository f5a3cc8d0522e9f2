"""The notebooks in notebooks/ run from top to bottom, offline, in a fresh kernel of this
interpreter, and are kept in git without outputs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_SECS = 90  # above the 60 s 04_studio gives the server to start
KERNEL_NAME = "criogen-graph-tests"
NOTEBOOK_TOOLS = ("nbclient", "nbformat", "ipykernel", "jupyter_client")

#: Text each notebook's outputs must show: the answers its runs are expected to give.
EXPECTED = {
    "01_quickstart.ipynb": [
        "'Order A-1 has shipped.'",
        "final_answer",
        "error | Error: No order B-9",
        "output after 3 model calls",
        "OrderStatus(order_id='A-1', status='shipped', refundable=False)",
        "get_order({'order_id': 'A-1'}) -> {'id': 'A-1'",
        "run completed",
    ],
    "02_threads_and_approvals.ipynb": [
        "needs approval: True | stop_reason: None",
        "'Done: refunded 42.00 EUR on A-1.'",
        "Refund 15.50 EUR on A-2",
        "'Done: refunded 10.00 EUR on A-2.'",
        "waits for approval",
        "'The refund was not approved; a colleague will follow up.'",
        "decide    ada",
        "'approved_args_sha256'",
    ],
    "03_step_by_step.ipynb": [
        "```mermaid",
        "next: ('approval',)",
        "must be 'approve' or 'reject'",
        "refunded 42.00 EUR on A-1",
        "waiting again: ['refund']",
        "'The refund was not approved.'",
        "'rewind'",
    ],
    "04_studio.ipynb": [
        "['memory', 'support']",
        "['__start__', 'model', 'approval', 'tools', '__end__']",
        "next: ['approval']",
        "edit -> refunded A-1 (damaged in transit)",
        "stop reason: final_answer",
    ],
}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def notebook_tools_problem() -> str | None:
    """Why the notebooks cannot be executed here, or None when they can."""
    missing = [name for name in NOTEBOOK_TOOLS if importlib.util.find_spec(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (pip install -e '.[dev]')"
    return None


def require_notebook_tools() -> None:
    """Skip (on a developer machine) or fail (in CI) when the notebook tools are missing."""
    problem = notebook_tools_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the notebooks: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Jupyter data folder holding one kernelspec that starts this very interpreter
    (not whatever `python` the `python3` kernelspec would find on the PATH)."""
    require_notebook_tools()
    from ipykernel.kernelspec import write_kernel_spec

    folder = tmp_path_factory.mktemp("jupyter")
    spec_dir = Path(write_kernel_spec(folder / "kernels" / KERNEL_NAME))
    spec = json.loads((spec_dir / "kernel.json").read_text(encoding="utf-8"))
    assert spec["argv"][0] == sys.executable
    return folder


def _text(outputs: list[Any]) -> str:
    parts: list[str] = []
    for output in outputs:
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] in ("execute_result", "display_data"):
            data = output["data"]
            parts.append(data.get("text/markdown") or data.get("text/plain", ""))
    return "".join(parts)


def test_the_notebooks_are_there() -> None:
    assert {p.name for p in NOTEBOOKS} >= set(EXPECTED)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebooks_install_lines_install_from_the_checkout(path: Path) -> None:
    """The package is on no index: what a notebook tells a newcomer to run installs it
    from this checkout, with the venv's tools."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        for line in "".join(cell["source"]).splitlines():
            if "pip install" not in line:
                continue
            assert re.search(r"\.venv/bin/pip install (-q )?-e ['\"]?\.", line), (path.name, line)
            assert "criogen-graph[" not in line, (path.name, line)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_kept_without_outputs(path: Path) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    dirty = [
        i
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code"
        and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name}: cells {dirty} keep outputs or execution counts; clear them before "
        "committing (JupyterLab: Edit > Clear Outputs of All Cells, then save)"
    )
    if importlib.util.find_spec("nbformat") is not None:
        import nbformat

        nbformat.validate(nbformat.reads(path.read_text(encoding="utf-8"), as_version=4))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(
    path: Path, jupyter_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellControlSignal

    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))  # where KERNEL_NAME is found
    dev_state = ROOT / ".langgraph_api"  # written by `langgraph dev` (04_studio)
    had_dev_state = dev_state.exists()
    nb = nbformat.read(path, as_version=4)
    started: list[int] = []
    client = NotebookClient(
        nb,
        kernel_name=KERNEL_NAME,
        timeout=CELL_TIMEOUT_SECS,
        startup_timeout=60,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
        on_cell_execute=lambda cell, cell_index: started.append(cell_index),
    )
    failure: str | None = None
    try:
        client.execute()  # shuts the kernel down when done, also after a failure
    except CellControlSignal as exc:  # a cell raised or timed out: its source and error
        index = started[-1] if started else "?"
        failure = f"{path.name}, cell {index} failed:\n{_ANSI.sub('', str(exc))}"
    finally:
        if not had_dev_state:
            shutil.rmtree(dev_state, ignore_errors=True)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code)  # every cell ran
    shown = "\n".join(_text(cell.outputs) for cell in code)
    missing = [text for text in EXPECTED.get(path.name, []) if text not in shown]
    assert not missing, f"{path.name}: outputs lack {missing}; they were:\n{shown}"
