"""FedLESAM on OfficeHome, leave-one-domain-out, ViT-B/32 (FedLESAM's ViT set-up).

    accelerate launch recipes/officehome_lesam.py --held_out_domain Art
    accelerate launch recipes/officehome_lesam.py --fed_algorithm fedlesam_s --clients_per_domain 10 \\
        --num_clients 30 --participation_fraction 0.2 --rho 0.5 --push_to_hub --hub_model_id me/officehome-lesam
    accelerate launch recipes/officehome_lesam.py --data_dir /data/OfficeHome --pretrained_path vit_b32.safetensors
    accelerate launch recipes/officehome_lesam.py --smoke          # seconds, offline, generated images

Data: the Hub copy ``flwrlabs/office-home`` (65 classes, domains Art, Clipart, Product, Real World) or
``--data_dir`` with the original layout ``<domain>/<class>/<image>``. One domain is the test set; every
other domain is one client (``--clients_per_domain 1``, all take part) or M clients (FedLESAM: 10 per
domain at 20% participation; set ``--num_clients`` to 3*M). Model: timm ``vit_base_patch32_224`` with
ImageNet weights from the Hub (``--pretrained_path`` for a local file) and timm's preprocessing.
Paper's settings: SGD lr 0.001, 5 local epochs, batch 32, 400 rounds. ``--use_lora true`` trains only
LoRA adapters + head. Offline without a local copy: pass ``--data_dir`` and ``--pretrained_path``.
"""

from hf_fedflat.cli.recipes import run_recipe

DEFAULTS = [
    "--dataset_name", "officehome", "--held_out_domain", "Art", "--clients_per_domain", "1",
    "--num_clients", "3", "--participation_fraction", "1.0",
    "--model_name", "vit_base_patch32_224", "--pretrained", "true", "--image_size", "224",
    "--fed_algorithm", "fedlesam", "--optim", "sgd", "--learning_rate", "0.001", "--local_epochs", "5",
    "--per_device_train_batch_size", "32", "--num_rounds", "400", "--output_dir", "outputs/officehome_lesam",
    "--save_every_n_rounds", "20",
]
SMOKE = [
    "--pretrained", "false", "--image_size", "32",
    "--model_kwargs", '{"patch_size": 16, "embed_dim": 32, "depth": 1, "num_heads": 2}',
    "--num_rounds", "2", "--local_epochs", "1", "--per_device_train_batch_size", "8", "--learning_rate", "0.01",
    "--output_dir", "outputs/smoke/officehome_lesam", "--save_every_n_rounds", "1", "--use_cpu", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


def main(argv=None):
    return run_recipe(argv, DEFAULTS, SMOKE)


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
