"""The next-character models (``hf_fedflat.models.next_char``: the char LSTM of LEAF Shakespeare, also used for
Sent140, and a small causal transformer) and the factory names added with them."""

from __future__ import annotations

import json
import math
import os

import datasets
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments
from transformers.modeling_outputs import SequenceClassifierOutput

from hf_fedflat.models import (
    CharLSTMConfig,
    CharLSTMModel,
    CharTransformerConfig,
    CharTransformerModel,
    FedFlatImageClassifier,
    available_models,
    create_model,
    load_model,
)

# Tiny sizes for speed; the LEAF sizes are checked by parameter count only.
TINY_LSTM = dict(embedding_dim=3, hidden_size=6, num_layers=2)
TINY_TRANSFORMER = dict(d_model=16, num_layers=2, num_heads=2, max_length=12)
SPECS = [("char_lstm", TINY_LSTM), ("char_transformer", TINY_TRANSFORMER)]
IDS = [name for name, _ in SPECS]
VOCAB, LENGTH = 11, 12


def _make(name, kwargs, seed=0, **extra):
    torch.manual_seed(seed)
    return create_model(name, vocab_size=VOCAB, **kwargs, **extra)


def _ids(n=4, length=LENGTH, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, length), generator=g)


def _state_equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------------------------
# architecture
# ------------------------------------------------------------------------------------------------
def test_leaf_lstm_has_the_leaf_layers_and_parameter_count():
    model = create_model("char_lstm")  # LEAF defaults
    cfg = model.config
    assert (cfg.vocab_size, cfg.num_classes, cfg.embedding_dim, cfg.hidden_size, cfg.num_layers) == (80, 80, 8, 256, 2)
    assert model.embed.weight.shape == (80, 8)
    assert model.lstm.hidden_size == 256 and model.lstm.num_layers == 2 and model.lstm.batch_first
    assert model.head.weight.shape == (80, 256)

    def lstm_layer(inp, hidden):  # 4 gates, PyTorch keeps two bias vectors (b_ih, b_hh)
        return 4 * (hidden * (inp + hidden) + 2 * hidden)

    expected = 80 * 8 + lstm_layer(8, 256) + lstm_layer(256, 256) + (256 * 80 + 80)
    assert expected == 819_920
    assert sum(p.numel() for p in model.parameters()) == expected
    logits = model(torch.zeros(3, 80, dtype=torch.long)).logits
    assert logits.shape == (3, 80)


def test_default_transformer_parameter_count():
    model = create_model("char_transformer")
    cfg = model.config
    assert (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.max_length, cfg.num_classes) == (128, 2, 4, 80, 80)
    d, v, length, c = 128, 80, 80, 80
    block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    expected = v * d + length * d + 2 * block + 2 * d + (d * c + c)
    assert sum(p.numel() for p in model.parameters()) == expected == 427_600


def _lstm_by_hand(model: CharLSTMModel, ids: torch.Tensor) -> torch.Tensor:
    """Stacked LSTM written out gate by gate (PyTorch order i, f, g, o); returns the last hidden state."""
    lstm = model.lstm
    x = model.embed.weight[ids]  # (B, L, E)
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        b = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
        h = torch.zeros(ids.shape[0], lstm.hidden_size)
        c = torch.zeros_like(h)
        outputs = []
        for t in range(ids.shape[1]):
            i, f, g, o = (x[:, t] @ w_ih.T + h @ w_hh.T + b).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        x = torch.stack(outputs, dim=1)
    return x[:, -1]


def _transformer_by_hand(model: CharTransformerModel, ids: torch.Tensor) -> torch.Tensor:
    """Pre-norm causal transformer written out with explicit matrices; returns the last position."""
    cfg = model.config
    heads, d = cfg.num_heads, cfg.d_model
    dh = d // heads
    length = ids.shape[1]
    ln = lambda x, m: F.layer_norm(x, (d,), m.weight, m.bias, cfg.layer_norm_eps)  # noqa: E731
    x = model.tok_embed.weight[ids] + model.pos_embed.weight[:length]
    future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
    for block in model.blocks:
        h = ln(x, block.norm1)
        q, k, v = (h @ block.attn.qkv.weight.T + block.attn.qkv.bias).split(d, dim=-1)
        outs = []
        for head in range(heads):
            sl = slice(head * dh, (head + 1) * dh)
            scores = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(dh)
            outs.append(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v[..., sl])
        x = x + torch.cat(outs, dim=-1) @ block.attn.proj.weight.T + block.attn.proj.bias
        h = F.gelu(ln(x, block.norm2) @ block.mlp.fc1.weight.T + block.mlp.fc1.bias)
        x = x + h @ block.mlp.fc2.weight.T + block.mlp.fc2.bias
    return ln(x, model.norm)[:, -1]


