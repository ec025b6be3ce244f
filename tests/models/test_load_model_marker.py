"""``load_model`` checks a saved folder against the completion marker hf_fedflat writes last into it
(``hf_fedflat_complete.json``): a flipped byte, another run's weights copied in or a missing file is refused naming
the file; a folder without a marker (a plain ``save_pretrained``, a Hub download) loads as it is. A save replacing
the folder swaps it in one step, and a save killed between two renames (where no swap is possible) leaves the previous
folder, which load_model puts back."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from hf_fedflat.io import COMPLETE_MARKER, IncompleteSaveError, atomic_write_dir
from hf_fedflat.models import create_model, load_model
from hf_fedflat.models.factory import FEDFLAT_SUBFOLDER


def small(seed: int):
    torch.manual_seed(seed)
    return create_model("small_cnn", 3, in_chans=1, image_size=8)


def saved(folder: Path, seed: int = 0, subfolder: str = "") -> Path:
    """A folder as ``FederatedTrainer.save_model`` writes one: ``save_pretrained`` output, then the marker."""
    atomic_write_dir(folder, lambda d: small(seed).save_pretrained(os.path.join(d, subfolder)))
    return folder / subfolder if subfolder else folder


def flip_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x01
    path.write_bytes(bytes(raw))


def other_run_s_weights(folder: Path) -> None:
    shutil.copy(saved(folder.parent / "other", seed=1) / "model.safetensors", folder / "model.safetensors")


# (case, what is done to the saved folder, the file the refusal names or None when it loads)
CASES = [
    ("intact", lambda f: None, None),
    ("a flipped byte in the weights", lambda f: flip_byte(f / "model.safetensors"), "model.safetensors"),
    ("another run's weights copied in", other_run_s_weights, "model.safetensors"),
    ("config.json edited", lambda f: (f / "config.json").write_text((f / "config.json").read_text() + " "),
     "config.json"),
    ("config.json deleted", lambda f: (f / "config.json").unlink(), "config.json"),
    ("no marker (a plain save_pretrained)", lambda f: (f / COMPLETE_MARKER).unlink(), None),
]


@pytest.mark.parametrize("case, tamper, named", CASES, ids=[c[0] for c in CASES])
def test_load_model_checks_the_completion_marker(tmp_path, case, tamper, named):
    folder = saved(tmp_path / "final_model")
    tamper(folder)
    if named is None:
        model = load_model(folder)
        expected = small(0).state_dict()
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
        return
    with pytest.raises(IncompleteSaveError, match=rf"{folder / named}: "):
        load_model(folder)


def test_the_hf_fedflat_subfolder_is_checked_against_its_parent_s_marker(tmp_path):
    inner = saved(tmp_path / "final_model", subfolder=FEDFLAT_SUBFOLDER)
    assert not (inner / COMPLETE_MARKER).exists()
    load_model(inner)
    flip_byte(inner / "model.safetensors")
    with pytest.raises(IncompleteSaveError, match=rf"{inner / 'model.safetensors'}: size or SHA-256 differs"):
        load_model(inner)
    load_model(inner, verify=False)  # asked for: loads what is there


SWAP_KILL = r"""
import os, signal, sys
import torch
import hf_fedflat.io as io
from hf_fedflat.models import create_model

real_replace = os.replace
io._exchange = lambda first, second: False  # a file system that cannot swap: the two renames

def replace_then_die(source, target):
    real_replace(source, target)
    os.kill(os.getpid(), signal.SIGKILL)  # between the two renames: the old folder hidden, the new not in place

io.os.replace = replace_then_die
torch.manual_seed(1)
io.atomic_write_dir(sys.argv[1], create_model("small_cnn", 3, in_chans=1, image_size=8).save_pretrained)
"""


def test_a_final_save_killed_between_its_renames_leaves_the_previous_model_loadable(tmp_path):
    import subprocess
    import sys

    from helpers import REPO_ROOT

    folder = saved(tmp_path / "final_model", seed=0)
    result = subprocess.run([sys.executable, "-c", SWAP_KILL, str(folder)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == -9, result.stderr[-2000:]
    assert not folder.exists()  # hidden in .final_model.old-<pid>-*/final_model
    loaded = load_model(folder)  # puts it back, then loads it
    for name, tensor in small(0).state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    left = sorted(p.name for p in tmp_path.iterdir())  # and the new folder's temporary, the next save removes
    assert len(left) == 2 and left[0].startswith(".final_model.tmp-") and left[1] == "final_model"


def test_a_final_save_swaps_the_folder_in_one_step(tmp_path, monkeypatch):
    """Where the file system can swap (renameat2), the previous folder is exchanged with the new one: no rename
    leaves the path missing."""
    import hf_fedflat.io as io

    folder = saved(tmp_path / "final_model", seed=0)
    seen = []
    real = io._exchange
    monkeypatch.setattr(io, "_exchange", lambda first, second: seen.append(second.exists()) or real(first, second))
    monkeypatch.setattr(io.os, "replace", lambda *a: pytest.fail("renamed instead of swapped"))
    saved(folder, seed=1)
    assert seen == [True]
    for name, tensor in small(1).state_dict().items():
        assert torch.equal(load_model(folder).state_dict()[name], tensor), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]
