"""One request's way in: its canonical form and key, body decoding, labels, overrides, perturbations and secret erasure."""

__all__ = [
    "decoding",
    "dependencies",
    "erasure",
    "headers",
    "keys",
    "labels",
    "overrides",
    "perturb",
    "secrets",
    "traffic",
]
