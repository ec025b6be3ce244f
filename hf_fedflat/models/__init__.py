"""Models for federated fine-tuning: one factory, Trainer-ready outputs, Hugging Face saving.

>>> from hf_fedflat.models import create_model, load_model, has_batchnorm
>>> model = create_model("small_cnn", num_classes=10, in_chans=1, image_size=32)
>>> model.save_pretrained("out")            # config.json + model.safetensors
>>> same = load_model("out")
>>> lstm = create_model("char_lstm")        # LEAF Shakespeare: 80 characters in, next character out

LoRA (only adapters + head trainable, hence federated): :mod:`hf_fedflat.models.lora`.
"""

from .backbones import build_backbone
from .factory import MODEL_CLASSES, available_models, create_model, load_model
from .lora import (
    LoraArguments,
    apply_lora,
    classification_head_names,
    save_federated_model,
    total_parameter_bytes,
    trainable_parameter_bytes,
)
from .modeling import FedFlatClassifierConfig, FedFlatImageClassifier
from .norms import batchnorm_modules, has_batchnorm
from .small_cnn import SmallCNN
from .next_char import CharLSTMConfig, CharLSTMModel, CharTransformerConfig, CharTransformerModel
from .word_lm import WordLSTMConfig, WordLSTMModel

__all__ = [
    "create_model",
    "load_model",
    "available_models",
    "build_backbone",
    "has_batchnorm",
    "batchnorm_modules",
    "FedFlatClassifierConfig",
    "FedFlatImageClassifier",
    "SmallCNN",
    "CharLSTMConfig",
    "CharLSTMModel",
    "CharTransformerConfig",
    "CharTransformerModel",
    "WordLSTMConfig",
    "WordLSTMModel",
    "MODEL_CLASSES",
    "LoraArguments",
    "apply_lora",
    "classification_head_names",
    "save_federated_model",
    "trainable_parameter_bytes",
    "total_parameter_bytes",
]
