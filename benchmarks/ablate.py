"""What each fast-path mechanism (``hf_fedflat.runtime``) saves: the same workload with one mechanism off.

    python benchmarks/ablate.py [--rounds 16] [--repeats 3] [--only fedavg,scaffold,multiprocess,memory]

Every side of a section runs the same federated workload in lock-step with the others (``run.py``'s
:class:`LockStep`: sides take turns round by round, so load from elsewhere hits all of them alike), one
side with the whole fast path (``all``) and one per mechanism with only that mechanism off
(``runtime.fast_path(without=[name])``). Saving = 1 - all / without (best of the repeats per round, round
0 not timed; also in CPU seconds of the process, which only the side holding the turn uses). A ``control``
side, everything on again, shows the noise floor: measured savings of a no-op were up to 6% in one run,
so compare a mechanism with both ``all`` and ``control`` and over runs. Sections:

- ``fedavg``: run.py's setting (digits 16x16, 100 clients, 10 per round, small_cnn) at one local epoch,
  where per-client costs weigh most (target 1).
- ``free_memory``: the same, 3 rounds, once (without it every client pays a garbage collection).
- ``scaffold``: the same at one local epoch with SCAFFOLD (client states, a correction per step).
- ``multiprocess``: ``buffer_pool`` (exchange buffers), 2 processes (``workers.py federated``), adjacent
  launches with and without it (``HF_FEDFLAT_FAST_PATH=-buffer_pool``).
- ``memory``: ``heap_trim``, peak RSS of SCAFFOLD with 1,000 clients (``workers.py memory``, run.py's
  target 3) with and without it.

Writes ``benchmarks/ablation.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("benchmarks_run", HERE / "run.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # its dataclasses look their module up there
spec.loader.exec_module(bench)

import torch  # noqa: E402

from hf_fedflat import runtime  # noqa: E402
from hf_fedflat.runtime import fast_trainer as fast  # noqa: E402

#: mechanisms measured in one process, per section (buffer_pool needs 2 processes; step_buffers a correction)
IN_PROCESS = {
    "fedavg": ("fedavg", [m for m in runtime.MECHANISMS if m not in ("buffer_pool", "step_buffers", "free_memory")]),
    "scaffold": ("scaffold", ["recycle_vectors", "step_buffers", "heap_trim"]),
    "free_memory": ("fedavg", ["free_memory"]),  # a gc.collect() per client: ~1 s each, so 3 rounds, once
}
SHORT_SIDES = {"free_memory": 3}  # rounds of sides too slow for the full count


class Lookups:
    """accelerate's package lookups cached or not, switched per turn (the cache is process-wide)."""

    def __init__(self):
        import accelerate.accelerator
        import accelerate.optimizer
        import accelerate.utils.other

        fast.cache_accelerate_package_lookups()
        self.slots = []
        for module in (accelerate.accelerator, accelerate.optimizer, accelerate.utils.other):
            for name in ("is_lomo_available", "is_deepspeed_available"):
                cached = getattr(module, name, None)
                if cached is not None:
                    self.slots.append((module, name, cached, cached.__wrapped__))

    def set(self, cached: bool) -> None:
        for module, name, with_cache, without in self.slots:
            setattr(module, name, with_cache if cached else without)


def side_runner(setting, data, algorithm: str, off: str | None, lookups: Lookups):
    def runner(gate):
        def before_round(round_index):
            gate(round_index)
            lookups.set(off != "cached_lookups")  # (this side's turn now)

        lookups.set(off != "cached_lookups")
        with runtime.fast_path(without=[off] if off else []):
            return bench.run_federated(setting, data, algorithm, before_round=before_round)[0]
    return runner


def section_in_process(name: str, rounds: int, repeats: int, only: list[str] | None = None) -> list[dict]:
    algorithm, mechanisms = IN_PROCESS[name]
    mechanisms = [m for m in mechanisms if not only or m in only]
    if name in SHORT_SIDES:
        rounds, repeats = SHORT_SIDES[name], 1
    setting = bench.Setting(num_rounds=rounds, local_epochs=1.0)
    data = bench.load_data(setting)
    lookups = Lookups()
    bench.warm_up_process(setting, data, [algorithm])
    runners = {"all": side_runner(setting, data, algorithm, None, lookups)}
    if name not in SHORT_SIDES:  # a second side with everything on: the noise floor of the comparison
        runners["control"] = side_runner(setting, data, algorithm, None, lookups)
    runners |= {f"-{m}": side_runner(setting, data, algorithm, m, lookups) for m in mechanisms}
    best = bench.lock_step_repeats(runners, repeats, f"ablation {name}")
    runs = best.pop("_runs")
    lookups.set(True)
    reference = best["all"]
    records = []
    control = best.get("control")
    if control is not None:
        records.append({"workload": f"{algorithm}, 1 local epoch", "mechanism": "(control: nothing off)",
                        "ms_per_round_with": round(1000 * reference.seconds_per_round, 1),
                        "ms_per_round_without": round(1000 * control.seconds_per_round, 1),
                        "saving": round(1 - reference.seconds_per_round / control.seconds_per_round, 4)})
    for mechanism in mechanisms:
        without = best[f"-{mechanism}"]
        if not torch.equal(without.final_params, reference.final_params):
            raise AssertionError(f"{name}: without {mechanism} the final weights differ")
        timed = len(without.timed_seconds)
        with_ms, without_ms = 1000 * reference.seconds_per_round, 1000 * without.seconds_per_round
        per_repeat = [1 - a.seconds_per_round / w.seconds_per_round for a, w in zip(runs["all"], runs[f"-{mechanism}"])]
        cpu_with, cpu_without = reference.cpu_seconds_per_round, without.cpu_seconds_per_round
        records.append({"workload": f"{algorithm}, 1 local epoch", "mechanism": mechanism,
                        "ms_per_round_with": round(with_ms, 1), "ms_per_round_without": round(without_ms, 1),
                        "saving": round(1 - with_ms / without_ms, 4),
                        "saving_vs_control": None if control is None else
                        round(1 - control.seconds_per_round / without.seconds_per_round, 4),
                        "cpu_ms_per_round_with": round(1000 * cpu_with, 1),
                        "cpu_ms_per_round_without": round(1000 * cpu_without, 1),
                        "saving_cpu": round(1 - cpu_with / cpu_without, 4),
                        "saving_per_repeat": [round(s, 4) for s in per_repeat], "rounds_timed": timed})
    return records


