"""Coevolve and HallOfFame: the contract blocks, injection, probe order, fitness checks, resume, archives.

The 2-process tests (``-m distributed``) run the contract's populations with
``step(distributed=True)`` on two gloo CPU processes (one spawn for the whole
module, FileStore in ``tmp_path``) and once through the real ``torchrun`` CLI.
"""

from __future__ import annotations

import copy
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
from ranks import init_gloo, save, spawn
from torch import nn

from populora import CheckpointError, Coevolve, Evolution, FitnessError, HallOfFame, Population
from populora.loops.coevolve.hall_of_fame import Champion
from populora.stats import GenerationStats

REPO = Path(__file__).resolve().parents[3]
SEED_README = REPO.parent / "shared" / "seeds" / "populora-0.1.18-README.txt"
WORLD = 2

# The README's two Coevolution blocks, verbatim except the step count (`range(100)`, substituted
# below). The three-population block reuses the two-population definitions in one namespace.
CONTRACT_TWO = """\
import torch
from torch import nn
from populora import Population, Coevolve

# the solver fits T(x) = sin(pi x); the proposer proposes test inputs - each is
# scored by the other's outputs

pop_size = 8

proposer = Population(nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1), nn.Tanh()), pop_size = pop_size, low_rank = 2, lora_targets = ['0', '2'])
solver = Population(nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1)), pop_size = pop_size, low_rank = 2, lora_targets = ['0', '2'])

def probe_proposer(coevolve):
    return coevolve.proposer(torch.randn(1, 1), all_individuals = True)  # (P, 1) proposed inputs

def probe_solver(coevolve, proposer_outputs):
    return coevolve.solver(proposer_outputs.repeat(solver.pop_size, 1), all_individuals = True)  # each solver sees all inputs

def fitness_solver(solver_outputs, proposer_outputs):
    target = torch.sin(torch.pi * proposer_outputs.repeat(solver.pop_size, 1))
    errors = ((solver_outputs - target) ** 2).reshape(solver.pop_size, -1)
    return -errors.mean(dim = 1)  # (S,) accuracy on the proposed inputs

def fitness_proposer(proposer_outputs, solver_outputs):
    target = torch.sin(torch.pi * proposer_outputs.repeat(solver.pop_size, 1))
    errors = ((solver_outputs - target) ** 2).reshape(solver.pop_size, -1)
    return errors.mean(dim = 0)  # (P,) error induced on the solver

coevolve = Coevolve(populations = dict(
    proposer = dict(population = proposer, probe = probe_proposer, fitness = fitness_proposer),
    solver = dict(population = solver, probe = probe_solver, fitness = fitness_solver)
))

for _ in range(100):
    coevolve.step()  # probes, derives fitnesses, evolves each population
"""

CONTRACT_THREE = """\
judge = Population(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1)), pop_size = pop_size, low_rank = 2, lora_targets = ['0', '2'])

def probe_judge(coevolve, solver_outputs, proposer_outputs):
    pairs = torch.cat((proposer_outputs.repeat(solver.pop_size, 1), solver_outputs), dim = -1)
    return coevolve.judge(pairs, all_individuals = True)  # (S * P, 1) correctness logits

def fitness_solver(solver_outputs, proposer_outputs, judge_outputs):
    target = torch.sin(torch.pi * proposer_outputs.repeat(solver.pop_size, 1))
    errors = ((solver_outputs - target) ** 2).reshape(solver.pop_size, -1)
    fooled = ((judge_outputs > 0.) & ((solver_outputs - target) ** 2 >= 0.05)).float()  # judge said "correct" on a wrong answer
    return -errors.mean(dim = 1) + 0.25 * fooled.reshape(solver.pop_size, -1).mean(dim = 1)  # accurate and hard to catch

def fitness_judge(solver_outputs, proposer_outputs, judge_outputs):
    target = torch.sin(torch.pi * proposer_outputs.repeat(solver.pop_size, 1))
    correct = (solver_outputs - target) ** 2 < 0.05
    acc = ((judge_outputs > 0.) == correct).float().reshape(judge.pop_size, -1).mean(dim = 1)
    return acc  # (J,) how well it catches the solver's mistakes

def fitness_proposer(proposer_outputs, solver_outputs):
    target = torch.sin(torch.pi * proposer_outputs.repeat(solver.pop_size, 1))
    errors = ((solver_outputs - target) ** 2).reshape(solver.pop_size, -1)
    return errors.mean(dim = 0)  # (P,) error its inputs induce on the solver

coevolve = Coevolve(populations = dict(
    proposer = dict(population = proposer, probe = probe_proposer, fitness = fitness_proposer),
    solver = dict(population = solver, probe = probe_solver, fitness = fitness_solver),
    judge = dict(population = judge, probe = probe_judge, fitness = fitness_judge)
))

for _ in range(100):
    coevolve.step(distributed = True)  # distribute the probes across ranks
"""


def contract(two_steps: int, three_steps: int, seed: int | None = 0) -> dict:
    """Run both contract blocks in one namespace with fewer steps (the allowed substitution)."""
    if seed is not None:
        torch.manual_seed(seed)
    namespace: dict = {}
    exec(CONTRACT_TWO.replace("range(100)", f"range({two_steps})"), namespace)
    namespace["coevolve_two"] = namespace["coevolve"]
    exec(CONTRACT_THREE.replace("range(100)", f"range({three_steps})"), namespace)
    return namespace


def adapters(pop: Population) -> list[torch.Tensor]:
    return [t.clone() for f in pop.factors() for t in f]


def line(width: int = 8, out: int = 1, seed: int = 0, pop_size: int = 4, **kwargs) -> Population:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, out))
    return Population(model, pop_size=pop_size, low_rank=2, seed=seed, **kwargs)


def probe_of(name: str):
    def probe(coevolve):
        return coevolve[name](torch.ones(1, 1), all_individuals=True)

    return probe


def own_fitness(name: str):
    """A fitness of population ``name`` that reads only its own outputs."""
    return eval(f"lambda {name}_outputs: {name}_outputs.flatten()")


def spec(pop: Population, probe=None, fitness=None, name: str = "a") -> dict:
    return dict(population=pop, probe=probe or probe_of(name), fitness=fitness or own_fitness(name))


