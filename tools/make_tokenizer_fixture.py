#!/usr/bin/env python3
"""Builds the tokenizer test fixtures (and the Unicode tables the C pre-tokenizer uses).

    python3 tools/make_tokenizer_fixture.py                 # writes tests/fixtures/tokenizer/*
    python3 tools/make_tokenizer_fixture.py --unicode-tables core/src/tokenizer_unicode.c

Fixtures: two tiny byte-level BPE tokenizers trained with Hugging Face `tokenizers` on a small built-in text
(deterministic: same text, same trainer settings, same output):
  glm_style/tokenizer.json  GLM's layout: Sequence[Split(cl100k regex, Isolated), ByteLevel(use_regex=false)],
                            ByteLevel decoder, GLM's special tokens ([gMASK], <sop>, <|user|>, ...) as added
                            tokens, plus a tokenizer_config.json naming eos/pad as GLM's does.
  gpt2_style/tokenizer.json ByteLevel(add_prefix_space=true, use_regex=true) alone (the GPT-2 regex), with
                            ignore_merges=false, and "<|endoftext|>" as its only special.
and cases.json: for each tokenizer, ~30 hand-picked strings plus 120 random ones (fixed seed) with the ids tokenizers' encode(s, add_special_tokens=False) gives.
The C tests compare dsarl's encode with those ids exactly and check decode(encode(s)) == s.
"""
import json
import os
import random
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")

GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>"]

TRAIN_TEXT = """\
What is 12+7? Give the final answer after 'Answer:'.
The answer is 19. Answer: 19
Let's compute 345 * 21 = 7245, so the result is 7245. I'd say it's done; we'll check it.
Solve the following math problem step by step. The last line of your response should be of the form
Answer: $Answer (without quotes) where $Answer is the answer to the problem.
Remember to put your answer on its own line after "Answer:".
    Indented code: def f(x):
        return x ** 2 + 3 * x - 1
Tabs\tand\tnew\nlines, commas, semi;colons: and (parentheses) [brackets] {braces}.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 12345 3.14159 -42 +7 1/2 \\frac{1}{2} \\boxed{19}
Unicode: café naïve résumé Straße Ελληνικά русский 中文 日本語 한국어 emoji 😀 ✓ °C
Whitespace   runs    and trailing spaces   
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! They've, we're, I'm, you'll, he'd.
"""

CASES = [
    "Hello world",
    "What is 12+7? Give the final answer after 'Answer:'.",
    "Answer: 19",
    "12345678901",
    "3.14159 and -42",
    "a  b   c    d",
    "trailing spaces   ",
    "   leading spaces",
    "line one\nline two\n\nline four\n",
    "tabs\tand\r\nCRLF",
    "x ** 2 + 3 * x - 1",
    "They've we're I'm you'll he'd IT'S",
    "punctuation!!! ??? ... ;;; ---",
    "(parentheses) [brackets] {braces}",
    "\\frac{1}{2} and \\boxed{19}",
    "café naïve résumé",
    "Straße Ελληνικά русский",
    "中文 日本語 한국어",
    "emoji 😀 ✓ °C",
    "mixed123abc456def",
    "",
    " ",
    "\n",
    "\n\n\n",
    " \n ",
    "<|endoftext|>",
    "[gMASK]<sop><|user|>\nWhat is 2+2?<|assistant|>\n",
    "text<|endoftext|>more text",
    "<|user|><|assistant|>",
    "unseen words: zyxwvut qqqq",
    "¡¿ unusual ¿! ™ ©",
    "x" * 40,
]


# Atoms for the random strings (fixed seed): letters, digits, contractions, every kind of whitespace the regexes
# treat specially, Unicode letters/numbers outside ASCII (Nl, No), a combining mark, emoji and the special markers.
RANDOM_ATOMS = ["a", "Z", "q", "hello", " the", " ", "  ", "\n", "\t", "\r\n", "\r", "7", "42", "123456", "'s", "'LL",
                "'re", "!", "?", "+", "=", "\u00e9", "\u03b1", "\u4e2d", "\U0001F600", "\u2713", "Answer:", "<|user|>",
                "[gMASK]", "<|endoftext|>", "\u00a0", "\u2003", "\u216b", "\u00b2", "\u00bd", "x\u0301", "--", "...",
                "'", '"', "(", ")"]
