"""Next-character models for LEAF Shakespeare: a character LSTM and a small causal transformer.

LEAF's Shakespeare task (Caldas et al., 2018, "LEAF: A Benchmark for Federated Settings") gives each
client 80-character windows of one speaker's lines and asks for the character that follows the
window: one label per sequence, predicted from the last position. Both models here follow that
contract, so the same data and the same ``transformers.Trainer`` code train either of them:

* ``forward(input_ids, labels=None)``: ``input_ids`` ``(B, L)`` integer character ids, ``labels``
  ``(B,)`` the id of the next character; returns a ``SequenceClassifierOutput`` with ``logits``
  ``(B, num_classes)`` and, given labels, ``loss`` = mean cross-entropy.
* ``forward_features(input_ids)``: the hidden states of every position ``(B, L, H)``; the logits are
  ``head(forward_features(input_ids)[:, -1])``.

Both are ``transformers.PreTrainedModel`` subclasses with their own config, so ``save_pretrained`` /
``from_pretrained`` (``config.json`` + ``model.safetensors``) and the Auto classes work offline.

* :class:`CharLSTMModel` is LEAF's ``stacked_lstm``: an 8-dimensional embedding of an 80-character
  vocabulary, two LSTM layers of 256 units and a linear layer to 80 classes. PyTorch's LSTM keeps two
  bias vectors per gate (``b_ih`` and ``b_hh``) where LEAF's TensorFlow cell keeps one, so this model
  has 819,920 parameters and LEAF's 817,872; the function computed is the same.
* :class:`CharTransformerModel` is a GPT-2-style pre-norm decoder (learned positions, causal
  self-attention, GELU MLP) whose modules are named like timm's ViT (``blocks.<i>.attn.qkv``,
  ``attn.proj``, ``mlp.fc1``, ``mlp.fc2``, ``head``), so the default LoRA targets of
  :mod:`hf_fedflat.models.lora` fit both.
"""

# No `from __future__ import annotations`: the `@strict` config dataclasses validate field types from
# real annotations and silently skip the checks when they are strings.
import math

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers import initialization as hf_init
from transformers.modeling_outputs import SequenceClassifierOutput
from ..field_checks import ConfigError

__all__ = [
    "CharLSTMConfig",
    "CharLSTMModel",
    "CharTransformerConfig",
    "CharTransformerModel",
    "LEAF_VOCAB_SIZE",
    "TEXT_MODELS",
]

LEAF_VOCAB_SIZE = 80
"""Size of LEAF Shakespeare's character vocabulary (its ``ALL_LETTERS`` string)."""


def _check_positive(**values) -> None:
    for name, value in values.items():
        if value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value}")


def _check_probability(**values) -> None:
    for name, value in values.items():
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{name} must be in [0, 1), got {value}")


class _NextCharConfigMixin:
    """``num_classes`` defaults to the vocabulary; ``num_labels`` follows ``num_classes``."""

    def _sync_num_classes(self, kwargs: dict) -> dict:
        if self.num_classes is None:
            self.num_classes = self.vocab_size
        _check_positive(vocab_size=self.vocab_size, num_classes=self.num_classes)
        if self.id2label is None:
            kwargs.setdefault("num_labels", self.num_classes)
        return kwargs

    def _check_num_labels(self) -> None:
        if self.num_labels != self.num_classes:
            raise ConfigError(f"num_labels={self.num_labels} disagrees with num_classes={self.num_classes}")


@strict
class CharLSTMConfig(_NextCharConfigMixin, PreTrainedConfig):
    r"""Configuration of :class:`CharLSTMModel` (defaults: LEAF Shakespeare's ``stacked_lstm``).

    Args:
        vocab_size: Number of character ids (80 in LEAF).
        num_classes: Number of output classes; ``None`` means ``vocab_size`` (predict a character).
        embedding_dim: Width of the character embedding (8 in LEAF).
        hidden_size: Units of each LSTM layer (256 in LEAF).
        num_layers: Number of stacked LSTM layers (2 in LEAF).
        dropout: Dropout between LSTM layers (0 in LEAF).
        forget_bias: Added to the initial forget-gate bias of every layer (TensorFlow's ``BasicLSTMCell``, which
            LEAF's LSTMs use, adds 1.0 to the forget gate; PyTorch's cell adds nothing). The gradients are the
            same, so an initial offset trains as TensorFlow's constant does. 0 keeps PyTorch's initialisation.
    """

    model_type = "hf_fedflat_char_lstm"

    vocab_size: int = LEAF_VOCAB_SIZE
    num_classes: int | None = None
    embedding_dim: int = 8
    hidden_size: int = 256
    num_layers: int = 2
    dropout: float = 0.0
    forget_bias: float = 0.0

    def __post_init__(self, **kwargs):
        kwargs = self._sync_num_classes(kwargs)
        _check_positive(embedding_dim=self.embedding_dim, hidden_size=self.hidden_size, num_layers=self.num_layers)
        _check_probability(dropout=self.dropout)
        super().__post_init__(**kwargs)
        self._check_num_labels()


