"""plot_history (issue 14, item 10): one call for every history populora keeps; matplotlib optional."""

import builtins
from collections import namedtuple

import matplotlib
import pytest
import torch
from models import mlp

matplotlib.use("Agg")

from matplotlib import pyplot as plt

from populora import EggrollES, GenerationStats, InvalidTypeError, InvalidValueError, Population, plot_history


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def evolved(generations=3):
    torch.manual_seed(0)
    pop = Population(mlp(), pop_size=8, low_rank=2, seed=1)
    for g in range(generations):
        pop.evolve_(torch.arange(8.0) * (g + 1))
    return pop


def test_population_history_to_png(tmp_path):
    pop = evolved()
    path = tmp_path / "history.png"
    ax = plot_history(pop.history, title="pop", path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    best, mean = ax.get_lines()
    assert best.get_label() == "best" and mean.get_label() == "mean" and ax.get_title() == "pop"
    assert list(best.get_xdata()) == [0, 1, 2] and list(best.get_ydata()) == [7.0, 14.0, 21.0]
    assert list(mean.get_ydata()) == [3.5, 7.0, 10.5]
    assert len(ax.collections) == 1  # the mean +- std band
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    std = torch.arange(8.0).std(correction=0).item()
    assert band.min() == pytest.approx(3.5 - std) and band.max() == pytest.approx(10.5 + 3 * std)


def test_an_object_with_a_history_and_a_coevolve_dict():
    pop = evolved(2)
    ax = plot_history(pop)
    assert [line.get_label() for line in ax.get_lines()] == ["best", "mean"]
    ax = plot_history({"solver": pop.history, "proposer": pop.history[:1]})
    assert [line.get_label() for line in ax.get_lines()] == [
        "solver: best",
        "solver: mean",
        "proposer: best",
        "proposer: mean",
    ]


def test_evolve_with_env_and_es_style_entries():
    """Three-field GenerationStats (std None: no band), plain tuples, other named entries, 0-d tensors."""
    ax = plot_history([GenerationStats(0, 1.0, 0.5), GenerationStats(1, 2.0, 1.0)])
    assert len(ax.collections) == 0 and list(ax.get_lines()[0].get_ydata()) == [1.0, 2.0]
    Step = namedtuple("Step", "generation best mean std extra")
    ax = plot_history([Step(0, torch.tensor(3.0), 1.0, 0.1, "x"), Step(1, 4.0, 2.0, 0.1, "y")])
    assert list(ax.get_lines()[0].get_ydata()) == [3.0, 4.0] and len(ax.collections) == 1
    ax = plot_history([(0, 1.0, 0.0), (1, 2.0, 1.0, 0.5)], std=False)
    assert len(ax.collections) == 0
    ax = plot_history([{"generation": 0, "best": 1.0, "mean": 0.5}])
    assert list(ax.get_lines()[1].get_ydata()) == [0.5]


def test_an_es_history():
    torch.manual_seed(0)
    es = EggrollES(mlp(), 6, 0.3, 0.1, 3, seed=0)
    for g in range(3):
        es.tell(torch.arange(6.0) + g)
    ax = plot_history(es)
    assert list(ax.get_lines()[0].get_ydata()) == [5.0, 6.0, 7.0] and len(ax.collections) == 1


def test_draws_on_a_given_axes():
    _, ax = plt.subplots()
    assert plot_history([(0, 1.0, 0.5)], ax=ax) is ax


@pytest.mark.parametrize(
    "history, error, message",
    [
        ([], InvalidValueError, r"`history` is empty"),
        ({}, InvalidValueError, r"the history is empty"),
        ({"a": []}, InvalidValueError, r"`history\['a'\]` is empty"),
        (5, InvalidTypeError, r"`history` must be a list of per-generation entries"),
        ([object()], InvalidTypeError, r"`history\[0\]` must have generation, best and mean"),
        ([(0, "a", 1.0)], InvalidTypeError, r"`history\[0\].best` must be a number, got str 'a'"),
    ],
)
def test_bad_histories_raise_naming_the_entry(history, error, message):
    with pytest.raises(error, match=message):
        plot_history(history)


def test_without_matplotlib_the_error_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r'plot_history needs matplotlib.*pip install -e "\.\[examples\]"'):
        plot_history([(0, 1.0, 0.5)])


def _selfplay_record(step, student_best, student_mean, teacher_best, teacher_mean):
    from populora.loops.selfplay.scores import SelfPlayRecord

    return SelfPlayRecord(
        step=step,
        validity=0.5,
        student_mean=student_mean,
        student_best=student_best,
        anchor_accuracy=None,
        teacher_mean=teacher_mean,
        teacher_best=teacher_best,
        teacher_mu=25.0,
        student_mu=25.0,
        teacher_ordinal_best=0.0,
        student_ordinal_best=0.0,
        matches=4,
        tokens=100,
        seconds=1.0,
        tokens_per_s=100.0,
    )


def test_a_selfplay_history_is_two_series_over_steps():
    """SelfPlay.history (records), its as_dict() rows, and an object holding it: students and teachers."""
    records = [_selfplay_record(0, 0.5, 0.25, 1.0, 0.5), _selfplay_record(1, 0.75, 0.5, 0.5, 0.25)]
    holder = type("SelfPlayLike", (), {"history": records})()
    for history in (records, [r.as_dict() for r in records], holder):
        ax = plot_history(history)
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines) == ["students: best", "students: mean", "teachers: best", "teachers: mean"]
        assert list(lines["students: best"].get_xdata()) == [0, 1]
        assert list(lines["students: best"].get_ydata()) == [0.5, 0.75]
        assert list(lines["teachers: mean"].get_ydata()) == [0.5, 0.25]
        assert ax.get_xlabel() == "self-play step" and len(ax.collections) == 0
        plt.close("all")
    with pytest.raises(InvalidTypeError, match=r"`history\[1\]` must be a self-play record like history\[0\]"):
        plot_history([records[0], GenerationStats(1, 1.0, 0.5)])


def test_a_torcheggroll_style_es_history():
    from populora.es import TorchEggrollES

    tegg = TorchEggrollES(mlp(), pop_size=4, sigma=0.1, lr=0.1, rank=1)
    for g in range(2):
        tegg.es.tell(torch.arange(4.0) + g)
    ax = plot_history(tegg)
    assert list(ax.get_lines()[0].get_ydata()) == [3.0, 4.0] and ax.get_xlabel() == "generation"