# ---------------------------------------------------------------------------- the contract


class TestContract:
    def test_blocks_are_the_readme_verbatim(self):
        """The constants above are the README's blocks (checked when the seed README is at hand)."""
        if not SEED_README.exists():
            pytest.skip(f"{SEED_README} not available")
        readme = SEED_README.read_text()
        blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
        assert CONTRACT_TWO in blocks
        assert CONTRACT_THREE in blocks

    def test_two_then_three_populations(self):
        ns = contract(3, 2)
        two, three = ns["coevolve_two"], ns["coevolve"]
        assert [len(two.history.of(n)) for n in ("proposer", "solver")] == [3, 3]
        assert [len(three.history.of(n)) for n in ("proposer", "solver", "judge")] == [2, 2, 2]
        assert two.proposer is ns["proposer"] and two["solver"] is ns["solver"]
        assert three.judge is ns["judge"] and three["judge"] is ns["judge"]
        assert three.order == ["proposer", "solver", "judge"]
        # the three-population Coevolve continues the same populations
        assert [s.generation for s in three.history.of("solver")] == [3, 4]
        assert ns["solver"].generation == 5 and ns["judge"].generation == 2
        for stats in three.history.of("judge"):
            assert isinstance(stats, GenerationStats)
            assert 0.0 <= stats.mean <= stats.best <= 1.0  # judge accuracy

    def test_step_returns_checked_fitnesses_matching_history(self):
        ns = contract(0, 0)
        co = ns["coevolve"]
        fitnesses = co.step()
        assert list(fitnesses) == ["proposer", "solver", "judge"]
        for name, f in fitnesses.items():
            assert f.shape == (8,) and f.dtype == torch.float32
            stats = co.history.of(name)[-1]
            assert stats == GenerationStats(0, float(f.max()), float(f.mean()), float(f.std(correction=0)))
        assert co.generation == 1

    def test_same_seed_same_run(self):
        a, b = contract(2, 2, seed=5), contract(2, 2, seed=5)
        assert a["coevolve"].history == b["coevolve"].history
        for name in ("proposer", "solver", "judge"):
            assert all(torch.equal(x, y) for x, y in zip(adapters(a[name]), adapters(b[name])))


# ---------------------------------------------------------------------------- construction


class TestAccess:
    def test_attribute_item_and_mapping_access(self):
        a, b = line(seed=1), line(seed=2)
        co = Coevolve(populations=dict(a=spec(a, name="a"), b=spec(b, name="b")))
        assert co.a is a and co["b"] is b
        assert list(co) == ["a", "b"] and len(co) == 2 and "a" in co and "c" not in co
        assert co.populations == {"a": a, "b": b}
        with pytest.raises(AttributeError, match="'c'"):
            _ = co.c
        with pytest.raises(KeyError, match=r"no population named 'c'; populations: \['a', 'b'\]"):
            co["c"]

    @pytest.mark.parametrize(
        "name",
        [
            "step",
            "history",
            "generation",
            "order",
            "populations",
            "save",
            "load",
            "state_dict",
            "hall_of_fame",
            "evolve_kwargs",
            "_members",
        ],
    )
    def test_names_that_shadow_an_attribute_raise(self, name):
        with pytest.raises(ValueError, match=f"population name '{name}' would shadow the Coevolve attribute"):
            Coevolve(populations={name: spec(line(), probe=lambda: torch.zeros(1), fitness=lambda: torch.zeros(4))})

    @pytest.mark.parametrize("name", ["1st", "with space", "class", "a-b", ""])
    def test_names_that_are_not_identifiers_raise(self, name):
        with pytest.raises(ValueError, match="must be a Python identifier"):
            Coevolve(populations={name: spec(line(), probe=lambda: torch.zeros(1), fitness=lambda: torch.zeros(4))})

    def test_spec_must_have_exactly_the_three_keys(self):
        with pytest.raises(TypeError, match="exactly the keys `population`, `probe`, `fitness`, got \\['population'"):
            Coevolve(populations=dict(a=dict(population=line(), probe=probe_of("a"))))
        with pytest.raises(TypeError, match="must be a Population, got Sequential"):
            Coevolve(
                populations=dict(a=dict(population=nn.Sequential(), probe=probe_of("a"), fitness=own_fitness("a")))
            )

    def test_one_population_under_two_names_raises(self):
        a = line()
        with pytest.raises(ValueError, match="populations 'a' and 'b' are the same Population object"):
            Coevolve(populations=dict(a=spec(a, name="a"), b=spec(a, name="b")))