@pytest.mark.parametrize("name,kwargs", SPECS, ids=IDS)
def test_next_char_loss_is_cross_entropy_of_the_last_position(name, kwargs):
    model = _make(name, kwargs).eval()
    ids, labels = _ids(), torch.tensor([0, 3, 7, 10])
    out = model(input_ids=ids, labels=labels)
    assert isinstance(out, SequenceClassifierOutput) and out.logits.shape == (4, VOCAB)
    by_hand = _lstm_by_hand(model, ids) if name == "char_lstm" else _transformer_by_hand(model, ids)
    logits = by_hand @ model.head.weight.T + model.head.bias
    torch.testing.assert_close(out.logits, logits, rtol=1e-5, atol=1e-5)
    log_probs = torch.log_softmax(logits, dim=1)
    loss = -log_probs[torch.arange(4), labels].mean()
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-5)
    no_labels = model(ids)
    assert no_labels.loss is None and "loss" not in no_labels
    torch.testing.assert_close(no_labels.logits, out.logits, rtol=0, atol=0)


@pytest.mark.parametrize("name,kwargs", SPECS, ids=IDS)
def test_hidden_states_are_causal(name, kwargs):
    """Changing the last character changes the prediction but no earlier position's state."""
    model = _make(name, kwargs).eval()
    ids = _ids(n=2)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    with torch.no_grad():
        a, b = model.forward_features(ids), model.forward_features(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=1e-6)
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-4


@pytest.mark.parametrize("name,kwargs", SPECS, ids=IDS)
def test_same_seed_same_init(name, kwargs):
    assert _state_equal(_make(name, kwargs, seed=0), _make(name, kwargs, seed=0))
    assert not _state_equal(_make(name, kwargs, seed=0), _make(name, kwargs, seed=1))


def test_transformer_init_follows_gpt2():
    model = _make("char_transformer", dict(d_model=64, num_layers=4, num_heads=2))
    block = model.blocks[0]
    assert abs(block.attn.qkv.weight.std().item() - 0.02) < 0.002
    # residual projections: 0.02 / sqrt(2 * num_layers)
    assert abs(block.mlp.fc2.weight.std().item() - 0.02 / math.sqrt(8)) < 0.001
    assert torch.count_nonzero(block.attn.qkv.bias) == 0
    assert torch.equal(model.norm.weight, torch.ones(64))


def test_bad_inputs_and_configs_are_refused():
    model = _make("char_transformer", TINY_TRANSFORMER)
    with pytest.raises(ValueError, match="max_length"):
        model(_ids(length=LENGTH + 1))
    with pytest.raises(ValueError, match="labels"):
        model(_ids(), labels=torch.zeros(4, LENGTH, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(4, LENGTH))
    with pytest.raises(ValueError, match="num_heads"):
        CharTransformerConfig(d_model=10, num_heads=3)
    with pytest.raises(ValueError, match="hidden_size"):
        CharLSTMConfig(hidden_size=0)
    with pytest.raises(ValueError, match="dropout"):
        CharLSTMConfig(dropout=1.0)


# ------------------------------------------------------------------------------------------------
# save / load
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kwargs", SPECS, ids=IDS)
def test_save_pretrained_round_trip_is_bit_identical(name, kwargs, tmp_path):
    model = _make(name, kwargs, num_classes=5).eval()
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(tmp_path)
    files = sorted(os.listdir(tmp_path))
    assert "config.json" in files and "model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == f"hf_fedflat_{name}"
    assert cfg["vocab_size"] == VOCAB and cfg["num_classes"] == 5 and cfg["num_layers"] == 2
    cls = CharLSTMModel if name == "char_lstm" else CharTransformerModel
    for loaded in (load_model(tmp_path), cls.from_pretrained(tmp_path),
                   AutoModelForSequenceClassification.from_pretrained(tmp_path)):
        assert type(loaded) is cls
        assert _state_equal(model, loaded)
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name,kwargs", SPECS, ids=IDS)
def test_missing_checkpoint_keys_are_initialised(name, kwargs, tmp_path):
    model = _make(name, kwargs)
    model.save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    del sd["head.weight"]
    save_file(sd, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model(tmp_path)
    w = loaded.head.weight
    assert torch.isfinite(w).all() and 0 < w.abs().max() < 1  # freshly drawn, not garbage
    torch.testing.assert_close(loaded.head.bias, model.head.bias, rtol=0, atol=0)


@pytest.mark.parametrize("name,kwargs", SPECS, ids=IDS)
def test_pretrained_path_loads_a_local_state_dict(name, kwargs, tmp_path):
    source = _make(name, kwargs, seed=1)
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    loaded = _make(name, kwargs, seed=2, pretrained_path=str(tmp_path / "w.safetensors"))
    assert _state_equal(source, loaded)


# ------------------------------------------------------------------------------------------------
# Trainer contract
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def training_args(tmp_path_factory):
    # One TrainingArguments per module: building new ones resets accelerate's global state.
    return TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("trainer")), use_cpu=True, report_to="none", max_steps=1,
        per_device_train_batch_size=4, per_device_eval_batch_size=4, learning_rate=0.1, save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0,
    )


