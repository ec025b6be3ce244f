"""Tiny-ImageNet (``hf_fedflat.data.tiny_imagenet``) from a generated ``tiny-imagenet-200`` tree and a Hub copy's
layout: validation annotations, class names, the valid split as the test split."""

from __future__ import annotations

import datasets
import pytest
from PIL import Image


def test_tiny_imagenet_val_annotations_and_class_names(tmp_path):
    from hf_fedflat.data.tiny_imagenet import load_tiny_imagenet, write_tiny_imagenet

    base = write_tiny_imagenet(tmp_path, num_classes=4, train_per_class=3, val_per_class=2, size=16)
    data, names = load_tiny_imagenet("zh-plus/tiny-imagenet", data_dir=str(tmp_path))  # the folder above
    wnids = (base / "wnids.txt").read_text().split()
    assert data["train"].features["label"].names == wnids and names == [f"thing {c}" for c in range(4)]
    raw = data["test"].cast_column("image", datasets.Image(decode=False))
    annotations = [line.split("\t")[:2] for line in (base / "val" / "val_annotations.txt").read_text().splitlines()]
    assert [(r["image"]["path"].rsplit("/", 1)[1], wnids[r["label"]]) for r in raw] == [tuple(a) for a in annotations]
    train = data["train"].cast_column("image", datasets.Image(decode=False))
    assert all(r["image"]["path"].split("/")[-3] == wnids[r["label"]] for r in train) and train.num_rows == 12
    lines = (base / "val" / "val_annotations.txt").read_text().splitlines()
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines[:2] + ["val_2.JPEG\tn99999999\t0\t0\t1\t1"]))
    with pytest.raises(ValueError, match=r"val_annotations.txt:3: class 'n99999999' of val_2.JPEG is not in wnids.txt"):
        load_tiny_imagenet(data_dir=str(base))
    (base / "words.txt").write_text(f"{wnids[0]}\tsame\n{wnids[1]}\tsame, other\n")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines))
    assert load_tiny_imagenet(data_dir=str(base))[1][:3] == [f"same ({wnids[0]})", f"same ({wnids[1]})", wnids[2]]
    (base / "val" / "images" / "val_0.JPEG").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 image\(s\) of .*val_annotations.txt are not in"):
        load_tiny_imagenet(data_dir=str(base))


def test_tiny_imagenet_hub_layout_valid_is_the_test_split(tmp_path):
    from hf_fedflat.data.tiny_imagenet import load_tiny_imagenet

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["n1", "n2"])})
    make = lambda n: datasets.Dataset.from_dict({"image": [Image.new("RGB", (64, 64))] * n, "label": [0, 1] * (n // 2)},
                                                features=features)
    datasets.DatasetDict({"train": make(4), "valid": make(2)}).save_to_disk(str(tmp_path / "hub"))
    data, names = load_tiny_imagenet(str(tmp_path / "hub"))
    assert data["train"].num_rows == 4 and data["test"].num_rows == 2 and names == ["n1", "n2"]
