"""Population.evaluate_distributed and lockstep evolution with two real CPU processes.

One spawned pair of gloo processes (FileStore in ``tmp_path``, no ports) runs
every scenario and saves what each rank saw to ``rank{r}.pt``; the assertions
run here, in the parent. A last test runs the contract's distributed example,
as written, through the real ``torchrun`` CLI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ranks import error_of, init_gloo, save, spawn
from torch import nn

from populora import Population
from populora import distributed as pd
from populora.fitness import evaluate

WORLD = 2
REPO = Path(__file__).resolve().parents[2]
X = torch.linspace(-1.0, 1.0, 8).view(1, 8)  # the same input on every rank


def _model(seed: int) -> nn.Sequential:
    """The contract's model, built under ``torch.manual_seed(seed)``, plus a random buffer."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model.register_buffer("offset", torch.randn(3))
    return model


def _pop(model: nn.Module, pop_size: int, seed: int) -> Population:
    return Population(model, pop_size=pop_size, low_rank=2, lora_targets=["0", "2"], seed=seed)


def _forward_fitness(population, individuals):
    return [-(population(X, individual=i) - 0.5).pow(2).sum().item() for i in individuals]


def _flat_state(pop: Population) -> dict:
    """``pop.state_dict(include_model=False)`` as ``downs`` / ``ups`` lists beside the counters (copies)."""
    state = pop.state_dict(include_model=False)
    extra = state["_extra_state"]
    n = len(pop.target_names)
    return {
        "downs": [state[f"_downs.{t}"].detach().clone() for t in range(n)],
        "ups": [state[f"_ups.{t}"].detach().clone() for t in range(n)],
        "generator": extra["generator"],
        "generation": extra["generation"],
        "eval_seed": extra["eval_seed"],
    }


def _state_sum(pop: Population) -> torch.Tensor:
    """Bit-exact fingerprint of everything the population's state dict holds but the base model."""
    state = _flat_state(pop)
    counters = torch.tensor([state["generation"], state["eval_seed"]])
    return pd.checksum([*state["downs"], *state["ups"], state["generator"], counters])


def _model_sum(model: nn.Module) -> torch.Tensor:
    return pd.checksum([*model.parameters(), *model.buffers()])


def _signatures(rank: int, res: dict) -> None:
    """Each signature's values are rank-dependent, so the gathered vector shows who evaluated what."""
    pop = _pop(_model(0), 7, seed=3)
    calls: dict[str, list] = {"batch": [], "single": [], "all": []}

    def batch(population, individuals):
        calls["batch"].append(list(individuals))
        return [1000.0 * rank + i for i in individuals]

    def single(population, idx):
        calls["single"].append(idx)
        return 1000.0 * rank + idx

    def whole(population):
        calls["all"].append(rank)
        return torch.arange(7.0) + 1000.0 * rank

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, fn in (("batch", batch), ("single", single), ("all", whole)):
            res[name] = pop.evaluate_distributed(fn)
    res["signature_calls"] = {name: list(seen) for name, seen in calls.items()}
    before = pd.bytes_communicated
    pop.evaluate_distributed(batch)
    res["bytes_per_evaluation"] = pd.bytes_communicated - before  # the fitness exchange only
    res["signature_warnings"] = [str(w.message) for w in caught]

    def boom(population, idx):
        if rank == 1 and idx == 5:
            raise KeyError("no environment for individual 5")
        return 0.0

    res["raised"] = error_of(pop.evaluate_distributed, boom)
    res["after_error"] = pop.evaluate_distributed(single)  # the group still works
    res["size_mismatch"] = error_of(_pop(_model(0), 6 + 2 * rank, seed=3).evaluate_distributed, single)


def _lockstep(rank: int, res: dict) -> None:
    """Different seeds per rank: rank 0's adapters and generator state must win, then stay in lockstep."""
    pop = _pop(_model(0), 16, seed=11 + rank)
    res["lock_initial"] = _state_sum(pop)
    if rank == 1:  # a local generation before the first sync: rank 0's counters and history must win
        with torch.no_grad():
            snapshot = [p.clone() for stack in pop._stacks() for p in stack]
            pop.evolve_(torch.arange(16.0))
            for p, saved in zip([p for stack in pop._stacks() for p in stack], snapshot):
                p.copy_(saved)
    seen = []

    def fitness(population, individuals):
        seen.append(population.eval_seed)
        return _forward_fitness(population, individuals)

    res["lock_fitness"], res["lock_local"], res["lock_states"] = [], [], []
    for gen in range(4):
        f = pop.evaluate_distributed(fitness)
        if gen == 0:
            res["lock_after_first"] = _state_sum(pop)
        res["lock_fitness"].append(f)
        res["lock_local"].append(evaluate(_forward_fitness, pop, 16, distributed=False))
        pop.evolve_(f)
        res["lock_states"].append(_state_sum(pop))
    res["lock_seen_seeds"] = seen
    res["lock_state"] = _flat_state(pop)
    res["lock_history"] = [tuple(h) for h in pop.history]


