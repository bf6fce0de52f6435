"""A routed forward equals, row by row, single-individual forwards of merged weights."""

import copy

import numpy as np
import pytest
import torch
from models import TinyTransformer, mlp
from torch import nn

from populora import Population
from populora.errors import InvalidIndexError, InvalidTypeError, InvalidValueError, PopuloraError, RouteError

P = 6


def merged(pop: Population, model: nn.Module, i: int) -> nn.Module:
    """An independent copy of the base model with individual ``i``'s delta written into its weights."""
    clone = copy.deepcopy(model)
    modules = dict(clone.named_modules())
    for name, dw in pop.delta_weight(i).items():
        modules[name].weight.data += dw
    return clone


def reference(pop, base, x, ids):
    """Row j through a plain forward of individual ids[j]'s merged model."""
    with torch.no_grad():
        return torch.cat([merged(pop, base, int(i))(x[j : j + 1]) for j, i in enumerate(ids)])


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def make(kind: str, targets=None, seed=0):
    torch.manual_seed(seed)
    if kind == "mlp":
        model, x = mlp(), torch.randn(12, 6)
    else:
        model, x = TinyTransformer(), torch.randint(0, 11, (12, 8))
        if targets is None:
            targets = ["embed", "*.q", "*.k", "*.v", "*.o", "*.mlp.*", "head"]
    base = copy.deepcopy(model)
    pop = Population(model, pop_size=P, low_rank=3, lora_targets=targets, seed=seed, init_scale=0.5)
    return pop, base, x


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
class TestLayouts:
    def test_individual(self, kind):
        pop, base, x = make(kind)
        with torch.no_grad():
            for i in (0, 4):
                close(pop(x, individual=i), merged(pop, base, i)(x))

    def test_all_split(self, kind):
        pop, base, x = make(kind)
        ids = torch.arange(P).repeat_interleave(len(x) // P)
        with torch.no_grad():
            close(pop(x, all_individuals=True), reference(pop, base, x, ids))

    def test_all_broadcast_single_row(self, kind):
        pop, base, x = make(kind)
        with torch.no_grad():
            out = pop(x[:1], all_individuals=True)
            assert out.shape[0] == P
            close(out, reference(pop, base, x[:1].expand(P, *x.shape[1:]), range(P)))

    def test_all_broadcast_flag(self, kind):
        pop, base, x = make(kind)
        with torch.no_grad():
            out = pop(x[:4], all_individuals=True, broadcast=True)  # (p b) with b = 4
            ids = torch.arange(P).repeat_interleave(4)
            close(out, reference(pop, base, x[:4].repeat(P, *([1] * (x.dim() - 1))), ids))

    def test_ids_shuffled_unequal(self, kind):
        pop, base, x = make(kind)
        ids = [3, 0, 5, 5, 1, 3, 3, 0, 2, 5, 5, 5]  # unequal groups, any order, id 4 absent
        with torch.no_grad():
            close(pop(x, individuals=ids), reference(pop, base, x, ids))

    def test_ids_permutation_equal(self, kind):
        pop, base, x = make(kind)
        ids = torch.randperm(len(x), generator=torch.Generator().manual_seed(1)) % P
        with torch.no_grad():
            close(pop(x, individuals=ids), reference(pop, base, x, ids.tolist()))

    def test_ids_broadcast_and_split(self, kind):
        pop, base, x = make(kind)
        with torch.no_grad():
            close(pop(x[:1], individuals=[2, 5, 2]), reference(pop, base, x[:1].expand(3, *x.shape[1:]), [2, 5, 2]))
            close(pop(x, individuals=[4, 1]), reference(pop, base, x, [4] * 6 + [1] * 6))


def test_plain_forward_without_route_is_base_model():
    pop, base, x = make("mlp")
    close(pop(x), base(x))


def test_nested_inputs_and_kwargs():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(5, 4)

        def forward(self, pair, extra=None, scale=1.0):
            return {"y": (self.a(pair[0]) + self.b(extra["z"])) * scale, "tag": "kept"}

    torch.manual_seed(0)
    model = TwoInputs()
    base = copy.deepcopy(model)
    pop = Population(model, pop_size=4, low_rank=2, init_scale=0.5)
    u, z = torch.randn(8, 3), torch.randn(8, 5)
    ids = [1, 3, 0, 0, 2, 1, 3, 3]
    with torch.no_grad():
        out = pop((u, None), extra={"z": z}, scale=2.0, individuals=ids)
        assert out["tag"] == "kept"
        for j, i in enumerate(ids):
            ref = merged(pop, base, i)((u[j : j + 1], None), extra={"z": z[j : j + 1]}, scale=2.0)
            close(out["y"][j : j + 1], ref["y"])


def test_keyword_call_of_target_is_routed():
    class Kw(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(input=x)

    torch.manual_seed(0)
    model = Kw()
    base = copy.deepcopy(model)
    pop = Population(model, pop_size=3, low_rank=1, init_scale=1.0)
    x = torch.randn(3, 3)
    with torch.no_grad():
        close(pop(x, all_individuals=True), reference(pop, base, x, [0, 1, 2]))
        assert not torch.allclose(pop(x, all_individuals=True), base(x))


def test_route_undone_when_forward_raises():
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.fail = True

        def forward(self, x):
            y = self.lin(x)
            if self.fail:
                raise RuntimeError("boom")
            return y

    model = Boom()
    pop = Population(model, pop_size=2, low_rank=1, init_scale=1.0)
    with pytest.raises(RuntimeError, match="boom"):
        pop(torch.randn(2, 2), all_individuals=True)
    model.fail = False
    x = torch.randn(2, 2)
    close(model(x), nn.functional.linear(x, model.lin.weight, model.lin.bias))  # no adapter left behind
    pop(x, all_individuals=True)  # and routing works again


def test_route_errors():
    pop, _, x = make("mlp")
    with pytest.raises(RouteError, match=r"batch of 7 rows cannot be split among pop_size=6.*broadcast=True"):
        pop(x[:7], all_individuals=True)
    with pytest.raises(RouteError, match=r"at most one of .*individual, all_individuals"):
        pop(x, individual=0, all_individuals=True)
    with pytest.raises(RouteError, match=r"batch of 12 rows does not fit 5 individual ids"):
        pop(x, individuals=[0, 1, 2, 3, 4])
    with pytest.raises(RouteError, match=r"disagree on the batch size \(leading dims \[2, 3\]\)"):
        pop((x[:2], x[:3]), all_individuals=True)


def test_batch_not_leading_raises():
    class SeqFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):  # x (n, t, d) -> (t, n, d): batch no longer leading
            return self.lin(x.transpose(0, 1)).transpose(0, 1)

    pop = Population(SeqFirst(), pop_size=2, low_rank=1)
    with pytest.raises(RouteError, match=r"target 'lin' received 3 rows but this routed forward has 4"):
        pop(torch.randn(4, 3, 4), all_individuals=True)


def test_grad_flows_to_adapters_only_when_asked():
    torch.manual_seed(0)
    model = mlp()
    pop = Population(model, pop_size=3, low_rank=2)
    assert not any(p.requires_grad for p in pop.parameters())
    pop = Population(mlp(), pop_size=3, low_rank=2, requires_grad=True)
    loss = pop(torch.randn(6, 6), all_individuals=True).pow(2).sum()
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in pop.parameters() if p.requires_grad)
    assert sum(p.requires_grad for p in pop.parameters()) == 4
    assert all(p.grad is None for p in pop.model.parameters())