@strict
class CharTransformerConfig(_NextCharConfigMixin, PreTrainedConfig):
    r"""Configuration of :class:`CharTransformerModel` (a tiny GPT-2-style decoder by default).

    Args:
        vocab_size: Number of character ids.
        num_classes: Number of output classes; ``None`` means ``vocab_size``.
        max_length: Longest input sequence (size of the learned position table; 80 in LEAF).
        d_model: Width of the residual stream.
        num_layers: Number of transformer blocks.
        num_heads: Attention heads per block (must divide ``d_model``).
        mlp_ratio: Hidden width of each MLP as a multiple of ``d_model``.
        dropout: Dropout on embeddings, attention probabilities and residual branches.
        layer_norm_eps: Epsilon of the LayerNorms.
        initializer_range: Standard deviation of the N(0, std) weight initialisation (GPT-2: 0.02).
    """

    model_type = "hf_fedflat_char_transformer"

    vocab_size: int = LEAF_VOCAB_SIZE
    num_classes: int | None = None
    max_length: int = 80
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        kwargs = self._sync_num_classes(kwargs)
        _check_positive(max_length=self.max_length, d_model=self.d_model, num_layers=self.num_layers,
                        num_heads=self.num_heads)
        if self.d_model % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if self.mlp_ratio <= 0:
            raise ConfigError(f"mlp_ratio must be positive, got {self.mlp_ratio}")
        _check_probability(dropout=self.dropout)
        super().__post_init__(**kwargs)
        self._check_num_labels()


