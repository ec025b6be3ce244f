"""Tests of hf_fedflat.models: the factory, the Trainer contract and Hugging Face save/load."""

from __future__ import annotations

import json
import os
from functools import partial

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForImageClassification, Trainer, TrainingArguments
from transformers.modeling_outputs import ImageClassifierOutput

from hf_fedflat.models import (
    FedFlatClassifierConfig,
    FedFlatImageClassifier,
    available_models,
    batchnorm_modules,
    create_model,
    has_batchnorm,
    load_model,
)

NUM_CLASSES = 10
TINY_VIT = dict(patch_size=8, depth=2, embed_dim=64, num_heads=2)

# (id, name, kwargs): the three architectures the federated experiments use, at test size.
SPECS = [
    ("small_cnn", "small_cnn", dict(in_chans=1, image_size=32)),
    ("resnet18_gn", "resnet18_gn", dict(in_chans=3, image_size=32)),
    ("resnet18_gn_cifar", "resnet18_gn", dict(in_chans=3, image_size=32, cifar_stem=True)),
    ("tiny_vit", "vit_tiny_patch16_224", dict(in_chans=1, image_size=32, **TINY_VIT)),
]
IDS = [s[0] for s in SPECS]


def _make(name, kwargs, seed=0, num_classes=NUM_CLASSES):
    torch.manual_seed(seed)
    return create_model(name, num_classes, **kwargs)


def _batch(kwargs, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, kwargs["in_chans"], kwargs["image_size"], kwargs["image_size"], generator=g)
    y = torch.arange(n) % NUM_CLASSES
    return x, y


def _state_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("_id,name,kwargs", SPECS, ids=IDS)
def test_forward_shapes_and_loss(_id, name, kwargs):
    model = _make(name, kwargs).eval()
    x, y = _batch(kwargs)
    out = model(pixel_values=x, labels=y)
    assert isinstance(out, ImageClassifierOutput)
    assert out.logits.shape == (4, NUM_CLASSES)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, y), rtol=0, atol=0)
    assert out.loss.ndim == 0

    no_labels = model(x)
    assert no_labels.loss is None
    assert "loss" not in no_labels  # a ModelOutput drops None fields
    torch.testing.assert_close(no_labels.logits, out.logits, rtol=0, atol=0)


@pytest.mark.parametrize("_id,name,kwargs", SPECS, ids=IDS)
def test_same_seed_same_init_and_parameter_order(_id, name, kwargs):
    a, b = _make(name, kwargs, seed=0), _make(name, kwargs, seed=0)
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    assert _state_equal(a, b)
    c = _make(name, kwargs, seed=1)
    assert not _state_equal(a, c)


def test_backbone_keeps_its_own_initialisation():
    """post_init() must not re-draw timm's weights from N(0, 0.02) (transformers 5.x default)."""
    torch.manual_seed(0)
    model = create_model("resnet18_gn", NUM_CLASSES)
    torch.manual_seed(0)
    gn2 = partial(timm.layers.GroupNorm, num_groups=2)
    ref = timm.create_model("resnet18", num_classes=NUM_CLASSES, norm_layer=gn2)
    torch.testing.assert_close(model.backbone.conv1.weight, ref.conv1.weight, rtol=0, atol=0)
    # timm zero-initialises the last norm of each residual block; a generic init would set it to 1.
    assert torch.count_nonzero(model.backbone.layer1[0].bn2.weight) == 0


@pytest.mark.parametrize("cifar_stem", [False, True])
def test_resnet18_gn_has_only_groupnorm_with_two_groups(cifar_stem):
    model = create_model("resnet18_gn", NUM_CLASSES, cifar_stem=cifar_stem)
    assert not has_batchnorm(model)
    assert batchnorm_modules(model) == []
    gns = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    # bn1 + 2 per BasicBlock x 8 blocks + 3 downsample norms
    assert len(gns) == 1 + 16 + 3
    assert all(m.num_groups == 2 for m in gns)
    assert not any("running_mean" in k for k in model.state_dict())
    if cifar_stem:
        assert model.backbone.conv1.kernel_size == (3, 3) and model.backbone.conv1.stride == (1, 1)
        assert isinstance(model.backbone.maxpool, nn.Identity)
    # custom group count
    model4 = create_model("resnet18_gn", NUM_CLASSES, gn_groups=4)
    assert {m.num_groups for m in model4.modules() if isinstance(m, nn.GroupNorm)} == {4}