def section_multiprocess(rounds: int, pairs: int) -> list[dict]:
    env_all = bench.child_env(1)
    env_off = dict(env_all, HF_FEDFLAT_FAST_PATH="-buffer_pool")
    times = {"all": [], "off": []}
    config = bench.REPO_ROOT / "accelerate_configs" / "cpu_2proc.yaml"
    launch = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", str(config)]
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_ablate_mp_") as root:
        for pair in range(pairs):
            for side in (("all", "off") if pair % 2 == 0 else ("off", "all")):
                out = Path(root) / f"{side}{pair}.json"
                bench.run_child([*launch, str(bench.WORKERS), "federated", "--num-rounds", str(rounds),
                                 "--local-steps", "20", "--output", str(out), "--output-dir", str(Path(root) / f"{side}{pair}")],
                                env_all if side == "all" else env_off, 1800, f"ablation multiprocess {side} {pair}")
                times[side].append(statistics.fmean(json.loads(out.read_text())["round_seconds"][1:]))
    with_ms, without_ms = 1000 * statistics.median(times["all"]), 1000 * statistics.median(times["off"])
    return [{"workload": "fedavg, 2 processes, 20 local steps", "mechanism": "buffer_pool",
             "ms_per_round_with": round(with_ms, 1), "ms_per_round_without": round(without_ms, 1),
             "saving": round(1 - with_ms / without_ms, 4),
             "saving_per_repeat": [round(1 - a / o, 4) for a, o in zip(times["all"], times["off"])]}]


def section_memory(rounds: int) -> list[dict]:
    peaks = {}
    with tempfile.TemporaryDirectory(prefix="hf_fedflat_ablate_mem_") as root:
        for side, value in (("all", "1"), ("off", "-heap_trim")):
            out = Path(root) / f"{side}.json"
            bench.run_child([sys.executable, str(bench.WORKERS), "memory", "--algorithm", "scaffold", "--num-clients",
                             "1000", "--num-rounds", str(rounds), "--store", "auto", "--memory-mb", "64",
                             "--save-every", "20", "--output", str(out), "--output-dir", str(Path(root) / side)],
                            dict(bench.child_env(1), HF_FEDFLAT_FAST_PATH=value), 1800, f"ablation memory {side}")
            peaks[side] = json.loads(out.read_text())["peak_rss_mb"]
    return [{"workload": f"scaffold, 1,000 clients, {rounds} rounds: peak RSS (MB)", "mechanism": "heap_trim",
             "mb_with": round(peaks["all"]), "mb_without": round(peaks["off"]),
             "saving": round(1 - peaks["all"] / peaks["off"], 4)}]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="fedavg,scaffold,free_memory,memory,multiprocess")
    parser.add_argument("--mechanisms", default="", help="Comma-separated: only these (in-process sections).")
    parser.add_argument("--output", default=str(HERE / "ablation.json"))
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    records = []
    for section in opts.only.split(","):
        if section in IN_PROCESS:
            records += section_in_process(section, opts.rounds, opts.repeats,
                                          [m for m in opts.mechanisms.split(",") if m] or None)
        elif section == "multiprocess":
            records += section_multiprocess(6, 2)
        elif section == "memory":
            records += section_memory(40)
        else:
            raise SystemExit(f"unknown section {section!r}")
        Path(opts.output).write_text(json.dumps(records, indent=2) + "\n")
    for r in records:
        print(f"{r['workload']:<45} {r['mechanism']:<18} saving {100 * r['saving']:6.2f}% "
              f"(cpu {100 * (r.get('saving_cpu') or float('nan')):6.2f}%, "
              f"vs control {100 * (r.get('saving_vs_control') or float('nan')):6.2f}%) "
              f"{'kept' if r['saving'] >= 0.03 else 'below 3%'}  {r.get('saving_per_repeat', '')}")
    return records


if __name__ == "__main__":
    main()
