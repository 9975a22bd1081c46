#!/usr/bin/env python
r"""dp_accounting's ε for the mechanisms whose peer comparison is slow to run: stored, so that
the default test run compares with dp_accounting without running it.

Independent of the package under test (never imports ``jaxrdp``); needs dp_accounting.

Quantities (dp_accounting's ``PLDAccountant``, pessimistic estimate, value discretisation
interval 1e-4, its defaults; one event composed ``steps`` times, ε read at δ):

* ``mixture``: ``MixtureOfGaussiansDpEvent(σ, sensitivities c, probabilities p)``, the
  mixture-of-Gaussians mechanism (Choquette-Choo et al. 2024, "Privacy amplification for
  matrix mechanisms"), 4.6 to 33 s per case in dp_accounting 0.6.0 on a 2-core CPU.
* ``truncated_poisson``: ``TruncatedSubsampledGaussianDpEvent(dataset_size, q, B, σ)``
  (arXiv 2508.15089); ``dataset_size`` is dp_accounting's, which counts the example whose
  presence differs, so the tests compare jaxrdp's N with dp_accounting's N + 1 (the larger
  neighbour).

The cases are defined here, and the tests parametrize over the file (tests/test_pld_mixture.py,
tests/test_pld_truncation.py); their ``slow`` test recomputes every stored value with the
installed dp_accounting and requires equality to 1e-12 relative (the file is not stale).

Output: tests/data/peer_references.json (one case per line).
Run:    python tools/make_peer_references.py     (about 1.5 minutes on a 2-core CPU)
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import time

OUT_PATH = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "peer_references.json"

# (σ, sensitivities, probabilities, steps, δ): Poisson sampling written as a mixture of two, a
# three-component mixture (cyclic Poisson's shape), one at a small δ, and a single Gaussian.
MIXTURE = [(1.0, [0.0, 1.0], [0.996, 0.004], 1000, 1e-5),
           (1.0, [0.0, 1.0, 2.0], [0.81, 0.18, 0.01], 100, 1e-5),
           (2.0, [0.0, 1.0, 2.0], [0.9, 0.09, 0.01], 500, 1e-6),
           (0.8, [1.0], [1.0], 10, 1e-5)]

# (jaxrdp's N, B, q, σ, steps, δ): MNIST's 60,000 examples at batches of 240 on average with the
# cut near the mean and above it, a small δ, and a smaller dataset at a larger rate.
TRUNCATED_POISSON = [(60_000, 300, 0.004, 1.0, 1000, 1e-5), (60_000, 290, 0.004, 0.8, 3000, 1e-6),
                     (10_000, 130, 0.01, 1.5, 500, 1e-5), (60_000, 330, 0.004, 1.0, 1000, 1e-5)]


def mixture_epsilon(sigma, c, p, steps, delta):
  """dp_accounting's ε of ``steps`` compositions of the mixture-of-Gaussians event."""
  import dp_accounting
  accountant = dp_accounting.pld.PLDAccountant()
  accountant.compose(dp_accounting.dp_event.MixtureOfGaussiansDpEvent(sigma, c, p), steps)
  return accountant.get_epsilon(delta)


def truncated_poisson_epsilon(n, b, q, sigma, steps, delta):
  """dp_accounting's ε of ``steps`` truncated Poisson steps, ``dataset_size`` n + 1 (see the
  module docstring)."""
  import dp_accounting
  accountant = dp_accounting.pld.PLDAccountant()
  accountant.compose(dp_accounting.TruncatedSubsampledGaussianDpEvent(n + 1, q, b, sigma), steps)
  return accountant.get_epsilon(delta)


def compute():
  """The file's contents: every case with dp_accounting's ε (repr of the float64)."""
  out = {"generator": "tools/make_peer_references.py",
         "dp_accounting": importlib.metadata.version("dp-accounting"),
         "interval": 1e-4, "mixture": [], "truncated_poisson": []}
  for sigma, c, p, steps, delta in MIXTURE:
    out["mixture"].append(dict(sigma=sigma, c=c, p=p, steps=steps, delta=delta,
                               epsilon=repr(mixture_epsilon(sigma, c, p, steps, delta))))
  for n, b, q, sigma, steps, delta in TRUNCATED_POISSON:
    out["truncated_poisson"].append(dict(
        dataset_size=n, max_batch_size=b, q=q, sigma=sigma, steps=steps, delta=delta,
        epsilon=repr(truncated_poisson_epsilon(n, b, q, sigma, steps, delta))))
  return out


def _dump(out):
  lines = ["{"]
  head = {k: v for k, v in out.items() if not isinstance(v, list)}
  lines += [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
  groups = [k for k, v in out.items() if isinstance(v, list)]
  for i, group in enumerate(groups):
    lines.append(f"  {json.dumps(group)}: [")
    rows = [f"    {json.dumps(case)}" for case in out[group]]
    lines.append(",\n".join(rows))
    lines.append("  ]" + ("," if i < len(groups) - 1 else ""))
  lines.append("}")
  return "\n".join(lines) + "\n"


def main():
  start = time.perf_counter()
  out = compute()
  OUT_PATH.write_text(_dump(out))
  print(f"wrote {OUT_PATH} ({sum(len(v) for v in out.values() if isinstance(v, list))} cases, "
        f"dp_accounting {out['dp_accounting']}, {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
  main()
