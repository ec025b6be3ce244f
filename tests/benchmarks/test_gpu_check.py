"""benchmarks/gpu_check.py --dry-run: every step of the GPU acceptance check runs on the CPU with tiny sizes and the
report has the structure docs/gpu.md describes (no number is checked: a dry run measures nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # (the five steps take about 90 s on 2 CPU cores)

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_check.py"
STEPS = ["cuda_tests", "quickstart", "workloads_bf16", "whole_run_digits", "concurrent_clients"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    output = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--output", str(output)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(output.read_text())


def test_dry_run_report_names_the_machine_and_the_run(report):
    for key in ("device", "torch", "cuda", "cudnn", "date", "commit", "budget_seconds", "wall_seconds", "steps",
                "all_targets_met", "throughput_target"):
        assert key in report
    assert report["dry_run"] is True
    assert report["device"] == "cpu" and report["throughput_target"] == 0.85


def test_every_step_ran_within_its_budget_and_recorded_its_result(report):
    assert [s["name"] for s in report["steps"]] == STEPS
    for step in report["steps"]:
        assert step["status"] == "ok", (step["name"], step["output_tail"])
        assert step["returncode"] == 0
        assert 0 < step["wall_seconds"] <= step["budget_seconds"] + 5
        assert step["command"].startswith("python ")
        for name, target in step["result"]["targets"].items():
            assert set(target) == {"value", "target", "passed"}, name


def test_each_step_reads_what_its_child_measured(report):
    steps = {s["name"]: s["result"] for s in report["steps"]}
    assert steps["cuda_tests"]["counts"]["passed"] >= 1 and steps["cuda_tests"]["targets"]["all_tests_pass"]["passed"]
    assert steps["quickstart"]["wall_seconds"] > 0
    assert 0 <= steps["quickstart"]["share_outside_local_training"] <= 1
    assert set(steps["quickstart"]["final_eval_accuracy"]) == {"fedavg", "fedsam"}  # the quickstart's --smoke
    assert set(steps["workloads_bf16"]["targets"]) == {"shakespeare_throughput_share", "vit_lora_throughput_share"}
    for workload in ("shakespeare", "vit_lora"):  # the plain loop and the library trained the same weights
        assert steps["workloads_bf16"][workload]["max_abs_weight_diff"] == 0.0
    assert set(steps["whole_run_digits"]["targets"]) == {"whole_run_digits_eval_vs_plain_loop",
                                                         "whole_run_digits_no_eval_vs_plain_loop"}
    assert steps["whole_run_digits"]["whole_run_digits_eval_vs_plain_loop"]["max_abs_weight_diff"] == 0.0
    assert set(steps["concurrent_clients"]) == {"k1", "k2", "k4", "targets"}
    assert steps["concurrent_clients"]["k4"]["max_abs_weight_diff"] == 0.0  # lanes on a CPU: K=1's weights
