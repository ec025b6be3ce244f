"""A word-level LSTM language model: LEAF Reddit's ``stacked_lstm`` (next-token prediction at every position).

LEAF's Reddit baseline (``models/reddit/stacked_lstm.py``, ``baseline_constants.py``: ``reddit.stacked_lstm``
= lr 0.0003, seq_len 10, n_hidden 256, 2 layers) embeds each token id of a 10-token sequence in
``n_hidden`` = 256 dimensions, runs two LSTM layers of 256 units and maps every position to the 10,000-word
vocabulary; the label of position ``t`` is the token that follows input ``t`` (the data already holds the
shifted targets, see :mod:`hf_fedflat.data.leaf_text`), so, unlike a transformers causal LM, nothing is shifted
inside the model.

* ``forward(input_ids, labels=None, attention_mask=None)``: ``input_ids`` ``(B, L)``; ``labels`` ``(B, L)``
  with ``-100`` at positions that are not scored (LEAF's ``count_tokens`` = 0: padding); returns a
  ``CausalLMOutput`` with ``logits`` ``(B, L, vocab_size)`` and ``loss`` = mean cross-entropy over the scored
  positions (every scored token weighted alike).
* ``get_output_embeddings()`` is the softmax layer, so input checks bound the labels by the vocabulary.

Departures from LEAF's TensorFlow model, all stated: PyTorch's LSTM keeps two bias vectors per gate (LEAF's
``LSTMBlockCell`` one, with ``forget_bias=0``); LEAF's loss is ``sequence_loss`` averaged per time step then over
the 10 steps, here the mean over scored tokens; LEAF carries the LSTM state from one batch to the next inside
a client's epoch (over shuffled comments), here every 10-token row starts from a zero state; weights are drawn
U(-0.1, 0.1) as LEAF's ``init_scale``. ``attention_mask`` is accepted (a collator may pass it) and not used:
padding sits at the end of a row and its positions are not scored.
"""

# No `from __future__ import annotations`: the `@strict` config validates field types from real annotations.
import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedConfig, PreTrainedModel
from transformers import initialization as hf_init
from transformers.modeling_outputs import CausalLMOutput
from ..field_checks import ConfigError

__all__ = ["LEAF_REDDIT_VOCAB_SIZE", "WordLSTMConfig", "WordLSTMModel"]

LEAF_REDDIT_VOCAB_SIZE = 10000
"""Size of LEAF Reddit's vocabulary (``build_vocab.py --vocab-size`` default; ``<PAD>`` = 0, ``<UNK>`` = 1)."""

IGNORE_INDEX = -100


@strict
class WordLSTMConfig(PreTrainedConfig):
    r"""Configuration of :class:`WordLSTMModel` (defaults: LEAF Reddit's ``stacked_lstm``).

    Args:
        vocab_size: Token ids ``[0, vocab_size)`` (LEAF: 10,000).
        num_classes: Output classes; ``None`` means ``vocab_size`` (predict a token).
        embedding_dim: Width of the token embedding (LEAF: ``n_hidden`` = 256).
        hidden_size: Units of each LSTM layer (LEAF: 256).
        num_layers: Stacked LSTM layers (LEAF: 2).
        dropout: Dropout between LSTM layers (LEAF: ``keep_prob`` 1.0, i.e. none).
        init_scale: Weights are drawn U(-init_scale, init_scale) (LEAF: 0.1).
    """

    model_type = "hf_fedflat_word_lstm"

    vocab_size: int = LEAF_REDDIT_VOCAB_SIZE
    num_classes: int | None = None
    embedding_dim: int = 256
    hidden_size: int = 256
    num_layers: int = 2
    dropout: float = 0.0
    init_scale: float = 0.1

    def __post_init__(self, **kwargs):
        if self.num_classes is None:
            self.num_classes = self.vocab_size
        for name in ("vocab_size", "num_classes", "embedding_dim", "hidden_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.num_classes != self.vocab_size:
            raise ConfigError(f"num_classes={self.num_classes} must equal vocab_size={self.vocab_size}: the model "
                             "predicts a token of its own vocabulary")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.init_scale > 0:
            raise ConfigError(f"init_scale must be positive, got {self.init_scale}")
        # no num_labels = vocab_size (as transformers' causal LMs): 10,000 LABEL_i names would fill config.json;
        # input checks bound token labels by get_output_embeddings() instead
        super().__post_init__(**kwargs)


class WordLSTMModel(PreTrainedModel):
    """Embedding -> stacked LSTM -> linear to the vocabulary at every position (LEAF Reddit's model).

    Args:
        config: The architecture; build it with ``create_model("word_lstm", vocab_size=...)`` or directly.
    """

    config_class = WordLSTMConfig
    config: WordLSTMConfig
    main_input_name = "input_ids"
    input_modalities = ("text",)
    accepts_loss_kwargs = False
    _no_split_modules: list[str] = []

    def __init__(self, config: WordLSTMConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.lstm = nn.LSTM(config.embedding_dim, config.hidden_size, num_layers=config.num_layers, batch_first=True,
                            dropout=config.dropout if config.num_layers > 1 else 0.0)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        scale = self.config.init_scale
        if isinstance(module, (nn.Embedding, nn.Linear, nn.LSTM)):
            for param in module.parameters(recurse=False):
                hf_init.uniform_(param, -scale, scale)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Top LSTM layer's output at every position, ``(B, L, hidden_size)``."""
        output, _ = self.lstm(self.embed(input_ids))
        return output

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> CausalLMOutput:
        """Logits for the token after every position; ``loss`` = mean cross-entropy over labels != -100.

        Raises:
            ValueError: ``input_ids`` is not a 2-D integer tensor, or ``labels`` has another shape.
        """
        if input_ids.ndim != 2 or input_ids.is_floating_point():
            raise ConfigError(f"input_ids must be integer token ids of shape (batch, length), got {input_ids.dtype} "
                             f"{tuple(input_ids.shape)}")
        logits = self.head(self.forward_features(input_ids))
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ConfigError(f"labels must hold one next-token id (or -100) per position, shape "
                                 f"{tuple(input_ids.shape)}, got {tuple(labels.shape)}")
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                   labels.reshape(-1).to(device=logits.device, dtype=torch.long),
                                   ignore_index=IGNORE_INDEX)
        return CausalLMOutput(loss=loss, logits=logits)


AutoConfig.register(WordLSTMConfig.model_type, WordLSTMConfig, exist_ok=True)
AutoModel.register(WordLSTMConfig, WordLSTMModel, exist_ok=True)