def test_has_batchnorm_detects_batchnorm():
    assert has_batchnorm(timm.create_model("resnet18", num_classes=2))
    assert has_batchnorm(nn.Sequential(nn.Conv2d(1, 2, 3), nn.SyncBatchNorm(2)))
    assert not has_batchnorm(create_model("small_cnn", 2, in_chans=1))
    assert not has_batchnorm(create_model("vit_tiny_patch16_224", 2, in_chans=1, **TINY_VIT))


@pytest.mark.parametrize("_id,name,kwargs", SPECS, ids=IDS)
def test_save_pretrained_round_trip_is_bit_identical(_id, name, kwargs, tmp_path):
    model = _make(name, kwargs).eval()
    x, _ = _batch(kwargs)
    with torch.no_grad():
        expected = model(x).logits
    model.save_pretrained(tmp_path)

    files = sorted(os.listdir(tmp_path))
    assert "config.json" in files and "model.safetensors" in files
    assert not any(f.endswith(".bin") for f in files)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "hf_fedflat_classifier"
    assert cfg["architecture"] == name and cfg["num_classes"] == NUM_CLASSES
    assert cfg["in_chans"] == kwargs["in_chans"] and cfg["image_size"] == kwargs["image_size"]

    for loaded in (
        load_model(tmp_path),
        FedFlatImageClassifier.from_pretrained(tmp_path),
        AutoModelForImageClassification.from_pretrained(tmp_path),
    ):
        assert type(loaded) is FedFlatImageClassifier
        assert _state_equal(model, loaded)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x).logits, expected, rtol=0, atol=0)


def test_round_trip_restores_non_persistent_buffers(tmp_path):
    """transformers 5.x leaves non-persistent buffers uninitialised on load; Swin needs them."""
    kwargs = dict(in_chans=3, image_size=32, window_size=4, depths=(1, 1), num_heads=(2, 2), embed_dim=32)
    model = _make("swin_tiny_patch4_window7_224", kwargs).eval()
    x, _ = _batch(kwargs)
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    for (n, a), (_, b) in zip(model.named_buffers(), loaded.named_buffers()):
        assert torch.equal(a, b), n
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)


def test_missing_checkpoint_keys_are_initialised(tmp_path):
    model = _make("small_cnn", dict(in_chans=1, image_size=32))
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    sd = load_file(tmp_path / "model.safetensors")
    del sd["backbone.fc2.weight"]
    save_file(sd, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model(tmp_path)
    w = loaded.backbone.fc2.weight
    assert torch.isfinite(w).all() and 0.005 < w.std() < 0.05  # freshly drawn, not garbage
    torch.testing.assert_close(loaded.backbone.fc1.weight, model.backbone.fc1.weight, rtol=0, atol=0)


@pytest.fixture(scope="module")
def training_args(tmp_path_factory):
    # One TrainingArguments per process: building new ones resets accelerate's global state.
    return TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("trainer")),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=1e-2,
        remove_unused_columns=False,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


