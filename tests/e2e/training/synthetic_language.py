#!/usr/bin/env python3
"""A synthetic language with a known entropy, for the learning test (standard library only).

The language: 16 symbols, the bytes 'a'..'p' (values v = 0..15). The first three symbols
of a file are uniform and independent; after that

    x[t] = f(x[t-1], x[t-3])   with probability 1 - eps,
    x[t] = uniform over the 16  with probability eps,

with f one of RULES, each a bijection in c = x[t-3] for every a = x[t-1]. The default,
"copy3", is f(a, c) = (5 c + 3) mod 16: the next symbol is a fixed permutation of the
one three back, whatever the previous one is; a bigram model learns nothing from it (its
best loss is ln 16), the model has to attend three positions back. "add" ((a + c) mod
16) and "flip" (c, with its top bit flipped when a >= 8) use both symbols; the tiny
model needs far more steps than a CTest budget for those (measured: "add" at 2.33 nats
after 150 steps of 1024 tokens, "flip" stuck at 1.39 after 100). The random generator is
splitmix64, written out below, so the files are the same on every Python version and
machine.

Entropy per symbol, for a model that sees x[t-1] and x[t-3]: the rule's symbol has
probability p = 1 - eps + eps/16, each of the 15 others eps/16:

    H = -p ln p - 15 (eps/16) ln(eps/16)

What the model sees. `dstrain train` reads a text file as one document followed by EOS;
sample i of a stream is tokens [i T, i T + T], T inputs and the T targets shifted by
one (lib/data/text_corpus.hpp). Target j (0-based) of a sample is predicted from inputs
0..j of the same sample only. Target j = 0 has x[t-1] but not x[t-3] (input -2); target
j = 1 has x[t-1] and x[t-2] but not x[t-3]. For those two the best prediction is
uniform, entropy ln 16, exactly:

    for every a, c -> f(a, c) is a bijection, so the uniform distribution over the
    triples (x[t-3], x[t-2], x[t-1]) is stationary (sum over c of P(n | c, a) = 1 for
    every (a, n)); the file starts in it (three uniform symbols), so every triple is
    uniform and independent: x[t-3] is uniform and independent of (x[t-2], x[t-1]),
    and x[t] = f(x[t-1], uniform) (or noise) is uniform whatever the model sees.

Targets j >= 2 see both, entropy H. The expected validation loss (mean cross-entropy
over every target of every sample, each sample having the same T positions) is

    L*(T) = (2 ln 16 + (T - 2) H) / T.

The files have k T + 1 symbols for k samples, so the document's EOS (appended by the
reader) is never a target: it is token k T + 1 of the stream, and the last target of
sample k - 1 is token k T.

usage:
  synthetic_language.py generate DIR --seq-len T --train-samples N --valid-samples M
                                     [--eps E] [--seed S] [--rule R]
      writes DIR/train.txt and DIR/valid.txt, prints L*(T), H and the empirical loss
      of the true distribution on the validation file (how far this finite sample is
      from the expectation).
  synthetic_language.py expected --seq-len T [--eps E]
"""
import argparse
import math
import os
import sys

SYMBOLS = 16
BASE = ord("a")
MASK64 = (1 << 64) - 1


class SplitMix64:
    """Steele, Lea and Flood 2014; the reference constants of Vigna's splitmix64.c."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        """A double in [0, 1) from the top 53 bits."""
        return (self.next() >> 11) * (1.0 / (1 << 53))

    def symbol(self):
        return self.next() >> 60  # top 4 bits: 0..15


RULES = {
    # name: f(a, c), a = x[t-1], c = x[t-3]; each a bijection in c for every a
    "add": lambda a, c: (a + c) % SYMBOLS,
    "flip": lambda a, c: c ^ (8 if a >= 8 else 0),
    "copy3": lambda a, c: (5 * c + 3) % SYMBOLS,
}
rule = RULES["copy3"]


def generate(n, eps, rng):
    x = [rng.symbol() for _ in range(3)]
    for t in range(3, n):
        if rng.uniform() < eps:
            x.append(rng.symbol())
        else:
            x.append(rule(x[t - 1], x[t - 3]))
    return x[:n]


def entropy(eps):
    p_rule = 1.0 - eps + eps / SYMBOLS
    p_other = eps / SYMBOLS
    h = -p_rule * math.log(p_rule)
    if p_other > 0:
        h -= (SYMBOLS - 1) * p_other * math.log(p_other)
    return h


def expected_loss(seq_len, eps):
    """L*(T): targets 0 and 1 of every sample cannot see x[t-3] (ln 16), the rest H."""
    blind = min(2, seq_len)
    return (blind * math.log(SYMBOLS) + (seq_len - blind) * entropy(eps)) / seq_len


def empirical_loss(x, seq_len, eps):
    """Cross-entropy of the true conditional distribution on the samples of `x`, with
    the same visibility as the model: the finite-sample value L*(T) is the mean of."""
    p_rule = 1.0 - eps + eps / SYMBOLS
    p_other = eps / SYMBOLS
    total, count = 0.0, 0
    for i in range((len(x) + 1 - 1) // seq_len):  # stream = x + EOS: (len + 1 - 1) / T samples
        start = i * seq_len
        for j in range(seq_len):
            t = start + j + 1  # the target's index in x
            if t >= len(x):
                raise ValueError("a target past the symbols: the file length is not k T + 1")
            if j < 2:
                total += math.log(SYMBOLS)
            else:
                total -= math.log(p_rule if x[t] == rule(x[t - 1], x[t - 3]) else p_other)
            count += 1
    return total / count


def write(path, x):
    with open(path, "wb") as f:
        f.write(bytes(BASE + v for v in x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("--seq-len", type=int, required=True)
    g.add_argument("--train-samples", type=int, required=True)
    g.add_argument("--valid-samples", type=int, required=True)
    g.add_argument("--eps", type=float, default=0.1)
    g.add_argument("--seed", type=int, default=20240611)
    g.add_argument("--rule", choices=sorted(RULES), default="copy3")
    e = sub.add_parser("expected")
    e.add_argument("--seq-len", type=int, required=True)
    e.add_argument("--eps", type=float, default=0.1)
    a = ap.parse_args()
    if a.cmd == "expected":
        print(f"{expected_loss(a.seq_len, a.eps):.6f}")
        return 0
    global rule
    rule = RULES[a.rule]
    os.makedirs(a.dir, exist_ok=True)
    T = a.seq_len
    train = generate(a.train_samples * T + 1, a.eps, SplitMix64(a.seed))
    valid = generate(a.valid_samples * T + 1, a.eps, SplitMix64(a.seed + 1))
    write(os.path.join(a.dir, "train.txt"), train)
    write(os.path.join(a.dir, "valid.txt"), valid)
    print(f"synthetic language: eps {a.eps}, H {entropy(a.eps):.6f} nats, seq_len {T}, "
          f"expected validation loss L* {expected_loss(T, a.eps):.6f} nats; "
          f"true-distribution loss on valid.txt {empirical_loss(valid, T, a.eps):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