class TestInjection:
    def test_unknown_probe_parameter_names_it_and_the_allowed_names(self):
        def probe(coevolve, solver_output):
            return None

        pops = dict(proposer=spec(line(seed=1), name="proposer"), solver=spec(line(seed=2), probe=probe, name="solver"))
        with pytest.raises(ValueError) as info:
            Coevolve(populations=pops)
        message = str(info.value)
        assert "the probe of population 'solver' (probe) has parameter `solver_output`" in message
        assert (
            "allowed parameter names: `coevolve`, `proposer`, `solver`, `proposer_outputs`, `solver_outputs`" in message
        )
        assert "Did you mean `solver_outputs`?" in message

    def test_fitness_cannot_take_coevolve(self):
        pops = dict(a=spec(line(), fitness=lambda coevolve, a_outputs: a_outputs.flatten()))
        with pytest.raises(
            ValueError,
            match=r"the fitness of population 'a' \(<lambda>\) has parameter `coevolve`.*"
            r"allowed parameter names: `a`, `a_outputs`\.",
        ):
            Coevolve(populations=pops)

    def test_outputs_of_an_unknown_population_raise(self):
        pops = dict(a=spec(line(), probe=lambda coevolve, judge_outputs: None))
        with pytest.raises(ValueError, match="has parameter `judge_outputs`"):
            Coevolve(populations=pops)

    def test_star_args_and_non_callables_raise(self):
        with pytest.raises(TypeError, match=r"takes \*\*kwargs parameter `outputs`"):
            Coevolve(populations=dict(a=spec(line(), fitness=lambda **outputs: None)))
        with pytest.raises(TypeError, match=r"takes \*args parameter `args`"):
            Coevolve(populations=dict(a=spec(line(), probe=lambda *args: None)))
        with pytest.raises(TypeError, match="the probe of population 'a' must be callable, got int"):
            Coevolve(populations=dict(a=spec(line(), probe=3)))

    def test_probe_gets_coevolve_and_outputs_fitness_gets_outputs(self):
        seen = {}

        def probe_b(a_outputs, coevolve):
            seen["probe_b"] = (a_outputs, coevolve)
            return a_outputs * 2

        def fitness_a(b_outputs, a_outputs):
            seen["fitness_a"] = (a_outputs, b_outputs)
            return torch.zeros(4)

        pops = dict(
            a=dict(population=line(seed=1), probe=lambda: torch.ones(3), fitness=fitness_a),
            b=dict(population=line(seed=2), probe=probe_b, fitness=lambda: torch.arange(4.0)),
        )
        co = Coevolve(populations=pops)
        co.step()
        assert torch.equal(seen["probe_b"][0], torch.ones(3)) and seen["probe_b"][1] is co
        assert torch.equal(seen["fitness_a"][0], torch.ones(3)) and torch.equal(
            seen["fitness_a"][1], torch.full((3,), 2.0)
        )

    def test_a_parameter_named_after_a_population_receives_its_outputs(self):
        """The seed README: "a parameter named after a population receives that population's outputs"."""
        seen = {}

        def probe_b(coevolve, a):
            seen["probe_b"] = a
            return a * 2

        def fitness_a(a, b_outputs, b):
            seen["fitness_a"] = (a, b_outputs, b)
            return torch.zeros(4)

        pops = dict(
            a=dict(population=line(seed=1), probe=lambda: torch.ones(3), fitness=fitness_a),
            b=dict(population=line(seed=2), probe=probe_b, fitness=lambda b: b.sum() + torch.arange(4.0)),
        )
        co = Coevolve(populations=pops)
        assert co.order == ["a", "b"]  # `a` in b's probe is a dependency, like `a_outputs`
        fitnesses = co.step()
        assert torch.equal(seen["probe_b"], torch.ones(3))
        a, b_outputs, b = seen["fitness_a"]
        assert torch.equal(a, torch.ones(3)) and b_outputs is b and torch.equal(b, torch.full((3,), 2.0))
        assert torch.equal(fitnesses["b"], torch.arange(4.0) + 6)

    def test_a_probe_taking_its_own_population_is_a_cycle_in_either_spelling(self):
        for param in ("a", "a_outputs"):
            probe = eval(f"lambda coevolve, {param}: None")
            with pytest.raises(ValueError, match="probes form a cycle: a -> a"):
                Coevolve(populations=dict(a=spec(line(), probe=probe)))

    def test_names_that_make_parameters_ambiguous_raise(self):
        with pytest.raises(ValueError, match="population names 'x' and 'x_outputs' are ambiguous"):
            Coevolve(populations=dict(x=spec(line(seed=1), name="x"), x_outputs=spec(line(seed=2), name="x_outputs")))
        with pytest.raises(ValueError, match="population name 'coevolve' is reserved"):
            Coevolve(populations=dict(coevolve=spec(line(), name="coevolve")))

    def test_a_population_whose_name_ends_in_outputs_is_injected_by_its_name(self):
        pops = dict(x_outputs=dict(population=line(), probe=lambda: torch.ones(4), fitness=lambda x_outputs: x_outputs))
        assert torch.equal(Coevolve(populations=pops).step()["x_outputs"], torch.ones(4))


class TestOrder:
    @staticmethod
    def chain(deps: dict[str, list[str]], calls: list | None = None) -> dict:
        pops = {}
        for i, (name, inputs) in enumerate(deps.items()):
            params = ", ".join(["coevolve", *(f"{d}_outputs" for d in inputs)])
            probe = eval(
                f"lambda {params}: calls.append({name!r}) or torch.zeros(4, 1)",
                {"calls": calls if calls is not None else [], "torch": torch},
            )
            pops[name] = spec(line(seed=i), probe=probe, name=name)
        return pops

    def test_probes_run_in_dependency_order_not_declaration_order(self):
        calls: list[str] = []
        co = Coevolve(
            populations=self.chain({"judge": ["solver", "proposer"], "solver": ["proposer"], "proposer": []}, calls)
        )
        assert co.order == ["proposer", "solver", "judge"]
        co.step()
        assert calls == ["proposer", "solver", "judge"]

    def test_independent_probes_keep_declaration_order(self):
        co = Coevolve(populations=self.chain({"b": [], "a": [], "c": ["a"]}))
        assert co.order == ["b", "a", "c"]

    def test_two_cycle_is_spelled_out(self):
        with pytest.raises(ValueError, match=re.escape("probes form a cycle: proposer -> solver -> proposer")):
            Coevolve(populations=self.chain({"proposer": ["solver"], "solver": ["proposer"]}))

    def test_three_cycle_is_spelled_out_in_data_flow_order(self):
        # b reads a, c reads b, a reads c: outputs flow a -> b -> c -> a
        with pytest.raises(
            ValueError,
            match=re.escape("probes form a cycle: a -> b -> c -> a (`a -> b`: the probe of b takes `a_outputs`)"),
        ):
            Coevolve(populations=self.chain({"a": ["c"], "b": ["a"], "c": ["b"], "d": ["a"]}))

    def test_cycle_behind_a_chain_and_self_loop(self):
        with pytest.raises(ValueError, match=re.escape("probes form a cycle: b -> c -> b")):
            Coevolve(populations=self.chain({"a": [], "b": ["a", "c"], "c": ["b"]}))
        with pytest.raises(ValueError, match=re.escape("probes form a cycle: a -> a")):
            Coevolve(populations=self.chain({"a": ["a"]}))

    def test_fitnesses_may_close_a_circle(self):
        """fitness_a reads b, fitness_b reads c, fitness_c reads a: fine, all probes run first."""
        pops = {
            "a": spec(line(seed=1), name="a", fitness=lambda b_outputs: b_outputs.flatten()),
            "b": spec(line(seed=2), name="b", fitness=lambda c_outputs: c_outputs.flatten()),
            "c": spec(line(seed=3), name="c", fitness=lambda a_outputs: a_outputs.flatten()),
        }
        co = Coevolve(populations=pops)
        co.step()
        assert [len(h) for h in co.history.by_population().values()] == [1, 1, 1]


