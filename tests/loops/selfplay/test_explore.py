"""Teachers that explore (PopuLoRAConfig.novelty_window / prompt_examples): a copied example earns nothing and is
not asked, the prompt shows past problems from the loop's buffer, the buffer resumes exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from parity_task import BLOCK, ParityTask, parity

from populora import Population, PopuLoRA, PopuLoRAConfig
from populora.llm import tiny_chat_model
from populora.tasks import Problem

CONFIG = PopuLoRAConfig(
    proposals=2,
    attempts=2,
    interval=100,
    teacher_lr=1e-2,
    student_lr=1e-2,
    teacher_generate=dict(max_new_tokens=4),
    student_generate=dict(max_new_tokens=3),
    seed=3,
)
EXPLORE = dataclasses.replace(CONFIG, novelty_window=3, prompt_examples=1)


class CopyTask(ParityTask):
    """Every proposal is the same problem (a teacher that only copies); the prompt records the examples shown."""

    name = "copy_parity"
    shown: list[list[str]] = []

    def proposal_prompt(self, examples=()) -> str:
        CopyTask.shown.append([p.question for p in examples])
        return "Propose a code." + (f" Before: {examples[0].question}" if examples else "")

    def parse_proposal(self, text: str) -> Problem | None:
        return Problem(self.name, "Parity of 7?", 1, {"code": 7})

    def proposal_line(self, problem: Problem) -> str | None:
        return "7"

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        return len(reply) % 2 == problem.answer

    def _sample_one(self, generator):
        p = parity(int(torch.randint(0, 100, (1,), generator=generator)))
        return Problem(self.name, p.question, p.answer, p.data)


def make(config: PopuLoRAConfig) -> PopuLoRA:
    model, tokenizer = tiny_chat_model(seed=0)
    teachers = Population(model, 2, 2, BLOCK, seed=1, init_scale=0.5)
    students = Population(model, 2, 2, BLOCK, seed=2, init_scale=0.5)
    return PopuLoRA(teachers, students, tokenizer, CopyTask(), config=config)


def test_a_teacher_that_copies_its_prompts_example_gets_nothing_for_it():
    CopyTask.shown.clear()
    loop = make(EXPLORE)
    first = loop.step()
    assert bool(first.valid.all()) and first.record.distinct == 1 and first.record.repeated == 0
    assert [p.question for p in loop.buffer] == ["Parity of 7?"] and CopyTask.shown == [[], []]
    second = loop.step()
    assert CopyTask.shown[2:] == [["Parity of 7?"], ["Parity of 7?"]]  # each teacher was shown the past problem
    assert not bool(second.valid.any()) and bool((second.teacher_rewards == 0).all())
    assert second.record.repeated == 4 and second.record.distinct == 0 and second.record.validity == 1.0
    assert second.tasks == []  # not asked again
    assert loop.distinct_asked() == (1, [1, 1])


def test_off_by_default_the_paper_pays_for_a_repeat():
    loop = make(CONFIG)
    loop.step()
    second = loop.step()
    assert bool(second.valid.all()) and second.record.repeated == 0 and loop.buffer == []


def test_the_buffer_and_window_resume_exactly(tmp_path):
    straight = make(EXPLORE)
    for _ in range(3):
        straight.step()
    first = make(EXPLORE)
    first.step()
    path = first.save(tmp_path / "x.ckpt")
    resumed = make(EXPLORE)
    resumed.load(path)
    assert [p.question for p in resumed.buffer] == ["Parity of 7?"] and resumed.recent == [(0, "Parity of 7?")]
    for _ in range(2):
        resumed.step()
    assert [r.deterministic for r in resumed.history] == [r.deterministic for r in straight.history]
    assert resumed.questions == straight.questions and resumed.recent == straight.recent


def test_the_window_forgets_after_k_steps():
    loop = make(dataclasses.replace(EXPLORE, novelty_window=1, prompt_examples=0))
    loop.step()
    assert loop.step().record.repeated == 4  # asked at the step before
    assert loop.step().record.repeated == 0  # the window (1 step) holds nothing now: step 1 asked nothing


@pytest.mark.parametrize("field", ["novelty_window", "prompt_examples", "buffer_size"])
def test_the_fields_are_checked(field):
    with pytest.raises(ValueError, match=field):
        PopuLoRAConfig(**{field: -1})
