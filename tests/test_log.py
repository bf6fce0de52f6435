"""populora.log: every log writes one row per record and returns None (the run goes on), with any loop."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from torch import nn

from populora import GenerationStats, Population
from populora.errors import InvalidTypeError
from populora.log import CSVLog, JSONLinesLog, Logs, TensorBoardLog, record_row, records_table
from populora.loops.base import Budget
from populora.train import PBT, PBTConfig

RECORDS = [
    GenerationStats(0, best=1.0, mean=0.5, std=0.1),
    GenerationStats(1, best=2.0, mean=1.0, std=0.2, validated=1.5),
    GenerationStats(2, best=float("nan"), mean=1.0, std=0.2),
]


def test_a_log_returns_none_so_the_run_goes_on(tmp_path):
    for log in (JSONLinesLog(tmp_path / "a.jsonl"), CSVLog(tmp_path / "a.csv")):
        with log:
            assert [log(r) for r in RECORDS] == [None, None, None]
        assert log.rows_written == 3


def test_json_lines_hold_every_record_and_nan_as_null(tmp_path):
    path = tmp_path / "sub" / "run.jsonl"  # the folder is made
    with JSONLinesLog(path, mode="w") as log:
        for r in RECORDS:
            log(r)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["generation"] for r in rows] == [0, 1, 2]
    assert rows[1]["validated"] == 1.5 and "validated" not in rows[0]
    assert rows[2]["best"] is None  # NaN is not JSON: written as null
    with JSONLinesLog(path) as log:  # "a" (the default) appends: a resumed run goes on in its file
        log(RECORDS[0])
    assert len(path.read_text().splitlines()) == 4


def test_csv_widens_its_header_when_a_key_appears_later(tmp_path):
    path = tmp_path / "run.csv"
    with CSVLog(path) as log:
        for r in RECORDS:
            log(r)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["generation", "best", "mean", "std", "validated"]
    assert [row["validated"] for row in rows] == ["", "1.5", ""]
    assert [float(row["best"]) for row in rows[:2]] == [1.0, 2.0]


def test_tensorboard_writes_one_scalar_per_number_at_the_records_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardLog(tmp_path / "tb", prefix="train") as log:
        log(RECORDS[0])
        log(RECORDS[1])
        log({"step": 7, "loss": torch.tensor(0.25), "name": "x", "ids": [1, 2]})  # strings and lists skipped
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/best", "train/mean", "train/std", "train/validated", "train/loss"} == tags
    assert [(e.step, e.value) for e in events.Scalars("train/best")] == [(0, 1.0), (1, 2.0)]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(7, 0.25)]


def test_logs_sends_each_record_to_every_log(tmp_path):
    seen = []
    with Logs(JSONLinesLog(tmp_path / "a.jsonl"), seen.append) as log:
        assert log(RECORDS[0]) is None
    assert seen == [RECORDS[0]] and len((tmp_path / "a.jsonl").read_text().splitlines()) == 1
    with pytest.raises(InvalidTypeError, match="every log must be callable"):
        Logs("runs/a.csv")


def test_a_record_without_as_dict_is_refused_naming_it():
    with pytest.raises(InvalidTypeError, match=r"needs as_dict\(\).*got int 3"):
        record_row(3)
    assert record_row({"loss": torch.tensor([0.5])}) == {"loss": 0.5}


def test_a_loops_run_logs_every_step_and_is_not_stopped_by_the_log(tmp_path):
    """The callback of loop.run: a log returns None, so every step of the budget runs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    pop = Population(model, pop_size=4, low_rank=2, requires_grad=True, seed=0)
    x = torch.randn(4 * 8, 3)
    optimizer = torch.optim.SGD(pop.adapter_parameters(), lr=0.01)

    def train(pbt):
        optimizer.zero_grad()
        loss = pop(x, all_individuals=True).view(4, 8).pow(2).mean(dim=1)
        loss.sum().backward()
        optimizer.step()
        return -loss.detach()

    pbt = PBT(pop, optimizer, PBTConfig(interval=2, fraction=0.25, seed=0), train=train)
    with JSONLinesLog(tmp_path / "pbt.jsonl") as log:
        records = pbt.run(Budget(max_steps=5), callback=log)
    lines = [json.loads(line) for line in (tmp_path / "pbt.jsonl").read_text().splitlines()]
    assert len(records) == 5 and len(lines) == 5
    assert [line["step"] for line in lines] == [r.as_dict()["step"] for r in records]


def test_records_table_shows_every_column_as_text_and_html():
    table = records_table(RECORDS)
    assert table.columns == ["generation", "best", "mean", "std", "validated"]
    assert table.column("validated") == [None, 1.5, None]
    text = repr(table).splitlines()
    assert text[0].split() == table.columns and len(text) == 4
    html = table._repr_html_()
    assert html.count("<tr>") == 4 and "<th>validated</th>" in html and "3 records" in html
    long = records_table([GenerationStats(g, float(g), 0.0) for g in range(30)], max_rows=6)
    assert repr(long).count("\n") == 7 and "..." in repr(long)  # header, 3 + gap + 3 rows


def test_the_getting_started_logging_example_runs_every_generation_and_says_what_it_requires(tmp_path, monkeypatch):
    """The page's example (as its test runs it: 2 generations) logs each one and is not stopped by its callback;
    the page says, in text a reader sees, which extra it needs."""
    pytest.importorskip("tensorboard")
    from test_docs import DOCS, run_unit, units

    page = DOCS / "getting-started.md"
    (unit,) = [u for u in units(page) if any("TensorBoardLog(" in b.code for b in u)]
    monkeypatch.chdir(tmp_path)
    namespace = run_unit(unit)
    assert len(namespace["history"]) == 2  # num_generations=10, run with 2 here: every one of them
    assert len((tmp_path / "runs" / "cartpole.csv").read_text().splitlines()) == 1 + 2
    assert len((tmp_path / "runs" / "cartpole.jsonl").read_text().splitlines()) == 2
    assert list((tmp_path / "runs" / "cartpole").glob("events.out.tfevents.*"))
    text = page.read_text()
    visible = text.replace("<!-- docs: requires tensorboard -->", "")
    assert "**Requires** the `log` extra" in visible and 'pip install -e ".[log]"' in visible