RANDOM_CASES = 120


def random_cases():
    rng = random.Random(20261130)
    return ["".join(rng.choice(RANDOM_ATOMS) for _ in range(rng.randint(1, 30))) for _ in range(RANDOM_CASES)]


def byte_level_alphabet():
    from tokenizers import pre_tokenizers
    return pre_tokenizers.ByteLevel.alphabet()


def train_glm_style():
    from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, special_tokens=GLM_SPECIALS,
                                  initial_alphabet=byte_level_alphabet(), show_progress=False)
    tok.train_from_iterator([TRAIN_TEXT] * 3, trainer=trainer)
    return tok


def train_gpt2_style():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=byte_level_alphabet(), show_progress=False)
    tok.train_from_iterator([TRAIN_TEXT] * 3, trainer=trainer)
    return tok


def write_fixtures():
    cases = {}
    for name, tok in (("glm_style", train_glm_style()), ("gpt2_style", train_gpt2_style())):
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        size = os.path.getsize(os.path.join(d, "tokenizer.json"))
        assert size < 50_000, f"{name}/tokenizer.json is {size} bytes; keep fixtures under 50 KB"
        rows = []
        for s in CASES + random_cases():
            enc = tok.encode(s, add_special_tokens=False)
            rows.append({"text": s, "ids": enc.ids,
                         "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
        cases[name] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": rows}
    with open(os.path.join(OUT, "glm_style", "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
        f.write("\n")
    # One case per line: reviewable diffs without a 100 KB indented file.
    parts = []
    for name, entry in cases.items():
        rows = ",\n".join("  " + json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in entry["cases"])
        parts.append(f'"{name}": {{"vocab_size": {entry["vocab_size"]}, "cases": [\n{rows}\n]}}')
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        f.write("{" + ",\n".join(parts) + "}\n")


def ranges(pred):
    out, start = [], None
    for cp in range(0x110000):
        hit = pred(cp)
        if hit and start is None:
            start = cp
        elif not hit and start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return out


def write_unicode_tables(path):
    letter = ranges(lambda c: unicodedata.category(chr(c)).startswith("L"))
    number = ranges(lambda c: unicodedata.category(chr(c)).startswith("N"))
    lines = [f"/* tokenizer_unicode.c: GENERATED by tools/make_tokenizer_fixture.py --unicode-tables from Python's",
             f" * unicodedata (Unicode {unicodedata.unidata_version}); do not edit. Code point ranges of the general",
             " * categories L (\\p{L}) and N (\\p{N}) used by the pre-tokenizer regexes. */",
             '#include "tokenizer_internal.h"', ""]
    for name, rs in (("letter", letter), ("number", number)):
        lines.append(f"static const uint32_t {name}_ranges[][2] = {{")
        row = []
        for a, b in rs:
            row.append(f"{{0x{a:X}, 0x{b:X}}},")
            if len(row) == 6:
                lines.append("    " + " ".join(row))
                row = []
        if row:
            lines.append("    " + " ".join(row))
        lines.append("};")
        lines.append("")
    lines.append("""static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t c)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < r[mid][0])
            hi = mid;
        else if (c > r[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

bool tokenizer_is_letter(uint32_t c) { return in_ranges(letter_ranges, sizeof letter_ranges / sizeof *letter_ranges, c); }

bool tokenizer_is_number(uint32_t c) { return in_ranges(number_ranges, sizeof number_ranges / sizeof *number_ranges, c); }
""")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--unicode-tables":
        write_unicode_tables(sys.argv[2])
    elif len(sys.argv) == 1:
        write_fixtures()
    else:
        sys.exit(__doc__)
