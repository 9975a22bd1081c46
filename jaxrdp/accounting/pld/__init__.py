r"""Tight accounting: the privacy-loss distribution (PLD) of Poisson-sampled Gaussian DP-SGD.

For a pair of distributions (P, Q), the privacy loss is L = log(P(X)/Q(X)) with X ~ P, and the
hockey-stick divergence is δ(ε) = E_P[(1 − e^{ε − L})₊] (+ P's mass where Q is zero, "infinite
loss"). The loss of a composition is the sum of the losses of its steps, so its distribution
is the convolution of theirs (Koskela, Jälkö, Honkela 2020; Meiser, Mohammadi 2018); every
(ε, δ) guarantee of DP-SGD follows from it, with nothing lost to a conversion, which is what
makes a PLD accountant tighter than RDP.

One step of DP-SGD with Poisson sampling at rate q and noise multiplier σ (sensitivity 1), in
the two directions of add/remove adjacency (Zhu, Dong, Wang 2022, Thm. 11; dp_accounting's
``from_gaussian_mechanism`` with ``sampling_prob``):

* remove: P = (1 − q)·N(0, σ²) + q·N(1, σ²), Q = N(0, σ²), L(x) = log(1 − q + q·r(x));
* add:    P = N(0, σ²), Q = (1 − q)·N(0, σ²) + q·N(1, σ²), L(x) = −log(1 − q + q·r(x)),

with r(x) = exp((2x − 1)/(2σ²)). L is monotone in x, so the probability of a loss interval is
a difference of Gaussian CDFs at the inverse x(u) = σ²·log((e^u − (1 − q))/q) + 1/2: a smooth
function of (q, σ) on a fixed loss grid. The reported δ is the larger of the two directions'.

Discretisation, pessimistic ("connect the dots", Doroshenko, Ghazi, Kamath, Kumar, Manurangsi
2022, Alg. 1): on the grid l_k = kΔ, the P-mass of each interval [l_k, l_{k+1}] is split between
its two ends so that both its P-mass and its Q-mass (Q = e^{−L}·P) are preserved. The original
pair is a post-processing of the split one (map a point at l_k back to the original points in
proportion to what they gave it: the same map for P and Q, since every point at l_k has the
same ratio P/Q = e^{l_k}), so the split pair dominates it: its δ(ε) is ≥ the true δ(ε) at every
ε, also after composition. Losses below the grid are rounded up to its first point (moving mass
to a larger loss only increases δ), and mass above it is counted as infinite loss.

Composition: the T-fold convolution is computed by FFT on a circle of ``bins`` points:
folding each step's PMF modulo ``bins`` and convolving circularly gives the composed PMF
folded modulo ``bins`` (exactly). It is read off on the window of ``bins`` points whose top
lies above the composed loss's upper tail: a Chernoff bound, min_λ exp(Σ_i T_i K_i(λ) − λu),
with K_i the log-moment-generating function of step i's discretised loss, bounds the mass
above the window, and that bound is added to the infinite-loss mass (so mass that wrapped
around from above cannot lower δ). Mass below the window wraps to its top: a larger loss,
so only a looser δ, as long as the window starts at or below the ε that δ is read at (δ(ε)
moves the window down to ε where needed; ε(δ) read at the window's first point is that point,
a bound). The window's width is a matter of tightness only: a grid sized for the δ that ε
will be read at (``pld_grid(..., delta=δ)``, and every grid the accountant sizes itself for
ε(δ)) reaches only as far below ε as the tilt needs. Negative values from rounding in the FFT
are set to zero.

ε(δ) and δ(ε): δ(ε) = p_∞ + Σ_k p_k (1 − e^{ε − l_k})₊ is a sum over bins; ε(δ) is its root,
in closed form on the grid interval that holds it: with S₀ = Σ_{l_k > ε} p_k and
S₁ = Σ_{l_k > ε} p_k e^{−l_k} fixed there, ε = log((p_∞ + S₀ − δ)/S₁). Its derivative with
respect to q and σ (through the bin probabilities, the FFT and this formula, the interval held
fixed) is the implicit derivative of δ(ε) = δ_target: no search loop is differentiated.

Precision: float64 only. The connect-the-dots split recovers a difference of order Δ·P_k
from two numbers of size P_k (about four digits lost at Δ = 1e-4), and the FFT spreads
rounding of 1e-16 of the total mass over every bin, against δ of 1e-5 to 1e-10: float32
cannot resolve either, and is refused.

Grid sizes are static (they set array shapes): :func:`pld_grid` chooses them from concrete
parameters (the loss range of one step, the composed loss's Chernoff quantiles at
``tail_mass``). A grid too small for the parameters it is used with still gives a valid,
looser bound (more infinite-loss mass, a higher ε), never a smaller o


The modules, one job each (each imports only modules above it in this list):

* ``truncation`` — the weights of a step of truncated Poisson sampling (the chance that the
  other examples fill a batch, and the rate of the example in a cut batch), in the graph;
* ``discretisation`` — the grid's shape (:class:`PldGrid`), the constants the others share, and
  one step's pessimistic discretised PLD (:func:`step_pmfs`), Poisson or truncated Poisson;
* ``convolution`` — composition by FFT of the tilted, folded PMFs, the window it is read on,
  and the bounds on its rounding (:func:`convolution._composed`);
* ``readout`` — δ(ε) and ε(δ) read off the composed PLD, and the jitted kernels
  (:func:`pld_epsilon_unchecked`, :func:`pld_delta_unchecked`);
* ``sizing`` — grid sizes on the host from concrete parameters (:func:`grid_for`,
  :func:`grid_of`);
* ``api`` — the public functions (:func:`pld_epsilon`, :func:`pld_delta`, :func:`pld_grid`)
  and their checks.
"""

from jaxrdp.accounting.pld.discretisation import (DEFAULT_INTERVAL, DEFAULT_TAIL_MASS, MAX_BINS,
                                                  MAX_ELEMENTS, PldGrid, step_pmfs)
from jaxrdp.accounting.pld.readout import pld_delta_unchecked, pld_epsilon_unchecked
from jaxrdp.accounting.pld.sizing import grid_for, grid_of
from jaxrdp.accounting.pld.api import (checked_phases, mixture_of_gaussians_delta,
                                       mixture_of_gaussians_epsilon, mixture_of_gaussians_grid,
                                       pld_delta, pld_epsilon, pld_grid, truncation_of)