def test_forward_factors_routes_given_stacks():
    pop, base, x = make("transformer")
    own = pop.factors()
    picked = [type(f)(f.down[[4, 1]], f.up[[4, 1]]) for f in own]  # a 2-member stack: individuals 4 and 1
    with torch.no_grad():
        close(pop.forward_factors(picked, x, all_individuals=True), pop(x, individuals=[4, 1]))
        close(pop.forward_factors(own, x, individual=3), pop(x, individual=3))
    with pytest.raises(ValueError, match=r"one entry per target \(14\), got 1"):
        pop.forward_factors(own[:1], x, individual=0)


def test_two_populations_share_one_base_model_and_deepcopy_is_plain():
    """Several populations may wrap one model (one LLM in memory); a deep copy of it is a plain model."""
    torch.manual_seed(0)
    model = mlp()
    base = copy.deepcopy(model)
    a = Population(model, pop_size=3, low_rank=2, init_scale=0.5, seed=1)
    b = Population(model, pop_size=4, low_rank=1, lora_targets=["2"], init_scale=0.5, seed=2)
    x = torch.randn(5, 6)
    with torch.no_grad():
        close(a(x, individual=2), merged(a, base, 2)(x))
        close(b(x, individual=3), merged(b, base, 3)(x))
        close(copy.deepcopy(model)(x), base(x))
        expected_b0 = merged(b, base, 0)(x)
        b.merge_(0)  # writes into the shared weights; a still routes on top of them
        close(model(x), expected_b0)
        close(a(x, individual=1), merged(a, copy.deepcopy(model), 1)(x))


def test_repeated_and_changing_ids_route_correctly():
    """The last plan is reused only for the same ids (env loops repeat them); any change replans."""
    pop, base, x = make("mlp")
    sequences = [
        [3, 0, 5, 5, 1, 3, 3, 0, 2, 5, 5, 5],
        [3, 0, 5, 5, 1, 3, 3, 0, 2, 5, 5, 5],
        [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5],
        [5] * 12,
        [3, 0, 5, 5, 1, 3, 3, 0, 2, 5, 5, 5],
    ]
    with torch.no_grad():
        for ids in sequences:
            close(pop(x, individuals=ids), reference(pop, base, x, ids))


