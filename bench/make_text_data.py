"""Writes a text dataset whose every line is longer than the benchmark's sequence (so each
example fills a 2048-token row after truncation): random words, one document per line.
  python3 bench/make_text_data.py OUT.txt [--lines 400]
"""
import argparse
import random

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--lines", type=int, default=400)
p.add_argument("--words", type=int, default=3000)
args = p.parse_args()
rng = random.Random(0)
vocab = ["the", "model", "train", "data", "seven", "reverse", "add", "word", "digits", "spell", "of", "and",
         "response", "instruction", "four", "nine", "two", "eight", "zero", "one"]
with open(args.out, "w") as f:
    for _ in range(args.lines):
        f.write(" ".join(rng.choice(vocab) + rng.choice(["", "s", "ed", ",", "."]) for _ in range(args.words)) + "\n")
