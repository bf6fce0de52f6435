"""PopuLoRA (the paper's RL loop) with its members partitioned across processes: the same run on any world size.

    python examples/selfplay_distributed.py --steps 4                                    # one process
    torchrun --standalone --nproc-per-node=2 examples/selfplay_distributed.py --steps 4  # two: the same run
    # two nodes (here both on localhost): run each line in its own shell
    torchrun --nnodes=2 --nproc-per-node=1 --node_rank=0 --rdzv_backend=c10d \\
        --rdzv_endpoint=localhost:29531 --rdzv_id=selfplay examples/selfplay_distributed.py --steps 4
    torchrun --nnodes=2 --nproc-per-node=1 --node_rank=1 --rdzv_backend=c10d \\
        --rdzv_endpoint=localhost:29531 --rdzv_id=selfplay examples/selfplay_distributed.py --steps 4

Each rank owns a contiguous block of each role's members, generates and trains only those, and exchanges reply
token ids, verdicts and (at a replacement) a parent's rows; see docs/guides/distributed.md. The last line
printed, ``run digest``, is a checksum of the sampled tokens, ratings and adapters: it is the same on one
process and on two (adapters rounded to 4 decimals). ``--model smollm2`` runs SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch

from populora import Population
from populora import distributed as pd
from populora.distributed import members as pm
from populora.llm import LLAMA_ALL
from populora.loops.selfplay import CPU_PRESET, PopuLoRA
from populora.tasks import Arithmetic


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--teachers", type=int, default=3)
    parser.add_argument("--students", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="write the loop's checkpoint here at the end (main rank)")
    parser.add_argument("--load", default=None, help="resume from this checkpoint (any world size wrote it)")
    args = parser.parse_args(argv)

    pd.init_from_env()  # torchrun: a gloo (CPU) or NCCL group; nothing on one process
    torch.set_num_threads(1)
    if args.model == "tiny":
        from populora.llm import tiny_chat_model

        model, tokenizer = tiny_chat_model(seed=0)
        sizes = dict(rank=2, teacher_generate=dict(max_new_tokens=8), student_generate=dict(max_new_tokens=6))
    else:
        from populora.llm import load_smollm2

        model, tokenizer = load_smollm2()
        sizes = dict(rank=8)
    config = CPU_PRESET.replace(
        teachers=args.teachers, students=args.students, anchors=1, interval=2, seed=args.seed, **sizes
    )
    teachers = Population(model, args.teachers, config.rank, list(LLAMA_ALL), seed=args.seed, init_scale=0.5)
    students = Population(model, args.students, config.rank, list(LLAMA_ALL), seed=args.seed + 1, init_scale=0.5)
    loop = PopuLoRA(teachers, students, tokenizer, Arithmetic(), config=config)
    if args.load:
        loop.load(args.load)
    main_rank = pd.is_main_rank()
    if main_rank:
        print(f"world size {pd.world_size()}; rank 0 owns teachers {list(pm.member_block(args.teachers))}")
    digest = hashlib.sha256()
    pm.reset_traffic()
    for _ in range(args.steps):
        start = time.process_time()
        out = loop.step(distributed=True)
        cpu = time.process_time() - start
        for ids in (*out.proposal_ids, *out.answer_ids):
            digest.update(str(ids).encode())
        if main_rank:
            rec = out.record
            print(
                f"step {rec.step} | validity {rec.validity:.2f} | teacher reward {rec.teacher_reward:+.3f} | "
                f"student reward {rec.student_reward:+.3f} | matches {rec.matches} | replaced {rec.replaced} | "
                f"cpu {cpu:.2f} s"
            )
    state = loop.state_dict()  # collective: every member's rows from its owner
    if args.save:
        loop.save(args.save)
    digest.update(str(state["ratings"]["mu"]).encode())
    for name in ("teachers", "students"):
        for key, value in state[name].items():
            if key != "_extra_state":
                digest.update(f"{key}:{torch.round(value * 1e4).tolist()}".encode())
    if main_rank:
        print("bytes this rank sent:", dict(pm.traffic))
        print(f"run digest {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
