"""A self-play task a random model plays, shared by the self-play tests."""

import torch

from populora.tasks import Problem, Task

BLOCK = ["model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj"]  # every block linear of a tiny Llama


class ParityTask(Task):
    """Valid proposals start with an even character code; a reply is right when its length has the problem's
    parity (a random model plays it)."""

    name = "parity"

    def _sample_one(self, generator: torch.Generator) -> Problem:
        return parity(int(torch.randint(0, 100, (1,), generator=generator)))

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        return len(reply) % 2 == problem.answer

    def proposal_prompt(self) -> str:
        return "Propose a code."

    def parse_proposal(self, text: str) -> Problem | None:
        return parity(ord(text[0])) if text and ord(text[0]) % 2 == 0 else None


class AnyProposal(ParityTask):
    """Every non-empty proposal is valid."""

    def parse_proposal(self, text: str) -> Problem | None:
        return parity(len(text)) if text else None


def parity(code: int) -> Problem:
    return Problem(task="parity", question=f"Parity of {code}?", answer=code % 2, data={"code": code})
