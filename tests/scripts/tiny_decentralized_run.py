"""A tiny decentralized run configured from the command line (used by the multi-process test)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402

from hf_fedflat import FedTrainingArguments, create_trainer, init_process_group  # noqa: E402

from conftest import TinyClassifier, make_tiny_dataset  # noqa: E402


def main():
    group = init_process_group()  # before the arguments set up accelerate
    (args,) = HfArgumentParser(FedTrainingArguments).parse_args_into_dataclasses()
    torch.manual_seed(args.seed)
    model = TinyClassifier()
    train = make_tiny_dataset(n=96, seed=1)
    test = make_tiny_dataset(n=30, seed=2)
    trainer = create_trainer(model, args, train, test, label_column="labels")
    output = trainer.train()
    if group.is_main:
        local = {f"client-{c}": trainer.local_model(c)["params"].contiguous() for c in range(args.num_clients)}
        path = os.path.join(args.output_dir, "final_params.safetensors")
        save_file({"params": output.params.contiguous(), **local}, path, metadata={"world_size": str(group.world_size)})


if __name__ == "__main__":
    main()