def test_broadcast_to_as_many_ids_as_rows():
    """`broadcast=True` gives every id the whole batch even when the batch has len(ids) rows."""
    pop, base, x = make("mlp")
    with torch.no_grad():
        out = pop(x[:3], individuals=[4, 1, 2], broadcast=True)  # 3 rows, 3 ids -> 9 rows
        close(out, reference(pop, base, x[:3].repeat(3, 1), [4, 4, 4, 1, 1, 1, 2, 2, 2]))


# ---------------------------------------------------------------------------- ids: types and range


def test_numpy_and_tensor_ids_route_like_python_ints():
    """NumPy scalars / arrays and integer tensors are accepted wherever Python ints are (same shapes:
    bitwise equal)."""
    pop, _, x = make("mlp")
    ids = [3, 0, 5, 5, 1, 3, 3, 0, 2, 5, 5, 5]
    with torch.no_grad():
        want = pop(x, individual=3)
        for i in (np.int64(3), np.int32(3), np.uint8(3), torch.tensor(3), torch.tensor([3])):
            assert torch.equal(pop(x, individual=i), want), type(i)
        want = pop(x, individuals=ids)
        for given in (
            np.array(ids),
            np.array(ids, dtype=np.uint8),
            [np.int64(i) for i in ids],
            tuple(ids),
            torch.tensor(ids, dtype=torch.int32),
            [torch.tensor(i) for i in ids],
        ):
            assert torch.equal(pop(x, individuals=given), want), type(given)
        assert torch.equal(pop(x, all_individuals=np.bool_(True)), pop(x, all_individuals=True))
        assert torch.equal(
            pop(x[:2], individuals=np.array([4, 1]), broadcast=np.bool_(True)),
            pop(x[:2], individuals=[4, 1], broadcast=True),
        )


def test_out_of_range_ids_raise_invalid_index_error():
    """An id out of [0, P) is an InvalidIndexError (an IndexError) in every layout, named with its position."""
    pop, _, x = make("mlp")
    for bad in (6, -1, np.int64(6), torch.tensor(-1)):
        with pytest.raises(InvalidIndexError, match=rf"`individual` must be an id in \[0, 6\), got {int(bad)}$"):
            pop(x, individual=bad)
    with pytest.raises(InvalidIndexError, match=r"`individuals` holds id -1, out of range \[0, 6\) \(at position 1\)"):
        pop(x[:2], individuals=[0, -1])
    with pytest.raises(InvalidIndexError, match=r"`individuals` holds id 6, out of range \[0, 6\) \(at position 2\)"):
        pop(x[:1], individuals=np.array([0, 5, 6]))
    with pytest.raises(InvalidIndexError, match=r"holds id 99, out of range \[0, 6\) \(at position 0\)"):
        pop(x[:0], individuals=torch.tensor([99]))  # checked even when no row would reach it
    with pytest.raises(IndexError):  # the builtin too, so both `except` styles work
        pop(x, individual=99)
    with pytest.raises(InvalidIndexError, match=r"`individual` must be an id in \[0, 2\), got 2"):
        pop.forward_factors([type(f)(f.down[:2], f.up[:2]) for f in pop.factors()], x, individual=2)


def test_non_integer_ids_and_flags_raise_invalid_type_error():
    pop, _, x = make("mlp")
    cases = [
        (dict(individual=1.5), r"`individual` must be an int id in \[0, 6\), got float 1.5"),
        (dict(individual=True), r"`individual` must be an int id in \[0, 6\), got bool True"),
        (dict(individual=torch.tensor(1.0)), r"`individual` must be an int id .*got float 1.0"),
        (dict(individuals=[0.0, 1.0]), r"`individuals` must hold integer ids, got dtype float64"),
        (dict(individuals=[True, False]), r"`individuals` must hold integer ids, got dtype bool"),
        (dict(individuals=["a", "b"]), r"`individuals` must hold integer ids, got dtype <U1"),
        (dict(individuals=torch.tensor([0.0, 1.0])), r"`individuals` must hold integer ids, got dtype torch.float32"),
        (
            dict(individuals=[0, [1]]),
            r"`individuals` must be a 1-D list or integer tensor of ids, got list \[0, \[1\]\]",
        ),
        (dict(all_individuals="yes"), r"`all_individuals` must be a bool, got str 'yes'"),
        (dict(individuals=[0, 1], broadcast=1), r"`broadcast` must be a bool, got int 1"),
    ]
    for kwargs, match in cases:
        with pytest.raises(InvalidTypeError, match=match):
            pop(x[:2], **kwargs)
    with pytest.raises(
        InvalidValueError,
        match=r"`individuals` must be a 1-D list or integer tensor of ids, got "
        r"shape \(1, 2\)",
    ):
        pop(x[:2], individuals=[[0, 1]])