# ---------------------------------------------------------------------------- one step


class TestStep:
    def test_wrong_shape_names_the_population_and_both_shapes_and_changes_nothing(self):
        a, b = line(seed=1), line(seed=2)
        before = adapters(a) + adapters(b)
        pops = dict(a=spec(a, name="a"), b=spec(b, name="b", fitness=lambda b_outputs: b_outputs))  # (4, 1)
        co = Coevolve(populations=pops)
        with pytest.raises(
            FitnessError,
            match=r"fitness of population 'b' \(<lambda>\) is invalid: .*"
            r"shape \(4,\), got \(4, 1\)",
        ):
            co.step()
        assert all(torch.equal(x, y) for x, y in zip(before, adapters(a) + adapters(b)))
        assert a.generation == b.generation == co.generation == 0 and co.history == []

    def test_non_finite_and_non_tensor_fitness_raise_naming_the_population(self):
        co = Coevolve(populations=dict(a=spec(line(), fitness=lambda a_outputs: torch.full((4,), float("nan")))))
        with pytest.raises(FitnessError, match="fitness of population 'a'.*must be finite"):
            co.step()
        co = Coevolve(populations=dict(a=spec(line(), fitness=lambda a_outputs: None)))
        with pytest.raises(FitnessError, match="fitness of population 'a'"):
            co.step()

    def test_evolution_reaches_its_population(self, monkeypatch):
        a, b = line(seed=1), line(seed=2)
        seen = {}

        def spy(name, original):
            def evolve_(fitnesses, config=None, **kwargs):
                seen[name] = (config, kwargs)
                return original(fitnesses, config, **kwargs)

            return evolve_

        for name, pop in (("a", a), ("b", b)):
            monkeypatch.setattr(pop, "evolve_", spy(name, pop.evolve_))
        chosen = Evolution(epsilon=0.5, survive_frac=0.25)
        co = Coevolve(populations=dict(a=spec(a, name="a"), b=spec(b, name="b")), evolution=dict(b=chosen))
        co.step()
        assert seen == {"a": (None, {}), "b": (chosen, {})}

    def test_0_5_0s_evolve_kwargs_warn_and_give_the_same_run(self):
        runs = []
        for form in ("config", "keyword", "positional"):
            a, b = line(seed=1), line(seed=2)
            pops = dict(a=spec(a, name="a"), b=spec(b, name="b"))
            if form == "config":
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    co = Coevolve(pops, dict(b=Evolution(epsilon=0.5, survive_frac=0.25)))
            else:
                options = dict(b=dict(epsilon=0.5, survive_frac=0.25))
                with pytest.warns(DeprecationWarning, match=r"evolution=\{name: populora.Evolution"):
                    co = Coevolve(pops, **({"evolve_kwargs": options} if form == "keyword" else {"evolution": options}))
            co.step()
            co.step()
            runs.append(adapters(a) + adapters(b))
        assert not all(torch.equal(x, y) for x, y in zip(runs[0], adapters(line(seed=1)) + adapters(line(seed=2))))
        for other in runs[1:]:
            assert all(torch.equal(x, y) for x, y in zip(runs[0], other))

    def test_evolution_for_unknown_population_or_option_raise(self):
        pops = dict(a=spec(line(), name="a"))
        with pytest.raises(
            ValueError,
            match=r"`evolution` has options for 'b', which is not a population; populations: \['a'\]",
        ):
            Coevolve(populations=pops, evolution=dict(b=Evolution()))
        with pytest.raises(TypeError, match=r"`evolution\['a'\]` must be a populora.Evolution, got float"):
            Coevolve(populations=pops, evolution=dict(a=0.1))
        with pytest.raises(ValueError, match="not both"):
            Coevolve(populations=pops, evolution=dict(a=Evolution()), evolve_kwargs=dict(a={}))
        with (
            pytest.warns(DeprecationWarning),
            pytest.raises(
                ValueError,
                match=r"`evolve_kwargs` has options for 'b', which is not a population; populations: \['a'\]",
            ),
        ):
            Coevolve(populations=pops, evolve_kwargs=dict(b={}))
        with (
            pytest.warns(DeprecationWarning),
            pytest.raises(
                ValueError, match="option `epsilonn`, which Population.evolve_ does not take.*Did you mean `epsilon`"
            ),
        ):
            Coevolve(populations=pops, evolve_kwargs=dict(a=dict(epsilonn=0.1)))

    def test_bad_option_value_at_first_step_restores_populations_already_evolved(self):
        a, b = line(seed=1), line(seed=2)
        before = adapters(a) + adapters(b)
        state = a.generator.get_state()
        with pytest.raises(TypeError, match="bogus"):  # an Evolution refuses it when built
            Evolution(mutation_kwargs=dict(bogus=1))
        with pytest.warns(DeprecationWarning):  # 0.5.0's dict form is checked by evolve_ itself, at the step
            co = Coevolve(
                populations=dict(a=spec(a, name="a"), b=spec(b, name="b")), evolve_kwargs=dict(b=dict(survive_frac=2.0))
            )
        with pytest.raises(ValueError, match="survive_frac"):
            co.step()
        assert all(torch.equal(x, y) for x, y in zip(before, adapters(a) + adapters(b)))
        assert torch.equal(a.generator.get_state(), state) and a.generation == 0 and co.history.of("a") == []

    def test_a_failure_at_a_later_step_restores_every_population(self, monkeypatch):
        """All or nothing at every step, not only the first: population b's evolve_ fails at step 2."""
        a, b = line(seed=1), line(seed=2)
        co = Coevolve(populations=dict(a=spec(a, name="a"), b=spec(b, name="b")))
        co.step()
        before = adapters(a) + adapters(b)
        states = (a.generator.get_state(), b.generator.get_state())
        real = b.evolve_

        def broken(*args, **kwargs):
            raise RuntimeError("boom at step 2")

        monkeypatch.setattr(b, "evolve_", broken)
        with pytest.raises(RuntimeError, match="boom at step 2"):
            co.step()
        assert all(torch.equal(x, y) for x, y in zip(before, adapters(a) + adapters(b)))
        assert torch.equal(a.generator.get_state(), states[0]) and torch.equal(b.generator.get_state(), states[1])
        assert (a.generation, b.generation, co.generation, len(co.history.of("a"))) == (1, 1, 1, 1)
        monkeypatch.setattr(b, "evolve_", real)
        twin_a, twin_b = line(seed=1), line(seed=2)
        twin = Coevolve(populations=dict(a=spec(twin_a, name="a"), b=spec(twin_b, name="b")))
        twin.step()
        twin.step()
        co.step()  # the retry is the twin's step 2, bit for bit
        assert all(torch.equal(x, y) for x, y in zip(adapters(a) + adapters(b), adapters(twin_a) + adapters(twin_b)))

    def test_probes_and_fitnesses_run_without_grad_in_eval_mode_and_modes_come_back(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1, 8), nn.Dropout(0.5), nn.Linear(8, 1))
        pop = Population(model, pop_size=4, low_rank=2)
        model[1].train()
        model[2].eval()  # a mixed state, restored module by module
        seen = []

        def probe(coevolve):
            seen.append(("probe", torch.is_grad_enabled(), model.training, model[1].training))
            return coevolve.a(torch.ones(1, 1), all_individuals=True)

        def fitness(a_outputs):
            seen.append(("fitness", torch.is_grad_enabled(), model.training, a_outputs.requires_grad))
            return a_outputs.flatten()

        Coevolve(populations=dict(a=dict(population=pop, probe=probe, fitness=fitness))).step()
        assert seen == [("probe", False, False, False), ("fitness", False, False, False)]
        assert model.training and model[1].training and not model[2].training and torch.is_grad_enabled()

    def test_modes_come_back_when_a_probe_raises(self):
        pop = line()
        pop.train()

        def probe(coevolve):
            raise RuntimeError("probe broke")

        with pytest.raises(RuntimeError, match="probe broke"):
            Coevolve(populations=dict(a=spec(pop, probe=probe))).step()
        assert pop.model.training

    def test_non_tensor_outputs_are_fine_locally(self):
        pops = dict(
            a=spec(
                line(),
                probe=lambda: {"x": torch.ones(4), "n": 3},
                fitness=lambda a_outputs: a_outputs["x"] * a_outputs["n"],
            )
        )
        assert torch.equal(Coevolve(populations=pops).step()["a"], torch.full((4,), 3.0))

    def test_distributed_without_a_process_group_runs_locally(self):
        runs = []
        for distributed in (True, False):
            ns = contract(0, 0, seed=3)  # the contract's probe draws from the global RNG: reseeded per run
            for _ in range(2):
                ns["coevolve"].step(distributed=distributed)
            runs.append(ns["coevolve"].history)
        assert runs[0] == runs[1]


