"""Fresh-episode scores of ``evolve_with_env`` on gymnasium tasks, at a stated budget.

Each run evolves a policy with :func:`populora.evolve_with_env` (validated
champions, env steps counted), then plays the returned policy on episodes of
its own reporting seeds (``EnvInteractor.play(policy, seed=REPORT + seed)``:
seeds never met by training or validation) and prints one table row:

    task | algorithm | seed | budget | fresh score (mean over N episodes) | target | env steps | wall s

Tasks and their targets (issue 11):

* ``cartpole``: CartPole-v1, the issue's call (16 envs, pop 64, rank 4, up
  to 30 generations, ``target_fitness=475``, defaults otherwise); >= 475 over
  20 fresh episodes.
* ``lunarlander``: LunarLander-v3 (discrete); >= 200 over 30 episodes within
  2M env steps.
* ``pendulum``: Pendulum-v1; >= -200 over 30 episodes within 5M env steps.
* ``lunarlander-continuous``: LunarLanderContinuous-v3; >= 200 over 30
  episodes within 2M env steps.

Each task runs its best measured configuration by default (``--algorithm``
picks another), which is the task's preset
(``populora.loops.env.presets.preset(task)``, the settings a user finds in
the docs; ``--algorithm preset`` names it for every task): the GA for
CartPole; for LunarLander the GA (2 episodes an individual, horizon 1000,
stopping at a confirmed validated 200); for Pendulum EggRoll ES with ClipUp
(64 members, each antithetic pair on its own start state, 30 validation
episodes, stopping at a confirmed validated -200); for
LunarLanderContinuous EggRoll ES with ClipUp (``populora.optim.ClipUp``) on
a zero-started linear policy, 128 members, rank-2 noise of scale 0.1, ClipUp
step 0.03 (max speed 0.06), centred ranks, normalised observations (its
``es`` configuration). ``ga`` / ``es`` are the earlier configurations. The
env-step budget is passed 2.5% low (:attr:`Task.step_cap`) because a run
stops after the generation that reaches it. Each row records
``first_validated_at_target``: the env steps at which a validated score
first reached the target.

Measured with ``--task lunarlander-continuous --seed 0 1 2``: 264, 287, 277
on 30 fresh episodes at 1.96M, 1.97M, 1.95M env steps (3/3 solved). The
``es`` configurations of LunarLander (linear, ClipUp: best validated 35 at
1.2M steps, stopped) is what was tried there. Pendulum's ``es`` (3-16-1
MLP, noise 0.5, ClipUp step 0.15, 128 members): -144 on 30 fresh episodes at
4.89M steps on seed 0 but -730 on seed 1 (with noise 0.1 / step 0.03:
-900 on seed 0): not solved.

``--budget-seconds`` is a total wall-time budget: a run stops (through
``evolve_with_env``'s ``callback``) once it is spent, and is reported as it
stands. Run::

    python benchmarks/envs.py --task cartpole --seed 0 1 2 3 4
    python benchmarks/envs.py --task lunarlander --seed 0 --budget-seconds 900
    python benchmarks/envs.py --task pendulum --seed 0 --algorithm es
    python benchmarks/envs.py --task lunarlander-continuous --seed 0 1 2 --budget-seconds 3600
    python benchmarks/envs.py --task lunarlander --seed 0 1 2 --budget-seconds 1000000 \
        --json benchmarks/results/0.5.0/envs_lunarlander.json --checkpoints outputs/envs_ckpt

``--json PATH`` also writes every run (the table row plus its per-generation history: training best / mean /
std, validated score, env steps) to ``PATH``, after each seed; rerun the same command to continue, and the seeds
already in the file are skipped (``benchmarks/plots.py`` draws the learning curves from these files). With
``--checkpoints DIR`` every run also checkpoints each generation (``Checkpointing(DIR/<task>-<algorithm>-<seed>,
resume=True)``), so a stopped long run continues inside a seed too (its ``wall`` then counts the last session only).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import populora
from populora import evolve_with_env, interact_with_env
from populora.interact import ES, Budget, Checkpointing, EnvOptions, Episodes
from populora.loops.env.presets import preset

RESULTS = Path(__file__).resolve().parent / "results" / populora.__version__  # by the version that writes

REPORT = 7_000_000  # the reporting seeds' run seed offset (play() draws them from its own stream)


@dataclass
class Task:
    env: str
    target: float
    episodes: int  # fresh episodes reported
    max_env_steps: int | None
    default: str  # the algorithm run unless --algorithm says otherwise
    # algorithm -> (model, evolve_with_env's keywords; `algorithm` there is its ES(...) options)
    configs: dict[str, tuple[Callable[[], nn.Module], dict[str, Any]]]
    play: dict[str, Any] = field(default_factory=dict)  # action / to_range / horizon for play()
    num_generations: int = 100_000

    @property
    def step_cap(self) -> int | None:
        """``max_env_steps`` passed: 2.5% under the budget, since a run stops after the generation that reaches it
        (one LunarLander generation of 128 members takes up to 40k steps)."""
        return None if self.max_env_steps is None else int(self.max_env_steps * 0.975)


def _mlp(*sizes: int, out_tanh: bool = False) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*(layers if out_tanh else layers[:-1]))


def _linear(d: int, e: int) -> nn.Module:
    """A linear policy starting at zero (as PGPE's usual start): ``(b, d) -> (b, e)``."""
    layer = nn.Linear(d, e)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
    return nn.Sequential(layer)


def _identity(out: Any) -> Any:
    return out


def _preset(task: str) -> tuple[Callable[[], nn.Module], dict[str, Any]]:
    """The model and options of ``populora.loops.env.presets.preset(task)`` as a config (budget and generations
    are the Task's)."""
    p = preset(task)
    options = {k: v for k, v in p.kwargs.items() if k not in ("budget", "num_generations")}
    return p.model, options


def tasks() -> dict[str, Task]:
    lander = dict(env_options=EnvOptions(num_envs=16, normalize_obs=True), horizon=1000)
    pendulum = dict(
        env_options=EnvOptions(num_envs=16, normalize_obs=True, to_range=(-2.0, 2.0)), horizon=200, action=_identity
    )
    return {
        "cartpole": Task(
            "CartPole-v1",
            475.0,
            20,
            None,
            "ga",
            {
                "preset": _preset("CartPole-v1"),  # the same as "ga"
                "ga": (
                    lambda: _mlp(4, 32, 2),
                    dict(pop_size=64, low_rank=4, target_fitness=475.0, env_options=EnvOptions(num_envs=16)),
                ),
            },
            num_generations=30,
        ),
        "lunarlander": Task(
            "LunarLander-v3",
            200.0,
            30,
            2_000_000,
            "preset",
            {
                "preset": _preset("LunarLander-v3"),
                "ga": (
                    lambda: _mlp(8, 32, 4),
                    dict(pop_size=64, low_rank=4, episodes=Episodes(num_episodes=2), **lander),
                ),
                "es": (
                    lambda: _linear(8, 4),
                    dict(pop_size=128, low_rank=2, **lander, algorithm=ES(sigma=0.1, optimizer="clipup", lr=0.03)),
                ),
            },
            preset("LunarLander-v3").play,
        ),
        "pendulum": Task(
            "Pendulum-v1",
            -200.0,
            30,
            5_000_000,
            "preset",
            {
                "preset": _preset("Pendulum-v1"),
                "ga": (
                    lambda: _mlp(3, 32, 32, 1, out_tanh=True),
                    dict(pop_size=64, low_rank=4, episodes=Episodes(num_episodes=2), **pendulum),
                ),
                "es": (
                    lambda: _mlp(3, 16, 1, out_tanh=True),
                    dict(pop_size=128, low_rank=2, **pendulum, algorithm=ES(sigma=0.5, optimizer="clipup", lr=0.15)),
                ),
            },
            dict(action=_identity, to_range=(-2.0, 2.0)),
        ),
        "lunarlander-continuous": Task(
            "LunarLanderContinuous-v3",
            200.0,
            30,
            2_000_000,
            "es",
            {
                "preset": _preset("LunarLanderContinuous-v3"),  # the same as "es"
                "ga": (
                    lambda: _mlp(8, 32, 2, out_tanh=True),
                    dict(pop_size=64, low_rank=4, episodes=Episodes(num_episodes=2), action=_identity, **lander),
                ),
                "es": (
                    lambda: _linear(8, 2),
                    dict(
                        pop_size=128,
                        low_rank=2,
                        action=_identity,
                        **lander,
                        algorithm=ES(sigma=0.1, optimizer="clipup", lr=0.03),
                    ),
                ),
            },
            dict(action=_identity),
        ),
    }


def run(
    task_name: str, seed: int, algorithm: str | None, deadline: float, checkpoints: Path | None = None
) -> dict[str, Any]:
    task = tasks()[task_name]
    config = algorithm or task.default
    if config not in task.configs:
        raise SystemExit(f"task {task_name!r} has no {config!r} configuration; it has {sorted(task.configs)}")
    make_model, options = task.configs[config]
    options = dict(options)
    chosen = options.get("algorithm", config)  # an ES(...) / GA(...) object, or 'ga' / 'es'
    algorithm = chosen if isinstance(chosen, str) else type(chosen).__name__.lower()
    torch.manual_seed(seed)
    pop_size, low_rank = options.pop("pop_size"), options.pop("low_rank")
    start = time.perf_counter()
    policy, history = evolve_with_env(
        task.env,
        make_model(),
        pop_size,
        low_rank,
        seed=seed,
        num_generations=task.num_generations,
        budget=Budget(max_env_steps=task.step_cap),
        algorithm=options.pop("algorithm", algorithm),  # the GA's / ES's own options where the config has them
        callback=lambda info: time.perf_counter() > deadline,
        checkpointing=Checkpointing()
        if checkpoints is None
        else Checkpointing(checkpoints / f"{task_name}-{config}-{seed}", resume=True),
        **options,
    )
    wall = time.perf_counter() - start
    with interact_with_env(task.env, num_envs=16) as interactor:
        returns = interactor.play(
            policy, num_episodes=task.episodes, seed=REPORT + seed, **{"horizon": options.get("horizon"), **task.play}
        )
    first = [h.env_steps for h in history if h.validated is not None and h.validated >= task.target]
    return dict(
        task=task.env,
        algorithm=algorithm,
        config=config,
        seed=seed,
        budget=task.max_env_steps,
        score=float(returns.mean()),
        episodes=task.episodes,
        target=task.target,
        steps=history[-1].env_steps,
        generations=len(history),
        wall=wall,
        validated=max((h.validated for h in history if h.validated is not None), default=float("nan")),
        first_validated_at_target=first[0] if first else None,  # env steps when a validated score first reached it
        history=[h.as_dict() for h in history],
    )


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _write(path: Path, command: str, rows: list[dict[str, Any]]) -> None:
    """The runs so far as JSON (written to a temporary file, then renamed: a stopped run leaves a whole file)."""
    report = {
        "benchmark": "benchmarks/envs.py",
        "command": command,
        "populora": populora.__version__,
        "commit": _commit(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
        "runs": rows,
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, allow_nan=True) + "\n")
    tmp.replace(path)


HEADER = (
    "| task | algorithm | seed | env-step budget | fresh score (episodes) | target | best validated "
    "| first validated >= target at (env steps) | generations | env steps | wall s |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def _row(r: dict[str, Any]) -> str:
    """One run as a row of :data:`HEADER`."""
    budget = "-" if r["budget"] is None else f"{r['budget']:,}"
    first = r.get("first_validated_at_target")
    return (
        f"| {r['task']} | {r['algorithm']} | {r['seed']} | {budget} | {r['score']:.1f} ({r['episodes']}) "
        f"| {r['target']:g} | {r['validated']:.1f} | {'-' if first is None else f'{first:,}'} | {r['generations']} "
        f"| {r['steps']:,} | {r['wall']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(tasks()), default="cartpole")
    parser.add_argument("--seed", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--algorithm",
        choices=["preset", "ga", "es"],
        default=None,
        help="default: the task's best measured one (see the module docstring; 'preset' is "
        "populora.loops.env.presets.preset(task))",
    )
    parser.add_argument("--budget-seconds", type=float, default=900.0, help="total wall time of all seeds")
    parser.add_argument(
        "--json",
        type=Path,
        nargs="?",
        const="auto",
        default=None,
        help="also write the runs and their histories here"
        + " (--json alone: benchmarks/results/<version>/envs_<task>.json, <version> = populora.__version__)",
    )
    parser.add_argument("--checkpoints", type=Path, default=None, help="checkpoint every run here (resumable)")
    parser.add_argument(
        "--table",
        action="store_true",
        help="print the rows of the runs already in --json (nothing is run): the results page's table",
    )
    args = parser.parse_args()
    if args.json == "auto":
        args.json = RESULTS / f"envs_{args.task}.json"
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    if args.table:
        if args.json is None or not args.json.exists():
            raise SystemExit(f"--table reads the runs of --json PATH; got {args.json}")
        report = json.loads(args.json.read_text())
        print(f"`{report['command']}` (populora {report['populora']}, commit `{report['commit']}`)\n")
        print(HEADER)
        for r in sorted(report["runs"], key=lambda r: (r["task"], r.get("config", ""), r["seed"])):
            print(_row(r))
        return
    torch.set_num_threads(1)
    deadline = time.perf_counter() + args.budget_seconds
    rows: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    if args.json is not None and args.json.exists():  # continue: keep the runs already written
        done = json.loads(args.json.read_text())["runs"]
    command = "python benchmarks/envs.py " + " ".join(sys.argv[1:])
    print(HEADER)
    for seed in args.seed:
        kept = [
            r
            for r in done
            if r["seed"] == seed and r["task"] == tasks()[args.task].env
            and r.get("config", r["algorithm"]) == (args.algorithm or tasks()[args.task].default)
        ]  # fmt: skip
        r = kept[0] if kept else run(args.task, seed, args.algorithm, deadline, args.checkpoints)
        rows.append(r)
        if args.json is not None:
            _write(args.json, command, [*[d for d in done if d not in rows], *rows])
        print(_row(r), flush=True)
    met = sum(r["score"] >= r["target"] for r in rows)
    print(f"\n{met}/{len(rows)} seeds reach the target")


if __name__ == "__main__":
    main()