# ---------------------------------------------------------------------------- empty batches


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_empty_batch_routes_in_every_layout(kind):
    """0 rows in, 0 rows out, like the base model: every layout (ids are still checked)."""
    pop, base, x = make(kind)
    empty = x[:0]
    with torch.no_grad():
        want = base(empty).shape
        assert want[0] == 0
        layouts = [
            dict(individual=2),
            dict(individual=np.int64(0)),
            dict(all_individuals=True),
            dict(all_individuals=True, broadcast=True),
            dict(individuals=[]),
            dict(individuals=[], broadcast=True),
            dict(individuals=[0, 1]),
            dict(individuals=torch.tensor([5, 1, 1]), broadcast=True),
        ]
        for route in layouts:
            out = pop(empty, **route)
            assert out.shape == want, route
        # a non-empty route after the empty ones still routes (the plan cache holds no stale empty plan)
        close(pop(x, individuals=[4, 1]), reference(pop, base, x, [4] * 6 + [1] * 6))


def test_empty_ids():
    """`individuals=[]` fits 0 rows; a broadcast batch (1 row, or broadcast=True) gives 0 rows; else a RouteError."""
    pop, _, x = make("mlp")
    with torch.no_grad():
        assert pop(x[:1], individuals=[]).shape == (0, 3)
        assert pop(x[:4], individuals=np.array([], dtype=np.int64), broadcast=True).shape == (0, 3)
    with pytest.raises(RouteError, match=r"`individuals=` is empty \(0 ids\), but the batch has 3 rows"):
        pop(x[:3], individuals=[])


def test_empty_batch_with_grad():
    pop = Population(mlp(), pop_size=3, low_rank=2, requires_grad=True)
    out = pop(torch.zeros(0, 6), all_individuals=True, broadcast=True)
    assert out.shape == (0, 3) and out.requires_grad
    out.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in pop.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------- errors count the user's rows


def test_wrong_feature_size_names_the_rows_passed():
    """A Linear target given the wrong feature size: the error counts the user's rows, not the broadcast copies."""
    pop, _, _ = make("mlp")
    bad = torch.randn(2, 5)  # the model wants 6 features
    with pytest.raises(
        RouteError,
        match=r"target '0' \(Linear with in_features=6\) got inputs with 5 features: its "
        r"input has shape \(2, 5\) for the 2 rows of the batch passed \(first input of shape \(2, 5\)\) "
        r"\(routed as 12 rows: the whole batch for each of 6 individuals\)$",
    ):
        pop(bad, all_individuals=True, broadcast=True)
    with pytest.raises(
        RouteError,
        match=r"its input has shape \(2, 5\) for the 2 rows .* \(routed as 6 rows: the "
        r"whole batch for each of 3 ids\)$",
    ):
        pop(bad, individuals=[0, 4, 4], broadcast=True)
    with pytest.raises(
        RouteError,
        match=r"got inputs with 5 features: its input has shape \(1, 5\) for the 1 row "
        r"of the batch passed \(first input of shape \(1, 5\)\) \(routed as 6 rows",
    ):
        pop(bad[:1], all_individuals=True)
    for x, route in (
        (bad, dict(individual=1)),
        (bad, dict(individuals=[3, 0])),
        (bad.repeat(3, 1), dict(all_individuals=True)),
    ):
        n = len(x)
        with pytest.raises(
            RouteError,
            match=rf"got inputs with 5 features: its input has shape \({n}, 5\) for the {n} "
            rf"rows of the batch passed \(first input of shape \({n}, 5\)\)$",
        ):
            pop(x, **route)
    with pytest.raises(RuntimeError, match=r"\(2x5 and 6x16\)"):  # the plain model's own error is untouched
        pop(bad)


def test_model_error_in_broadcast_forward_notes_the_rows_passed():
    """An error raised by a non-target layer keeps its type and message, plus a note with the user's rows."""
    torch.manual_seed(0)
    pop = Population(mlp(), pop_size=4, low_rank=1, lora_targets=["2"])  # layer 0 is not a target
    with pytest.raises(RuntimeError, match=r"\(8x5 and 6x16\)") as info:
        pop(torch.randn(2, 5), all_individuals=True, broadcast=True)
    assert not isinstance(info.value, PopuloraError)
    assert info.value.__notes__ == [
        "populora: this routed forward ran the model on 8 rows, the whole batch for each "
        "of 4 individuals: the batch passed has 2 rows (first input of shape (2, 5)), so "
        "row counts above count the repeated rows"
    ]
