"""The documentation against the code: README.md and docs/*.md.

- the preset tables are exactly what the registry generates, and every "<N> presets" says the registry's N;
- the README stays short, and no page points outside the repository or reads like a development log;
- every relative link points to a file that exists (and to one of its headings, if it names one);
- every command of a ```bash block is checked: the short offline ones (``--help``, ``--smoke``, ``hf-fedflat
  list``, ``python -c``) run; for the others, the files they name exist and every ``--flag`` (and every key of a
  config file they pass) is one the command's parser knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import REPO_ROOT

ROOT = REPO_ROOT
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
TABLE = re.compile(r"<!-- preset-table:start -->\n(.*?)\n<!-- preset-table:end -->", re.S)
RUN_TIMEOUT_S = 180


def bash_commands(page: Path) -> list[str]:
    """The commands of a page's ```bash blocks, continuation lines joined, comments dropped; ``a && b`` is two."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            while tokens:
                cut = next((i for i, t in enumerate(tokens) if t in ("&&", ";", "|")), len(tokens))
                part = tokens[:cut]
                while part and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", part[0]):  # VAR=value before the command
                    part = part[1:]
                if part:
                    commands.append(shlex.join(part))
                tokens = tokens[cut + 1:]
    return commands


def runs_quickly(tokens: list[str]) -> bool:
    return bool({"--help", "-h", "--smoke"} & set(tokens)) or tokens[:2] in (["hf-fedflat", "list"], ["python", "-c"])


COMMANDS = sorted({c for page in PAGES for c in bash_commands(page)})
QUICK = [c for c in COMMANDS if runs_quickly(shlex.split(c))]
CHECKED = [c for c in COMMANDS if c not in QUICK]


# -- tables and text --------------------------------------------------------------------------------------------
def test_preset_tables_are_the_registry_s():
    from hf_fedflat.algorithms.preset_table import preset_table

    table = preset_table()
    for page in (README, ROOT / "docs" / "algorithms.md"):
        assert TABLE.findall(page.read_text()) == [table], (
            f"{page.name}: the preset table differs from the registry's; paste the output of "
            "`python -m hf_fedflat.algorithms.preset_table` between the preset-table markers")


def test_preset_counts_are_the_registry_s():
    from hf_fedflat import list_algorithms

    count = len(list_algorithms())
    for page in PAGES:
        for match in re.finditer(r"\b(\d+) presets\b", page.read_text()):
            assert int(match.group(1)) == count, f"{page.name}: {match.group(0)!r}, the registry has {count}"


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 300


def test_no_page_points_outside_the_repository_or_logs_development():
    pattern = re.compile(r"\.\./shared|issue [0-9]")
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in [README, ROOT / "CONTRIBUTING.md", *DOCS]
            for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def test_relative_links_point_to_files_and_headings():
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path, _, anchor = target.partition("#")
            if re.match(r"[a-z]+:", path):
                continue
            file = page.parent / path if path else page
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "\n".join(missing)


# -- commands that run ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    """``{command: CompletedProcess}`` of every quick command, run two at a time in a folder that mirrors the
    repository (its outputs stay there)."""
    work = tmp_path_factory.mktemp("docs_commands")
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name != "outputs":
            (work / entry.name).symlink_to(entry)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(QUICK, pool.map(run, QUICK)))


@pytest.mark.parametrize("command", QUICK)
def test_quick_command_runs(command, quick_results):
    result = quick_results[command]
    assert result.returncode == 0, f"{command}\n{(result.stdout + result.stderr)[-3000:]}"


# -- commands that are checked ----------------------------------------------------------------------------------
def _known_flags(dataclass_types) -> set[str]:
    from hf_fedflat.cli.parsing import build_parser

    return set(build_parser(dataclass_types)._option_string_actions)


def _recipe_types(script: Path) -> tuple:
    """The dataclasses a recipe parses: its own (with ``FedTrainingArguments``) if it declares some, else the ones
    ``hf-fedflat train`` parses."""
    from hf_fedflat import FedTrainingArguments
    from hf_fedflat.cli.parsing import train_argument_types

    spec = importlib.util.spec_from_file_location(f"docs_recipe_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses resolve their annotations through sys.modules)
    spec.loader.exec_module(module)
    own = tuple(v for v in vars(module).values()
                if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == module.__name__)
    return (*own, FedTrainingArguments) if own else train_argument_types()


def _subcommand_help(command: str) -> str:
    from hf_fedflat.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([command, "--help"])
    return out.getvalue()


def _flags(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def command_problems(command: str) -> list[str]:
    """What is wrong with a command that is not run: files it names that do not exist, flags its parser does not
    know, keys of its config file that are no field."""
    from hf_fedflat.cli.parsing import read_config_file, train_argument_types

    tokens = shlex.split(command)
    problems = [f"{t} does not exist" for t in tokens
                if "/" in t and re.search(r"\.(py|ya?ml|json|md)$", t) and not t.startswith(("-", "outputs/"))
                and not (ROOT / t).exists()]
    if problems:
        return problems
    if tokens[:2] == ["accelerate", "launch"]:
        script = next((i for i, t in enumerate(tokens) if t.endswith(".py")), None)
        if script is None:
            return ["accelerate launch without a script"]
        types, args = _recipe_types(ROOT / tokens[script]), tokens[script + 1:]
    elif tokens[0] in ("python", "python3") and len(tokens) > 1 and tokens[1].startswith("recipes/"):
        types, args = _recipe_types(ROOT / tokens[1]), tokens[2:]
    elif tokens[:2] == ["hf-fedflat", "train"]:
        types, args = train_argument_types(), tokens[2:]
    elif tokens[:2] == ["hf-fedflat", "flower-app"]:  # its own flags, then any flag of hf-fedflat train
        own = _flags(re.findall(r"--[a-z_-]+", _subcommand_help("flower-app")))
        types, args = train_argument_types(), [t for t in tokens[2:] if t.split("=", 1)[0] not in own or t == "--config"]
    elif tokens[0] == "hf-fedflat" and len(tokens) > 1:
        text = _subcommand_help(tokens[1])
        return [f"{flag} is not a flag of hf-fedflat {tokens[1]}" for flag in _flags(tokens[2:])
                if not re.search(re.escape(flag) + r"\b", text)]
    else:
        return []
    known = _known_flags(types)
    problems = [f"{flag} is not a flag of its parser" for flag in _flags(args) if flag not in known]
    configs = [args[i + 1] for i, t in enumerate(args[:-1]) if t == "--config"]
    configs += [t for t in args[:1] if re.search(r"\.(ya?ml|json)$", t)]
    for config in configs:
        problems += [f"{config}: {key} is not a field of its parser"
                     for key in read_config_file(ROOT / config) if f"--{key}" not in known]
    return problems


@pytest.mark.parametrize("command", CHECKED)
def test_command_names_existing_files_and_known_flags(command):
    assert not command_problems(command)
