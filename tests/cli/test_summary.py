"""What one run's ``history.json`` says (``hf_fedflat.cli.summary``): final and best value of the run's metric,
the best round, seconds per round; a language model's perplexity is best when lowest. (``hf-fedflat compare``'s
table of several runs is tested in ``test_commands.py``.)"""

from __future__ import annotations

import json


def test_run_summary_of_a_language_model_shows_perplexity_lowest_best(tmp_path):
    from hf_fedflat.cli import summarize_run

    history = [{"round": 1, "eval_loss": 3.0, "eval_perplexity": 20.0, "round_seconds": 1.0},
               {"round": 2, "eval_loss": 2.0, "eval_perplexity": 7.4, "round_seconds": 3.0},
               {"round": 3, "eval_loss": 2.2, "eval_perplexity": 9.0, "round_seconds": 2.0}]
    (tmp_path / "history.json").write_text(json.dumps(history))
    summary = summarize_run(tmp_path)
    assert (summary["metric"], summary["final"], summary["best"]) == ("eval_perplexity", 9.0, 7.4)
    assert summary["best_round"] == 2
    assert summary["seconds_per_round"] == 2.0
    assert summarize_run(tmp_path, "eval_loss")["best"] == 2.0
