"""One run, one folder: a run holds its output_dir's lock for its life (a second run is refused naming the holder;
the OS releases the lock of a killed one), refuses a folder holding another run's files unless it resumes or
overwrites it, keeps run_status.json right from the start to every end, and removes only the temporary folders of
writers that are gone (and only while it holds the lock)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hf_fedflat import cli
from hf_fedflat.cli.exit_codes import EXIT_BAD_INPUT
from hf_fedflat.federation import FederatedCallback, TrainingFailedError
from hf_fedflat.federation.checkpoint import recover_interrupted
from hf_fedflat.federation.run_folder import (
    LOCK_FILE, RunFolderError, claim_run_folder, holds_run_folder, release_run_folder,
)
from hf_fedflat.io import UnsafeWritePathError

from helpers import REPO_ROOT, forbid_loading
from helpers.runs import run

TINY = dict(num_rounds=2, save_every_n_rounds=1, fed_algorithm="fedavg", disable_tqdm=True)


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (the lock file's contents aside) and its bytes."""
    return {str(p.relative_to(folder)): (b"" if p.name == LOCK_FILE else p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def status(folder: Path) -> dict:
    return json.loads((folder / "run_status.json").read_text())


def hold_lock(folder: Path, pid: int = 4242) -> int:
    """A live holder, as another run leaves it: the lock file locked through another open file description."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": pid, "host": "elsewhere", "started": "2026-01-01T00:00:00+00:00",
                             "run_id": "0123456789abcdef"}).encode())
    return fd


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed tiny run (2 rounds, a checkpoint each): copied by the cases that need another run's folder."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    run(folder, **TINY)
    return folder


def copy_of(finished: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "run"
    shutil.copytree(finished, target)
    return target


# --- the lock -----------------------------------------------------------------------------------------------
def test_a_held_folder_is_refused_naming_the_holder_and_left_alone(tmp_path):
    folder = tmp_path / "run"
    fd = hold_lock(folder)
    try:
        before = files(folder)
        with pytest.raises(RunFolderError, match=r"^output_dir: .*run is in use by another run \(pid 4242 on "
                                                 r"elsewhere, started 2026-01-01T00:00:00\+00:00, run 0123456789abcdef\)"):
            run(folder, **TINY)
        assert files(folder) == before  # nothing written: no status, no history, no checkpoint
    finally:
        os.close(fd)


def test_the_cli_refuses_a_held_folder_before_data_loads_with_one_line_and_status_2(tmp_path, capsys, monkeypatch):
    forbid_loading(monkeypatch)
    folder = tmp_path / "run"
    fd = hold_lock(folder)
    try:
        code = cli.main(["train", "--dataset_name", "digits", "--output_dir", str(folder), "--num_rounds", "1"])
    finally:
        os.close(fd)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT
    assert err[-1].startswith("hf-fedflat train: error: output_dir: ") and "pid 4242 on elsewhere" in err[-1]
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]


HOLDER = textwrap.dedent("""
    import os, sys, time
    from types import SimpleNamespace
    from hf_fedflat.federation.run_folder import claim_run_folder
    claim_run_folder(SimpleNamespace(output_dir=sys.argv[1], overwrite_output_dir=False))
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_killed_holder_releases_the_folder(tmp_path):
    """A real second process: it claims the folder, is SIGKILLed; the OS drops its lock, and the next run takes the
    folder (its run_status.json said running: a stale status with no live holder)."""
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match=f"in use by another run \\(pid {holder.pid} "):
            run(folder, **TINY)
        assert status(folder)["status"] == "running" and status(folder)["pid"] == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the holder's status is all the folder holds: a start that died before any round; replaced on request
    with pytest.raises(RunFolderError, match=r"holds another run's files \(run_status.json \(status 'running'"):
        run(folder, **TINY)
    _, output = run(folder, overwrite_output_dir=True, **TINY)
    assert status(folder)["status"] == "completed" and len(output.history) == 2


def test_only_the_main_process_locks_and_the_claim_is_reentrant(tmp_path):
    class Other:  # a non-main process of a multi-process run: it receives the main one's claim
        is_main, distributed = False, True

        def broadcast_object(self, obj):
            return ("claimed", "feedfacecafebeef", "2026-01-01T00:00:00+00:00", False)

    from types import SimpleNamespace

    args = SimpleNamespace(output_dir=str(tmp_path / "run"), overwrite_output_dir=False)
    folder = claim_run_folder(args, comm=Other())
    assert folder.run_id == "feedfacecafebeef" and not folder.is_holder and not (tmp_path / "run").exists()
    release_run_folder(folder)
    main = claim_run_folder(args)
    try:
        assert main.is_holder and holds_run_folder(tmp_path / "run") and claim_run_folder(args) is main
        assert json.loads((tmp_path / "run" / LOCK_FILE).read_text())["run_id"] == main.run_id == status(
            tmp_path / "run")["run_id"]
    finally:
        release_run_folder(main)
    assert not holds_run_folder(tmp_path / "run")


# --- another run's files ------------------------------------------------------------------------------------
def keep_only(*kept):
    """Leave only ``kept`` of the run's outputs in the folder."""
    import shutil

    def prepare(folder: Path) -> None:
        for name in ("run_status.json", "history.json", "checkpoints", "final_model"):
            if name not in kept:
                shutil.rmtree(folder / name) if (folder / name).is_dir() else os.unlink(folder / name)
    return prepare


REFUSED = [  # (what the folder holds, what the message names)
    ("a finished run", keep_only("run_status.json", "history.json", "checkpoints", "final_model"),
     r"run_status.json \(status 'completed', run [0-9a-f]{16}\), checkpoints/round-1..round-2, final_model/, "
     r"history.json"),
    ("checkpoints only", keep_only("checkpoints"), r"\(checkpoints/round-1..round-2\)"),
    ("a final model only", keep_only("final_model"), r"\(final_model/\)"),
    ("a run status only", keep_only("run_status.json"), r"\(run_status.json \(status 'completed'"),
    ("a history only", keep_only("history.json"), r"\(history.json\)"),
]


@pytest.mark.parametrize("case, prepare, named", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_folder_holding_another_run_is_refused_naming_it_and_the_ways_out(tmp_path, finished, case, prepare, named):
    folder = copy_of(finished, tmp_path)
    prepare(folder)
    before = files(folder)
    with pytest.raises(RunFolderError, match=named) as refused:
        run(folder, **{**TINY, "local_steps": 3})
    message = str(refused.value)
    assert "--overwrite_output_dir true" in message and "--resume_from_checkpoint latest" in message
    assert "\n" not in message and files(folder) == before


def test_overwrite_output_dir_replaces_the_old_run_and_keeps_other_files(tmp_path, finished):
    folder = copy_of(finished, tmp_path)
    old = status(folder)["run_id"]
    (folder / "notes.txt").write_text("mine")
    (folder / "sweep_member.json").write_text("{}")
    trainer, output = run(folder, overwrite_output_dir=True, **{**TINY, "num_rounds": 1})
    new = status(folder)
    assert new["status"] == "completed" and new["run_id"] != old and new["run_id"] == trainer.run_folder.run_id
    # one run's files: the new run's checkpoint only, its final model, and the files that were not a run's
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["round-1"]
    meta = json.loads((folder / "checkpoints" / "round-1" / "federated_state.json").read_text())
    assert meta["run_id"] == new["run_id"]
    assert json.loads((folder / "final_model" / "federated_config.json").read_text())["run_id"] == new["run_id"]
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "sweep_member.json").exists()
    assert len(json.loads((folder / "history.json").read_text())) == 1


def test_overwrite_with_a_resume_of_the_same_folder_is_refused(tmp_path, finished):
    folder = copy_of(finished, tmp_path)
    before = files(folder)
    with pytest.raises(RunFolderError, match=r"^overwrite_output_dir: it would delete the checkpoints"):
        run(folder, overwrite_output_dir=True, resume="latest", **TINY)
    assert files(folder) == before


def test_a_resume_continues_the_folder_s_run_and_refuses_another_run_s_checkpoint(tmp_path, finished):
    from hf_fedflat.federation import CheckpointError

    folder = copy_of(finished, tmp_path)
    run_id = status(folder)["run_id"]
    _, output = run(folder, resume="latest", **{**TINY, "num_rounds": 3})
    assert [r["round"] for r in output.history] == [1, 2, 3] and status(folder)["run_id"] == run_id
    other = tmp_path / "other"
    run(other, **TINY)
    before = files(folder)
    with pytest.raises(CheckpointError, match=rf"^run_id: the checkpoint .*other/checkpoints/round-2 belongs to run "
                                              rf"[0-9a-f]{{16}}, the run in .*run is {run_id}"):
        run(folder, resume=str(other / "checkpoints" / "round-2"), **{**TINY, "num_rounds": 4})
    assert files(folder) == before  # the refused resume left the folder's status as it was


def test_a_resume_into_an_empty_folder_continues_the_checkpoint_s_run(tmp_path, finished):
    fresh = tmp_path / "fresh"
    _, output = run(fresh, resume=str(finished / "checkpoints" / "round-2"), **{**TINY, "num_rounds": 3})
    assert [r["round"] for r in output.history] == [1, 2, 3]
    assert status(fresh)["run_id"] == status(finished)["run_id"]


def test_a_resume_from_another_run_s_checkpoint_never_writes_into_a_folder_of_another_run(tmp_path, finished):
    """The folder has no run_status.json (so no recorded run id) but its own checkpoints: the run ids come from them."""
    folder = copy_of(finished, tmp_path)
    (folder / "run_status.json").unlink()
    other = tmp_path / "other"
    run(other, **TINY)
    before = files(folder)
    with pytest.raises(RunFolderError) as refused:
        run(folder, resume=str(other / "checkpoints" / "round-2"), **{**TINY, "num_rounds": 4})
    own = json.loads((folder / "checkpoints" / "round-1" / "federated_state.json").read_text())["run_id"]
    theirs = json.loads((other / "checkpoints" / "round-2" / "federated_state.json").read_text())["run_id"]
    assert str(refused.value) == (
        f"resume_from_checkpoint: {other / 'checkpoints' / 'round-2'} belongs to run {theirs}, but {folder} holds "
        f"checkpoints of run {own} (round-1); resume into an empty output_dir (or that run's own folder), or resume "
        f"{folder}'s own run with --resume_from_checkpoint latest.")
    assert files(folder) == before


# --- entries of the wrong kind, refused before anything is written ------------------------------------------
def _file(name):
    return lambda folder: (folder / name).write_text("not the run's")


def _folder(name):
    return lambda folder: (folder / name).mkdir()


WRONG_KIND = [  # (case, how the folder is prepared, extra arguments, the one line after "error: ")
    ("a file named checkpoints", _file("checkpoints"), [],
     "output_dir: {out}/checkpoints is a file where the run keeps its checkpoints/ folder; move or delete it (or "
     "choose another output_dir)."),
    ("a file named final_model", _file("final_model"), [],
     "output_dir: {out}/final_model is a file where the run keeps its final_model/ folder; move or delete it (or "
     "choose another output_dir)."),
    ("run.lock is a folder", _folder("run.lock"), [],
     "output_dir: {out}/run.lock is a folder where the run writes its run.lock file; move or delete it (or choose "
     "another output_dir)."),
    ("run_status.json is a folder", _folder("run_status.json"), [],
     "output_dir: {out}/run_status.json is a folder where the run writes its run_status.json file; move or delete it "
     "(or choose another output_dir)."),
    ("history.json is a folder", _folder("history.json"), [],
     "output_dir: {out}/history.json is a folder where the run writes its history.json file; move or delete it (or "
     "choose another output_dir)."),
    ("client_state_dir names a file", _file("states"), ["--client_state_dir", "{out}/states"],
     "client_state_dir: {out}/states is a file; name a folder (new or existing) for the clients' states."),
    ("output_dir is a file", lambda folder: folder.rmdir() or folder.write_text("x"), [],
     "output_dir: {out} exists and is not a folder; pass a folder (it is created if missing)."),
]


@pytest.mark.parametrize("case, prepare, extra, line", WRONG_KIND, ids=[w[0] for w in WRONG_KIND])
def test_an_entry_of_the_wrong_kind_is_one_line_before_data_loads(tmp_path, capsys, monkeypatch, case, prepare, extra,
                                                                  line):
    forbid_loading(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    prepare(out)
    before = files(out) if out.is_dir() else out.read_bytes()
    capsys.readouterr()
    code = cli.main(["train", "--dataset_name", "digits", "--output_dir", str(out), "--num_rounds", "1",
                     *[a.format(out=out) for a in extra]])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == EXIT_BAD_INPUT
    assert err == ["hf-fedflat train: error: " + line.format(out=out)]
    assert (files(out) if out.is_dir() else out.read_bytes()) == before


# --- run_status.json from the start to every end -------------------------------------------------------------
class Raise(FederatedCallback):
    def __init__(self, error):
        self.error, self.seen = error, []

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        self.seen.append(status(Path(trainer.args.output_dir)))
        if round_index == 1:
            raise self.error


@pytest.mark.parametrize("error, reason", [
    (RuntimeError("disk full"), "RuntimeError: disk full"),
    (KeyboardInterrupt(), "KeyboardInterrupt"),
], ids=["error", "keyboard interrupt"])
def test_run_status_says_running_from_the_start_and_interrupted_with_the_reason(tmp_path, error, reason):
    callback = Raise(error)
    with pytest.raises(type(error)):
        run(tmp_path, callbacks=[callback], **{**TINY, "num_rounds": 3})
    assert callback.seen[0]["status"] == "running" and callback.seen[0]["run_id"]
    ended = status(tmp_path)
    assert ended["status"] == "interrupted" and ended["reason"] == reason and ended["rounds_run"] == 1
    assert ended["run_id"] == callback.seen[0]["run_id"] and not (tmp_path / "final_model").exists()
    assert not holds_run_folder(tmp_path)  # released: the next run may resume it
    _, output = run(tmp_path, resume="latest", **{**TINY, "num_rounds": 3})
    assert status(tmp_path)["status"] == "completed" and status(tmp_path)["run_id"] == ended["run_id"]


def test_a_refused_start_leaves_no_status_and_a_failed_run_says_failed(tmp_path):
    from hf_fedflat.federation import CheckpointError

    with pytest.raises(CheckpointError, match="no round-<k> checkpoint"):
        run(tmp_path, resume="latest", **TINY)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]
    with pytest.raises(TrainingFailedError):
        run(tmp_path, max_update_norm=1e-12, **TINY)
    assert status(tmp_path)["status"] == "failed" and status(tmp_path)["reason"].startswith("No round aggregated")


# --- temporary folders: their writer's, removed once it is gone ------------------------------------------------
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_leftovers_are_removed_only_by_the_lock_holder_and_only_when_their_writer_is_gone(tmp_path):
    from types import SimpleNamespace

    root = tmp_path / "run" / "checkpoints"
    live, dead = os.getppid(), dead_pid()
    names = [f".tmp-round-3-{live}", f".tmp-round-4-{dead}", f".old-round-2-{dead}"]
    for name in names:
        (root / name).mkdir(parents=True)
    recover_interrupted(root)  # not holding the folder: nothing is touched
    assert sorted(p.name for p in root.iterdir()) == sorted(names)
    # (a folder holding only leftovers holds a run: a new run is refused, a resume takes it)
    folder = claim_run_folder(SimpleNamespace(output_dir=str(tmp_path / "run"), overwrite_output_dir=False), "latest")
    try:
        recover_interrupted(root)
    finally:
        release_run_folder(folder)
    # the live writer's folder stays; the dead one's are gone (round-2, whose save was cut between its renames,
    # is put back)
    assert sorted(p.name for p in root.iterdir()) == sorted([f".tmp-round-3-{live}", "round-2"])


def test_a_symlinked_loggers_folder_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "runs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeWritePathError, match="runs"):
        run(folder, **TINY)
    assert sorted(p.name for p in folder.iterdir()) == ["runs"]


def test_the_next_start_puts_back_a_final_model_a_killed_save_left_hidden(tmp_path, finished):
    from types import SimpleNamespace

    folder = copy_of(finished, tmp_path)
    before = files(folder / "final_model")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    hidden = folder / f".final_model.old-{int(gone.stdout)}-x1y2"  # as a save killed between its renames leaves it
    hidden.mkdir()
    os.replace(folder / "final_model", hidden / "final_model")
    claimed = claim_run_folder(SimpleNamespace(output_dir=str(folder), overwrite_output_dir=False), resume="latest")
    try:
        assert files(folder / "final_model") == before and not hidden.exists()
    finally:
        release_run_folder(claimed)