# ---------------------------------------------------------------------------- save / load


def pure_coevolution(seed: int = 0, hall: bool = True) -> Coevolve:
    """A proposer / solver pair whose probes draw only from generators seeded by the step."""
    torch.manual_seed(seed)
    proposer = Population(nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1), nn.Tanh()), 6, 2, seed=seed)
    solver = Population(nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1)), 6, 2, seed=seed + 1)
    archive = HallOfFame(dict(proposer=proposer), capacity=3, seed=seed) if hall else None

    def probe_proposer(coevolve):
        z = torch.randn(2, 1, generator=torch.Generator().manual_seed(coevolve.generation))
        x = coevolve.proposer(z, all_individuals=True, broadcast=True)
        if archive is not None and len(archive):
            x = torch.cat([x, archive.run(archive.sample(1), z, broadcast=True)])
        return x

    def probe_solver(coevolve, proposer_outputs):
        return coevolve.solver(proposer_outputs.repeat(6, 1), all_individuals=True)

    def errors(solver_outputs, proposer_outputs):
        return ((solver_outputs - torch.sin(torch.pi * proposer_outputs.repeat(6, 1))) ** 2).reshape(6, -1)

    return Coevolve(
        populations=dict(
            proposer=dict(
                population=proposer,
                probe=probe_proposer,
                fitness=lambda proposer_outputs, solver_outputs: (
                    errors(solver_outputs, proposer_outputs)[:, :12].mean(0).view(6, 2).mean(1)
                ),
            ),
            solver=dict(
                population=solver,
                probe=probe_solver,
                fitness=lambda solver_outputs, proposer_outputs: -errors(solver_outputs, proposer_outputs).mean(1),
            ),
        ),
        evolution=dict(solver=Evolution(epsilon=0.2)),
        hall_of_fame=archive,
    )