def _dataset(n, seed):
    ids = _ids(n=n, seed=seed)
    # an extra column the Trainer must drop (remove_unused_columns=True reads forward's signature)
    return datasets.Dataset.from_dict(
        {"input_ids": ids.tolist(), "labels": (ids[:, 0] % VOCAB).tolist(), "speaker": ["x"] * n}
    )


@pytest.mark.parametrize("name,kwargs", SPECS, ids=IDS)
def test_trainer_step_and_eval_keep_all_samples(name, kwargs, training_args):
    model = _make(name, kwargs)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = Trainer(model=model, args=training_args, train_dataset=_dataset(8, 1))
    result = trainer.train()
    assert result.global_step == 1 and math.isfinite(result.training_loss)
    assert all(not torch.equal(v, before[k]) for k, v in model.named_parameters() if k.startswith("head."))
    pred = trainer.predict(_dataset(6, 2))
    assert pred.predictions.shape == (6, VOCAB) and "test_loss" in pred.metrics


# ------------------------------------------------------------------------------------------------
# factory
# ------------------------------------------------------------------------------------------------
def test_factory_text_options_and_errors():
    model = create_model("char_transformer", vocab_size=20, num_classes=7, d_model=32, num_heads=2, dropout=0)
    assert model.config.dropout == 0.0 and model.config.num_classes == 7 and model.config.num_labels == 7
    assert create_model("char_lstm", vocab_size=20).config.num_classes == 20  # defaults to the vocabulary
    with pytest.raises(ValueError, match="^in_chans"):
        create_model("char_lstm", in_chans=1)
    with pytest.raises(ValueError, match="^hidden: not an option of char_lstm; its options are .*hidden_size"):
        create_model("char_lstm", hidden=32)
    with pytest.raises(ValueError, match="^pretrained"):
        create_model("char_lstm", pretrained=True)
    with pytest.raises(ValueError, match="^num_classes"):
        create_model("small_cnn")
    with pytest.raises(ValueError, match="^vocab_size"):
        create_model("small_cnn", 10, vocab_size=80)


def test_fedgam_cnn_is_the_mcmahan_mnist_cnn(tmp_path):
    model = create_model("fedgam_cnn", 10)
    assert isinstance(model, FedFlatImageClassifier)
    assert (model.config.in_chans, model.config.image_size) == (1, 28)
    net = model.backbone
    assert (net.conv1.out_channels, net.conv2.out_channels, net.conv1.kernel_size, net.fc1.out_features) == (
        32, 64, (5, 5), 512)
    # conv 1->32 (5x5), conv 32->64 (5x5), fc 64*7*7->512, fc 512->10
    expected = (25 * 32 + 32) + (25 * 32 * 64 + 64) + (64 * 7 * 7 * 512 + 512) + (512 * 10 + 10)
    assert sum(p.numel() for p in model.parameters()) == expected == 1_663_370
    x = torch.randn(2, 1, 28, 28)
    model.eval().save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.architecture == "fedgam_cnn"
    torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="hidden_dim"):
        create_model("fedgam_cnn", 10, hidden_dim=128)


def test_available_models_and_unknown_name_message():
    names = available_models()
    assert names == ["small_cnn", "resnet18_gn", "fedgam_cnn", "logistic", "char_lstm", "char_transformer", "word_lstm"]
    with pytest.raises(ValueError) as err:
        create_model("char_lsmt")
    msg = str(err.value)
    assert all(name in msg for name in names) and "Closest matches: char_lstm" in msg


def test_load_model_refuses_foreign_directories(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type 'bert'"):
        load_model(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path / "empty")


def test_char_lstm_forget_bias_shifts_only_the_forget_gate(tmp_path):
    """LEAF's TensorFlow LSTM cells add 1.0 to the forget gate; with LEAF's trailing padding (a tweet's ids, then
    up to 24 unknown ids) a PyTorch-initialised LSTM stays at chance (measured in the notes), so the option exists."""
    from hf_fedflat.models import create_model, load_model

    torch.manual_seed(0)
    plain = create_model("char_lstm", vocab_size=10, num_classes=2, embedding_dim=3, hidden_size=4)
    torch.manual_seed(0)
    shifted = create_model("char_lstm", vocab_size=10, num_classes=2, embedding_dim=3, hidden_size=4, forget_bias=1)
    for (name, a), (_, b) in zip(plain.named_parameters(), shifted.named_parameters()):
        expected = torch.zeros_like(a)
        if name.startswith("lstm.bias_ih_l"):
            expected[4:8] = 1.0  # PyTorch's gate order i, f, g, o
        torch.testing.assert_close(b - a, expected, rtol=0, atol=1e-6)
    shifted.save_pretrained(tmp_path)
    again = load_model(tmp_path)  # loading does not add the offset a second time
    assert all(torch.equal(a, b) for a, b in zip(shifted.parameters(), again.parameters()))
