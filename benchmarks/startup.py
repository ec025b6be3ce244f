"""Start-up cost: ``import hf_fedflat`` against ``import torch, transformers`` (target: ratio <= 1.3).

    python benchmarks/startup.py [--repeats 7] [--importtime]

Each statement runs in a fresh interpreter, timed inside it around the statement alone (interpreter
start-up excluded), the statements taking turns so that load from elsewhere hits all of them alike;
the median of the repeats is reported. ``hf-fedflat --help`` and ``hf-fedflat train --help`` (which builds
the argument parser from ``FedTrainingArguments``, hence loads transformers' ``TrainingArguments``) are timed
as whole processes (wall clock, interpreter start-up included), beside ``python -c pass``. ``--importtime``
adds the ten modules that cost ``import hf_fedflat`` most (``python -X importtime``, cumulative microseconds).

Rows: the reference (``import torch, transformers``; transformers itself is lazy), ``import hf_fedflat``
(what the target is about), the usual first line of a script (``from hf_fedflat import FederatedTrainer,
FedTrainingArguments``: loads transformers' Trainer, datasets, peft and timm), and transformers' own
``from transformers import Trainer, TrainingArguments`` for comparison with it. Writes
``benchmarks/startup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE = "import torch, transformers"
STATEMENTS = {
    "reference": REFERENCE,
    "hf_fedflat": "import hf_fedflat",
    "hf_fedflat_trainer": "from hf_fedflat import FederatedTrainer, FedTrainingArguments",
    "transformers_trainer": "import torch; from transformers import Trainer, TrainingArguments",
}
TIMER = "import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"


def timed_import(statement: str) -> float:
    """Seconds that ``statement`` takes in a fresh interpreter (start-up excluded)."""
    out = subprocess.run([sys.executable, "-c", TIMER.format(statement=statement)], check=True,
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return float(out.stdout.strip().splitlines()[-1])


def timed_process(command: list[str]) -> float:
    """Wall-clock seconds of a whole process."""
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - start


def cli_command(*arguments: str) -> list[str]:
    script = shutil.which("hf-fedflat", path=os.path.dirname(sys.executable))
    return [script, *arguments] if script else [sys.executable, "-c", "import sys; from hf_fedflat.cli import main; "
                                                                       "sys.exit(main(sys.argv[1:]))", *arguments]


def slowest_imports(statement: str, count: int = 10) -> list[tuple[str, int]]:
    """The ``count`` modules of largest cumulative import time under ``statement`` (microseconds)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], check=True, capture_output=True,
                         text=True)
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split(":", 1)[1].split("|"))
        rows.append((name, int(cumulative)))
    return sorted(rows, key=lambda row: -row[1])[:count]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--output", default=str(HERE / "startup.json"))
    options = parser.parse_args(argv)

    times: dict[str, list[float]] = {name: [] for name in [*STATEMENTS, "python_pass", "cli_help", "cli_train_help"]}
    for _ in range(options.repeats):  # the rows take turns
        for name, statement in STATEMENTS.items():
            times[name].append(timed_import(statement))
        times["python_pass"].append(timed_process([sys.executable, "-c", "pass"]))
        times["cli_help"].append(timed_process(cli_command("--help")))
        times["cli_train_help"].append(timed_process(cli_command("train", "--help")))
    median = {name: statistics.median(values) for name, values in times.items()}
    reference = median["reference"]
    result = {
        "python": sys.version.split()[0], "repeats": options.repeats, "median_seconds": median,
        "ratio_to_reference": {name: median[name] / reference for name in STATEMENTS},
        "target": "hf_fedflat / reference <= 1.3", "all_seconds": times,
    }
    print(f"{'statement':<70} {'median s':>9} {'x reference':>12}")
    for name, statement in STATEMENTS.items():
        print(f"{statement:<70} {median[name]:9.3f} {median[name] / reference:12.2f}")
    print(f"{'hf-fedflat --help (whole process)':<70} {median['cli_help']:9.3f}")
    print(f"{'hf-fedflat train --help (whole process)':<70} {median['cli_train_help']:9.3f}")
    print(f"{'python -c pass (whole process)':<70} {median['python_pass']:9.3f}")
    ratio = result["ratio_to_reference"]["hf_fedflat"]
    print(f"import hf_fedflat / import torch, transformers = {ratio:.2f} (target <= 1.3: "
          f"{'met' if ratio <= 1.3 else 'NOT met'})")
    if options.importtime:
        result["slowest_imports_us"] = slowest_imports(STATEMENTS["hf_fedflat"])
        print("slowest modules under `import hf_fedflat` (cumulative us):")
        for name, cumulative in result["slowest_imports_us"]:
            print(f"  {cumulative:>10}  {name}")
    Path(options.output).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
