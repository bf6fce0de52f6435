"""PopuLoRA's sampler="member" on one process: members' generators in the state (format /3), 0.6.0's first files
(/2) loading with fresh members' generators, bad states refused, per-member policy-gradient blocks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from parity_task import BLOCK, AnyProposal

from populora import Population
from populora.errors import CheckpointError, InvalidValueError
from populora.llm import tiny_chat_model
from populora.loops.selfplay import PopuLoRA, PopuLoRAConfig
from populora.loops.selfplay.loop import member_seed
from populora.train import PolicyGradient, policy_gradient_step_

CONFIG = PopuLoRAConfig(
    proposals=2,
    attempts=2,
    interval=2,
    teacher_lr=1e-2,
    student_lr=1e-2,
    teacher_generate=dict(max_new_tokens=4),
    student_generate=dict(max_new_tokens=3),
    seed=3,
)


def make(**changes) -> PopuLoRA:
    model, tokenizer = tiny_chat_model(seed=0)
    teachers = Population(model, 2, 2, BLOCK, seed=1, init_scale=0.5)
    students = Population(model, 2, 2, BLOCK, seed=2, init_scale=0.5)
    return PopuLoRA(teachers, students, tokenizer, AnyProposal(), config=CONFIG.replace(**changes))


def test_the_state_holds_every_members_generator_and_resumes_it():
    loop = make()
    fresh = [g.get_state() for g in loop.samplers["students"]]
    assert torch.equal(fresh[1], torch.Generator().manual_seed(member_seed(3, "students", 1)).get_state())
    loop.step()
    state = loop.state_dict()
    assert state["format"] == "populora.PopuLoRA/3"
    assert len(state["samplers"]["teachers"]) == 2 and not torch.equal(state["samplers"]["students"][1], fresh[1])
    twin = make()
    twin.load_state_dict(state)
    assert all(torch.equal(a.get_state(), b) for a, b in zip(twin.samplers["students"], state["samplers"]["students"]))
    a, b = loop.step(), twin.step()
    assert a.proposal_ids == b.proposal_ids and a.answer_ids == b.answer_ids


def test_a_file_of_format_2_loads_and_continues_with_fresh_members_generators():
    loop = make()
    loop.step()
    state = loop.state_dict()
    old = dict(state, format="populora.PopuLoRA/2", config={k: v for k, v in state["config"].items() if k != "sampler"})
    del old["samplers"]
    resumed = make()
    resumed.load_state_dict(old)
    assert resumed.steps == 1
    for name in ("teachers", "students"):
        for i, g in enumerate(resumed.samplers[name]):
            assert torch.equal(g.get_state(), torch.Generator().manual_seed(member_seed(3, name, i)).get_state())
    assert resumed.step().record.step == 1


def test_a_bad_members_generator_state_is_refused_and_changes_nothing():
    loop = make()
    loop.step()
    state = loop.state_dict()
    fresh = make()
    before = [g.get_state() for g in fresh.samplers["teachers"]]
    with pytest.raises(CheckpointError, match=r"'samplers\['teachers'\]' must hold 2 generator states .* got 1"):
        fresh.load_state_dict(
            dict(state, samplers={**state["samplers"], "teachers": state["samplers"]["teachers"][:1]})
        )
    with pytest.raises(CheckpointError, match="'samplers' must map"):
        fresh.load_state_dict(dict(state, samplers={"teachers": []}))
    assert fresh.steps == 0 and all(torch.equal(g.get_state(), s) for g, s in zip(fresh.samplers["teachers"], before))


def test_a_bad_sampler_is_named():
    with pytest.raises(InvalidValueError, match="sampler"):
        CONFIG.replace(sampler="rows")


def test_per_member_micro_batches_make_a_members_step_independent_of_the_others_rows():
    def step(rows):
        model, _ = tiny_chat_model(seed=0)
        pop = Population(model, 2, 2, BLOCK, seed=1, init_scale=0.5)
        opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
        prompts = [[2, 5, 7], [2, 9], [3, 4, 5, 6], [2, 8, 8]]
        replies = [[10, 11], [12], [13, 14, 15], [16, 17]]
        ids, adv = [0, 1, 0, 1], torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
        policy_gradient_step_(
            pop,
            opt,
            [prompts[j] for j in rows],
            [replies[j] for j in rows],
            [ids[j] for j in rows],
            adv[rows],
            PolicyGradient(pad_id=0, micro_batch=2),
            by_member=True,
        )
        return [t[0].detach().clone() for f in pop.factors() for t in f]

    both, alone = step([0, 1, 2, 3]), step([0, 2])
    assert all(torch.equal(a, b) for a, b in zip(both, alone))  # member 0: bit for bit
    start = step([])
    assert any(not torch.equal(a, b) for a, b in zip(both, start))  # and it moved