class TestSaveLoad:
    def test_resume_is_bitwise_the_uninterrupted_run(self, tmp_path):
        straight = pure_coevolution()
        for _ in range(6):
            straight.step()

        first = pure_coevolution()
        for _ in range(3):
            first.step()
        first.save(tmp_path / "co.pt")
        assert [p.name for p in tmp_path.iterdir()] == ["co.pt"]  # no temp file left behind
        for _ in range(2):
            first.step()  # diverges from the checkpoint; loading must undo it

        resumed = pure_coevolution()
        resumed.step()  # state to be overwritten: adapters, generators, counters, history, archive
        resumed.load(tmp_path / "co.pt")
        assert resumed.generation == 3 and [len(h) for h in resumed.history.by_population().values()] == [3, 3]
        for _ in range(3):
            resumed.step()

        assert resumed.history == straight.history and resumed.generation == 6
        for name in ("proposer", "solver"):
            assert all(torch.equal(x, y) for x, y in zip(adapters(resumed[name]), adapters(straight[name])))
            assert torch.equal(resumed[name].generator.get_state(), straight[name].generator.get_state())
            assert resumed[name].generation == straight[name].generation == 6
        a, b = resumed.hall_of_fame, straight.hall_of_fame
        assert torch.equal(a.generator.get_state(), b.generator.get_state())
        for x, y in zip(a.champions("proposer"), b.champions("proposer")):
            assert x[:4] == y[:4]
            assert all(torch.equal(s, t) for fx, fy in zip(x.factors, y.factors) for s, t in zip(fx, fy))

    def test_loading_a_mismatched_checkpoint_raises_and_changes_nothing(self, tmp_path):
        co = pure_coevolution()
        co.step()
        co.save(tmp_path / "co.pt")
        other = Coevolve(populations=dict(a=spec(line(), name="a")))
        with pytest.raises(
            ValueError,
            match=r"checkpoint has populations \['proposer', 'solver'\], this Coevolve "
            r"has \['a'\]",
        ):
            other.load(tmp_path / "co.pt")
        with pytest.raises(ValueError, match="disagree on having a hall of fame"):
            pure_coevolution(hall=False).load(tmp_path / "co.pt")

        fresh = pure_coevolution()
        before = adapters(fresh.proposer) + adapters(fresh.solver)
        state = co.state_dict()
        extra = state["populations"]["solver"]["_extra_state"]
        extra["config"] = {**extra["config"], "pop_size": 7}
        with pytest.raises(ValueError, match="pop_size"):
            fresh.load_state_dict(state)  # the proposer loaded first is restored
        assert all(torch.equal(x, y) for x, y in zip(before, adapters(fresh.proposer) + adapters(fresh.solver)))
        assert fresh.generation == 0 and fresh.proposer.generation == 0

    @pytest.mark.parametrize("entry", [[0, None, 1.0, 0.0], [0, 1.0, None], [0, 1.0, 1.0, "x"]])
    def test_a_history_entry_without_a_best_or_mean_number_is_refused(self, entry):
        co = pure_coevolution()
        co.step()
        state = co.state_dict()
        state["history"]["solver"][0] = entry
        fresh = pure_coevolution()
        with pytest.raises(CheckpointError, match="history of 'solver' must be a list of"):
            fresh.load_state_dict(state)
        assert fresh.generation == 0 and fresh.history == []

    @pytest.mark.parametrize("damage", ["empty", "truncated", "text", "flipped"])
    def test_a_damaged_checkpoint_raises_checkpoint_error_and_changes_nothing(self, tmp_path, damage):
        co = pure_coevolution()
        co.step()
        path = co.save(tmp_path / "co.pt")
        data = path.read_bytes()
        path.write_bytes(
            {
                "empty": b"",
                "truncated": data[: len(data) // 2],
                "text": b"hello, world\n",
                "flipped": data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:],
            }[damage]
        )
        fresh = pure_coevolution()
        before = adapters(fresh.proposer) + adapters(fresh.solver)
        with pytest.raises(CheckpointError, match=re.escape(str(path))):
            fresh.load(path)
        assert all(torch.equal(x, y) for x, y in zip(before, adapters(fresh.proposer) + adapters(fresh.solver)))
        assert fresh.generation == 0

    def test_a_checkpoint_of_another_kind_names_the_kind_it_found(self, tmp_path):
        path = tmp_path / "pop.pt"
        line().save(path)
        with pytest.raises(CheckpointError, match="holds a Population checkpoint, expected a Coevolve checkpoint"):
            pure_coevolution().load(path)


# ---------------------------------------------------------------------------- hall of fame


class TestHallOfFame:
    def test_champion_is_a_copy_of_the_best_individual(self):
        pop = line(pop_size=5, init_scale=1.0)
        hall = HallOfFame(dict(critic=pop), seed=0)
        x = torch.linspace(-1, 1, 7).view(-1, 1)
        with torch.no_grad():
            expected = pop(x, individual=3)
        champion = hall.add_champion(pop, torch.tensor([0.0, 1.0, -1.0, 2.0, 0.5]), generation=4)
        assert isinstance(champion, Champion)
        assert champion[:4] == ("critic", 4, 3, 2.0)
        pop.evolve_(torch.tensor([5.0, 4.0, 3.0, 0.0, 1.0]))  # individual 3 is culled and replaced
        with torch.no_grad():
            assert not torch.allclose(pop(x, individual=3), expected)
            assert torch.allclose(hall.run(champion, x), expected, atol=1e-6)

    def test_run_routes_several_champions_in_one_forward(self):
        pop = line(pop_size=4, init_scale=1.0)
        hall = HallOfFame(dict(p=pop))
        champions = [hall.add_champion("p", torch.eye(4)[i], generation=i) for i in (2, 0, 3)]
        x = torch.linspace(-1, 1, 6).view(-1, 1)
        with torch.no_grad():
            shared = hall.run(champions, x, broadcast=True)  # (k b)
            split = hall.run(champions, x)  # 6 rows split among 3 champions
            single_row = hall.run(champions, x[:1])
            for j, i in enumerate((2, 0, 3)):
                assert torch.allclose(shared[6 * j : 6 * j + 6], pop(x, individual=i), atol=1e-6)
                assert torch.allclose(split[2 * j : 2 * j + 2], pop(x[2 * j : 2 * j + 2], individual=i), atol=1e-6)
                assert torch.allclose(single_row[j], pop(x[:1], individual=i)[0], atol=1e-6)

    def test_sample_is_seeded_distinct_and_capacity_drops_the_oldest(self):
        def filled(seed):
            pop = line(pop_size=4)
            hall = HallOfFame(dict(p=pop), capacity=5, seed=seed)
            for g in range(8):
                hall.add_champion(pop, torch.arange(4.0), generation=g)
            return hall

        a, b, c = filled(1), filled(1), filled(2)
        assert [ch.generation for ch in a.champions()] == [3, 4, 5, 6, 7] and len(a) == 5
        draws = [[ch.generation for ch in a.sample(5)] for _ in range(3)]
        assert draws == [[ch.generation for ch in b.sample(5)] for _ in range(3)]
        assert all(sorted(d) == [3, 4, 5, 6, 7] for d in draws)  # without replacement
        assert draws != [[ch.generation for ch in c.sample(5)] for _ in range(3)]
        assert len(a.sample(9, replace=True)) == 9

    def test_sample_errors(self):
        a, b = line(seed=1), line(seed=2)
        hall = HallOfFame(dict(a=a, b=b))
        with pytest.raises(ValueError, match="no champions of 'a' yet"):
            hall.sample(1, "a")
        hall.add_champion("a", torch.arange(4.0), 0)
        with pytest.raises(ValueError, match="cannot sample 2 distinct champions of 'a': the archive holds 1"):
            hall.sample(2, a)
        with pytest.raises(ValueError, match=r"tracks \['a', 'b'\]: pass `population`"):
            hall.sample(1)
        with pytest.raises(ValueError, match="not tracked"):
            hall.add_champion(line(seed=3), torch.arange(4.0), 0)
        with pytest.raises(FitnessError, match=r"shape \(4,\), got \(3,\)"):
            hall.add_champion("b", torch.arange(3.0), 0)
        hall.add_champion("b", torch.arange(4.0), 0)
        with pytest.raises(ValueError, match=r"must all come from one population, got \['a', 'b'\]"):
            hall.run([*hall.champions("a"), *hall.champions("b")], torch.ones(2, 1))

    def test_coevolve_archives_each_champion_before_it_evolves(self):
        co = pure_coevolution()
        archive = co.hall_of_fame
        for g in range(4):
            with torch.no_grad():
                z = torch.randn(2, 1, generator=torch.Generator().manual_seed(g))
                before = co.proposer(z, all_individuals=True, broadcast=True).view(6, 2)
            fitnesses = co.step()
            champion = archive.champions("proposer")[-1]
            assert champion.generation == g and champion.individual == int(torch.argmax(fitnesses["proposer"]))
            assert champion.fitness == co.history.of("proposer")[-1].best
            with torch.no_grad():
                assert torch.allclose(archive.run(champion, z).flatten(), before[champion.individual], atol=1e-6)
        assert len(archive) == 3  # capacity

    def test_hall_must_track_this_coevolves_populations(self):
        a = line()
        with pytest.raises(ValueError, match="tracks population 'a', which is not this Coevolve's population"):
            Coevolve(populations=dict(a=spec(a, name="a")), hall_of_fame=HallOfFame(dict(a=line(seed=5))))

    def test_save_load_roundtrip(self, tmp_path):
        pop = line()
        hall = HallOfFame(dict(p=pop), capacity=4, seed=3)
        for g in range(3):
            hall.add_champion("p", torch.randn(4, generator=torch.Generator().manual_seed(g)), g)
        hall.sample(2)
        hall.save(tmp_path / "hall.pt")
        other = HallOfFame(dict(p=pop))
        other.load(tmp_path / "hall.pt")
        assert [c[:4] for c in other.champions()] == [c[:4] for c in hall.champions()]
        assert [c.generation for c in other.sample(3)] == [c.generation for c in hall.sample(3)]


