"""The word-level LSTM language model (``hf_fedflat.models.word_lm``): LEAF Reddit's ``stacked_lstm``, its
parameter count and its loss masked at the padded positions."""

from __future__ import annotations

import pytest
import torch


def test_word_lstm_is_leafs_stacked_lstm_and_masks_its_loss():
    from hf_fedflat.models import create_model

    model = create_model("word_lstm", vocab_size=10000)  # LEAF: embedding 256, 2 x LSTM(256), softmax 10,000
    leaf_tf = 10000 * 256 + 2 * 4 * (256 * 256 + 256 * 256 + 256) + 256 * 10000 + 10000  # one bias per gate
    assert sum(p.numel() for p in model.parameters()) == leaf_tf + 2 * 4 * 256  # PyTorch: b_ih and b_hh
    small = create_model("word_lstm", vocab_size=12, embedding_dim=4, hidden_size=6).eval()
    ids = torch.tensor([[2, 5, 7, 3, 0, 0], [2, 9, 3, 0, 0, 0]])
    labels = torch.tensor([[5, 7, 3, 0, -100, -100], [9, 3, 0, -100, -100, -100]])
    with torch.no_grad():
        out = small(ids, labels=labels)
    logp = torch.log_softmax(out.logits, -1)
    scored = [(b, t) for b in range(2) for t in range(6) if labels[b, t] != -100]
    expected = -sum(logp[b, t, labels[b, t]] for b, t in scored) / len(scored)
    assert out.logits.shape == (2, 6, 12) and float(out.loss) == pytest.approx(float(expected), rel=1e-6)
    assert small.get_output_embeddings().weight.shape == (12, 6)
    with pytest.raises(ValueError, match=r"labels must hold one next-token id \(or -100\) per position"):
        small(ids, labels=labels[:, :3])
    with pytest.raises(ValueError, match="num_classes=5 must equal vocab_size=12"):
        create_model("word_lstm", num_classes=5, vocab_size=12)
