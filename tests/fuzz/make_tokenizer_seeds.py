#!/usr/bin/env python3
"""Writes the seed corpora of the two tokenizer fuzz targets (deterministic: run it again, same bytes).

    python3 tests/fuzz/make_tokenizer_seeds.py

corpus/tokenizer_load/*: small tokenizer.json files (every layout dsarl loads: the GPT-2 ByteLevel regex,
Split(cl100k) and Split(Qwen2) before ByteLevel, merges as "a b" strings and as pairs, ignore_merges, an NFC
normalizer, added tokens special and not) followed by "\\n%%\\n" and a text to encode. Each is ~3 KB: the 256
byte-level symbols the loader insists on, plus merges learnt from a short built-in text. A real tokenizer.json
is 20-30 KB at the least and the fuzzer then spends its time parsing JSON it does not mutate.

corpus/tokenizer_encode/*: inputs of fuzz_tokenizer_encode, which loads tests/fixtures/tokenizer/glm_style once:
a text, optionally "\\n%%\\n" and a messages JSON array for the chat template (the conversations of
tests/fixtures/chat_templates/cases.json).
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEP = "\n%%\n"

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
TEXT = ("Hello world, the quick brown fox jumps over the lazy dog. What is 12+7? The answer is 19. "
        "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600 the then there these those")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE = bytes_to_unicode()


def learn_merges(words, n_merges):
    """Plain BPE training: the most frequent adjacent pair (ties: the smallest pair), n_merges times."""
    seqs = [[BYTE[b] for b in w.encode()] for w in words]
    merges = []
    for _ in range(n_merges):
        counts = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        for s in seqs:
            i = 0
            while i + 1 < len(s):
                if (s[i], s[i + 1]) == best:
                    s[i:i + 2] = [s[i] + s[i + 1]]
                i += 1
    return merges


def tokenizer(pre_tokenizer, specials, n_merges=24, pairs=False, ignore_merges=False, normalizer=None,
              words=None):
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": special} for i, (t, special) in enumerate(specials)]
    vocab = {t: i for i, (t, _) in enumerate(specials)}
    for b in range(256):
        vocab.setdefault(BYTE[b], len(vocab))
    merges = learn_merges(words or [" " + w for w in TEXT.split(" ")], n_merges)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
             "vocab": vocab, "merges": [[a, b] if pairs else a + " " + b for a, b in merges]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": model}


def split_then_bytelevel(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


GLM_SPECIALS = [(t, True) for t in ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
                                    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]]


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)


def load_seeds():
    out = os.path.join(HERE, "corpus", "tokenizer_load")
    gpt2 = tokenizer({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                     [("<|endoftext|>", True)])
    glm = tokenizer(split_then_bytelevel(CL100K), GLM_SPECIALS, pairs=True)
    qwen2 = tokenizer(split_then_bytelevel(QWEN2), [("<|endoftext|>", True), ("<|im_start|>", True),
                                                     ("<|im_end|>", True), ("<tool_call>", False)],
                      ignore_merges=True, normalizer={"type": "NFC"})
    plain = tokenizer({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
                      [("<s>", True), ("</s>", True), ("<pad>", True), ("[X]", False)], n_merges=8)
    texts = {
        "gpt2": "Hello world, 12 + 34 = 46 <|endoftext|> caf\u00e9 \U0001F600",
        "glm": "[gMASK]<sop><|user|>\nWhat is 2+2?<|assistant|>\n1234567 don't \r\n\t  x",
        "qwen2": "<|im_start|>user\n12345 na\u00efve<tool_call><|im_end|>\n",
        "plain": "<s>the lazy dog[X]</s> \u00ff\xfe",
    }
    for name, tok in [("gpt2", gpt2), ("glm", glm), ("qwen2", qwen2), ("plain", plain)]:
        write(os.path.join(out, name), json.dumps(tok, ensure_ascii=False, separators=(",", ":")) + SEP +
              texts[name])
    write(os.path.join(out, "unsupported"), '{"model":{"type":"Unigram","vocab":[["a",0.0]]}}' + SEP + "a")


def encode_seeds():
    out = os.path.join(HERE, "corpus", "tokenizer_encode")
    cases = json.load(open(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "cases.json")))
    texts = [c["text"] for c in cases["glm_style"]["cases"][:30]]
    convs = json.load(open(os.path.join(ROOT, "tests", "fixtures", "chat_templates", "cases.json")))
    for i, text in enumerate(texts[:12]):
        write(os.path.join(out, "text%02d" % i), text)
    for name, messages in convs["conversations"].items():
        write(os.path.join(out, "chat_" + name), "[gMASK]<sop>" + SEP +
              json.dumps(messages, ensure_ascii=False, separators=(",", ":")))
    write(os.path.join(out, "ids"), bytes(range(256)))


if __name__ == "__main__":
    load_seeds()
    encode_seeds()
