"""Shared reporting for the derivation scripts in this folder (not a derivation itself).

``claim(name, ok)`` prints ``PASS: name`` or ``FAIL: name``; ``finish()`` prints the verdict and
exits with status 1 when any claim failed. Importing this module also puts the repository root
on ``sys.path`` so that a script run as ``python derivations/NAME.py`` can import the package.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAILURES: list[str] = []


def claim(name: str, ok: bool, detail: str = "") -> bool:
    """Report one claim; remember it when it fails."""
    print(f"{'PASS' if ok else 'FAIL'}: {name}{'  (' + detail + ')' if detail else ''}")
    if not ok:
        FAILURES.append(name)
    return bool(ok)


def finish() -> None:
    """Print the verdict; exit 1 if any claim failed."""
    if FAILURES:
        print(f"FAIL: {len(FAILURES)} claim(s) failed: {'; '.join(FAILURES)}")
        sys.exit(1)
    print("PASS: all claims hold")


def random_point(rng, blocks: dict, X, q, y) -> tuple[dict, dict, tuple]:
    """Random numbers for symbolic parameters and data: ``(values, arrays, (X, q, y))``.

    ``blocks`` maps ``"WQ"``, ``"WK"``, ``"WV"`` to lists of symbolic matrices, one per head;
    ``values`` substitutes every symbol, ``arrays`` holds the blocks as ``(H, rows, cols)``
    arrays and the triple the data as arrays ``(n, d)``, ``(d,)``, ``(p,)``.
    """
    values, arrays = {}, {}
    for key, mats in blocks.items():
        arr = rng.normal(size=(len(mats),) + mats[0].shape)
        arrays[key] = arr
        for h, M in enumerate(mats):
            values.update({M[i, j]: arr[h, i, j] for i in range(M.shape[0]) for j in range(M.shape[1])})
    data = tuple(rng.normal(size=S.shape) for S in (X, q, y))
    for S, v in zip((X, q, y), data):
        values.update({S[i, j]: v[i, j] for i in range(S.shape[0]) for j in range(S.shape[1])})
    return values, arrays, (data[0], data[1][:, 0], data[2][:, 0])


def package_claims(label: str, loss, values: dict, blocks: dict, loss_pkg, grads) -> None:
    """Claim that the package's loss and gradients equal the symbolic ones at ``values``."""
    import numpy as np
    import sympy as sp
    claim(f"package {label}loss equals the sympy loss",
          abs(float(loss.subs(values)) - float(loss_pkg)) <= 1e-12 * max(1.0, abs(float(loss_pkg))))
    for key, mats in blocks.items():
        sym = np.array([[[float(sp.diff(loss, M[i, j]).subs(values)) for j in range(M.shape[1])]
                         for i in range(M.shape[0])] for M in mats])
        claim(f"package {label}∇{key} equals the sympy gradient",
              np.allclose(getattr(grads, key), sym, rtol=1e-10, atol=1e-12))


def symbols(name: str, rows: int, cols: int):
    """A ``rows × cols`` matrix of real symbols ``name_ij``."""
    import sympy as sp
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}{j}", real=True))


def layer_symbols(heads: int, d: int, r: int, p: int, n: int):
    """Symbolic ``(W_Q, W_K, W_V, X, q, y, K)`` of one layer: lists of per-head matrices, data, kernels."""
    WQ = [symbols(f"Q{h}", d, r) for h in range(heads)]
    WK = [symbols(f"K{h}", d, r) for h in range(heads)]
    WV = [symbols(f"V{h}", d, p) for h in range(heads)]
    kernels = [WQ[h] * WK[h].T for h in range(heads)]
    return WQ, WK, WV, symbols("X", n, d), symbols("q", d, 1), symbols("y", p, 1), kernels
