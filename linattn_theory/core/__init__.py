"""The bottom layer: arrays and the model (docs/theory.md §1, §5).

Array backends (NumPy, CuPy, array-api-strict), the linear/softmax attention layer with its
closed-form gradients, client data and their stacked sufficient form, the value moments and the
frozen stage's affine client map, the clients' curvature (stable step sizes), the fused CPU
kernels, random streams by purpose, atomic file writes and the configuration error. Imports
nothing above it.
"""
from .lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".errors": ["ConfigError", "RunIntegrityError"],
    ".seeds": ["seed_sequence", "SEED_TEACHER", "SEED_CLIENT", "SEED_INIT", "SEED_MINIBATCH",
        "SEED_PARTICIPATION", "SEED_EVAL"],
    ".clients": ["ClientDataset", "FederatedDataset", "StackedClients", "as_federated", "stack_clients"],
    ".model": ["Params", "kernel", "context_second_moment", "features", "predict", "predict_from_moments",
        "loss_and_grad", "loss_and_grad_from_moments", "kernel_gradient_from_moments", "ATTENTIONS",
        "softmax_weights", "softmax_features", "attention_features", "predict_from_contexts",
        "loss_and_grad_from_contexts", "loss_and_grad_from_inputs", "kernel_gradient_from_inputs"],
    ".moments": ["ValueMoments", "value_moments", "value_objective"],
    ".frozen_map": ["frozen_client_map"],
    ".curvature": ["value_curvature", "stable_learning_rate", "hessian_curvature"],
    ".backend": ["BACKENDS", "BackendUnavailableError", "get_namespace", "gpu_available", "client_chunks",
        "client_working_bytes", "resolve_max_bytes", "CPU_CHUNK_BYTES"],
    ".fused": ["ENGINES", "MIN_STEP_WORK", "FusedEngine", "numba_available",
        "default_threads", "set_threads"],
    ".io": ["atomic_write_bytes", "atomic_write_text", "write_json", "write_run", "read_run", "run_status",
        "provenance", "timed_run", "RUN_FILES"],
}, submodules=("errors", "seeds", "clients", "model", "moments", "frozen_map", "curvature", "backend", "fused",
             "io",))