# ------------------------------------------------------------------------------------------------
# shared behaviour
# ------------------------------------------------------------------------------------------------
class _NextCharModel(PreTrainedModel):
    """Loss, input checks and output type shared by the two next-character models."""

    main_input_name = "input_ids"
    input_modalities = ("text",)
    # forward() takes no `num_items_in_batch`: the loss is the micro-batch mean, which the Trainer
    # scales for gradient accumulation.
    accepts_loss_kwargs = False
    _no_split_modules: list[str] = []

    def forward_features(self, input_ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> SequenceClassifierOutput:
        """Predict the character that follows each sequence.

        Args:
            input_ids: Character ids ``(B, L)``, integer.
            labels: Optional id of the next character for each sequence ``(B,)``.

        Returns:
            ``SequenceClassifierOutput`` with ``logits`` ``(B, num_classes)`` computed from the last
            position, and ``loss`` = mean cross-entropy when ``labels`` are given (``None`` otherwise).

        Raises:
            ValueError: If ``input_ids`` is not a 2-D integer tensor or ``labels`` is not one id per
                sequence.
        """
        if input_ids.ndim != 2 or input_ids.is_floating_point():
            raise ConfigError(
                f"input_ids must be integer character ids of shape (batch, length), got "
                f"{input_ids.dtype} {tuple(input_ids.shape)}"
            )
        logits = self.head(self.forward_features(input_ids)[:, -1])
        loss = None
        if labels is not None:
            if labels.shape != logits.shape[:1]:
                raise ConfigError(
                    f"labels must hold one next-character id per sequence, shape ({logits.shape[0]},), got "
                    f"{tuple(labels.shape)}"
                )
            loss = F.cross_entropy(logits, labels.to(device=logits.device, dtype=torch.long))
        return SequenceClassifierOutput(loss=loss, logits=logits)


def _init_linear_like_pytorch(module: nn.Linear) -> None:
    """``nn.Linear.reset_parameters`` through transformers' guarded init (skips loaded tensors)."""
    hf_init.kaiming_uniform_(module.weight, a=math.sqrt(5))
    if module.bias is not None:
        bound = 1.0 / math.sqrt(module.in_features) if module.in_features > 0 else 0.0
        hf_init.uniform_(module.bias, -bound, bound)


# ------------------------------------------------------------------------------------------------
# LEAF character LSTM
# ------------------------------------------------------------------------------------------------
class CharLSTMModel(_NextCharModel):
    """LEAF's Shakespeare LSTM: embedding -> stacked LSTM -> linear on the last hidden state.

    Initialisation is PyTorch's default for each layer (N(0, 1) embedding, U(+-1/sqrt(hidden)) LSTM,
    Kaiming-uniform linear), as in the PyTorch ports of LEAF; ``from_pretrained`` initialises only
    tensors missing from the checkpoint.

    Args:
        config: The architecture; build it with ``create_model("char_lstm", ...)`` or directly.
    """

    config_class = CharLSTMConfig
    config: CharLSTMConfig

    def __init__(self, config: CharLSTMConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.lstm = nn.LSTM(
            config.embedding_dim,
            config.hidden_size,
            num_layers=config.num_layers,
            batch_first=True,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.head = nn.Linear(config.hidden_size, config.num_classes)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Embedding):
            hf_init.normal_(module.weight, mean=0.0, std=1.0)
        elif isinstance(module, nn.LSTM):
            bound = 1.0 / math.sqrt(module.hidden_size)
            for name, param in module.named_parameters():
                if getattr(param, "_is_hf_initialized", False):  # loaded from a checkpoint: left alone
                    continue
                hf_init.uniform_(param, -bound, bound)
                if name.startswith("bias_ih") and self.config.forget_bias:  # gates i, f, g, o: f is the 2nd
                    param[module.hidden_size: 2 * module.hidden_size] += self.config.forget_bias
        elif isinstance(module, nn.Linear):
            _init_linear_like_pytorch(module)

    def forward_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Top LSTM layer's output at every position, ``(B, L, hidden_size)``."""
        output, _ = self.lstm(self.embed(input_ids))
        return output


# ------------------------------------------------------------------------------------------------
# small causal transformer
# ------------------------------------------------------------------------------------------------
class _CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.proj._residual_out = True  # GPT-2 scales the init of projections onto the residual stream
        self.proj_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, width // self.num_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(batch, length, width)))


class _Mlp(nn.Module):
    def __init__(self, d_model: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d_model)
        self.fc2._residual_out = True
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class _Block(nn.Module):
    def __init__(self, config: CharTransformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.norm1 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.attn = _CausalSelfAttention(d, config.num_heads, config.dropout)
        self.norm2 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.mlp = _Mlp(d, int(round(config.mlp_ratio * d)), config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharTransformerModel(_NextCharModel):
    """A small GPT-2-style causal transformer predicting the next character from the last position.

    Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP ->
    residual), learned token and position embeddings, a final LayerNorm and a linear head. Weights
    are drawn as in GPT-2: N(0, ``initializer_range``), with the residual output projections
    (``attn.proj``, ``mlp.fc2``) scaled by ``1/sqrt(2 * num_layers)``; biases zero, norms one.

    Args:
        config: The architecture; build it with ``create_model("char_transformer", ...)`` or directly.
    """

    config_class = CharTransformerConfig
    config: CharTransformerConfig

    def __init__(self, config: CharTransformerConfig) -> None:
        super().__init__(config)
        self.tok_embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.max_length, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.head = nn.Linear(config.d_model, config.num_classes)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            residual_out = getattr(module, "_residual_out", False)
            scale = 1.0 / math.sqrt(2 * self.config.num_layers) if residual_out else 1.0
            hf_init.normal_(module.weight, mean=0.0, std=std * scale)
            if getattr(module, "bias", None) is not None:
                hf_init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            hf_init.ones_(module.weight)
            hf_init.zeros_(module.bias)

    def forward_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final-LayerNorm hidden states at every position, ``(B, L, d_model)``.

        Position ``t`` depends only on ``input_ids[:, :t + 1]`` (causal attention).

        Raises:
            ValueError: If the sequences are longer than ``config.max_length``.
        """
        length = input_ids.shape[1]
        if length > self.config.max_length:
            raise ConfigError(
                f"input_ids has length {length} > max_length={self.config.max_length}; build the model "
                f"with max_length={length} or shorter windows"
            )
        positions = torch.arange(length, device=input_ids.device)
        x = self.drop(self.tok_embed(input_ids) + self.pos_embed(positions))
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


TEXT_MODELS: dict[str, tuple[type[PreTrainedConfig], type[_NextCharModel]]] = {
    "char_lstm": (CharLSTMConfig, CharLSTMModel),
    "char_transformer": (CharTransformerConfig, CharTransformerModel),
}
"""Factory names of the next-character models -> (config class, model class)."""

from .word_lm import WordLSTMConfig, WordLSTMModel  # noqa: E402 - LEAF Reddit's word-level LSTM language model

TEXT_MODELS["word_lstm"] = (WordLSTMConfig, WordLSTMModel)

# Let the Auto classes resolve the model types once hf_fedflat.models is imported.
for _config_class, _model_class in TEXT_MODELS.values():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    AutoModel.register(_config_class, _model_class, exist_ok=True)
    AutoModelForSequenceClassification.register(_config_class, _model_class, exist_ok=True)
