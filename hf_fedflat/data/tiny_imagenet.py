"""Tiny-ImageNet: 200 ImageNet classes, 64x64 colour images (500 train and 50 validation images per class).

Sources (:func:`load_tiny_imagenet`):

* the standard download (``tiny-imagenet-200/`` of ``http://cs231n.stanford.edu/tiny-imagenet-200.zip``), via
  ``data_dir`` (the ``tiny-imagenet-200`` folder or the folder holding it)::

      wnids.txt                          the 200 class ids (WordNet ids), one per line: the class order here
      words.txt                          "<wnid>\\t<names, comma separated>" for all of WordNet (82,115 lines)
      train/<wnid>/images/<wnid>_<i>.JPEG
      val/images/val_<i>.JPEG            labels in val/val_annotations.txt:
      val/val_annotations.txt            "val_<i>.JPEG\\t<wnid>\\t<x0>\\t<y0>\\t<x1>\\t<y1>" (a bounding box)
      test/images/test_<i>.JPEG          no labels: not used

  The validation split (labelled) is the test split of a run, as in the federated papers.
* the Hub copy ``zh-plus/tiny-imagenet`` (``image``, ``label``; splits ``train`` and ``valid``) or a
  ``save_to_disk`` copy: ``valid`` becomes ``test``; its ``ClassLabel`` order is kept.

Class names (the model's ``id2label``) are the first name words.txt gives each wnid (``n01443537`` ->
``goldfish``), made unique by appending the wnid to a name two classes share. There is no natural partition:
the clients come from the partition arguments (Dirichlet, IID, ...), as for CIFAR. Images are decoded lazily
and normalised with Tiny-ImageNet's training mean/std (:data:`TINY_IMAGENET_MEAN`, :data:`TINY_IMAGENET_STD`);
about 2% of the images are greyscale JPEGs, converted to RGB by the transform.
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import numpy as np
from ..field_checks import ConfigError

__all__ = ["TINY_IMAGENET_HUB", "TINY_IMAGENET_MEAN", "TINY_IMAGENET_STD", "find_tiny_imagenet_root",
           "load_tiny_imagenet", "read_val_annotations", "read_wnid_names", "tiny_imagenet_from_folder",
           "write_tiny_imagenet"]

TINY_IMAGENET_HUB = "zh-plus/tiny-imagenet"
TINY_IMAGENET_MEAN = (0.4802, 0.4481, 0.3975)
TINY_IMAGENET_STD = (0.2770, 0.2691, 0.2821)
_LAYOUT = "wnids.txt, words.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG and val/val_annotations.txt"


def find_tiny_imagenet_root(path: str | os.PathLike) -> Path | None:
    """The folder holding ``wnids.txt`` and ``train/``: ``path`` or ``path/tiny-imagenet-200``; None otherwise."""
    path = Path(path).expanduser()
    for candidate in (path, path / "tiny-imagenet-200"):
        if (candidate / "wnids.txt").is_file() and (candidate / "train").is_dir():
            return candidate
    return None


def read_wnid_names(root: str | os.PathLike) -> tuple[list[str], list[str]]:
    """``(wnids, names)``: the class ids in ``wnids.txt`` order and a unique readable name for each (words.txt)."""
    root = Path(root)
    wnids = [line.strip() for line in (root / "wnids.txt").read_text().splitlines() if line.strip()]
    if len(set(wnids)) != len(wnids):
        raise ConfigError(f"{root / 'wnids.txt'}: a class id is listed twice.")
    words: dict[str, str] = {}
    words_file = root / "words.txt"
    if words_file.is_file():
        wanted = set(wnids)
        with open(words_file, encoding="utf-8") as handle:
            for line in handle:
                wnid, _, text = line.rstrip("\n").partition("\t")
                if wnid in wanted:
                    words[wnid] = text.split(",")[0].strip() or wnid
    names = [words.get(w, w) for w in wnids]
    counts = {n: names.count(n) for n in names}
    return wnids, [f"{n} ({w})" if counts[n] > 1 else n for n, w in zip(names, wnids)]


def read_val_annotations(root: str | os.PathLike, wnids: list[str]) -> list[tuple[str, int]]:
    """``[(image file name, class index)]`` of ``val/val_annotations.txt`` (file order), checked against
    ``wnids`` and ``val/images``.

    Raises:
        ValueError: a line without a file and a wnid, a wnid not in wnids.txt, a file listed twice (the message
            names the line); FileNotFoundError: annotated images missing from ``val/images``.
    """
    root = Path(root)
    path = root / "val" / "val_annotations.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; a Tiny-ImageNet folder has {_LAYOUT}.")
    index = {w: i for i, w in enumerate(wnids)}
    out, seen = [], set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise ConfigError(f"{path}:{number}: expected '<file>\\t<wnid>\\t<box>', got {line!r}.")
        name, wnid = fields[0].strip(), fields[1].strip()
        if wnid not in index:
            raise ConfigError(f"{path}:{number}: class {wnid!r} of {name} is not in wnids.txt.")
        if name in seen:
            raise ConfigError(f"{path}:{number}: {name} is annotated twice.")
        seen.add(name)
        out.append((name, index[wnid]))
    missing = [name for name, _ in out if not (root / "val" / "images" / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} image(s) of {path} are not in {root / 'val' / 'images'} "
                                f"(e.g. {missing[0]}).")
    return out


def tiny_imagenet_from_folder(root: str | os.PathLike) -> tuple[datasets.DatasetDict, list[str]]:
    """``(DatasetDict train/test, class names)`` from the standard layout (test = the labelled val split)."""
    found = find_tiny_imagenet_root(root)
    if found is None:
        raise FileNotFoundError(f"data_dir={str(root)!r} is not a Tiny-ImageNet folder: expected {_LAYOUT} (in it or "
                                "in its tiny-imagenet-200/).")
    wnids, names = read_wnid_names(found)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=wnids)})
    paths, labels = [], []
    for c, wnid in enumerate(wnids):
        folder = found / "train" / wnid / "images"
        files = sorted(p for p in folder.glob("*") if p.suffix.lower() in (".jpeg", ".jpg", ".png")) \
            if folder.is_dir() else []
        if not files:
            raise FileNotFoundError(f"{folder}: no images for class {wnid} of wnids.txt.")
        paths += [str(p) for p in files]
        labels += [c] * len(files)
    train = datasets.Dataset.from_dict({"image": paths, "label": labels}, features=features, split="train")
    val = read_val_annotations(found, wnids)
    test = datasets.Dataset.from_dict({"image": [str(found / "val" / "images" / n) for n, _ in val],
                                       "label": [c for _, c in val]}, features=features, split="test")
    return datasets.DatasetDict({"train": train, "test": test}), names


def load_tiny_imagenet(name_or_path: str = TINY_IMAGENET_HUB, *, data_dir: str | os.PathLike | None = None,
                       label_column: str | None = None, image_column: str | None = None,
                       cache_dir: str | os.PathLike | None = None) -> tuple[datasets.DatasetDict, list[str]]:
    """Tiny-ImageNet as ``(DatasetDict with train and test, class names)``, columns ``image`` and ``label``."""
    from .images import load_image_dataset, require_splits, standardize_columns

    for path in (data_dir, name_or_path):
        if path is not None and find_tiny_imagenet_root(path) is not None:
            return tiny_imagenet_from_folder(path)
    raw = load_image_dataset(name_or_path, data_dir=data_dir, cache_dir=cache_dir)
    if "test" not in raw and "valid" in raw:
        raw = datasets.DatasetDict({"train": raw["train"], "test": raw["valid"]}) if "train" in raw else raw
    require_splits(raw, ("train", "test"), "name_or_path/data_dir")
    data = standardize_columns(datasets.DatasetDict({"train": raw["train"], "test": raw["test"]}),
                               image_column=image_column, label_column=label_column or "label")
    return data, list(data["train"].features["label"].names)


def write_tiny_imagenet(root: str | os.PathLike, *, num_classes: int = 10, train_per_class: int = 6,
                        val_per_class: int = 2, size: int = 64, seed: int = 0) -> Path:
    """A tiny copy in the standard layout (``root/tiny-imagenet-200/...``, JPEG files, words.txt with other WordNet
    lines too, val annotations in shuffled order, a few greyscale images) for ``--smoke`` and tests."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = Path(root) / "tiny-imagenet-200"
    wnids = [f"n{1440000 + 7 * c:08d}" for c in range(num_classes)]
    (base / "train").mkdir(parents=True, exist_ok=True)
    (base / "wnids.txt").write_text("".join(f"{w}\n" for w in wnids))
    words = [f"n{99000000 + i:08d}\tunused entity {i}" for i in range(3)]
    words += [f"{w}\tthing {c}, object {c}" for c, w in enumerate(wnids)]
    (base / "words.txt").write_text("\n".join(words[::-1]) + "\n")
    colours = rng.uniform(40, 215, size=(num_classes, 3))

    def image(c: int) -> Image.Image:
        pixels = np.clip(colours[c] + rng.normal(0, 20, size=(size, size, 3)), 0, 255).astype(np.uint8)
        picture = Image.fromarray(pixels)
        return picture.convert("L") if rng.random() < 0.1 else picture

    for c, wnid in enumerate(wnids):
        folder = base / "train" / wnid / "images"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(train_per_class):
            image(c).save(folder / f"{wnid}_{i}.JPEG", format="JPEG", quality=90)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text(
            "".join(f"{wnid}_{i}.JPEG\t0\t0\t{size - 1}\t{size - 1}\n" for i in range(train_per_class)))
    (base / "val" / "images").mkdir(parents=True, exist_ok=True)
    (base / "test" / "images").mkdir(parents=True, exist_ok=True)
    classes = rng.permutation(np.repeat(np.arange(num_classes), val_per_class))
    lines = []
    for i, c in enumerate(classes):
        image(int(c)).save(base / "val" / "images" / f"val_{i}.JPEG", format="JPEG", quality=90)
        lines.append(f"val_{i}.JPEG\t{wnids[c]}\t0\t0\t{size - 1}\t{size - 1}")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    image(0).save(base / "test" / "images" / "test_0.JPEG", format="JPEG")
    return base