def _base_mismatch(rank: int, res: dict) -> None:
    """Each rank builds its model under its own seed: detected, warned about once, repaired."""
    model = _model(100 + rank)
    res["base_before"] = _model_sum(model)
    res["base_rank0"] = _model_sum(_model(100))
    pop = _pop(model, 8, seed=0)
    res["base_local_before"] = evaluate(_forward_fitness, pop, 8, distributed=False)
    res["base_fitness"], res["base_local"] = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            f = pop.evaluate_distributed(_forward_fitness)
            res["base_fitness"].append(f)
            res["base_local"].append(evaluate(_forward_fitness, pop, 8, distributed=False))
            pop.evolve_(f)
    res["base_warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
    res["base_after"] = _model_sum(model)
    res["base_pop_model_is_model"] = pop.model is model

    model = _model(200 + rank)  # sync_base_model=True: broadcast, no checksum, no warning
    res["forced_before"] = _model_sum(model)
    res["forced_rank0"] = _model_sum(_model(200))
    pop = _pop(model, 8, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res["forced_fitness"] = pop.evaluate_distributed(_forward_fitness, sync_base_model=True)
        pop.evolve_(res["forced_fitness"])
        pop.evaluate_distributed(_forward_fitness)
    res["forced_warnings"] = [str(w.message) for w in caught]
    res["forced_after"] = _model_sum(model)
    res["forced_local"] = evaluate(_forward_fitness, pop, 8, distributed=False)


def _worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    res: dict = {}
    _signatures(rank, res)
    _lockstep(rank, res)
    _base_mismatch(rank, res)
    save(res, out, rank)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each of the two ranks saw (one spawn for the whole module)."""
    return spawn(_worker, tmp_path_factory.mktemp("popdist"))


@pytest.mark.distributed
class TestEvaluateDistributed:
    def test_fitness_gathered_in_id_order_for_each_signature(self, ranks):
        by_rank = torch.tensor([0.0, 1.0, 2.0, 3.0, 1004.0, 1005.0, 1006.0])  # ids 0-3 on rank 0, 4-6 on rank 1
        for res in ranks:
            for name in ("batch", "single"):
                assert res[name].dtype == torch.float32 and res[name].shape == (7,)
                assert torch.equal(res[name], by_rank), name
            assert torch.equal(res["all"], torch.arange(7.0))  # rank 0's result, broadcast
            assert res["signature_warnings"] == []  # same model on both ranks: nothing to repair
            assert res["bytes_per_evaluation"] == 4 * (7 + WORLD)  # float32 values + one failure flag per rank
        assert ranks[0]["signature_calls"] == {"batch": [[0, 1, 2, 3]], "single": [0, 1, 2, 3], "all": [0]}
        assert ranks[1]["signature_calls"] == {"batch": [[4, 5, 6]], "single": [4, 5, 6], "all": []}

    def test_an_error_on_one_rank_fails_both(self, ranks):
        assert ranks[1]["raised"] == ("KeyError", "'no environment for individual 5'")
        assert ranks[0]["raised"][0] == "RuntimeError"
        assert "rank 1: KeyError: 'no environment for individual 5'" in ranks[0]["raised"][1]
        for res in ranks:  # ranks built different populations: a clear error on both, no abort
            assert res["size_mismatch"][0] == "InvalidValueError"
            assert res["size_mismatch"][1].startswith(
                "adapters (pop_size, low_rank and lora_targets must match on every rank) have different shapes"
            )
            assert torch.equal(res["after_error"], torch.tensor([0.0, 1.0, 2.0, 3.0, 1004.0, 1005.0, 1006.0]))


@pytest.mark.distributed
class TestLockstep:
    def test_rank_0_wins_at_the_first_evaluation(self, ranks):
        zero, one = ranks
        assert not torch.equal(zero["lock_initial"], one["lock_initial"])  # the seeds really differ
        assert torch.equal(zero["lock_after_first"], zero["lock_initial"])
        assert torch.equal(one["lock_after_first"], zero["lock_initial"])

    def test_full_state_identical_after_every_generation(self, ranks):
        zero, one = ranks
        for gen, (a, b) in enumerate(zip(zero["lock_states"], one["lock_states"], strict=True)):
            assert torch.equal(a, b), f"ranks diverged at generation {gen}"
        assert len({tuple(s.tolist()) for s in zero["lock_states"]}) == 4  # evolution changed something
        sa, sb = zero["lock_state"], one["lock_state"]
        for a, b in zip([*sa["downs"], *sa["ups"], sa["generator"]], [*sb["downs"], *sb["ups"], sb["generator"]]):
            assert torch.equal(a, b)
        assert (sa["generation"], sa["eval_seed"]) == (sb["generation"], sb["eval_seed"]) == (4, 15)

    def test_each_rank_evaluates_with_the_shared_adapters(self, ranks):
        for res in ranks:
            for gathered, local in zip(res["lock_fitness"], res["lock_local"], strict=True):
                assert torch.equal(gathered, local)  # rank 1's share used rank 0's adapters

    def test_history_is_rank_0s(self, ranks):
        zero, one = ranks
        assert len(zero["lock_history"]) == 4 and [h[0] for h in zero["lock_history"]] == [0, 1, 2, 3]
        assert one["lock_history"] == zero["lock_history"]

    def test_eval_seed_advances_identically(self, ranks):
        assert ranks[0]["lock_seen_seeds"] == ranks[1]["lock_seen_seeds"] == [11, 12, 13, 14]

    def test_same_result_as_one_process(self, ranks):
        """World size does not change the run: one process, rank 0's seed, same fitness."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            pop = _pop(_model(0), 16, seed=11)
            for _ in range(4):
                pop.evolve_(pop.evaluate_distributed(_forward_fitness))
            assert torch.equal(_state_sum(pop), ranks[0]["lock_states"][-1])
        finally:
            torch.set_num_threads(threads)


@pytest.mark.distributed
class TestBaseModel:
    def test_mismatch_detected_warned_once_and_repaired(self, ranks):
        zero, one = ranks
        assert not torch.equal(zero["base_before"], one["base_before"])
        for res in ranks:
            assert res["base_pop_model_is_model"]
            assert torch.equal(res["base_after"], zero["base_rank0"])  # rank 0's model, in the user's module
            assert len(res["base_warnings"]) == 1, res["base_warnings"]
            category, message = res["base_warnings"][0]
            assert category == "UserWarning"
            assert message.startswith("base model parameters differ across ranks (rank(s) [1] differ from rank 0;")
            assert message.endswith(
                "broadcasting rank 0's. Seed their construction (torch.manual_seed) "
                "identically on every rank to avoid this."
            )

    def test_fitnesses_agree_after_repair(self, ranks):
        zero, one = ranks
        assert not torch.equal(zero["base_local_before"], one["base_local_before"])  # the mismatch mattered
        for gen in range(3):
            assert torch.equal(zero["base_fitness"][gen], one["base_fitness"][gen])
            for res in ranks:
                assert torch.equal(res["base_fitness"][gen], res["base_local"][gen])
        assert torch.equal(zero["base_local"][0], zero["base_local_before"])  # rank 0's model won

    def test_sync_base_model_broadcasts_without_warning(self, ranks):
        zero, one = ranks
        assert not torch.equal(zero["forced_before"], one["forced_before"])
        for res in ranks:
            assert res["forced_warnings"] == []
            assert torch.equal(res["forced_after"], zero["forced_rank0"])
        assert torch.equal(zero["forced_local"], one["forced_local"])


# ---------------------------------------------------------------- the contract's example, via torchrun

# The README's "Distributed Evolution" block, verbatim except `range(10)` -> `range(3)` (a smaller
# generation count, the one substitution allowed in tests). No seeding is added.
CONTRACT_EXAMPLE = """\
from time import sleep

import torch
from torch import nn
from populora import Population, is_main_rank

model = nn.Sequential(
    nn.Linear(8, 16),
    nn.ReLU(),
    nn.Linear(16, 1)
)

pop = Population(
    model,
    pop_size = 16,
    low_rank = 2,
    lora_targets = ['0', '2']
)

x = torch.randn(1, 8)

def eval_env(population, idx):
    sleep(0.1)
    with torch.no_grad():
        # seed the environment with population.eval_seed (shared, auto-synced across ranks)

        return population(x, individual = idx).abs().mean().item() + torch.randn(1).item()

for gen in range(3):

    # distributed evaluation

    fitnesses = pop.evaluate_distributed(eval_env)

    if is_main_rank():
        print(f'gen {gen:02d} | best: {fitnesses.max():.3f} | mean: {fitnesses.mean():.3f}')

    # evolution step

    pop.evolve_(fitnesses)
"""

# Appended after the verbatim block: each rank saves what the test compares.
SAVE_STATE = """
import os as _os
_state = pop.state_dict(include_model=False)
_state = {"downs": [v for k, v in _state.items() if k.startswith("_downs.")],
          "ups": [v for k, v in _state.items() if k.startswith("_ups.")], **_state["_extra_state"]}
torch.save({"state": _state, "model": model.state_dict(), "x": x, "fitnesses": fitnesses},
           _os.path.join(_os.environ["POPULORA_TEST_OUT"], f"rank{_os.environ['RANK']}.pt"))
"""


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.distributed
def test_contract_example_under_torchrun(tmp_path):
    script = tmp_path / "evolve.py"
    script.write_text(CONTRACT_EXAMPLE + SAVE_STATE)
    env = {
        **os.environ,
        "POPULORA_TEST_OUT": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [*_torchrun(), "--standalone", f"--nproc-per-node={WORLD}", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    gen_lines = [line for line in proc.stdout.splitlines() if line.startswith("gen ")]
    assert [line[:6] for line in gen_lines] == ["gen 00", "gen 01", "gen 02"], proc.stdout  # rank 0 only
    assert all(re.fullmatch(r"gen \d\d \| best: -?\d+\.\d{3} \| mean: -?\d+\.\d{3}", line) for line in gen_lines)
    # torch seeds each process differently: the unseeded example builds a different model per rank
    assert proc.stderr.count("base model parameters differ across ranks") == WORLD, proc.stderr[-4000:]

    zero, one = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD))
    assert not torch.equal(zero["x"], one["x"])  # really unseeded
    for a, b in zip(
        [*zero["state"]["downs"], *zero["state"]["ups"]], [*one["state"]["downs"], *one["state"]["ups"]], strict=True
    ):
        assert torch.equal(a, b)
    assert torch.equal(zero["state"]["generator"], one["state"]["generator"])
    assert zero["state"]["generation"] == one["state"]["generation"] == 3
    assert zero["state"]["eval_seed"] == one["state"]["eval_seed"] == 3
    assert zero["model"].keys() == one["model"].keys()
    for name in zero["model"]:
        assert torch.equal(zero["model"][name], one["model"][name]), name
    assert torch.equal(zero["fitnesses"], one["fitnesses"])


EXPLICIT_DEVICE = """
import os, torch, torch.distributed as dist
from torch import nn
from populora import EggrollES, Population, world_size
pop = Population(nn.Linear(3, 2), pop_size=4, low_rank=1, device="cpu")
ok = dist.is_initialized() and world_size() == 2
es = EggrollES(nn.Linear(3, 2), pop_size=4, sigma=0.1, lr=0.1, rank=1, device="cpu")
# one write per rank: two ranks' print() calls (text, then newline) interleave on the shared stdout
os.write(1, f"explicit device joins the group: {ok and dist.is_initialized()}\\n".encode())
"""


@pytest.mark.distributed
def test_explicit_device_still_joins_torchruns_group(tmp_path):
    """Passing device= must not skip the process group: each rank would silently evaluate everyone."""
    script = tmp_path / "explicit.py"
    script.write_text(EXPLICIT_DEVICE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [*_torchrun(), "--standalone", f"--nproc-per-node={WORLD}", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("explicit device joins the group: True") == WORLD, proc.stdout


def test_example_script_is_the_contract_example():
    """examples/evolve_distributed.py runs the same code (with the README's 10 generations)."""
    import ast

    script = ast.parse((REPO / "examples" / "evolve_distributed.py").read_text())
    contract = ast.parse(CONTRACT_EXAMPLE.replace("range(3)", "range(10)"))
    body = [ast.dump(node) for node in script.body[1 if ast.get_docstring(script) else 0 :]]
    assert body == [ast.dump(node) for node in contract.body]  # the same code, whatever its formatting