# ---------------------------------------------------------------------------- the arms race trains


def test_arms_race_lowers_the_solvers_held_out_error():
    """Proposers shift inputs towards the solver's mistakes; the solver's error on a fixed grid falls.

    Each proposer warps 4 uniform draws (``x = clamp(z + shift(z))``) so that
    proposals cover the domain while concentrating where the solver errs; the
    solver is scored only on the proposals, never on the grid.
    """
    torch.manual_seed(0)
    s_size, p_size, draws = 32, 8, 4
    shifter = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1), nn.Tanh())
    nn.init.zeros_(shifter[2].bias)
    proposer = Population(shifter, pop_size=p_size, low_rank=2, lora_targets=["0", "2"], seed=0)
    solver = Population(
        nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1)),
        pop_size=s_size,
        low_rank=2,
        lora_targets=["0", "2"],
        seed=1,
    )

    def probe_proposer(coevolve):
        z = torch.rand(draws, 1, generator=torch.Generator().manual_seed(coevolve.generation)) * 2 - 1
        return (z.repeat(p_size, 1) + coevolve.proposer(z, all_individuals=True, broadcast=True)).clamp(-1, 1)

    def probe_solver(coevolve, proposer_outputs):
        return coevolve.solver(proposer_outputs.repeat(s_size, 1), all_individuals=True)

    def errors(solver_outputs, proposer_outputs):
        target = torch.sin(torch.pi * proposer_outputs.repeat(s_size, 1))
        return ((solver_outputs - target) ** 2).reshape(s_size, -1)  # (S, P * draws)

    co = Coevolve(
        populations=dict(
            proposer=dict(
                population=proposer,
                probe=probe_proposer,
                fitness=lambda proposer_outputs, solver_outputs: (
                    errors(solver_outputs, proposer_outputs).mean(0).view(p_size, draws).mean(1)
                ),
            ),
            solver=dict(
                population=solver,
                probe=probe_solver,
                fitness=lambda solver_outputs, proposer_outputs: -errors(solver_outputs, proposer_outputs).mean(1),
            ),
        ),
        evolution=dict(solver=Evolution(epsilon=0.3)),
    )
    grid = torch.linspace(-1, 1, 41).view(-1, 1)

    def held_out() -> float:
        with torch.no_grad():
            out = solver(grid, all_individuals=True, broadcast=True).view(s_size, -1)
        return float(((out - torch.sin(torch.pi * grid).view(1, -1)) ** 2).mean(1).median())

    curve = [held_out()]
    for _ in range(4):
        for _ in range(50):
            co.step()
        curve.append(held_out())
    assert curve[0] > 0.35, curve  # the untrained solver is far from sin(pi x) (predicting 0 scores 0.5)
    assert max(curve[2:]) < 0.6 * curve[0], curve
    assert curve[-1] < 0.3, curve
    assert co.history.of("solver")[-1].best > co.history.of("solver")[0].best


# ---------------------------------------------------------------------------- two processes


def _contract_run(seed: int, distributed: bool, res: dict) -> None:
    """The contract's populations built under ``seed``, 3 steps with two then three populations."""
    ns = contract(0, 0, seed=seed)
    two, three = ns["coevolve_two"], ns["coevolve"]
    for _ in range(3):
        two.step(distributed=distributed)
    res["two_history"] = copy.deepcopy(two.history.by_population())
    for _ in range(3):
        three.step(distributed=distributed)
    res["three_history"] = copy.deepcopy(three.history.by_population())
    res["adapters"] = {n: adapters(ns[n]) for n in ("proposer", "solver", "judge")}
    res["generators"] = {n: ns[n].generator.get_state() for n in ("proposer", "solver", "judge")}
    res["models"] = {n: copy.deepcopy(ns[n].model.state_dict()) for n in ("proposer", "solver", "judge")}


