"""FedLESAM on DomainNet, leave-one-domain-out, ViT-B/32 (FedLESAM's ViT set-up).

    accelerate launch recipes/domainnet_lesam.py --data_dir /data/DomainNet --held_out_domain sketch
    accelerate launch recipes/domainnet_lesam.py --dataset_path <hub copy> --image_column img --label_column label \\
        --domain_column domain --held_out_domain real --clients_per_domain 10 --participation_fraction 0.2
    accelerate launch recipes/domainnet_lesam.py --smoke

Data: the original layout ``<domain>/<class>/<image>`` (clipart, infograph, painting, quickdraw, real,
sketch; 345 classes) via ``--data_dir``, or a Hub copy via ``--dataset_path`` with its column names (the
copies on the Hub differ, so there is no default). One domain is the test set, each other domain is 1
or ``--clients_per_domain`` clients. Model and settings as in ``officehome_lesam.py``.
"""

from hf_fedflat.cli.recipes import run_recipe

DEFAULTS = [
    "--dataset_name", "domainnet", "--held_out_domain", "sketch", "--clients_per_domain", "1",
    "--num_clients", "5", "--participation_fraction", "1.0",
    "--model_name", "vit_base_patch32_224", "--pretrained", "true", "--image_size", "224",
    "--fed_algorithm", "fedlesam", "--optim", "sgd", "--learning_rate", "0.001", "--local_epochs", "5",
    "--per_device_train_batch_size", "32", "--num_rounds", "400", "--output_dir", "outputs/domainnet_lesam",
    "--save_every_n_rounds", "20",
]
SMOKE = [
    "--pretrained", "false", "--image_size", "32",
    "--model_kwargs", '{"patch_size": 16, "embed_dim": 32, "depth": 1, "num_heads": 2}',
    "--num_rounds", "2", "--local_epochs", "1", "--per_device_train_batch_size", "8", "--learning_rate", "0.01",
    "--output_dir", "outputs/smoke/domainnet_lesam", "--save_every_n_rounds", "1", "--use_cpu", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


def main(argv=None):
    return run_recipe(argv, DEFAULTS, SMOKE)


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
