"""populora.fitness: the three fitness signatures, alone and across 2 gloo processes."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ranks import error_of, init_gloo, save

from populora.errors import FitnessError, InvalidValueError
from populora.fitness import as_fitnesses, evaluate, fitness_kind, validate_fitnesses

WORLD = 2
NUM = 5
FORMS = r"expected fn\(population, individuals=\.\.\.\) .* fn\(population, idx\) .* fn\(population\)"


class Recorder:
    """A 'population' that records how the fitness functions were called.

    Fitness of individual ``i`` is ``offset + i`` (``nan`` for ids in ``nan_ids``).
    """

    def __init__(self, offset: float = 0.5, nan_ids: tuple[int, ...] = ()):
        self.offset, self.nan_ids, self.calls = offset, nan_ids, []

    def value(self, i: int) -> float:
        return float("nan") if i in self.nan_ids else self.offset + i


def batch_fn(population, individuals):
    population.calls.append(("batch", list(individuals)))
    return torch.tensor([population.value(i) for i in individuals])


def single_fn(population, idx):
    population.calls.append(("single", idx))
    return population.value(idx)


def all_fn(population):
    population.calls.append(("all",))
    return [population.value(i) for i in range(NUM)]


def expected(population: Recorder, num: int = NUM) -> torch.Tensor:
    return torch.tensor([population.value(i) for i in range(num)])


# ----------------------------------------------------------------- single process


class TestFitnessKind:
    def test_batch(self):
        assert fitness_kind(batch_fn) == "batch"
        assert fitness_kind(lambda population, *, individuals: 0) == "batch"
        assert fitness_kind(lambda population, individuals=None: 0) == "batch"

    def test_single(self):
        assert fitness_kind(single_fn) == "single"
        assert fitness_kind(lambda pop, i, scale=1.0, **kwargs: 0) == "single"

    def test_all(self):
        assert fitness_kind(all_fn) == "all"
        assert fitness_kind(lambda pop, extra=None: 0) == "all"

    def test_callable_objects_and_partials(self):
        class Scorer:
            def __call__(self, population, idx):
                return 0.0

        assert fitness_kind(Scorer()) == "single"
        assert fitness_kind(functools.partial(lambda scale, population: 0, 2.0)) == "all"

    @pytest.mark.parametrize(
        ("fn", "why"),
        [
            (lambda: 0, r"<lambda>\(\): it has 0 required positional parameters, not 1 or 2"),
            (lambda a, b, c: 0, r"<lambda>\(a, b, c\): it has 3 required positional parameters, not 1 or 2"),
            (lambda *args: 0, r"<lambda>\(\*args\): it takes \*args \(a wrapper\? decorate it with functools\.wraps\)"),
            (
                lambda pop, *, k: 0,
                r"<lambda>\(pop, \*, k\): it requires keyword-only argument\(s\) \['k'\] that populora cannot supply",
            ),
            (
                lambda pop, idx, individuals: 0,
                r"<lambda>\(pop, idx, individuals\): it takes `individuals` but 2 other required positional parameters, "
                r"not 1",
            ),
        ],
    )
    def test_refuses_other_signatures(self, fn, why):
        with pytest.raises(TypeError, match=f"cannot tell how to call fitness function {why}; {FORMS}"):
            fitness_kind(fn)

    def test_refuses_non_callables(self):
        with pytest.raises(TypeError, match=f"a fitness function must be callable, got int; {FORMS}"):
            fitness_kind(3)


class TestEvaluateSingleProcess:
    @pytest.mark.parametrize("fn", [batch_fn, single_fn, all_fn])
    def test_full_vector_in_id_order(self, fn):
        population = Recorder(nan_ids=(3,))
        out = evaluate(fn, population, NUM)
        assert out.dtype == torch.float32 and out.device.type == "cpu" and out.shape == (NUM,)
        torch.testing.assert_close(out, expected(population), equal_nan=True)  # NaN kept
        calls = {
            "batch": [("batch", list(range(NUM)))],
            "single": [("single", i) for i in range(NUM)],
            "all": [("all",)],
        }
        assert population.calls == calls[fitness_kind(fn)]

    @pytest.mark.parametrize(
        "result",
        [
            [0.0, 1.0, 2.0],
            (0, 1, 2),
            torch.arange(3.0, dtype=torch.float64),
            torch.arange(3.0).reshape(3, 1),  # a (p, 1) model output
            torch.arange(3.0).reshape(1, 3),
            [torch.tensor(0.0), torch.tensor([1.0]), 2],
            pytest.param("numpy", id="numpy"),
        ],
    )
    def test_converts_results(self, result):
        if isinstance(result, str):
            np = pytest.importorskip("numpy")
            result = np.arange(3, dtype=np.float64)
        out = evaluate(lambda population: result, None, 3)
        assert out.dtype == torch.float32 and out.tolist() == [0.0, 1.0, 2.0]

    def test_single_converts_scalars(self):
        np = pytest.importorskip("numpy")
        values = [1, 2.5, torch.tensor(3.0), torch.tensor([4.0], dtype=torch.float64), np.float32(5.0), True]
        out = evaluate(lambda population, idx: values[idx], None, len(values))
        assert out.tolist() == [1.0, 2.5, 3.0, 4.0, 5.0, 1.0]

    @pytest.mark.parametrize(
        ("fn", "match"),
        [
            (
                lambda population: [1.0, 2.0],
                r"fitness function <lambda>\(population\) returned 2 values \(shape \(2,\)\) for 3 individuals; "
                r"expected shape \(3,\)",
            ),
            (
                lambda population, individuals: torch.zeros(3, 2),
                r"returned 6 values \(shape \(3, 2\)\) for 3 individuals; expected shape \(3,\)",
            ),
            (lambda population: None, r"returned None; expected 3 values \(did it forget to `return`\?\)"),
            (
                lambda population, idx: torch.ones(2),
                r"fitness function <lambda>\(population, idx\) \(individual 0\) must return one number, got shape \(2,\)",
            ),
            (lambda population, idx: "good", r"\(individual 0\) must return a number, got str: 'good'"),
            (lambda population: "abc", r"must return 3 numbers \(sequence, array or tensor\), got str"),
            (lambda population: torch.zeros(3, dtype=torch.complex64), r"must return real numbers, got dtype"),
        ],
    )
    def test_wrong_results(self, fn, match):
        with pytest.raises(FitnessError, match=match):
            evaluate(fn, None, 3)

    def test_errors_from_fn_propagate(self):
        def fails(population, idx):
            raise KeyError("no such env")

        with pytest.raises(KeyError, match="no such env"):
            evaluate(fails, None, 3)

    @pytest.mark.parametrize("num", [0, -1, 2.0, True])
    def test_num_must_be_positive_int(self, num):
        with pytest.raises(ValueError, match="`num` must be a positive int"):
            evaluate(single_fn, Recorder(), num)


# --------------------------------------------------------------- two processes


def _fitness_worker(rank: int, store: str, out: str) -> None:
    init_gloo(rank, WORLD, store)
    res: dict = {}
    for name, fn in (("batch", batch_fn), ("single", single_fn), ("all", all_fn)):
        population = Recorder(offset=0.25, nan_ids=(4,))
        res[name] = evaluate(fn, population, NUM)
        res[f"{name}_calls"] = population.calls
        population = Recorder(offset=0.25, nan_ids=(4,))
        res[f"{name}_local"] = evaluate(fn, population, NUM, distributed=False)
        res[f"{name}_local_calls"] = population.calls

    population = Recorder()  # fewer individuals than ranks: rank 1's share is empty
    res["tiny"] = evaluate(batch_fn, population, 1)
    res["tiny_calls"] = population.calls

    def boom(population, idx):
        if rank == 1:
            raise RuntimeError("boom in rank 1")
        return 0.0

    res["raised"] = error_of(evaluate, boom, None, NUM)

    def short(population, individuals):
        return [0.0] * (len(individuals) - (rank == 0))

    res["wrong_length"] = error_of(evaluate, short, None, NUM)
    res["after_errors"] = evaluate(single_fn, Recorder(), NUM)  # the group still works
    save(res, out, rank)
    dist.destroy_process_group()


def _raising_worker(rank: int, store: str) -> None:
    init_gloo(rank, WORLD, store)

    def boom(population, individuals):
        if rank == 1:
            raise RuntimeError("boom in rank 1")
        return [0.0] * len(individuals)

    evaluate(boom, None, NUM)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("fitness")
    mp.spawn(_fitness_worker, args=(str(tmp / "store"), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.distributed
class TestEvaluateTwoRanks:
    @pytest.mark.parametrize("kind", ["batch", "single", "all"])
    def test_same_full_vector_on_every_rank(self, two_ranks, kind):
        want = expected(Recorder(offset=0.25, nan_ids=(4,)))
        for res in two_ranks:
            torch.testing.assert_close(res[kind], want, equal_nan=True)
            torch.testing.assert_close(res[f"{kind}_local"], want, equal_nan=True)

    def test_ids_are_split_across_ranks(self, two_ranks):
        assert two_ranks[0]["batch_calls"] == [("batch", [0, 1, 2])]
        assert two_ranks[1]["batch_calls"] == [("batch", [3, 4])]
        assert two_ranks[0]["single_calls"] == [("single", i) for i in (0, 1, 2)]
        assert two_ranks[1]["single_calls"] == [("single", i) for i in (3, 4)]

    def test_whole_population_fn_runs_on_rank_0_only(self, two_ranks):
        assert two_ranks[0]["all_calls"] == [("all",)]
        assert two_ranks[1]["all_calls"] == []

    def test_distributed_false_evaluates_everything_on_every_rank(self, two_ranks):
        for res in two_ranks:
            assert res["batch_local_calls"] == [("batch", list(range(NUM)))]
            assert res["single_local_calls"] == [("single", i) for i in range(NUM)]
            assert res["all_local_calls"] == [("all",)]

    def test_empty_share_is_not_called(self, two_ranks):
        assert two_ranks[0]["tiny_calls"] == [("batch", [0])]
        assert two_ranks[1]["tiny_calls"] == []
        for res in two_ranks:
            assert res["tiny"].tolist() == [0.5]

    def test_an_error_on_one_rank_fails_every_rank(self, two_ranks):
        assert two_ranks[1]["raised"] == ("RuntimeError", "boom in rank 1")
        assert two_ranks[0]["raised"] == (
            "RuntimeError",
            "rank(s) [1] failed while evaluating (rank 1: RuntimeError: boom in rank 1)",
        )
        kind, message = two_ranks[0]["wrong_length"]
        assert kind == "FitnessError" and "returned 2 values (shape (2,)) for 3 individuals" in message
        kind, message = two_ranks[1]["wrong_length"]
        assert kind == "RuntimeError" and "rank 0: FitnessError: fitness function short" in message
        for res in two_ranks:
            assert res["after_errors"].tolist() == expected(Recorder()).tolist()


@pytest.mark.distributed
def test_raising_rank_ends_the_run_with_its_error(tmp_path):
    """An uncaught fitness error stops both processes (no rank hangs in a collective) and shows the message."""
    context = mp.spawn(_raising_worker, args=(str(tmp_path / "store"),), nprocs=WORLD, join=False)
    with pytest.raises(mp.ProcessRaisedException, match="boom in rank 1"):
        for _ in range(1200):  # a hang fails after this many waits; a slow machine just waits longer
            if context.join(timeout=0.5):
                break
        else:
            pytest.fail("the ranks did not end: one is blocked")


# ---------------------------------------------------------------------------- precision and types (issue 10, 9 and 12)


class TestAsFitnesses:
    """The dtype rules of populora.fitness.as_fitnesses, which Population.validate_fitnesses applies."""

    @pytest.mark.parametrize(
        "values, dtype",
        [
            ([1e8 + 1, 1e8], torch.float64),  # Python floats are doubles: kept exactly
            ([1, 2, 3], torch.float64),
            ((0.5, np.float32(1.5), torch.tensor(2.5)), torch.float64),
            (np.arange(3.0), torch.float64),
            (np.arange(3.0, dtype=np.float32), torch.float32),
            (torch.arange(3.0, dtype=torch.float64), torch.float64),
            (torch.arange(3.0), torch.float32),
            (torch.arange(3), torch.int64),  # integer tensors keep their dtype; the population widens them
        ],
    )
    def test_precision_is_kept(self, values, dtype):
        out = as_fitnesses(values)
        assert out.dtype == dtype and out.shape == (len(values),)
        assert out.tolist() == [float(v) for v in values]

    @pytest.mark.parametrize(
        "values, named",
        [
            ("abc", "str"),
            (b"abc", "bytes"),
            ({"a": 1.0}, "dict"),
            ({1.0, 2.0}, "set"),
            (None, "NoneType"),
            (object(), "object"),
            (["a", "b"], "list holding str"),
            ([{"a": 1}], "list holding dict"),
            ([1.0, object()], r"list of non-numbers"),
        ],
    )
    def test_non_numbers_raise_naming_the_type(self, values, named):
        with pytest.raises(
            FitnessError, match=rf"fitnesses must be real numbers \(a tensor, array or list\), got {named}"
        ):
            as_fitnesses(values)

    def test_complex_is_refused(self):
        with pytest.raises(FitnessError, match="must be real numbers, got dtype torch.complex64"):
            as_fitnesses(torch.zeros(3, dtype=torch.complex64))


P = 8
# float64 fitnesses whose order float32 cannot see (float32 spacing at 1e8 is 8): odd ids are the best
CLOSE = 1e8 + torch.tensor([0.0, 4, 1, 5, 2, 6, 3, 7], dtype=torch.float64)


def population(**kwargs):
    from populora import Population

    torch.manual_seed(0)
    return Population(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)), pop_size=P, low_rank=2, seed=0, **kwargs
    )


class TestPopulationPrecision:
    def test_validate_fitnesses_keeps_float64(self):
        pop = population()
        assert pop.validate_fitnesses(CLOSE).dtype == torch.float64
        assert pop.validate_fitnesses(CLOSE.tolist()).dtype == torch.float64
        assert pop.validate_fitnesses(CLOSE.float()).dtype == torch.float32
        assert pop.validate_fitnesses(torch.arange(P, dtype=torch.bfloat16)).dtype == torch.float32
        assert pop.validate_fitnesses(torch.arange(P, dtype=torch.float16)).dtype == torch.float32
        assert pop.validate_fitnesses(torch.arange(P)).dtype == torch.float64
        assert torch.equal(pop.validate_fitnesses(CLOSE), CLOSE)

    @pytest.mark.parametrize("fitnesses", [CLOSE, CLOSE.tolist(), CLOSE.numpy()])
    def test_deterministic_survivors_in_float64(self, fitnesses):
        result = population().select("deterministic", fitnesses, survive_frac=0.5, elite_frac=0.25)
        assert sorted(result.selected_in_indices.tolist()) == [1, 3, 5, 7]
        assert result.elite_indices.tolist() == [7, 5]
        assert result.selected_out_indices.tolist() == [0, 2, 4, 6]

    def test_probabilistic_selection_sees_float64_differences(self):
        """At a low temperature the softmax of the z-score is the top: only visible in float64."""
        result = population().select("probabilistic", CLOSE, survive_frac=0.5, elite_frac=0.0, temperature=1e-3)
        assert sorted(result.selected_in_indices.tolist()) == [1, 3, 5, 7]

    @pytest.mark.parametrize("kind", ["tournament", "queen_bee"])
    def test_parents_in_float64(self, kind):
        """Every survivor competes: the fittest parent first is id 7, as only float64 can tell."""
        pop = population()
        parents = pop.select_parents(kind, CLOSE, 6, [0, 2, 4, 6], tournament_size=4)
        assert parents[:, 0].tolist() == [7] * 6
        assert (parents[:, 1] == 5).all()

    def test_fuss_weights_in_float64(self):
        from populora.operators import fuss_weights

        w = fuss_weights(CLOSE)
        assert w.dtype == torch.float64 and not torch.allclose(w, torch.full((P,), 1 / P, dtype=torch.float64))

    def test_select_and_merge_best_picks_the_float64_argmax(self):
        fitnesses = 1 + torch.arange(P, dtype=torch.float64) * 1e-9  # all 1.0 in float32
        pop = population()
        x = torch.randn(3, 4)
        with torch.no_grad():
            expected = pop(x, individual=P - 1)
        model = pop.select_and_merge_best_(fitnesses)
        torch.testing.assert_close(model(x), expected)
        model2 = population().select_and_merge_best_(fitnesses.tolist())
        torch.testing.assert_close(model2(x), expected)

    def test_evolve_keeps_the_float64_elites(self):
        pop = population()
        before = [f.down.clone() for f in pop.factors()]
        result = pop.evolve_(CLOSE, elite_frac=0.25)
        assert result.elite_indices.tolist() == [7, 5]
        assert all(torch.equal(b[[1, 3, 5, 7]], f.down[[1, 3, 5, 7]]) for b, f in zip(before, pop.factors()))

    def test_nan_worst_in_float64(self):
        pop = population(nan_policy="worst")
        f = CLOSE.clone()
        f[7] = float("nan")
        checked = pop.validate_fitnesses(f)
        assert checked.dtype == torch.float64 and int(checked.argmin()) == 7 and int(checked.argmax()) == 5


class TestPopulationNonNumericFitnesses:
    @pytest.mark.parametrize(
        "fitnesses, named",
        [
            ("abcdefgh", "str"),
            ({i: float(i) for i in range(P)}, "dict"),
            (object(), "object"),
            (["a"] * P, "list holding str"),
        ],
    )
    @pytest.mark.parametrize(
        "call", ["evolve_", "select", "select_parents", "select_and_merge_best_", "validate_fitnesses", "crossover_"]
    )
    def test_fitness_error_names_the_type(self, fitnesses, named, call):
        pop = population()
        before = [f.down.clone() for f in pop.factors()]
        method = getattr(pop, call)
        args = {
            "select": ("deterministic", fitnesses),
            "select_parents": ("tournament", fitnesses, 2, [0, 1]),
            "crossover_": ("xes", [[2, 3]], [0], fitnesses),
        }
        with pytest.raises(FitnessError, match=rf"fitnesses must be real numbers .*got {named}"):
            method(*args.get(call, (fitnesses,)))
        assert all(torch.equal(b, f.down) for b, f in zip(before, pop.factors())) and pop.generation == 0


def test_evaluate_in_float64_keeps_python_floats():
    close = lambda population, idx: 1e8 + idx
    assert evaluate(close, None, 3, dtype=torch.float64).tolist() == [1e8, 1e8 + 1, 1e8 + 2]
    assert evaluate(close, None, 3).dtype == torch.float32
    with pytest.raises(ValueError, match=r"`dtype` must be torch.float32 or torch.float64"):
        evaluate(close, None, 3, dtype=torch.int64)


class TestValidateFitnesses:
    """populora.fitness.validate_fitnesses: the one boundary check (the population's, Coevolve's, ES tell's)."""

    def test_shape_precision_and_device(self):
        assert validate_fitnesses([1, 2, 3], 3).dtype == torch.float64
        assert validate_fitnesses(torch.ones(3, dtype=torch.float16), 3).dtype == torch.float32
        with pytest.raises(FitnessError, match=r"fitnesses must have shape \(4,\), got \(3,\)"):
            validate_fitnesses([1.0, 2.0, 3.0], 4)
        with pytest.raises(FitnessError, match=r"fitnesses are required: a \(3,\) tensor"):
            validate_fitnesses(None, 3)
        with pytest.raises(FitnessError, match="got dtype torch.bool"):
            validate_fitnesses(torch.ones(3, dtype=torch.bool), 3)

    def test_nan_policy_and_infinities(self):
        nan = [1.0, float("nan"), 3.0]
        with pytest.raises(FitnessError, match=r"must be finite, got \[nan\] at ids \[1\]; pass nan_policy='worst'"):
            validate_fitnesses(nan, 3)
        assert validate_fitnesses(nan, 3, nan_policy="worst").tolist() == [1.0, -1.0, 3.0]
        with pytest.raises(FitnessError, match="must be finite"):
            validate_fitnesses([1.0, float("inf"), 3.0], 3, nan_policy="worst")
        kept = validate_fitnesses([1.0, float("inf"), -float("inf")], 3, allow_inf=True)
        assert kept.tolist() == [1.0, float("inf"), -float("inf")]
        with pytest.raises(FitnessError, match=r"must be free of NaN, got \[nan\]"):
            validate_fitnesses(nan, 3, allow_inf=True)
        with pytest.raises(InvalidValueError, match="`nan_policy` must be one of"):
            validate_fitnesses(nan, 3, nan_policy="ignore")
