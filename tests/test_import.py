"""`import populora` stays light (issue 23): no torch._dynamo, transformers or matplotlib at import, nor after a
routed forward and a generation of evolution (the time ratio to `import torch` is benchmarks/import_time.py's)."""

import json
import subprocess
import sys

HEAVY = ("torch._dynamo", "torch._inductor", "transformers", "peft", "matplotlib", "openskill")

PROBE = f"""
import json, sys
heavy = lambda: [m for m in {HEAVY!r} if m in sys.modules]
seen = {{}}
import populora, populora.interact, populora.selfplay, populora.train, populora.es, populora.llm
seen["import"] = heavy()
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
pop = populora.Population(model, 4, 2, seed=0)
pop(torch.randn(8, 4), all_individuals=True)
pop.evolve_(torch.arange(4.0))
pop(torch.randn(4, 4), individuals=torch.tensor([0, 1, 2, 3]))
seen["forward"] = heavy()
import matplotlib  # the probe sees a heavy import when there is one
seen["probe"] = heavy()
print(json.dumps(seen))
"""


def test_import_populora_and_a_routed_forward_import_nothing_heavy():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"import": [], "forward": [], "probe": ["matplotlib"]}
