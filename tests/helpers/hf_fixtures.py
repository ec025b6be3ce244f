"""Tiny offline transformers models and tokenizers for tests (no Hub): build them into a folder.

Plain functions, so any test module can use them (``from helpers.hf_fixtures import tiny_bert_dir``):

* :func:`train_word_tokenizer` -- a WordLevel tokenizer trained here on :data:`CORPUS`, wrapped in
  ``PreTrainedTokenizerFast`` with ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (BERT-style) or ``<pad> <eos> <unk>``
  (GPT-style) special tokens.
* :func:`tiny_bert_dir` -- ``BertForSequenceClassification`` (hidden 32, 2 layers) + its tokenizer, saved.
* :func:`tiny_gpt2_dir` -- ``GPT2LMHeadModel`` (n_embd 32, 2 layers) + its tokenizer, saved.
* :func:`tiny_llama_dir` -- ``LlamaForCausalLM`` (hidden 32, 2 layers) + its tokenizer, saved.
* :func:`tiny_vit_dir` -- ``ViTForImageClassification`` (16x16 images, patch 8) + a ``ViTImageProcessor``.
* :func:`tiny_family_dir` -- one tiny model of each family of :data:`FAMILIES` (BERT to T5), saved as its
  checkpoints are published (``*ForMaskedLM``, ``*ForCausalLM``); :func:`family_tasks` the tasks of each.

Each takes the target folder and returns it (a ``str``); weights come from ``torch.manual_seed(seed)``.
"""

from __future__ import annotations

import os

CORPUS = [
    "the movie was great and the actors were great",
    "a wonderful film with a good story",
    "the plot was bad and the acting was terrible",
    "an awful boring movie with a bad end",
    "good fun and great music",
    "terrible pacing and awful dialogue",
    "i loved it , a great story",
    "i hated it , a bad story",
]
"""Sentences the test tokenizers are trained on (positive ones even-indexed, negative ones odd)."""


def train_word_tokenizer(style: str = "bert", corpus=CORPUS, model_max_length: int = 32):
    """A word-level ``PreTrainedTokenizerFast`` trained on ``corpus`` (``style`` ``"bert"`` or ``"gpt"``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if style == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        unk = "[UNK]"
    elif style == "gpt":
        specials = ["<pad>", "<eos>", "<unk>"]
        unk = "<unk>"
    else:
        raise ValueError(f"style: bert or gpt, got {style!r}")
    tok = Tokenizer(models.WordLevel(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(list(corpus), trainers.WordLevelTrainer(special_tokens=specials))
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
            mask_token="[MASK]", model_max_length=model_max_length,
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<eos>", model_max_length=model_max_length)


def tiny_bert_dir(path, num_labels: int = 2, seed: int = 0, architecture: str = "BertForSequenceClassification") -> str:
    """A tiny BERT (``architecture``: ``BertForSequenceClassification``, ``BertForTokenClassification`` or
    ``BertForMaskedLM``) and its word-level tokenizer saved in ``path``."""
    import torch
    import transformers
    from transformers import BertConfig

    tokenizer = train_word_tokenizer("bert")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return os.fspath(path)


def tiny_gpt2_dir(path, seed: int = 0) -> str:
    """A tiny ``GPT2LMHeadModel`` and its word-level tokenizer (``<pad>`` is its own token) saved in ``path``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = train_word_tokenizer("gpt")
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return os.fspath(path)


def tiny_llama_dir(path, seed: int = 0) -> str:
    """A tiny ``LlamaForCausalLM`` and its word-level tokenizer saved in ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_word_tokenizer("gpt")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return os.fspath(path)


def tiny_vit_dir(path, num_labels: int = 3, seed: int = 0, image_size: int = 16) -> str:
    """A tiny ``ViTForImageClassification`` (``image_size`` pixels, patch 8, 3 channels) and its image processor."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(image_size=image_size, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=num_labels)
    torch.manual_seed(seed)
    ViTForImageClassification(config).save_pretrained(path)
    ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(path)
    return os.fspath(path)


# --- one tiny model of each family, for LoRA on every architecture --------------------------------------------
#: family (``model_type``) -> (config class, tiny sizes, the class its checkpoints are published as: what a user
#: starts from, so a classifier's head, and BERT's pooler under an MLM checkpoint, are new layers)
FAMILIES = {
    "bert": ("BertConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                max_position_embeddings=128), "BertForMaskedLM"),
    "distilbert": ("DistilBertConfig", dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128),
                   "DistilBertForMaskedLM"),
    "roberta": ("RobertaConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                      max_position_embeddings=130), "RobertaForMaskedLM"),
    "deberta-v2": ("DebertaV2Config", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, max_position_embeddings=128), "DebertaV2ForMaskedLM"),
    "albert": ("AlbertConfig", dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=64, max_position_embeddings=128), "AlbertForMaskedLM"),
    "electra": ("ElectraConfig", dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=128), "ElectraForMaskedLM"),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=2, n_positions=128), "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=2, max_position_embeddings=128), "LlamaForCausalLM"),
    "mistral": ("MistralConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=128), "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=2, max_position_embeddings=128), "Qwen2ForCausalLM"),
    "phi": ("PhiConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              max_position_embeddings=128), "PhiForCausalLM"),
    "gemma": ("GemmaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16, max_position_embeddings=128), "GemmaForCausalLM"),
    "bart": ("BartConfig", dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                max_position_embeddings=128), "BartForConditionalGeneration"),
    "t5": ("T5Config", dict(d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2), "T5ForConditionalGeneration"),
}


def family_tasks() -> list[tuple[str, str]]:
    """``(family, task)`` for every family of :data:`FAMILIES` and every task transformers ships a class of it for
    (its Auto mappings decide); a causal LM only for the decoder families (BERT-style encoders' ``*ForCausalLM`` and
    BART's decoder alone are not checkpoints a user fine-tunes as one)."""
    from transformers.models.auto import modeling_auto

    mappings = {"text-classification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
                "token-classification": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
                "causal-lm": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}
    decoders = {family for family, (_, _, published) in FAMILIES.items() if published.endswith(("CausalLM", "LMHeadModel"))}
    return [(family, task) for family in FAMILIES for task, mapping in mappings.items()
            if family in mapping and (task != "causal-lm" or family in decoders)]


def tiny_family_dir(path, family: str, tokenizer, seed: int = 0) -> str:
    """A tiny random-init model of ``family`` (:data:`FAMILIES`), saved as the class its checkpoints are published
    as, with ``tokenizer``; the tokenizer's ``[SEP]``/``<eos>`` is the end-of-sequence token (BART and T5 classify
    at it)."""
    import torch
    import transformers

    config_class, sizes, published = FAMILIES[family]
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                                 eos_token_id=eos, bos_token_id=bos,
                                                 decoder_start_token_id=tokenizer.pad_token_id, **sizes)
    torch.manual_seed(seed)
    getattr(transformers, published)(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return os.fspath(path)
