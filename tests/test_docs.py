"""Every ```python block of the documentation site (``docs/**/*.md``) runs, as a reader would paste it.

A block runs in a fresh namespace, from a scratch folder. Markers, HTML comments on the lines right above a block
(invisible on the site), say what it needs:

- ``<!-- docs: setup -->``: a setup block that says what the NEXT block assumes; both run together.
- ``<!-- docs: continues -->``: the block continues the one above (the prose says so) and runs in its namespace.
- ``<!-- docs: requires MODULE -->``: the block (and its group) runs only where ``MODULE`` imports (an optional
  heavy dependency; kept rare).

README.md uses the same mechanism with ``readme:`` markers (``tests/test_readme.py``). Only smaller counts are
substituted (:data:`SMALLER`), so the suite stays fast; blocks that need a language model use
``populora.llm.tiny_chat_model()`` as written. Shell blocks are not run.

Also checked here: the seed READMEs' blocks (the API contract, ``shared/seeds/``) are on the site verbatim and so run
in these tests, the API reference documents exactly ``populora.__all__`` at the top level, and the pages link only to
pages and images that exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SEED_README = REPO.parent / "shared" / "seeds" / "populora-0.1.18-README.txt"

SMALLER = [  # (pattern, replacement): smaller counts only, never another behaviour
    (r"num_generations( ?= ?)\d+", r"num_generations\g<1>2"),
    (r"horizon( ?= ?)\d+", r"horizon\g<1>20"),
    (r"range\(\d{3,}\)", "range(3)"),  # training loops of 100+ steps
    (r"range\(10\)", "range(2)"),
    (r"range\(25\)", "range(2)"),
    (r"sleep\(0\.1\)", "sleep(0.001)"),
    (r"max_new_tokens=\d+", "max_new_tokens=4"),
]

_MARKER = r"<!-- (?:docs|readme): [^>]*-->\n"
_BLOCK = re.compile(rf"((?:{_MARKER})*)```python\n(.*?)^```[ \t]*$", re.S | re.M)  # a fence closes at a line start
_ONE_MARKER = re.compile(r"<!-- (?:docs|readme): (setup|continues|requires [\w.]+) -->")


@dataclass
class Block:
    page: Path
    line: int  # of the block's first code line
    code: str
    markers: list[str]


def pages() -> list[Path]:
    """Every Markdown page of the site, in a stable order."""
    return sorted(p for p in DOCS.rglob("*.md") if "_griffe" not in p.parts)


def blocks(page: Path) -> list[Block]:
    """Every ```python block of ``page`` with the markers right above it."""
    text = page.read_text()
    return [
        Block(page, text[: m.start(2)].count("\n") + 1, m.group(2), _ONE_MARKER.findall(m.group(1)))
        for m in _BLOCK.finditer(text)
    ]


def units(page: Path) -> list[list[Block]]:
    """Groups of blocks that run in one namespace, a fresh one per group."""
    groups: list[list[Block]] = []
    pending_setup = False
    for block in blocks(page):
        if "continues" in block.markers or pending_setup:
            assert groups, f"{page.name} line {block.line}: nothing above to continue"
            groups[-1].append(block)
        else:
            groups.append([block])
        pending_setup = "setup" in block.markers
    assert not pending_setup, f"{page.name}: the last block is a setup block with nothing after it"
    return groups


def smaller(code: str) -> str:
    for pattern, replacement in SMALLER:
        code = re.sub(pattern, replacement, code)
    return code


def run_unit(unit: list[Block]) -> dict:
    """Run one group of blocks in a fresh namespace (line numbers point into the page); returns the namespace."""
    for block in unit:
        for marker in block.markers:
            if marker.startswith("requires "):
                pytest.importorskip(marker.split()[1])
    namespace = {"__name__": "docs"}
    for block in unit:
        code = "\n" * (block.line - 1) + smaller(block.code)
        exec(compile(code, str(block.page), "exec"), namespace)
    return namespace


def _all_units() -> Iterator[tuple[str, list[Block]]]:
    for page in pages():
        for unit in units(page):
            yield f"{page.relative_to(DOCS)}:{unit[0].line}", unit


UNITS = list(_all_units())


@pytest.fixture
def registries():
    """The operator registries as they were: a page that registers an operator leaves no trace in other tests."""
    from populora import operators

    kept = {
        name: dict(getattr(operators, name)) for name in ("SELECTIONS", "PARENT_SELECTIONS", "CROSSOVERS", "MUTATIONS")
    }
    yield
    for name, registry in kept.items():
        getattr(operators, name).clear()
        getattr(operators, name).update(registry)


@pytest.mark.parametrize("unit", [u for _, u in UNITS], ids=[name for name, _ in UNITS])
def test_docs_block_runs(unit, tmp_path, monkeypatch, registries):
    monkeypatch.chdir(tmp_path)  # blocks that save write into a scratch folder
    run_unit(unit)


def test_markers_are_well_formed():
    for page in [*pages(), REPO / "README.md"]:
        text = page.read_text()
        every = re.findall(r"<!-- (?:docs|readme):[^>]*-->", text)
        known = re.findall(rf"{_ONE_MARKER.pattern}\n(?=(?:{_MARKER})*```python)", text)
        assert len(every) == len(known), f"{page.name}: a marker that is unknown or not right above a python block"


