"""The representation hook (``models.representation``): the features MOON and FedDecorr read are the input of the
model's head, for timm models, hf_fedflat's image classifier and transformers classifiers (pooled over the attended
tokens); a model without a head must name its representation module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_fedflat.models.representation import RepresentationCapture, pool, representation_module


def capture(model, *args, mask=None, **kwargs):
    grab = RepresentationCapture(model)
    with grab.active():
        model(*args, **kwargs)
    return grab.take(mask)


def test_representation_of_a_timm_model_is_forward_head_pre_logits():
    import timm
    torch.manual_seed(0)
    model = timm.create_model("resnet10t", num_classes=3, pretrained=False).eval()
    x = torch.randn(2, 3, 32, 32)
    assert representation_module(model) is model.get_classifier()
    with torch.no_grad():
        want = model.forward_head(model.forward_features(x), pre_logits=True)
        torch.testing.assert_close(capture(model, x), want, rtol=0, atol=0)


def test_representation_of_hf_fedflat_image_classifier_reads_the_timm_head():
    from hf_fedflat.models import create_model

    model = create_model("resnet18_gn", num_classes=3, in_chans=3, image_size=32).eval()
    head = representation_module(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = capture(model, pixel_values=x)
        torch.testing.assert_close(head(z), model(pixel_values=x).logits, rtol=0, atol=1e-6)
    assert z.shape == (2, head.in_features)


def test_representation_of_transformers_classifiers():
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    ids = torch.randint(1, 50, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    bert = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3)).eval()
    assert representation_module(bert) is bert.classifier
    with torch.no_grad():
        z = capture(bert, input_ids=ids, attention_mask=mask, mask=mask)
        torch.testing.assert_close(z, bert.bert(input_ids=ids, attention_mask=mask).pooler_output, rtol=0, atol=1e-6)

    gpt = GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, num_labels=3,
                                                   pad_token_id=0)).eval()
    assert representation_module(gpt) is gpt.score
    with torch.no_grad():
        z = capture(gpt, input_ids=ids, attention_mask=mask, mask=mask)
        hidden = gpt.transformer(input_ids=ids, attention_mask=mask).last_hidden_state
    want = torch.stack([hidden[0].mean(0), hidden[1, :3].mean(0)])  # mean over the attended tokens
    torch.testing.assert_close(z, want, rtol=0, atol=1e-6)


def test_representation_module_can_be_named_and_a_model_without_head_is_refused():
    model = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(ValueError, match="representation_module"):
        representation_module(model)
    named = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    named.representation_module = "0"
    assert representation_module(named) is named[0]
    assert pool(torch.ones(2, 3, 4)).shape == (2, 4)
