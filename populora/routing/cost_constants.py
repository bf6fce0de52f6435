"""Constants of the routing cost model (:mod:`populora.routing.cost`), measured by ``benchmarks/cost_model.py``.

Generated file: ``python benchmarks/cost_model.py --write`` measures the machine it runs on again.
Microseconds: ``linear`` (fixed, per multiply-add), ``bmm`` (fixed, per group, per multiply-add below
and above ``UNBLOCKED`` multiply-adds per group), ``ew`` (fixed, per element of one elementwise
operation).
"""

CONSTANTS: dict[tuple[str, str], dict[str, tuple[float, ...]]] = {
    ("cpu", "float32"): {
        "bmm": (4.363, 0.04276, 0.001043, 7.75e-05),
        "ew": (2.221, 0.000324),
        "linear": (5.962, 3.169e-05),
    },
}
