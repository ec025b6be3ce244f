"""Image datasets and transforms (``hf_fedflat.data.images``): the padded random crop and flip, offline errors of
every image loader, timm's transforms and data configs."""

from __future__ import annotations

import time

import numpy as np
import pytest
import timm
import timm.data
import torch
from PIL import Image

from hf_fedflat.data import (
    DatasetUnavailableError,
    image_transform,
    load_cifar,
    load_domain_dataset,
    load_mnist,
    resolve_data_config,
    timm_transform,
)

from helpers.images import TIMM_CONFIG as CONFIG


# --- train augmentation -----------------------------------------------------------------------


def crop_flip_candidates(image: torch.Tensor, padding: int) -> list[torch.Tensor]:
    c, h, w = image.shape
    padded = torch.nn.functional.pad(image, (padding,) * 4)
    crops = [padded[:, i:i + h, j:j + w] for i in range(2 * padding + 1) for j in range(2 * padding + 1)]
    return crops + [crop.flip(-1) for crop in crops]


def test_train_augmentation_is_a_padded_random_crop_and_flip():
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (10, 10, 3), dtype=np.uint8) for _ in range(4)]
    fn = image_transform(None, 0.0, 1.0, train_augmentation=True, padding=2)
    torch.manual_seed(0)
    outputs = [fn({"image": images, "label": [0, 1, 2, 3]})["pixel_values"] for _ in range(5)]
    seen = set()
    for out in outputs:
        for k, image in enumerate(images):
            source = torch.from_numpy(image).permute(2, 0, 1).float() / 255
            matches = [i for i, cand in enumerate(crop_flip_candidates(source, 2)) if torch.equal(cand, out[k])]
            assert len(matches) == 1
            seen.add(matches[0])
    assert len(seen) > 5  # offsets and flips actually vary


# --- offline errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "load,name",
    [(load_cifar, "uoft-cs/cifar10"), (load_cifar, "uoft-cs/cifar100"), (load_mnist, "ylecun/mnist"),
     (load_mnist, "zalando-datasets/fashion_mnist"), (load_domain_dataset, "flwrlabs/office-home")],
)
def test_unreachable_hub_name_says_pass_data_dir(tmp_path, load, name):
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailableError, match=r"Pass a local path via data_dir=\.\.\."):
        load(name, cache_dir=tmp_path)
    assert time.perf_counter() - start < 10  # HF_HUB_OFFLINE=1 (conftest): no retries


def test_missing_local_folder(tmp_path):
    with pytest.raises(DatasetUnavailableError, match="^data_dir: '.*nope' is not an existing folder"):
        load_cifar(data_dir=tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="name_or_path="):
        load_domain_dataset(str(tmp_path / "nope"))
    (tmp_path / "only_train" / "train" / "cat").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp_path / "only_train" / "train" / "cat" / "0.png")
    with pytest.raises(ValueError, match=r"missing \['test'\]"):
        load_cifar(data_dir=tmp_path / "only_train", cache_dir=tmp_path / "cache")


# --- timm data config -------------------------------------------------------------------------


def test_timm_transform_constant_image_size_and_normalisation():
    fn = timm_transform(CONFIG)
    batch = {"image": [Image.new("RGB", (8, 8), (51, 102, 204)), Image.new("L", (12, 7), 153)], "label": [1, 0]}
    out = fn(batch)
    assert out["pixel_values"].shape == (2, 3, 20, 20) and out["labels"].tolist() == [1, 0]
    mean, std = torch.tensor(CONFIG["mean"]).view(3, 1, 1), torch.tensor(CONFIG["std"]).view(3, 1, 1)
    rgb = torch.tensor([51, 102, 204], dtype=torch.float32).view(3, 1, 1) / 255
    torch.testing.assert_close(out["pixel_values"][0], ((rgb - mean) / std).expand(3, 20, 20), rtol=0, atol=1e-5)
    grey = torch.full((3, 1, 1), 153 / 255)  # grey image repeated to the 3 channels the model wants
    torch.testing.assert_close(out["pixel_values"][1], ((grey - mean) / std).expand(3, 20, 20), rtol=0, atol=1e-5)


def test_timm_transform_matches_timm_pipeline_and_crops_the_border():
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, (30, 24, 3), dtype=np.uint8)
    image = Image.fromarray(array)
    reference = timm.data.create_transform(**CONFIG, is_training=False)(image)
    out = timm_transform(CONFIG)({"image": [image]})["pixel_values"][0]
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    # crop_pct 0.5: resize 80 -> 40, centre crop 20: a black frame of 8 (then 4) pixels is cut off.
    framed = np.zeros((80, 80, 3), np.uint8)
    framed[8:72, 8:72] = 200
    plain = {**CONFIG, "mean": (0.0,) * 3, "std": (1.0,) * 3, "crop_pct": 0.5}
    out = timm_transform(plain)({"image": [Image.fromarray(framed)]})
    torch.testing.assert_close(out["pixel_values"], torch.full((1, 3, 20, 20), 200 / 255), rtol=0, atol=1e-6)


def test_resolve_data_config_from_models():
    from hf_fedflat.models import create_model

    rgb = timm.create_model("resnet18", pretrained=False, num_classes=3)
    assert resolve_data_config(rgb) == timm.data.resolve_model_data_config(rgb)  # 224, ImageNet stats
    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, depth=1, embed_dim=48, num_heads=2,
    )
    assert resolve_data_config(vit)["input_size"] == (3, 32, 32)  # the size the ViT was built for
    wrapped = create_model("resnet18", num_classes=3, in_chans=1, image_size=48)  # FedFlatImageClassifier
    config = resolve_data_config(wrapped)
    assert config["input_size"] == (1, 48, 48) and config["crop_pct"] == rgb.pretrained_cfg["crop_pct"]
    assert config["mean"] == pytest.approx((np.mean((0.485, 0.456, 0.406)),))
    assert config["std"] == pytest.approx((np.mean((0.229, 0.224, 0.225)),))
    out = timm_transform(wrapped)({"image": [Image.new("RGB", (32, 32), (10, 200, 30))]})["pixel_values"]
    luma = round(0.299 * 10 + 0.587 * 200 + 0.114 * 30) / 255  # colour -> grey as PIL's convert("L")
    expected = (luma - config["mean"][0]) / config["std"][0]
    assert out.shape == (1, 1, 48, 48)
    torch.testing.assert_close(out, torch.full_like(out, expected), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="not a timm model.*image_size"):
        resolve_data_config(create_model("small_cnn", num_classes=3, image_size=16))
    with pytest.raises(ValueError, match="data_config\\['mean'\\] has 2 values"):
        resolve_data_config({"input_size": (3, 8, 8), "mean": (0.1, 0.2)})


def test_evaluation_transforms_declare_themselves_deterministic():
    """Only a transform without random augmentation may have its evaluation batches kept (runtime.eval_data)."""
    from hf_fedflat.data.transforms import image_classification_transform

    assert image_transform(None, 0.5, 0.5, in_chans=1).deterministic is True
    assert image_transform(None, 0.5, 0.5, in_chans=1, train_augmentation=True).deterministic is False
    assert timm_transform(CONFIG).deterministic is True
    assert timm_transform(CONFIG, train_augmentation=True).deterministic is False
    assert image_classification_transform(8, 0.5, 0.5).deterministic is True
