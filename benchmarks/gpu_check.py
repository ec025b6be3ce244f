"""The GPU acceptance check: five steps on one GPU in under 8 minutes, one JSON.

    python benchmarks/gpu_check.py [--output gpu_check.json] [--only cuda_tests,quickstart,...] [--budget 480]
    python benchmarks/gpu_check.py --dry-run      # every step on the CPU with tiny sizes: the script itself works

Steps, each a child process with its own time budget (its timeout); a step that fails or runs out of time is
recorded and the next one runs:

1. ``cuda_tests``: ``HF_FEDFLAT_TEST_CUDA=1 pytest -q tests/algorithms/test_presets.py -k bf16`` (every preset for
   2 rounds in fp32, then in bf16 on the GPU; the one test module that reads the variable);
2. ``quickstart``: ``recipes/quickstart.py`` (FedAvg, FedSAM, SCAFFOLD, 30 rounds each) on the GPU, timed as a
   process by ``benchmarks/whole_run.py --only quickstart``: wall seconds, the share outside local training, the
   final accuracies;
3. ``workloads_bf16``: workloads 1 (LEAF Shakespeare, char LSTM) and 2 (ViT-S/16 + LoRA) of
   ``benchmarks/workloads.py`` in bf16, FedAvg against the plain loop; target: the library's throughput at least 85%
   of the plain loop's (time ratio <= 1/0.85);
4. ``whole_run_digits``: ``benchmarks/whole_run.py --only digits`` on the GPU (evaluation every round on all 1,797
   rows; targets 1.15 with evaluation, 1.10 without);
5. ``concurrent_clients``: ``benchmarks/concurrent_clients.py --ks 1,2,4`` (rounds per second at K clients at once).

The JSON (written after every step, atomically): ``device``, ``torch``, ``cuda``, ``cudnn``, ``date``, ``commit``,
``dry_run``, ``budget_seconds``, ``wall_seconds`` and ``steps``: per step ``name``, ``status`` (``ok``, ``failed``,
``timed_out``, ``skipped``), ``returncode``, ``wall_seconds``, ``budget_seconds``, ``command``, ``result`` (what the
step measured; its ``targets``: ``{name: {"value", "target", "passed"}}``), ``output_tail``. ``all_targets_met``:
every step ok and every target passed. The exit status is 0 unless the script itself breaks: a failed step is a
result, not an error. docs/gpu.md describes the fields and the targets.

``--dry-run`` runs the same five steps on the CPU with tiny sizes (one preset's bf16 test, the quickstart's
``--smoke``, workloads 1-2 at one step per client on a 16-client play set and a small ViT on 32 px images, three
rounds of the digits, two rounds of each K): about a minute, mostly the five child processes' imports; its numbers
mean nothing, its JSON has the real one's structure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
#: workloads 1-2: the library's throughput must be at least this share of the plain loop's
THROUGHPUT_TARGET = 0.85
DEFAULT_BUDGET = 480.0
DRY_RUN_BUDGET = 1500.0


@dataclasses.dataclass(frozen=True)
class Step:
    """A child process: its command for a GPU run and for a dry run, its time budget, how to read its result."""

    name: str
    budget_seconds: float
    dry_budget_seconds: float
    command: Callable[[bool, Path], list[str]]  # (dry_run, the step's scratch folder) -> argv
    read: Callable[[Path, str], dict]  # (scratch folder, stdout+stderr) -> result
    env: dict = dataclasses.field(default_factory=dict)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


# --- 1. the CUDA tests ---------------------------------------------------------------------------------------------
def cuda_tests_command(dry: bool, scratch: Path) -> list[str]:
    # dry run: FedAvg's and its decentralized relatives' bf16 runs only (the CPU's bf16 autocast)
    return python("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/algorithms/test_presets.py",
                  "-k", "bf16 and fedavg" if dry else "bf16")


def read_pytest(scratch: Path, output: str) -> dict:
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", output)}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    return {"counts": counts,
            "targets": {"all_tests_pass": {"value": f"{counts.get('passed', 0)} passed, {failed} failed",
                                           "target": "0 failed", "passed": failed == 0 and counts.get("passed", 0) > 0}}}


# --- 2. the quickstart ---------------------------------------------------------------------------------------------
def quickstart_command(dry: bool, scratch: Path) -> list[str]:
    return python(str(HERE / "whole_run.py"), "--only", "quickstart", "--device", "cpu" if dry else "cuda",
                  *(["--smoke"] if dry else []), "--output", str(scratch / "quickstart.json"))


def read_quickstart(scratch: Path, output: str) -> dict:
    details = json.loads((scratch / "quickstart.json").read_text())[0]["details"]
    keys = ("wall_seconds", "local_training_seconds", "share_outside_local_training", "launch_to_first_round_seconds",
            "after_aggregation_seconds", "final_eval_accuracy", "command")
    return {k: details.get(k) for k in keys} | {"targets": {}}


# --- 3. workloads 1-2 in bf16 --------------------------------------------------------------------------------------
def workloads_command(dry: bool, scratch: Path) -> list[str]:
    common = ["--only", "shakespeare,vit_lora", "--algorithms", ",", "--output", str(scratch / "workloads.json")]
    if dry:  # fp32 (this CPU's oneDNN has no bf16 LSTM), a small ViT on 32 px, a play set of 16 clients, one step
        return python(str(HERE / "workloads.py"), *common, "--quick", "--rounds", "2", "--shakespeare-steps", "1",
                      "--shakespeare-scale", "0.02", "--vit-model", "vit_tiny_patch16_224", "--vit-image-size", "32")
    return python(str(HERE / "workloads.py"), *common, "--quick", "--rounds", "4", "--shakespeare-steps", "4",
                  "--device", "cuda", "--bf16")


def read_workloads(scratch: Path, output: str) -> dict:
    records = json.loads((scratch / "workloads.json").read_text())
    result, targets = {}, {}
    for r in records:
        if not r["name"].endswith("_fedavg_vs_plain_loop"):
            continue
        workload = r["name"].removesuffix("_fedavg_vs_plain_loop")
        throughput = 1.0 / r["ratio"]
        result[workload] = {"time_ratio": r["ratio"], "throughput_share": round(throughput, 4),
                            "raw": r["details"].get("raw"),
                            "max_abs_weight_diff": r["details"].get("max_abs_weight_diff")}
        targets[f"{workload}_throughput_share"] = {"value": round(throughput, 4), "target": f">= {THROUGHPUT_TARGET}",
                                                   "passed": throughput >= THROUGHPUT_TARGET}
    return result | {"targets": targets}


# --- 4. the evaluation path: whole-run row (a) -----------------------------------------------------------------------
def whole_run_command(dry: bool, scratch: Path) -> list[str]:
    sizes = ["--smoke"] if dry else ["--rounds", "30", "--repeats", "1"]
    return python(str(HERE / "whole_run.py"), "--only", "digits", "--device", "cpu" if dry else "cuda", *sizes,
                  "--output", str(scratch / "whole_run.json"))


def read_whole_run(scratch: Path, output: str) -> dict:
    records = json.loads((scratch / "whole_run.json").read_text())
    result = {r["name"]: {"ratio": r["ratio"], "raw": r["details"].get("raw"),
                          "max_abs_weight_diff": r["details"].get("max_abs_weight_diff")} for r in records}
    targets = {r["name"]: {"value": r["ratio"], "target": f"<= {r['target']}", "passed": r["passed"]}
               for r in records if r["target"] is not None}
    return result | {"targets": targets}


# --- 5. several clients at once -------------------------------------------------------------------------------------
def concurrent_command(dry: bool, scratch: Path) -> list[str]:
    sizes = ["--rounds", "2", "--num_clients", "20", "--rows_per_client", "4"] if dry else ["--rounds", "6"]
    return python(str(HERE / "concurrent_clients.py"), "--ks", "1,2,4", "--device", "cpu" if dry else "cuda", *sizes,
                  "--output", str(scratch / "concurrent_clients.json"))


def read_concurrent(scratch: Path, output: str) -> dict:
    results = json.loads((scratch / "concurrent_clients.json").read_text())["results"]
    keys = ("seconds_per_round", "rounds_per_second", "speedup_vs_first", "vs_flute", "max_abs_weight_diff")
    return {f"k{r['k']}": {k: r.get(k) for k in keys} for r in results} | {"targets": {}}


#: GPU budgets sum to 460 s of the 480; a dry run's are generous (a loaded CPU machine is slow, and a dry run that
#: times out would only say so)
STEPS = [
    Step("cuda_tests", 130, 300, cuda_tests_command, read_pytest, env={"HF_FEDFLAT_TEST_CUDA": "1"}),
    Step("quickstart", 90, 300, quickstart_command, read_quickstart),
    Step("workloads_bf16", 110, 300, workloads_command, read_workloads),
    Step("whole_run_digits", 70, 300, whole_run_command, read_whole_run),
    Step("concurrent_clients", 60, 300, concurrent_command, read_concurrent),
]


# --- the run ----------------------------------------------------------------------------------------------------------
def machine() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None,
            "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit}


def run_step(step: Step, dry: bool, scratch: Path, timeout: float) -> dict:
    command = step.command(dry, scratch)
    entry = {"name": step.name, "status": "ok", "returncode": None, "budget_seconds": round(timeout, 1),
             "command": " ".join(command).replace(sys.executable, "python"), "result": None, "output_tail": ""}
    env = dict(os.environ, **step.env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        output = done.stdout + done.stderr
        entry["returncode"] = done.returncode
        if done.returncode != 0:
            entry["status"] = "failed"
    except subprocess.TimeoutExpired as expired:
        output = _text(expired.stdout) + _text(expired.stderr)
        entry["status"] = "timed_out"
    entry["wall_seconds"] = round(time.perf_counter() - started, 1)
    entry["output_tail"] = output[-3000:]
    try:
        entry["result"] = step.read(scratch, output)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:  # nothing (or half) written
        entry["result"] = {"unreadable": f"{type(error).__name__}: {error}", "targets": {}}
        if entry["status"] == "ok":
            entry["status"] = "failed"
    return entry


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def write(report: dict, output: Path) -> None:
    from hf_fedflat.io import atomic_write_json

    atomic_write_json(report, output, durable=False)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="gpu_check.json", help="The JSON report (default gpu_check.json).")
    parser.add_argument("--dry-run", action="store_true", help="Every step on the CPU with tiny sizes.")
    parser.add_argument("--only", default=",".join(s.name for s in STEPS),
                        help=f"Comma-separated steps of {[s.name for s in STEPS]}.")
    parser.add_argument("--budget", type=float, default=None,
                        help="Seconds for all steps together; a step gets its own budget or what is left, whichever "
                             "is less, and is skipped with under 10 s left (default 480; dry run 1500).")
    opts = parser.parse_args(argv)
    names = [n.strip() for n in opts.only.split(",") if n.strip()]
    unknown = sorted(set(names) - {s.name for s in STEPS})
    if unknown:
        parser.error(f"--only: unknown steps {unknown}; choose from {[s.name for s in STEPS]}")
    output = Path(opts.output)
    if opts.budget is None:
        opts.budget = DRY_RUN_BUDGET if opts.dry_run else DEFAULT_BUDGET
    report = {**machine(), "dry_run": opts.dry_run, "budget_seconds": opts.budget, "wall_seconds": None,
              "throughput_target": THROUGHPUT_TARGET, "steps": [], "all_targets_met": None}
    if not opts.dry_run and report["device"] == "cpu":
        print("gpu_check: no CUDA device; the steps will fail (use --dry-run for the CPU check)", file=sys.stderr)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_gpu_check_") as root:
        for step in (s for s in STEPS if s.name in names):
            left = opts.budget - (time.perf_counter() - started)
            budget = step.dry_budget_seconds if opts.dry_run else step.budget_seconds
            if left < 10:
                entry = {"name": step.name, "status": "skipped", "returncode": None, "budget_seconds": 0,
                         "wall_seconds": 0.0, "command": None, "result": {"targets": {}},
                         "output_tail": f"skipped: {left:.0f} s of the budget left"}
            else:
                scratch = Path(root) / step.name
                scratch.mkdir()
                entry = run_step(step, opts.dry_run, scratch, min(budget, left))
            report["steps"].append(entry)
            targets = entry["result"]["targets"]
            print(f"[gpu_check] {step.name}: {entry['status']} in {entry['wall_seconds']} s"
                  + "".join(f"; {k} {t['value']} ({t['target']}: {'met' if t['passed'] else 'MISSED'})"
                            for k, t in targets.items()), file=sys.stderr, flush=True)
            report["wall_seconds"] = round(time.perf_counter() - started, 1)
            write(report, output)
    report["all_targets_met"] = all(e["status"] == "ok" and all(t["passed"] for t in e["result"]["targets"].values())
                                    for e in report["steps"])
    write(report, output)
    print(f"[gpu_check] {report['wall_seconds']} s; all targets met: {report['all_targets_met']}; wrote {output}",
          file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