class _TinyImages(torch.utils.data.Dataset):
    def __init__(self, kwargs, n):
        self.x, self.y = _batch(kwargs, n=n, seed=1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


@pytest.mark.parametrize("_id,name,kwargs", SPECS, ids=IDS)
def test_trainer_step_changes_weights_and_eval_keeps_all_samples(_id, name, kwargs, training_args):
    model = _make(name, kwargs)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = Trainer(model=model, args=training_args, train_dataset=_TinyImages(kwargs, 8))
    result = trainer.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert changed, "one Trainer step did not change any weight"

    # 6 samples with batch 4: the last, partial batch must not be dropped (needs loss + logits).
    pred = trainer.predict(_TinyImages(kwargs, 6))
    assert pred.predictions.shape == (6, NUM_CLASSES)
    assert "test_loss" in pred.metrics


def test_unknown_name_lists_available_names():
    with pytest.raises(ValueError) as err:
        create_model("resnet18_bn_typo", NUM_CLASSES)
    msg = str(err.value)
    assert "resnet18_bn_typo" in msg
    for name in available_models():
        assert name in msg
    assert "timm" in msg
    assert available_models() == ["small_cnn", "resnet18_gn", "fedgam_cnn", "logistic", "char_lstm", "char_transformer",
                                  "word_lstm"]
    assert "vit_tiny_patch16_224" in available_models(include_timm=True)


def test_invalid_kwargs_are_rejected():
    with pytest.raises(TypeError, match="JSON"):
        create_model("small_cnn", NUM_CLASSES, conv_channels=object())
    with pytest.raises(ValueError, match="image_size"):
        create_model("vit_tiny_patch16_224", NUM_CLASSES, img_size=32, **TINY_VIT)
    with pytest.raises(ValueError, match="pretrained_path"):
        create_model("small_cnn", NUM_CLASSES, pretrained=True)
    with pytest.raises(FileNotFoundError):
        create_model("vit_tiny_patch16_224", NUM_CLASSES, pretrained_path="/nonexistent.safetensors", **TINY_VIT)
    with pytest.raises(FileNotFoundError):
        load_model("/nonexistent_dir")


@pytest.mark.parametrize("_id,name,kwargs", SPECS, ids=IDS)
def test_pretrained_path_loads_local_weights(_id, name, kwargs, tmp_path):
    source = _make(name, kwargs, seed=1)
    path = tmp_path / "weights.safetensors"
    save_file(source.backbone.state_dict(), str(path))  # a plain timm / SmallCNN state dict
    torch.manual_seed(2)  # a different seed: equal weights can only come from the file
    loaded = create_model(name, NUM_CLASSES, pretrained_path=str(path), **kwargs)
    assert _state_equal(source.backbone, loaded.backbone)
    assert loaded.config.model_kwargs == {k: v for k, v in kwargs.items() if k not in ("in_chans", "image_size")}


def test_pretrained_path_with_other_head_size_reinitialises_only_the_head(tmp_path):
    kwargs = dict(in_chans=1, image_size=32, **TINY_VIT)
    source = _make("vit_tiny_patch16_224", kwargs, seed=1)
    path = tmp_path / "weights.safetensors"
    save_file(source.backbone.state_dict(), str(path))
    loaded = create_model("vit_tiny_patch16_224", 5, pretrained_path=str(path), **kwargs)
    src, dst = source.backbone.state_dict(), loaded.backbone.state_dict()
    assert dst["head.weight"].shape == (5, 64)
    assert all(torch.equal(src[k], dst[k]) for k in src if not k.startswith("head."))


def test_batchnorm_resnet_checkpoint_loads_into_resnet18_gn(tmp_path):
    bn = timm.create_model("resnet18", num_classes=1000)
    path = tmp_path / "resnet18_bn.pth"
    torch.save(bn.state_dict(), path)
    model = create_model("resnet18_gn", NUM_CLASSES, in_chans=1, pretrained_path=str(path))
    gn = model.backbone
    torch.testing.assert_close(gn.layer4[1].conv2.weight, bn.layer4[1].conv2.weight, rtol=0, atol=0)
    torch.testing.assert_close(gn.layer1[0].bn1.weight, bn.layer1[0].bn1.weight, rtol=0, atol=0)
    # 3-channel stem summed to 1 channel by timm; 1000-class head replaced
    torch.testing.assert_close(gn.conv1.weight, bn.conv1.weight.sum(1, keepdim=True))
    assert gn.fc.weight.shape == (NUM_CLASSES, 512)
    assert not has_batchnorm(model)


def test_config_rebuilds_architecture_without_factory():
    cfg = FedFlatClassifierConfig(
        architecture="vit_tiny_patch16_224", num_classes=3, in_chans=1, image_size=32, model_kwargs=TINY_VIT
    )
    model = FedFlatImageClassifier(cfg)
    assert model(torch.zeros(2, 1, 32, 32)).logits.shape == (2, 3)
    assert len(model.backbone.blocks) == 2


def test_config_validates_types_and_keeps_num_labels_in_line():
    with pytest.raises(Exception, match="num_classes"):
        FedFlatClassifierConfig(num_classes="ten")
    cfg = FedFlatClassifierConfig(architecture="small_cnn", num_classes=7)
    assert cfg.num_labels == 7
    assert create_model("small_cnn", 7, in_chans=1).config.num_labels == 7
