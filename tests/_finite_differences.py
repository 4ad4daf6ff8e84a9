"""Finite-difference gradients with a stated error bound, for the gradient tests.

Fourth-order central differences with step ``h = 1e-5``: the truncation error ``h⁴|f⁽⁵⁾|/30`` is
below ``1e-19·|f⁽⁵⁾|``, so what remains is rounding. One loss evaluation is off by at most
``δ = LOSS_ROUNDING · ε · |L|`` (the losses are means of squared residuals of sums of products,
exponentials and normalisations: at most 150 ε|L| measured on 300 random problems of the sizes the
tests draw; 2¹⁰ bounds it with room), and the stencil turns that into ``(16 + 2)/12 · δ/h``. The
bound is relative to the loss, not to a floor on the gradient: a problem whose gradient is 1e-4
beside a loss of 10 has differences dominated by rounding, and a floor of 1e-3 on the gradient's
scale made such draws fail at random.
"""

import numpy as np

STEP = 1e-5
LOSS_ROUNDING = 2 ** 10


def numeric_gradient(loss, W, h=STEP):
    """``[8(L(W + hE) − L(W − hE)) − (L(W + 2hE) − L(W − 2hE))] / (12h)``, entry by entry."""
    grad = np.zeros_like(W)
    for idx in np.ndindex(W.shape):
        step = np.zeros_like(W)
        step[idx] = h
        grad[idx] = (8 * (loss(W + step) - loss(W - step)) - (loss(W + 2 * step) - loss(W - 2 * step))) / (12 * h)
    return grad


def tolerance(gradient, loss_value, h=STEP) -> float:
    """What a closed-form gradient may differ from :func:`numeric_gradient` by: ``1e-7·max|g|``
    plus the stencil's rounding bound ``1.5 δ/h`` (a wrong term in a closed form is off by far more)."""
    return 1e-7 * np.abs(gradient).max() + 1.5 * LOSS_ROUNDING * np.finfo(float).eps * abs(loss_value) / h


def assert_gradients_match(loss_of, params, grads, loss_value, blocks=("WQ", "WK", "WV")):
    """Every block of ``grads`` equals the numeric gradient of ``loss_of(params with that block)``."""
    for block in blocks:
        numeric = numeric_gradient(lambda W: loss_of(params.replace(**{block: W})), getattr(params, block))
        error = np.abs(getattr(grads, block) - numeric).max()
        assert error <= tolerance(getattr(grads, block), loss_value), (block, error)