def _worker(rank: int, world: int, store: str, out: str) -> None:
    init_gloo(rank, world, store)
    res: dict = {}
    # rank 0 seeds its models differently from rank 1: the first distributed step repairs that, with a warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _contract_run(100 + rank, True, res)
    res["warnings"] = [str(w.message) for w in caught]

    # who runs which probe: independent probes, one per rank; outputs of several kinds travel
    calls: list[str] = []

    def probe(name, value):
        return lambda coevolve: calls.append(name) or value

    pops = {
        "a": spec(
            line(seed=1),
            probe=probe("a", torch.arange(6, dtype=torch.int16).view(2, 3)),
            fitness=lambda a_outputs, b_outputs, c_outputs: torch.full((4,), float(a_outputs.sum() + b_outputs[1])),
        ),
        "b": spec(line(seed=2), probe=probe("b", (torch.ones(2), 7.5)), fitness=lambda b_outputs: torch.arange(4.0)),
        "c": spec(
            line(seed=3),
            probe=lambda coevolve, a_outputs: calls.append("c") or a_outputs.float() * 2,
            fitness=lambda c_outputs: c_outputs.flatten()[:4],
        ),
    }
    co = Coevolve(populations=pops)
    res["mixed_fitness"] = co.step(distributed=True)
    res["calls"] = list(calls)

    # a probe that fails on rank 1: both ranks raise, then the group still works
    def failing(coevolve, a_outputs):
        raise RuntimeError("boom in the probe")

    pops["b"] = spec(line(seed=2), probe=failing, fitness=lambda b_outputs: torch.arange(4.0))
    pops["c"] = spec(line(seed=3), probe=lambda coevolve, b_outputs: b_outputs, fitness=lambda c_outputs: c_outputs)
    co = Coevolve(populations=pops)
    try:
        co.step(distributed=True)
        res["failure"] = None
    except Exception as error:
        res["failure"] = (type(error).__name__, str(error))
    res["after_failure"] = Coevolve(populations=dict(x=spec(line(), name="x"))).step(distributed=True)["x"]
    save(res, out, rank)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn(_worker, tmp_path_factory.mktemp("coevolve_dist"))


@pytest.mark.distributed
class TestDistributed:
    def test_identical_history_and_adapters_on_both_ranks(self, ranks):
        zero, one = ranks
        assert zero["two_history"] == one["two_history"] and len(zero["two_history"]["solver"]) == 3
        assert zero["three_history"] == one["three_history"] and len(zero["three_history"]["judge"]) == 3
        for name in ("proposer", "solver", "judge"):
            assert all(torch.equal(x, y) for x, y in zip(zero["adapters"][name], one["adapters"][name]))
            assert torch.equal(zero["generators"][name], one["generators"][name])
            for key in zero["models"][name]:
                assert torch.equal(zero["models"][name][key], one["models"][name][key])

    def test_same_run_as_one_process(self, ranks):
        """Rank 0's models win; probes ran once each, so the run equals a local run of rank 0's setup."""
        local: dict = {}
        _contract_run(100, False, local)
        assert ranks[0]["two_history"] == local["two_history"]
        assert ranks[0]["three_history"] == local["three_history"]
        for name in ("proposer", "solver", "judge"):
            assert all(torch.equal(x, y) for x, y in zip(ranks[1]["adapters"][name], local["adapters"][name]))

    def test_differing_base_models_are_repaired_with_a_warning(self, ranks):
        for res in ranks:
            repaired = [w for w in res["warnings"] if "differ across ranks" in w]
            # proposer and solver at the first two-population step, the judge at the first three-population one
            assert len(repaired) == 3, res["warnings"]
            for warning, name in zip(repaired, ("proposer", "solver", "judge")):
                assert f"base model parameters of population {name!r} differ across ranks" in warning

    def test_probes_run_once_on_their_rank_and_outputs_of_any_kind_travel(self, ranks):
        zero, one = ranks
        assert zero["calls"] == ["a", "c"] and one["calls"] == ["b"]  # order a, b, c -> ranks 0, 1, 0
        for name in ("a", "b", "c"):
            assert torch.equal(zero["mixed_fitness"][name], one["mixed_fitness"][name])
        assert torch.equal(zero["mixed_fitness"]["a"], torch.full((4,), 15.0 + 7.5))
        assert torch.equal(zero["mixed_fitness"]["c"], torch.tensor([0.0, 2.0, 4.0, 6.0]))

    def test_a_failing_probe_fails_every_rank_without_hanging(self, ranks):
        zero, one = ranks
        assert one["failure"] == ("RuntimeError", "boom in the probe")
        assert zero["failure"] == (
            "RuntimeError",
            "the probe of population 'b' failed on rank 1: RuntimeError: boom in the probe",
        )
        assert torch.equal(zero["after_failure"], one["after_failure"])


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


SAVE_STATE = """
import os as _os
torch.save({"history": coevolve.history.by_population(), "state": coevolve.state_dict()},
           _os.path.join(_os.environ["POPULORA_TEST_OUT"], f"rank{_os.environ['RANK']}.pt"))
"""


@pytest.mark.distributed
def test_contract_blocks_under_torchrun(tmp_path):
    """Both blocks as written (2 steps each, unseeded) under `torchrun --standalone --nproc-per-node=2`."""
    script = tmp_path / "coevolve.py"
    script.write_text(
        CONTRACT_TWO.replace("range(100)", "range(2)") + CONTRACT_THREE.replace("range(100)", "range(2)") + SAVE_STATE
    )
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
    zero, one = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD))
    assert zero["history"] == one["history"] and [len(h) for h in zero["history"].values()] == [2, 2, 2]
    a, b = zero["state"]["populations"], one["state"]["populations"]
    for name in ("proposer", "solver", "judge"):
        assert a[name].keys() == b[name].keys()
        assert all(torch.equal(a[name][k], b[name][k]) for k in a[name] if k.startswith(("_downs.", "_ups.")))
        assert torch.equal(a[name]["_extra_state"]["generator"], b[name]["_extra_state"]["generator"])


def test_example_runs(tmp_path):
    """examples/coevolve_sine.py runs a few generations, prints per-population stats and saves its plot."""
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sine.png"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "coevolve_sine.py"), "--generations", "3", "--plot", str(plot)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("gen ")]
    assert [ln[:8] for ln in lines] == ["gen 0000", "gen 0001", "gen 0002"]
    assert all(f"{name} best" in lines[0] for name in ("proposer", "solver", "judge"))
    assert "held-out mse" in proc.stdout and plot.exists()
