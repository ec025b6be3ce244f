"""``ModelArguments``: the model the federation trains (``hf_fedflat.models.create_model``).

The LoRA options are :class:`hf_fedflat.models.lora.LoraArguments`, beside the code that applies them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .auto import TASKS, check_task
from ..field_checks import ConfigError

__all__ = ["ModelArguments"]


@dataclass
class ModelArguments:
    """The model the federation trains (``hf_fedflat.models.create_model``)."""

    model_name: str = field(
        default="small_cnn",
        metadata={"help": "small_cnn, resnet18_gn, or any timm model name (e.g. vit_tiny_patch16_224). Ignored when "
                          "--model_name_or_path is given."},
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A transformers model: Hub id (e.g. distilbert-base-uncased) or local folder saved with "
                          "save_pretrained. Loaded with the Auto class of --task; its tokenizer / image processor "
                          "loads from the same path and is saved with the final model."},
    )
    task: str | None = field(
        default=None,
        metadata={"help": "Task of --model_name_or_path: image-classification, text-classification, "
                          "token-classification or causal-lm (default: from the config's architectures, else the "
                          "dataset's task).",
                  "choices": list(TASKS)},
    )
    model_dtype: str = field(
        default="float32",
        metadata={"help": "Weight dtype of --model_name_or_path: float32, bfloat16, float16 or auto (the checkpoint's).",
                  "choices": ["float32", "bfloat16", "float16", "auto"]},
    )
    image_size: int = field(default=16, metadata={"help": "Square input resolution the images are resized to."})
    pretrained: bool = field(default=False, metadata={"help": "Start from timm's published weights (needs the Hub)."})
    pretrained_path: str | None = field(
        default=None, metadata={"help": "Start from a local weights file (.safetensors or a torch state dict)."}
    )
    model_kwargs: str | None = field(
        default=None,
        metadata={"help": 'Architecture options as a JSON object, e.g. \'{"depth": 2, "patch_size": 8}\' for a tiny ViT '
                          "(a YAML mapping works too)."},
    )
    base_model: str | None = field(
        default=None,
        metadata={"help": "Hub id of the starting weights, for the model card (default: timm's id when pretrained)."},
    )

    license: str | None = field(
        default=None,
        metadata={"help": "License of the trained model for its card's metadata (a Hub license id, e.g. apache-2.0, "
                          "mit; it should allow what the base model's and the data's licenses allow)."},
    )

    def __post_init__(self):
        if not isinstance(self.image_size, int) or self.image_size < 1:
            raise ConfigError(f"image_size: must be an integer >= 1, got {self.image_size!r}.")
        check_task(self.task)
        if self.task is not None and self.model_name_or_path is None:
            raise ConfigError("task: applies to --model_name_or_path (a transformers model); --model_name models "
                             "know their task.")
        if self.model_dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ConfigError(f"model_dtype: must be one of float32, bfloat16, float16, auto; got {self.model_dtype!r}.")
        if isinstance(self.model_name_or_path, str) and not self.model_name_or_path.strip():
            raise ConfigError("model_name_or_path: empty; give a Hub id or a local folder, or leave it unset.")
        if self.model_name_or_path is None:  # an unknown name: refused now, before any data loads
            from .factory import available_models
            from .backbones import check_model_name

            check_model_name(self.model_name, known=available_models())

    @property
    def follows_trainer_conventions(self) -> bool:
        """Whether the model is trained as a transformers user expects (AdamW at the Trainer's rate when optim and
        learning_rate are unset): a transformers model (``model_name_or_path``) or a timm model given by name.
        The built-in models (``available_models()``: small_cnn, fedgam_cnn, resnet18_gn, logistic, the LSTMs and
        char_transformer) are the federated papers' and keep their SGD."""
        if self.model_name_or_path:
            return True
        from .factory import available_models

        return self.model_name not in available_models()

    @property
    def model_kwargs_dict(self) -> dict[str, Any]:
        """``model_kwargs`` as a dict (the CLI gives a JSON string, YAML may give a mapping)."""
        if self.model_kwargs in (None, ""):
            return {}
        if isinstance(self.model_kwargs, dict):
            return dict(self.model_kwargs)
        try:
            value = json.loads(self.model_kwargs)
        except json.JSONDecodeError as error:
            raise ConfigError(f"model_kwargs: not valid JSON ({error}); write e.g. '{{\"depth\": 2}}'.") from None
        if not isinstance(value, dict):
            raise ConfigError(f"model_kwargs: must be a JSON object, got {type(value).__name__}.")
        return value


def model_follows_trainer_conventions(model) -> tuple[bool, bool]:
    """``(trainer conventions, LoRA)`` of a model built in Python, as :attr:`ModelArguments.follows_trainer_conventions`
    decides them for one named on the command line: a transformers model, a timm model or an image classifier whose
    backbone is a timm model is trained as a transformers user expects (AdamW at the Trainer's rate when ``optim`` and
    ``learning_rate`` are unset); the papers' built-in models and any other ``nn.Module`` keep the papers' SGD. A peft
    model is judged by its base model, with LoRA's rate."""
    from transformers import PreTrainedModel

    from .factory import available_models
    from .modeling import FedFlatImageClassifier

    use_lora = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
    base = model.get_base_model() if use_lora else model
    if isinstance(base, FedFlatImageClassifier):
        return base.config.architecture not in available_models(), use_lora
    if type(base).__module__.startswith("hf_fedflat."):  # the LSTMs and the other built-in models
        return False, use_lora
    return isinstance(base, PreTrainedModel) or hasattr(base, "pretrained_cfg"), use_lora
