#!/usr/bin/env python3
"""Trains tiny-bpe.json, a small byte-level BPE (vocab 600) for the C++ unit tests, with
Hugging Face tokenizers on corpus.txt, using DeepSeek-V3's pre-tokenizer sequence (Split
regexes with Unicode classes, then ByteLevel) and a few added tokens of each kind.
Run with the oracle venv: $(scripts/setup-oracles) tests/data/tokenizer/make_tiny_tokenizer.py
"""
import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

here = Path(__file__).parent
v3_pre = [
    pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
    pre_tokenizers.Split(Regex("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"), behavior="isolated"),
    pre_tokenizers.Split(Regex(
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
        " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence(v3_pre)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
tok.train([str(here / "corpus.txt")], trainer)
tok.add_special_tokens([AddedToken("<|begin|>", normalized=False), AddedToken("<|end|>", normalized=False)])
tok.add_tokens([AddedToken("<tool>", normalized=True)])
tok.save(str(here / "tiny-bpe.json"))
print("tiny-bpe.json:", tok.get_vocab_size(), "tokens")
