"""Import time of ``import populora`` against ``import torch`` (issue 23): fresh interpreters, medians.

Each round starts one fresh interpreter per statement, in turn (``import torch``, ``import populora``), and
times the import inside it with ``time.perf_counter`` (the interpreter's own start-up is not counted). Printed:
each statement's median over the rounds, and the median of the per-round ratios populora / torch (robust to
slow spells of a shared machine). ``import populora`` imports torch, so the ratio is at least 1; what it adds
is populora's own modules, einops and tqdm (no ``torch._dynamo``, transformers or matplotlib:
``tests/test_import.py``). Not a test.

    python benchmarks/import_time.py            # 7 rounds
    python benchmarks/import_time.py 15         # more rounds
"""

from __future__ import annotations

import statistics
import subprocess
import sys

STATEMENTS = {"torch": "import torch", "populora": "import populora"}


def timed(statement: str) -> float:
    """Seconds ``statement`` takes in a fresh interpreter."""
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    for _ in range(rounds):
        for name, statement in STATEMENTS.items():
            times[name].append(timed(statement))
    ratios = [p / t for p, t in zip(times["populora"], times["torch"])]
    result = {f"{name}_s": statistics.median(values) for name, values in times.items()}
    result["ratio"] = statistics.median(ratios)
    print(
        f"{rounds} rounds, python {sys.version.split()[0]}: import torch {result['torch_s']:.2f} s, "
        f"import populora {result['populora_s']:.2f} s (medians); populora / torch {result['ratio']:.2f} "
        f"(median of the per-round ratios)"
    )
    return result


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
