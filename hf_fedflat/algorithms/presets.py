"""The named algorithms, one registry line each (see ALGORITHMS.md, "Named algorithms")."""

from .registry import AlgorithmSpec, register_preset

register_preset(AlgorithmSpec(
    "fedavg", "none", (), "mean",
    "Local SGD, weighted average of the updates.",
    "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017",
))
register_preset(AlgorithmSpec(
    "fedsam", "sam", (), "mean",
    "Local SAM steps, weighted average.",
    "Qu et al., Generalized Federated Learning via Sharpness Aware Minimization, ICML 2022",
    defaults={"rho": 0.05},
))
register_preset(AlgorithmSpec(
    "scaffold", "none", ("scaffold",), "mean",
    "Control variates c, c_i correct client drift.",
    "Karimireddy et al., SCAFFOLD: Stochastic Controlled Averaging for Federated Learning, ICML 2020",
))
register_preset(AlgorithmSpec(
    "fedgamma", "sam", ("scaffold",), "mean",
    "SAM local steps with SCAFFOLD control variates.",
    "Dai et al., FedGAMMA: Federated Learning With Global Sharpness-Aware Minimization, TNNLS 2023",
    defaults={"rho": 0.05},
))
