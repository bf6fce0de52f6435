"""Env steps per second of ``EnvInteractor.evaluate`` against the bare wrapped vector env.

Both sides run a gymnasium ``SyncVectorEnv`` of CartPole-v1, single-threaded:

* baseline: the env-ssl-wrapper stack (``compose_env`` with its gymnasium
  adapter and ``TensorWrapper``) around the vector env, ``env.step(random
  actions)`` in a loop (the env autoresets by itself); every slot step counts.
* evaluate: ``interactor.evaluate(population, ...)``: per timestep one routed
  forward of a 4-32-2 MLP over the playing slots, the action map, the
  bookkeeping, stepping the playing slots (the interactor steps the
  ``SyncVectorEnv``'s sub-envs itself, only the busy ones), and seeded resets
  of the slots whose episode ended; only steps inside episodes count.
* vector path: the same ``evaluate`` with the env behind a pass-through
  ``gymnasium.vector.VectorWrapper``, which keeps the interactor on the
  vector env's own ``step`` (every slot steps, idle ones too), as for any
  vector env other than a plain ``SyncVectorEnv``.

Columns: ``ratio`` = evaluate's env steps/s over the baseline's (targets,
generation 0: >= 75% at 64 slots, >= 55% at 256); ``routed forward`` = share
of evaluate's time spent in the policy's forward with its routed layers (the
loop runs it in a route block of the playing slots' assignment, kept until an
episode ends; measured in the untimed run that records the playing counts);
``utilisation`` = share of slot-timesteps inside an episode (low when the
longest episodes leave most slots without work); ``timesteps`` = routed
forwards of the evaluation (at least the longest episode: a 500-step episode
takes 500 timesteps however many slots are free); ``us / timestep`` = wall
time per timestep, the floor set by the routed forward and the loop when
few slots play.

Two populations: "generation 0" (the default init: individuals act
differently, episodes of 10 to 500 steps, so the longest episodes make a
tail) and "near a controller" (adapters of scale 0.3 around a hand-set
balancing controller: long episodes, as after a few generations of
evolution).

``unrouted policy``: the same evaluation with the plain model (an unwrapped copy of the base) standing
in for every individual; both sides step the actions the routed evaluation chose (recorded in the untimed
run), so they play exactly the same episodes, timestep by timestep, and differ only in the forward
(``population(obs, individuals=ids)`` or ``model(obs)``). ``evaluate / unrouted``: the best runs' ratio
and the median of the per-repeat ratios (target: 1.15).

``critical path``: at generation 0 with 256 slots one long episode plays
alone for ~460 timesteps, so no loop can reach the random-action throughput.
The bound is the time the evaluation would take if each of its timesteps cost
what one random-action step of the same wrapped vector env costs with as many
slots as were playing then (``sum_t cost(n_t)``: the counts ``n_t`` are
recorded in an untimed run of the same, deterministic evaluation; ``cost(n)``
is measured at ``n = 1, 2, 4, .., N`` and interpolated linearly); the column is
that bound over evaluate's time (100%: as fast as stepping the env with random
actions, timestep by timestep).

``--compile`` instead times the per-timestep policy (``pop(obs,
individuals=ids).argmax(-1)``) eager against ``torch.compile`` of the same
function (inductor, ``dynamic=True``), at the row counts an evaluation meets.

``--cpu-time`` times with the process's CPU time instead of the wall clock
(everything here runs on one thread, so on a loaded machine that is close to
the wall time the same run takes on a free core).

Timings are the best of ``--repeats`` runs on each side (the machine this
was written on is shared, and the best run is the least disturbed one).

Run: ``python benchmarks/interact.py`` (``--quick`` for one repeat).

``--seed-dm-control-block`` instead runs the seed README's dm_control block
exactly as written (``[env for _ in range(16)]``, 16 individuals, 25
generations of 1000 steps: 400,000 env steps; the repeated env becomes 16
deep-copied slots) and prints its wall time, the process's CPU time and the
load average, so that a run on a shared machine can be read too (the
rollouts run on one thread, so CPU time is about the wall time on a free
core). Needs ``dm_control`` (``MUJOCO_GL=disable`` silences its renderer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from populora import __version__, interact_with_env

RESULTS = Path(__file__).resolve().parent / "results" / __version__  # benchmarks/results/<version>/


def random_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))


def controller_mlp() -> nn.Module:
    """The same MLP set to push towards the pole's lean (angle + angular velocity)."""
    model = random_mlp()
    with torch.no_grad():
        model[0].weight.mul_(0.1)
        model[0].bias.zero_()
        model[0].weight[0] = torch.tensor([0.0, 0.0, 1.0, 1.0])
        model[2].weight.mul_(0.01)
        model[2].bias.zero_()
        model[2].weight[:, 0] = torch.tensor([-3.0, 3.0])
    return model


