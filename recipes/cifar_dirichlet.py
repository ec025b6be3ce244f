"""Any algorithm on CIFAR-10/100 with Dirichlet label skew, ResNet-18-GN (FedLESAM's CIFAR set-up).

    accelerate launch recipes/cifar_dirichlet.py                                   # FedLESAM, CIFAR-10, Dir(0.3)
    accelerate launch recipes/cifar_dirichlet.py --fed_algorithm fedgam_cv --dirichlet_alpha 0.6
    accelerate launch recipes/cifar_dirichlet.py --dataset_name cifar100 --num_clients 200 --participation_fraction 0.05
    accelerate launch recipes/cifar_dirichlet.py --partition_scheme inner_dirichlet   # FedDyn/FedSMOO style, equal sizes
    accelerate launch recipes/cifar_dirichlet.py --partition_scheme pathological --classes_per_client 2
    accelerate launch recipes/cifar_dirichlet.py --data_dir /data/cifar10              # offline: save_to_disk or image folder
    accelerate launch recipes/cifar_dirichlet.py --smoke

Defaults: ``uoft-cs/cifar10``; 100 clients at 10% participation (FedLESAM also runs 200 at 5%);
Dirichlet over clients per class (FedML style); ResNet-18 with GroupNorm; SGD lr 0.1 decaying 0.998 per
round, weight decay 1e-3, 5 local epochs of batch 50, clipping at 10, random crop + flip; 800 rounds.
"""

from hf_fedflat.cli.recipes import run_recipe

DEFAULTS = [
    "--dataset_name", "cifar10", "--train_augmentation", "true", "--model_name", "resnet18_gn", "--image_size", "32",
    "--fed_algorithm", "fedlesam", "--num_clients", "100", "--participation_fraction", "0.1",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.3",
    "--optim", "sgd", "--learning_rate", "0.1", "--lr_decay_per_round", "0.998", "--weight_decay", "0.001",
    "--local_epochs", "5",
    "--per_device_train_batch_size", "50", "--num_rounds", "800", "--eval_every_n_rounds", "5",
    "--output_dir", "outputs/cifar_dirichlet", "--save_every_n_rounds", "50",
]
SMOKE = [
    "--model_name", "small_cnn", "--num_clients", "4", "--participation_fraction", "0.5", "--min_partition_size", "1",
    "--num_rounds", "2", "--local_epochs", "1", "--per_device_train_batch_size", "8", "--eval_every_n_rounds", "1",
    "--output_dir", "outputs/smoke/cifar_dirichlet", "--save_every_n_rounds", "1", "--use_cpu", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


def main(argv=None):
    return run_recipe(argv, DEFAULTS, SMOKE)


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
