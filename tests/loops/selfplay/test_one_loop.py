"""One self-play loop: PopuLoRA over one typed PopuLoRAConfig, SelfPlay a thin constructor of it, 0.5.0's keywords
deprecated (and equal to the config form), a config stored in the checkpoint and checked on resume, a bad field
refused before any model is wrapped, the loop surface (step, run, history, save / load)."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from parity_task import BLOCK, ParityTask

import populora
import populora.selfplay
from populora import Population, PopuLoRA, PopuLoRAConfig, SelfPlay
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.llm import tiny_chat_model
from populora.loops.base import Budget, Loop
from populora.loops.selfplay import CPU_PRESET, PAPER_PRESET, SELFPLAY_PRESET, PopuLoRARecord, SelfPlayRecord
from populora.loops.selfplay import loop as loop_module
from populora.loops.selfplay.config import Preset

RL = PopuLoRAConfig(
    proposals=2,
    attempts=2,
    interval=2,
    teacher_lr=1e-2,
    student_lr=1e-2,
    teacher_generate=dict(max_new_tokens=4),
    student_generate=dict(max_new_tokens=3),
    seed=3,
)
EVOLVE = dataclasses.replace(
    SELFPLAY_PRESET,
    anchors=2,
    teacher_generate=dict(max_new_tokens=4),
    student_generate=dict(max_new_tokens=3),
    evolve_kwargs={"teachers": {"epsilon": 0.2}, "students": {"epsilon": 0.2}},
    seed=3,
)


def players(p_t: int = 2, p_s: int = 2):
    model, tokenizer = tiny_chat_model(seed=0)
    teachers = Population(model, p_t, 2, BLOCK, seed=1, init_scale=0.5)
    students = Population(model, p_s, 2, BLOCK, seed=2, init_scale=0.5)
    return teachers, students, tokenizer


def make(config: PopuLoRAConfig = RL, **kwargs) -> PopuLoRA:
    teachers, students, tokenizer = players()
    return PopuLoRA(teachers, students, tokenizer, ParityTask(), config=config, **kwargs)


def adapters(loop: PopuLoRA) -> list[torch.Tensor]:
    return [t.detach().clone() for pop in (loop.teachers, loop.students) for f in pop.factors() for t in f]


def same_run(a: PopuLoRA, b: PopuLoRA) -> None:
    assert [r.deterministic for r in a.history] == [r.deterministic for r in b.history]
    assert all(torch.equal(x, y) for x, y in zip(adapters(a), adapters(b)))
    assert torch.equal(a.generator.get_state(), b.generator.get_state())


def test_one_loop_class_and_selfplay_is_a_constructor_of_its_evolution_only_config():
    teachers, students, tokenizer = players()
    sp = SelfPlay(teachers, students, tokenizer, ParityTask())
    assert type(sp) is PopuLoRA and sp.config == SELFPLAY_PRESET and isinstance(sp, Loop)
    assert populora.PopuLoRA is PopuLoRA and populora.selfplay.PopuLoRA is PopuLoRA
    assert isinstance(PAPER_PRESET, PopuLoRAConfig) and isinstance(CPU_PRESET, PopuLoRAConfig)
    for name in ("pair", "propose", "verify", "answer", "score", "rate", "update", "replace"):
        assert callable(getattr(loop_module, name)), name


@pytest.mark.parametrize("config", [RL, EVOLVE], ids=["rl", "evolve"])
def test_the_050_keywords_warn_and_give_the_config_forms_run_bit_for_bit(config):
    typed = make(config)
    changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    changed = {k: v for k, v in changed.items() if v != getattr(PopuLoRAConfig(), k) or k == "update"}
    teachers, students, tokenizer = players()
    with pytest.warns(DeprecationWarning, match=r"PopuLoRA\(.*\) is deprecated since 0.6.0.*config=PopuLoRAConfig"):
        flat = PopuLoRA(teachers, students, tokenizer, ParityTask(), **changed)
    assert flat.config == typed.config
    for loop in (typed, flat):
        loop.run(2)
    same_run(typed, flat)


def test_selfplay_050_keywords_warn_and_equal_the_config():
    teachers, students, tokenizer = players()
    with pytest.warns(DeprecationWarning, match=r"SelfPlay\(anchors=, pg_micro_batch=\)"):
        sp = SelfPlay(teachers, students, tokenizer, ParityTask(), anchors=3, pg_micro_batch=2)
    assert sp.config == dataclasses.replace(SELFPLAY_PRESET, anchors=3, micro_batch=2)


def test_the_record_has_named_fields_and_history_as_dict_is_numbers():
    for config, kind in ((RL, PopuLoRARecord), (EVOLVE, SelfPlayRecord)):
        loop = make(config)
        out = loop.step()
        assert isinstance(out.record, kind) and loop.history == [out.record]
        row = out.record.as_dict()
        assert row["step"] == 0 and all(isinstance(v, (int, float)) for v in row.values() if v is not None)
        assert kind.from_dict(row) == out.record
        assert out.valid.shape == (2, 2) and out.solved.shape == (2, 2, config.attempts)


@pytest.mark.parametrize("config", [RL, EVOLVE], ids=["rl", "evolve"])
def test_run_budget_callback_and_resume_is_the_uninterrupted_run(config, tmp_path):
    straight = make(config)
    straight.run(Budget(max_steps=3))
    first = make(config)
    assert len(first.run(1)) == 1
    path = first.save(tmp_path / "loop.ckpt")
    resumed = make(config)
    resumed.load(path)
    seen = []
    assert resumed.run(5, callback=lambda r: seen.append(r.step) or r.step == 2) == resumed.history[1:]
    assert seen == [1, 2]
    same_run(straight, resumed)
    with pytest.raises(InvalidTypeError, match=r"callback .* returned \[3\]"):
        resumed.run(2, callback=lambda r: [r.step])
    assert resumed.steps == 4  # the refused return came after the step, which stands


def test_run_budget_legacy_keywords_warn():
    loop = make(EVOLVE)
    with pytest.warns(DeprecationWarning, match="run\\(steps=, max_seconds=\\) is deprecated"):
        assert len(loop.run(steps=1)) == 1
    with pytest.raises(InvalidValueError, match="never stop"):
        loop.run()


def test_a_state_of_another_config_is_refused_naming_the_field_and_changes_nothing():
    a = make()
    a.step()
    state = a.state_dict()
    assert state["config"] == RL.to_dict() and json.loads(json.dumps(state["config"])) == state["config"]
    b = make(dataclasses.replace(RL, interval=3))
    before, gen = adapters(b), b.generator.get_state()
    with pytest.raises(CheckpointError, match=r"PopuLoRAConfig.interval=2; this run has PopuLoRAConfig.interval=3"):
        b.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(before, adapters(b)))
    assert torch.equal(gen, b.generator.get_state()) and b.steps == 0
    c = make(dataclasses.replace(RL, seed=99))  # the seed only seeded the generator the state restores
    c.load_state_dict(state)
    assert c.steps == 1
    d = make(EVOLVE)
    with pytest.raises(
        CheckpointError, match="PopuLoRAConfig.update='rl'; this run has PopuLoRAConfig.update='evolve'"
    ):
        d.load_state_dict(state)


@pytest.mark.parametrize(
    "fields, error, match",
    [
        (dict(interval=0), InvalidValueError, "`interval` must be an int >= 1, got 0"),
        (dict(attempts=1), InvalidValueError, "`attempts`"),
        (dict(update="ga"), InvalidValueError, "update"),
        (dict(student_generate=dict(do_sample=False)), InvalidValueError, "do_sample=True"),
        (dict(teacher_generate=dict(num_return_sequences=2)), InvalidValueError, "may not set"),
        (dict(reserved="2 + 2"), InvalidTypeError, "`reserved`"),
        (dict(mutations=("nope",)), InvalidValueError, "nope"),
        (dict(student_pg_lr=0.1), InvalidValueError, "student_pg_lr"),
        (dict(evolve_kwargs={"judges": {}}), InvalidValueError, "judges"),
    ],
)
def test_every_field_is_checked_when_the_config_is_built(fields, error, match):
    with pytest.raises(error, match=match):
        PopuLoRAConfig(**fields)
    with pytest.raises(error, match=match):
        dataclasses.replace(CPU_PRESET, **fields)


def test_a_misspelt_generation_option_is_refused_before_the_model_is_wrapped():
    model, tokenizer = tiny_chat_model(seed=0)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(x).logits
    config = dataclasses.replace(CPU_PRESET, teachers=2, students=2, student_generate=dict(max_new_token=5))
    with pytest.raises(InvalidValueError, match=r"'max_new_token', which is no generation option \(did you mean"):
        PopuLoRA.from_preset(model, tokenizer, ParityTask(), config)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
    assert not any("population" in type(m).__name__.lower() for _, m in model.named_modules())


def test_a_generation_config_is_accepted_as_options():
    from transformers import GenerationConfig

    config = PopuLoRAConfig(student_generate=GenerationConfig(max_new_tokens=7, do_sample=True))
    assert config.student_generate["max_new_tokens"] == 7 and config.student_generate["do_sample"] is True
    assert PopuLoRAConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_presets_round_trip_and_keep_050s_surface():
    for preset in (PAPER_PRESET, CPU_PRESET, SELFPLAY_PRESET):
        assert PopuLoRAConfig.from_dict(json.loads(json.dumps(preset.to_dict()))) == preset
    assert PAPER_PRESET.loop["interval"] == 10 and CPU_PRESET.replace(loop=dict(interval=3)).interval == 3
    with pytest.warns(DeprecationWarning, match="Preset"):
        old = Preset(teachers=2, students=2, rank=4, loop=dict(interval=3))
    assert old == PopuLoRAConfig(teachers=2, students=2, rank=4, interval=3)


def test_swapped_optimizers_are_refused_when_built():
    teachers, students, tokenizer = players()
    swapped = {
        "teachers": torch.optim.Adam(students.adapter_parameters()),
        "students": torch.optim.Adam(teachers.adapter_parameters()),
    }
    with pytest.raises(InvalidValueError, match="swapped"):
        PopuLoRA(teachers, students, tokenizer, ParityTask(), config=RL, optimizers=swapped)


def test_population_sizes_in_the_config_must_fit():
    teachers, students, tokenizer = players()
    with pytest.raises(InvalidValueError, match="`PopuLoRAConfig.teachers` is 4"):
        PopuLoRA(teachers, students, tokenizer, ParityTask(), config=PAPER_PRESET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config form warns nothing
        PopuLoRA(teachers, students, tokenizer, ParityTask(), config=dataclasses.replace(PAPER_PRESET, teachers=None,
                 students=None, rank=None))  # fmt: skip