CLOCK = time.perf_counter
"""The clock every timing reads (``--cpu-time``: ``time.process_time``)."""

POPULATIONS = {"generation 0": (random_mlp, 1.0), "near a controller": (controller_mlp, 0.3)}


def vector_env(num: int):
    return gym.make_vec("CartPole-v1", num_envs=num, vectorization_mode="sync")


def baseline(num: int, steps: int) -> float:
    """Slot steps per second of the wrapped vector env under random actions."""
    from env_ssl_wrapper import compose_env

    env = compose_env(vector_env(num), ("tensor", dict(device="cpu")), pad_episodes=False)
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        env.step(torch.randint(0, 2, (num,), generator=g))
    start = CLOCK()
    for _ in range(steps):
        env.step(torch.randint(0, 2, (num,), generator=g))
    return num * steps / (CLOCK() - start)


def step_costs(num: int) -> dict[int, float]:
    """Seconds per random-action step of the wrapped vector env with ``n = 1, 2, 4, .., num`` slots."""
    sizes = sorted({*(1 << i for i in range(num.bit_length()) if 1 << i <= num), num})
    return {n: n / baseline(n, max(20, 2560 // n)) for n in sizes}


def playing_counts(num: int, pop_size: int, episodes: int, which: str) -> tuple[np.ndarray, float, list]:
    """``(T,)`` slots playing at each timestep of the evaluation :func:`evaluate` times, the share of its
    time spent in the policy's forwards (the model's forward with its routed layers, as the loop calls it; an
    instrumented rerun, not timed itself), and the actions of each timestep (replayed by :func:`evaluate`, so
    that the unrouted policy plays the same episodes)."""
    make_model, init_scale = POPULATIONS[which]
    interactor = interact_with_env(vector_env(num))
    population = interactor.population(make_model(), pop_size=pop_size, low_rank=4, seed=0, init_scale=init_scale)
    interactor.evaluate(population, horizon=5)
    counts: list[int] = []
    actions: list = []
    in_forward = [0.0]
    step, model = interactor._slots.step, population.model
    forward = model.forward

    def counting(acts, slots):
        counts.append(len(slots))
        actions.append(acts)
        return step(acts, slots)

    def timed(*args, **kwargs):
        start = CLOCK()
        out = forward(*args, **kwargs)
        in_forward[0] += CLOCK() - start
        return out

    interactor._slots.step, model.forward = counting, timed
    start = CLOCK()
    interactor.evaluate(population, horizon=500, num_episodes=episodes)
    interactor.close()
    return np.asarray(counts, dtype=np.float64), in_forward[0] / (CLOCK() - start), actions


def critical_path(counts: np.ndarray, costs: dict[int, float]) -> float:
    """``sum_t cost(n_t)`` seconds, ``cost`` interpolated linearly between the measured sizes."""
    sizes = np.asarray(sorted(costs), dtype=np.float64)
    return float(np.interp(counts, sizes, [costs[int(n)] for n in sizes]).sum())


def evaluate(
    num: int,
    pop_size: int,
    episodes: int,
    which: str,
    vector_path: bool = False,
    replay: list | None = None,
    unrouted: bool = False,
) -> tuple[float, ...]:
    """(env steps per second, slot utilisation, timesteps, mean fitness, seconds) of one ``evaluate`` call.

    ``replay``: the actions of each timestep (:func:`playing_counts`) are the ones stepped, whatever the
    policy computed (it computes them all the same), so that two policies play the same episodes.
    ``unrouted``: the plain model (an unwrapped copy) stands in for every individual: the same loop, each
    timestep's forward ``model(obs)`` instead of ``population(obs, individuals=ids)``.
    """
    make_model, init_scale = POPULATIONS[which]
    env = vector_env(num)
    interactor = interact_with_env(gym.vector.VectorWrapper(env) if vector_path else env)
    population = interactor.population(make_model(), pop_size=pop_size, low_rank=4, seed=0, init_scale=init_scale)
    if unrouted:
        plain = make_model()
        population.forward = lambda *args, **routing: plain(*args)
    interactor.evaluate(population, horizon=5)  # warm up
    if replay is not None:
        step, timestep = interactor._slots.step, iter(replay)
        interactor._slots.step = lambda actions, slots: step(next(timestep), slots)
    before = dict(interactor.counters)
    start = CLOCK()
    fitness = interactor.evaluate(population, horizon=500, num_episodes=episodes)
    seconds = CLOCK() - start
    steps = interactor.counters["env_steps"] - before["env_steps"]
    timesteps = interactor.counters["timesteps"] - before["timesteps"]
    interactor.close()
    return steps / seconds, steps / (timesteps * num), timesteps, fitness.mean().item(), seconds


def compiled_policy(repeats: int) -> None:
    """Per-call time of the per-timestep policy, eager vs ``torch.compile`` (inductor, dynamic shapes)."""
    make_model, init_scale = POPULATIONS["generation 0"]
    interactor = interact_with_env(vector_env(1))
    population = interactor.population(make_model(), pop_size=256, low_rank=4, seed=0, init_scale=init_scale)

    def policy(obs, ids):
        return population(obs, individuals=ids).argmax(-1)

    compiled = torch.compile(policy, dynamic=True)
    g = torch.Generator().manual_seed(0)
    print(f"per-timestep policy (4-32-2 MLP, P=256, r=4), torch {torch.__version__}, 1 thread, best of {repeats}")
    print("| rows | eager (us) | compiled (us) | compiled / eager | first call (s) | same actions |")
    print("|---:|---:|---:|---:|---:|:---:|")
    with torch.no_grad():  # dynamo guards fail on inference tensors (torch 2.13)
        for n in (1, 2, 16, 64, 256):
            obs = torch.randn(n, 4, generator=g)
            ids = torch.randint(0, 256, (n,), generator=g).sort().values
            start = CLOCK()
            same = torch.equal(compiled(obs, ids), policy(obs, ids))
            first = CLOCK() - start
            times = {"eager": float("inf"), "compiled": float("inf")}
            for _ in range(repeats):  # interleaved
                for name, fn in (("eager", policy), ("compiled", compiled)):
                    start = CLOCK()
                    for _ in range(200):
                        fn(obs, ids)
                    times[name] = min(times[name], (CLOCK() - start) / 200)
            print(
                f"| {n} | {times['eager'] * 1e6:.0f} | {times['compiled'] * 1e6:.0f} | "
                f"{times['compiled'] / times['eager']:.2f} | {first:.1f} | {'yes' if same else 'no'} |"
            )
    interactor.close()


SEED_DM_CONTROL_BLOCK = """\
from torch import nn
from dm_control import suite
from populora import evolve_with_env

env = suite.load('cartpole', 'balance')  # any env from any sim

policy, history = evolve_with_env(
    [env for _ in range(16)],             # one env, a list, a vector env, or a factory
    nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2)),
    pop_size = 16,
    low_rank = 16,
    action = lambda logits: logits.argmax(-1) * 2 - 1,  # discrete bang-bang
    num_generations = 25,
    horizon = 1000,
    seed = 0,
    progress = True
)
"""


def seed_dm_control_block() -> None:
    """Time the seed README's dm_control block as written (wall, CPU, load average)."""
    import os
    import resource

    start, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    namespace: dict = {}
    exec(compile(SEED_DM_CONTROL_BLOCK, "<seed README dm_control block>", "exec"), namespace)
    wall, cpu1 = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    history = namespace["history"]
    best = [round(h.best, 1) for h in history]
    print(
        f"seed dm_control block: wall {wall:.0f} s, CPU {cpu:.0f} s, load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores; {history[-1].env_steps:,} env steps (validation included; training alone "
        f"{16 * 1000 * len(history):,}); best per generation {best}; validated "
        f"{[None if h.validated is None else round(h.validated, 1) for h in history]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs per measurement")
    parser.add_argument("--quick", action="store_true", help="one run per measurement")
    parser.add_argument(
        "--seed-dm-control-block",
        action="store_true",
        help="time the seed README's dm_control block as written instead",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the process's CPU time (a loaded machine) instead of the wall clock",
    )
    parser.add_argument("--no-vector-path", action="store_true", help="skip the vector-path column")
    parser.add_argument(
        "--json",
        nargs="?",
        const=str(RESULTS / "interact.json"),
        default=None,
        help="also write the rows here, per row (--json alone: benchmarks/results/<version>/interact.json)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="time the per-timestep policy eager vs torch.compile instead (minutes to compile)",
    )
    args = parser.parse_args()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    if args.seed_dm_control_block:
        seed_dm_control_block()
        return
    torch.set_num_threads(1)
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    repeats = 1 if args.quick else args.repeats
    if args.compile:
        compiled_policy(repeats)
        return
    rows = []
    for num, pop_size, episodes in ((64, 64, 4), (256, 256, 2)):
        for which in POPULATIONS:
            counts, share, actions = playing_counts(num, pop_size, episodes, which)
            bases, runs, plain, vector, costs = [], [], [], [], {}
            for _ in range(repeats):  # interleaved, so every side meets the same load
                bases.append(baseline(num, 12800 // num))
                runs.append(evaluate(num, pop_size, episodes, which, replay=actions))
                plain.append(evaluate(num, pop_size, episodes, which, replay=actions, unrouted=True)[-1])
                if not args.no_vector_path:
                    vector.append(evaluate(num, pop_size, episodes, which, vector_path=True)[0])
                for n, cost in step_costs(num).items():
                    costs[n] = min(cost, costs.get(n, cost))
            rate, util, timesteps, fit, _ = max(runs)
            bound = critical_path(counts, costs)
            paired = statistics.median(run[-1] / p for run, p in zip(runs, plain))  # same repeat, same load
            rows.append(
                (
                    num,
                    f"{pop_size} x {episodes}",
                    which,
                    fit,
                    max(bases),
                    rate,
                    max(vector, default=None),
                    util,
                    timesteps,
                    bound,
                    share,
                    min(plain),
                    paired,
                )
            )
            if args.json:  # a stopped run keeps the rows it measured
                keys = "slots work population fitness baseline_steps_s evaluate_steps_s vector_steps_s utilisation"
                keys += " timesteps critical_path_s forward_share unrouted_s evaluate_over_unrouted_paired"
                table = [dict(zip(keys.split(), row)) for row in rows]
                for row in table:
                    row["evaluate_s"] = row["utilisation"] * row["timesteps"] * row["slots"] / row["evaluate_steps_s"]
                    row["evaluate_over_unrouted_best"] = row["evaluate_s"] / row["unrouted_s"]
                    row["critical_path_over_evaluate"] = row["critical_path_s"] / row["evaluate_s"]
                Path(args.json).write_text(
                    json.dumps(
                        dict(
                            populora=__version__,
                            torch=torch.__version__,
                            clock="cpu" if args.cpu_time else "wall",
                            repeats=repeats,
                            load=os.getloadavg(),
                            rows=table,
                        ),
                        indent=1,
                    )
                )
    print(
        f"CartPole-v1, SyncVectorEnv + env-ssl-wrapper, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread, best of {repeats}, {'CPU' if args.cpu_time else 'wall'} time"
    )
    print(
        "| slots | individuals x episodes | population (mean return) | wrapped env, random actions (steps/s) "
        "| evaluate (steps/s) | ratio | critical path (ms) | evaluate (ms) | ratio to critical path "
        "| routed forward (share of evaluate) | unrouted policy (ms) | evaluate / unrouted (best; paired) "
        "| vector path (steps/s) | utilisation | timesteps | us / timestep |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for num, work, which, fit, base, rate, vec, util, timesteps, bound, share, unrouted, paired in rows:
        seconds = util * timesteps * num / rate
        vec_text = "-" if vec is None else f"{vec:,.0f}"
        print(
            f"| {num} | {work} | {which} ({fit:.0f}) | {base:,.0f} | {rate:,.0f} | {rate / base:.0%} | "
            f"{bound * 1e3:.1f} | {seconds * 1e3:.1f} | {bound / seconds:.0%} | {share:.0%} | "
            f"{unrouted * 1e3:.1f} | {seconds / unrouted:.2f}; {paired:.2f} | {vec_text} | "
            f"{util:.0%} | {timesteps} | {seconds / timesteps * 1e6:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