def test_every_guide_and_the_getting_started_page_have_runnable_examples():
    for page in [DOCS / "getting-started.md", *sorted((DOCS / "guides").glob("*.md"))]:
        assert blocks(page), f"{page.name} has no python block"


def test_the_contract_blocks_are_on_the_site():
    """The seed READMEs' calls (populora 0.1.18, torcheggroll 0.2.0) are in blocks that run above."""
    text = "\n".join(b.code for page in pages() for b in blocks(page))
    for needle in (
        "pop.select_and_merge_best_(fitnesses)",
        "pop.evaluate_distributed(eval_env)",
        "policy, history = evolve_with_env(",
        "interactor.evaluate(",
        "coevolve.step(distributed = True)",
        "es.step(x_train, mse_loss, y_train)",
        "es.apply_fitness_scores(fitnesses)",
        "batched_forward = vmap(",
        "compute_es_gradient(noise, rewards)",
        'torch.save(state, "checkpoint.pt")',
    ):
        assert needle in text, needle


def test_the_seed_readme_blocks_are_on_the_site_verbatim():
    """Every python block of the populora 0.1.18 README (when the seed is at hand) is one of the site's blocks, as
    written (its dm_control block runs where dm_control imports, which the test extra installs)."""
    if not SEED_README.exists():
        pytest.skip(f"{SEED_README} not available")
    site = {b.code for page in pages() for b in blocks(page)}
    seed = re.findall(r"```python\n(.*?)```", SEED_README.read_text(), flags=re.S)
    assert len(seed) == 6
    missing = [code.splitlines()[0] for code in seed if code not in site]
    assert not missing, f"seed README blocks not on the site: {missing}"


def _documented(page: Path) -> list[str]:
    return re.findall(r"^::: ([\w.]+)$", page.read_text(), flags=re.M)


def test_the_api_reference_documents_exactly_the_public_surface():
    import populora

    top = [name.removeprefix("populora.") for name in _documented(DOCS / "api" / "index.md")]
    assert all("." not in name for name in top), "the root page documents root names only"
    assert sorted(top) == sorted(populora.__all__), (
        f"missing: {sorted(set(populora.__all__) - set(top))}, not public: {sorted(set(top) - set(populora.__all__))}"
    )
    elsewhere = [name for page in (DOCS / "api").glob("*.md") if page.name != "index.md" for name in _documented(page)]
    assert not [name for name in elsewhere if name.count(".") == 1 and name.split(".")[1] in populora.__all__], (
        "a root name documented twice"
    )


def test_every_documented_object_exists():
    import importlib

    for page in sorted((DOCS / "api").glob("*.md")):
        for name in _documented(page):
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
                break
            else:
                raise AssertionError(f"{page.name}: {name} does not import")


