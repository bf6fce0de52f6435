"""Run every notebook of docs/notebooks/ top to bottom, each under a time limit, in a scratch folder.

    python .ci/notebooks.py [--limit SECONDS] [--out FOLDER] [NOTEBOOK ...]

A notebook fails when a cell raises (their check cells assert values: a solved CartPole, equal logits) or when it
runs past its limit (default 600 s each). The notebooks run in a scratch folder, so what they write (runs/, outputs/)
never lands in docs/; ``--out`` keeps the executed copies (with their outputs) there. The repository copies stay
stripped (tests/test_notebooks.py). The site renders them with their outputs by executing them at build time
(mkdocs-jupyter, ``execute: true`` in mkdocs.yml).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "docs" / "notebooks"


def run(path: Path, limit: float, out: Path | None) -> float:
    """Execute ``path``; its wall-clock seconds. Raises on a failing cell or past ``limit``."""
    book = nbformat.read(path, as_version=4)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"nb-{path.stem}-") as scratch:
        client = NotebookClient(
            book, timeout=int(limit), kernel_name="python3", resources={"metadata": {"path": scratch}}
        )
        with client.setup_kernel():
            for index, cell in enumerate(book.cells):
                if cell.cell_type != "code":
                    continue
                left = limit - (time.monotonic() - started)
                if left <= 0:
                    raise TimeoutError(f"{path.name}: over its {limit:.0f} s limit before cell {index}")
                client.timeout = max(1, int(left))
                client.execute_cell(cell, index)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(book, out / path.name)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every docs/notebooks/*.ipynb")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per notebook")
    parser.add_argument("--out", type=Path, help="write the executed notebooks there")
    args = parser.parse_args()
    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    failed = []
    for path in paths:
        try:
            seconds = run(path, args.limit, args.out)
        except (CellExecutionError, CellTimeoutError, TimeoutError) as error:
            text = str(error)
            print(f"FAIL {path.name}: {text[:1500]}\n...\n{text[-1500:]}", file=sys.stderr)
            failed.append(path.name)
        else:
            print(f"ok   {path.name} ({seconds:.0f} s, limit {args.limit:.0f} s)")
    if failed:
        print(f"notebooks failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
