"""Federated instruction tuning of a small causal LM with LoRA (the job of FlowerTune / FedLLM / OpenFedLLM).

    accelerate launch recipes/llm_lora.py                                   # SmolLM2-135M on Alpaca-cleaned
    accelerate launch recipes/llm_lora.py --model_name_or_path Qwen/Qwen2.5-0.5B --fed_algorithm fedlesam
    accelerate launch recipes/llm_lora.py --dataset_name my_instructions.jsonl --partition_by user_id
    accelerate launch recipes/llm_lora.py --smoke                           # seconds, offline

Model: ``--model_name_or_path`` (default ``HuggingFaceTB/SmolLM2-135M``, Apache-2.0) loaded with
``AutoModelForCausalLM``; its tokenizer comes from the same path (a missing pad token is set to EOS). LoRA
(r 16, alpha 32, peft's default targets for the architecture) is the federated state: only adapters travel and
are averaged; the final model is merged into the base weights (``--lora_save adapter`` keeps the adapter).

Data: ``--dataset_name`` (default ``yahma/alpaca-cleaned``; any Hub id or local save_to_disk / csv / json /
jsonl / parquet with ``instruction``, ``input``, ``output`` columns, see ``--instruction_column`` ...) rendered
with Alpaca's prompt (``--prompt_template`` for another), loss on the response tokens only (the prompt is
labelled -100), cut at ``--max_seq_length`` 512. The data has one split: 2% is held out for evaluation (at most
``--max_eval_samples`` 500 rows). Clients: 20, IID (``--partition_by <column>`` for one client per user).

Every evaluation round reports ``eval_loss``, ``eval_token_loss`` (mean loss per response token), its
``eval_perplexity`` = exp(token loss) and ``eval_token_accuracy`` (next-token argmax, shifted and masked); logits
are reduced per batch (``preprocess_logits_for_metrics``), never gathered whole.

Optimizer: AdamW (lr 2e-4, as LoRA fine-tuning usually takes), 10 local steps of batch 8, 2 of 20 clients per
round, 100 rounds; SCAFFOLD/FedDyn-style corrections assume plain SGD, so keep ``--fed_algorithm`` to
FedAvg-like or SAM-like methods with AdamW. ``--smoke`` writes a tiny random-init Llama, its word-level
tokenizer and 160 Alpaca-format rows (``alpaca_data.json``) under ``<output_dir>/smoke_assets`` and runs
2 rounds on the CPU.
"""

from __future__ import annotations

import os
import sys

from hf_fedflat.cli.parsing import wants_smoke
from hf_fedflat.cli.recipes import run_recipe, smoke_asset_flags

DEFAULTS = [
    "--model_name_or_path", "HuggingFaceTB/SmolLM2-135M", "--task", "causal-lm", "--dataset_name", "yahma/alpaca-cleaned",
    "--test_fraction", "0.02", "--max_eval_samples", "500", "--max_seq_length", "512",
    "--use_lora", "true", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0.05",
    "--fed_algorithm", "fedavg", "--num_clients", "20", "--clients_per_round", "2", "--partition_scheme", "iid",
    "--num_rounds", "100", "--local_steps", "10", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
    "--optim", "adamw_torch", "--learning_rate", "2e-4", "--max_grad_norm", "1.0", "--eval_every_n_rounds", "10",
    "--save_every_n_rounds", "20", "--output_dir", "outputs/llm_lora",
]
SMOKE = [
    "--model_name_or_path", "outputs/smoke/llm_lora/smoke_assets/model",
    "--dataset_name", "outputs/smoke/llm_lora/smoke_assets/data/alpaca_data.json",
    "--test_fraction", "0.2", "--max_seq_length", "96", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0.0",
    "--num_clients", "4", "--clients_per_round", "2", "--num_rounds", "2", "--local_steps", "3",
    "--learning_rate", "0.01", "--eval_every_n_rounds", "1", "--save_every_n_rounds", "1",
    "--output_dir", "outputs/smoke/llm_lora", "--use_cpu", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


def write_smoke_assets(root: str) -> None:
    """The tiny Llama + tokenizer and the Alpaca-format rows the ``--smoke`` flags point at (offline)."""
    from hf_fedflat.data.tiny_text import write_instruction_data, write_tiny_model

    write_tiny_model(os.path.join(root, "model"), "llama")
    write_instruction_data(os.path.join(root, "data"), rows=160)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    smoke, assets = smoke_asset_flags(argv, SMOKE, "outputs/smoke/llm_lora", {
        "--model_name_or_path": "model", "--dataset_name": os.path.join("data", "alpaca_data.json")})
    if wants_smoke(argv) and not {"-h", "--help"} & set(argv):
        write_smoke_assets(assets)
    experiment, output = run_recipe(argv, DEFAULTS, smoke)
    last = next((r for r in reversed(output.history) if "eval_perplexity" in r), {})
    if last:
        print(f"final eval perplexity {last['eval_perplexity']:.3f}, token accuracy {last['eval_token_accuracy']:.4f}")
    return experiment, output


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