def test_links_point_to_pages_and_images_that_exist():
    """Relative links and images of every page (and the README's links into docs/) name files that exist."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    for page in [*pages(), REPO / "README.md"]:
        for target in link.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s):, mailto:
            assert (page.parent / target).resolve().exists(), f"{page.relative_to(REPO)} links to missing {target}"


def test_mkdocs_nav_lists_every_page():
    nav = (REPO / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, flags=re.M))
    on_disk = {str(p.relative_to(DOCS)) for p in pages()}
    assert listed == on_disk, f"not in nav: {sorted(on_disk - listed)}, missing files: {sorted(listed - on_disk)}"


def test_the_plot_script_draws_every_figure_the_pages_show_from_the_committed_results(tmp_path):
    """``benchmarks/plots.py`` runs on ``benchmarks/results/`` and makes every committed figure of ``docs/images/``."""
    import importlib.util

    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("plots", REPO / "benchmarks" / "plots.py")
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    made = plots.main(REPO / "benchmarks" / "results", tmp_path)
    drawn = {name for name, path in made.items() if path is not None}
    assert {"forward-ratio.png", "es-vs-torcheggroll.png"} <= drawn
    for name in drawn:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    committed = {p.name for p in (DOCS / "images").glob("*.png")}
    assert committed == drawn, (
        f"figures not drawn by the script: {committed - drawn}; not committed: {drawn - committed}"
    )
    shown = {m for page in pages() for m in re.findall(r"\]\((?:\.\./)*images/([\w.-]+\.png)\)", page.read_text())}
    assert shown <= committed, f"pages show missing figures: {shown - committed}"


def test_the_api_reference_reads_the_rest_habits_of_the_docstrings_as_markdown():
    """``docs/_griffe/rst_to_markdown.py``: roles become code, simple tables become Markdown tables."""
    import importlib.util

    pytest.importorskip("griffe", reason="the docs extra (mkdocstrings) brings griffe; .ci/run builds the site with it")
    spec = importlib.util.spec_from_file_location("rst_to_markdown", DOCS / "_griffe" / "rst_to_markdown.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    text = (
        "See :class:`~populora.Population` and :meth:`evolve_ <populora.Population.evolve_>`::\n"
        "\n"
        "    pop.evolve_(f)\n"
        "\n"
        "=============  ====\n"
        "name           kind\n"
        "=============  ====\n"
        ":func:`a`      one\n"
        "               more\n"
        "``b``          two\n"
        "=============  ====\n"
        "Example:\n"
        "    >>> 1\n"
    )
    assert ext.to_markdown(text).splitlines() == [
        "See `Population` and `evolve_`:",
        "",
        "    pop.evolve_(f)",
        "",
        "",
        "| name | kind |",
        "| --- | --- |",
        "| `a` | one more |",
        "| ``b`` | two |",
        "",
        "Examples:",
        "    >>> 1",
    ]


def _griffe_extension():
    import importlib.util

    pytest.importorskip("griffe", reason="the docs extra (mkdocstrings) brings griffe; .ci/run builds the site with it")
    spec = importlib.util.spec_from_file_location("rst_to_markdown", DOCS / "_griffe" / "rst_to_markdown.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


def test_the_docstring_check_parses_as_the_site_does_and_every_docstring_passes_it():
    """Every docstring renders its Returns as one entry and closes its ``code`` spans (the build warns, and
    --strict fails, on the same check: docs/_griffe/rst_to_markdown.py)."""
    ext = _griffe_extension()  # griffe: the test extra brings it, so the README's command runs this check
    import griffe

    config = (REPO / "mkdocs.yml").read_text()
    for option, value in ext.PARSE_OPTIONS.items():
        assert re.search(rf"^\s+{option}: {str(value).lower()}\s*(#.*)?$", config, flags=re.M), option
    broken = griffe.Docstring("Sum.\n\nReturns:\n    ``{name: (P,) fitness}`` per population.")
    assert ext.problems(broken) == ["Returns: an unclosed ``code`` span (raw backticks on the page)"]
    assert (
        ext.problems(griffe.Docstring("Sum.\n\nReturns:\n    ``EvolveResult(policy,\n    history)``: a tuple.")) == []
    )
    package = griffe.load("populora", search_paths=[str(REPO)])
    found, seen, stack = [], set(), [package]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj.is_alias:
            continue
        seen.add(id(obj))
        if obj.docstring is not None:
            obj.docstring.value = ext.to_markdown(obj.docstring.value)
            found += [f"{obj.path}: {p}" for p in ext.problems(obj.docstring)]
        stack.extend(obj.members.values())
    assert len(seen) > 500 and not found, found


def test_every_documented_snapshot_shows_its_inherited_save_and_load():
    """``save`` / ``load`` come from ``populora.snapshots.Snapshot``: a class page shows them where users call them."""
    import importlib

    from populora.snapshots import Snapshot

    shown = []
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", text, flags=re.M):
            module, _, name = match.group(1).rpartition(".")
            try:
                obj = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
            if isinstance(obj, type) and issubclass(obj, Snapshot) and "save" not in vars(obj):
                assert "inherited_members: [save, load]" in match.group(2), f"{page.name}: {match.group(1)}"
                shown.append(name)
    assert {"Ratings", "HallOfFame"} <= set(shown), shown
    from populora import PopuLoRA  # its save is its own (collective after a distributed step): shown as a member

    assert "PopuLoRA" in shown or "save" in vars(PopuLoRA), shown


def test_search_splits_identifiers_inside_code():
    """mkdocs.yml's search separator: `gym.make("Acrobot-v1")` gives the word "acrobot", `PopuLoRAConfig` "config"."""
    config = (REPO / "mkdocs.yml").read_text()
    separator = re.search(r"separator: '(.*)'", config).group(1)
    words = lambda text: [w.lower() for w in re.split(separator, text) if w]
    assert "acrobot" in words('env = gym.make("Acrobot-v1")')
    assert {"popu", "config"} <= set(words("PopuLoRAConfig(update=1)")) or "config" in words("PopuLoRAConfig(update=1)")
    assert {"evolve", "with", "env"} <= set(words("evolve_with_env(env)"))
    assert "0.5" in " ".join(words("version 0.5.0"))  # a version number stays one word


def test_the_results_summary_has_the_readme_headlines_and_a_page_per_record():
    readme = (REPO / "README.md").read_text()
    summary = (DOCS / "results.md").read_text()
    headline = readme[readme.index("| what | result |") :].split("\n\n")[0].splitlines()[2:]
    for row in headline:
        what = row.split("|")[1].strip()
        line = next((s for s in summary.splitlines() if s.startswith(f"| {what} |")), None)
        assert line is not None and "](results/" in line, what
    records = sorted((DOCS / "results").glob("*.md"))
    assert len(records) >= 10 and all(f"](results/{p.name})" in summary for p in records)
    assert summary.count("\n") < 120, "a summary a reader takes in at once"
