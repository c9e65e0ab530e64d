#!/usr/bin/env python3
"""Draws (response, ground truth) pairs in the shapes DAPO-Math-17k, AIME and MATH answers take and labels each
with Hugging Face math-verify called exactly as NeMo RL's hf_math_verify does (gold wrapped in \\boxed{}, gold
extraction LatexExtractionConfig(), prediction extraction ExprExtractionConfig() then LatexExtractionConfig()).

Fixture-making time only: dsarl never runs Python when it trains. Usage:
    python3 -m venv VENV && VENV/bin/pip install 'math-verify==0.9.*'
    VENV/bin/python tools/make_math_verify_fixtures.py --n 10000 --seed 1 --out tests/fixtures/math_verify/pairs_10k.jsonl
Each output line is {"response": ..., "ground_truth": ..., "label": 0|1}; label -1 marks a pair on which
math-verify raised (NeMo RL scores those 0.0 as well)."""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
from fractions import Fraction


def _rand_int(rng):
    r = rng.random()
    if r < 0.5:
        return rng.randint(0, 999)  # AIME answers are 000..999
    if r < 0.8:
        return rng.randint(-100, 100)
    return rng.randint(1000, 10**7)


def _thousands(n):
    return f"{n:,}"


def _frac_latex(f, cmd="\\frac"):
    s = "-" if f < 0 else ""
    return f"{s}{cmd}{{{abs(f.numerator)}}}{{{f.denominator}}}"


def _dec(x, places):
    return f"{x:.{places}f}"


def shape_integer(rng):
    n = _rand_int(rng)
    gold = str(n)
    eq = [str(n), f"{n}.0", f"{n}" if n < 0 else f"+{n}" if rng.random() < 0.1 else str(n), f"\\text{{{n}}}",
          f"{n} \\text{{ cm}}", f"{n}^\\circ", f"\\${n}" if n >= 0 else str(n), f"x = {n}", f"{n}\\%"]
    if abs(n) >= 1000:
        eq += [_thousands(n), _thousands(n).replace(",", "{,}"), _thousands(n).replace(",", "\\,")]
    if n > 0 and n < 1000 and rng.random() < 0.3:
        eq.append(f"{n:03d}")
    wrong = [str(n + 1), str(n - 1), str(-n) if n else "1", str(n * 10), f"{n}.5", f"\\frac{{{n}}}{{2}}"]
    return gold, eq, wrong


def shape_fraction(rng):
    while True:
        p, q = rng.randint(-60, 60), rng.randint(2, 40)
        f = Fraction(p, q)
        if f.denominator != 1:
            break
    cmd = rng.choice(["\\frac", "\\dfrac", "\\tfrac"])
    gold = _frac_latex(f, rng.choice(["\\frac", "\\frac", "\\dfrac"]))
    k = rng.randint(2, 4)
    eq = [_frac_latex(f, cmd), f"{f.numerator}/{f.denominator}", _frac_latex(f).replace("-", "") if False else
          f"\\frac{{{f.numerator * k}}}{{{f.denominator * k}}}", _dec(float(f), 6), _dec(float(f), 8)]
    if f.denominator in (2, 4, 5, 8, 10, 20, 25):
        eq.append(str(float(f)))
    if abs(f.numerator) < 10 and f.denominator < 10 and f > 0:
        eq.append(f"\\frac{f.numerator}{f.denominator}")
    if f > 1:
        w, r = divmod(f.numerator, f.denominator)
        eq.append(f"{w}\\frac{{{r}}}{{{f.denominator}}}")
    wrong = [_frac_latex(f + 1), _frac_latex(-f), f"\\frac{{{f.denominator}}}{{{f.numerator}}}" if f.numerator else "1",
             _dec(float(f), 2), _dec(float(f), 3), f"{f.numerator}"]
    return gold, eq, wrong


def shape_decimal(rng):
    x = round(rng.uniform(-100, 100), rng.choice([1, 2, 3]))
    gold = str(x)
    f = Fraction(str(x))
    eq = [str(x), f"{x}0", _frac_latex(f) if f.denominator != 1 else str(f.numerator), f"{x} \\text{{ m}}"]
    wrong = [str(round(x + 0.1, 3)), str(round(x * 10, 3)), str(-x) if x else "1", str(round(x + 0.01, 4))]
    return gold, eq, wrong


def shape_radical(rng):
    a, b = rng.randint(1, 9), rng.choice([2, 3, 5, 6, 7, 10, 11])
    c = rng.choice([1, 2, 3, 4, 6])
    forms = rng.random()
    if forms < 0.4:
        gold = f"{a}\\sqrt{{{b}}}" if a != 1 else f"\\sqrt{{{b}}}"
        val = a * math.sqrt(b)
        eq = [gold, f"\\sqrt{{{a * a * b}}}", f"{a} \\sqrt {{{b}}}" if a != 1 else f"\\sqrt{b}", _dec(val, 6),
              f"\\sqrt{{{b}}} \\cdot {a}", f"{a}\\times\\sqrt{{{b}}}"]
        wrong = [f"{a + 1}\\sqrt{{{b}}}", f"\\sqrt{{{a * b}}}", _dec(val, 2), f"{a}\\sqrt{{{b + 1}}}"]
    elif forms < 0.7:
        gold = f"\\frac{{{a}\\sqrt{{{b}}}}}{{{c + 1}}}"
        val = a * math.sqrt(b) / (c + 1)
        eq = [gold, f"\\dfrac{{{a}\\sqrt{{{b}}}}}{{{c + 1}}}", f"\\frac{{{a}}}{{{c + 1}}}\\sqrt{{{b}}}", _dec(val, 7)]
        wrong = [f"\\frac{{{a}\\sqrt{{{b}}}}}{{{c + 2}}}", f"\\frac{{{a}}}{{{c + 1}}}", _dec(val, 3)]
    else:
        gold = f"{a} + {c}\\sqrt{{{b}}}" if rng.random() < 0.5 else f"{a} - {c}\\sqrt{{{b}}}"
        sign = 1 if "+" in gold else -1
        eq = [gold, f"{c}\\sqrt{{{b}}} + {a}" if sign > 0 else f"-{c}\\sqrt{{{b}}} + {a}",
              _dec(a + sign * c * math.sqrt(b), 7), f"\\sqrt[3]{{{(a) ** 3}}} {'+' if sign > 0 else '-'} {c}\\sqrt{{{b}}}"]
        wrong = [f"{a} {'-' if sign > 0 else '+'} {c}\\sqrt{{{b}}}", f"{a + 1} + {c}\\sqrt{{{b}}}"]
    return gold, eq, wrong


def shape_pi(rng):
    a, b = rng.randint(1, 12), rng.choice([1, 1, 2, 3, 4, 6])
    gold = (f"{a}\\pi" if a != 1 else "\\pi") if b == 1 else f"\\frac{{{a}\\pi}}{{{b}}}"
    val = a * math.pi / b
    eq = [gold, (f"\\pi {a}" if b == 1 else f"\\frac{{{a}}}{{{b}}}\\pi"), _dec(val, 6), f"{a}\\cdot\\pi/{b}" if b > 1
          else f"{a} \\pi"]
    wrong = [f"{a + 1}\\pi", _dec(val, 2), str(a), f"\\frac{{{a}}}{{{b + 1}}}\\pi"]
    return gold, eq, wrong


def shape_power(rng):
    b, e = rng.randint(2, 9), rng.randint(2, 8)
    gold = str(b ** e) if rng.random() < 0.5 else f"{b}^{{{e}}}"
    eq = [f"{b}^{{{e}}}", f"{b}^{e}", str(b ** e)]
    wrong = [f"{b}^{{{e + 1}}}", str(b ** e + 1), f"{e}^{{{b}}}" if b != e else "1"]
    return gold, eq, wrong


def shape_interval(rng):
    a = rng.randint(-20, 10)
    b = a + rng.randint(1, 15)
    lo = rng.choice(["(", "["])
    hi = rng.choice([")", "]"])
    left = "-\\infty" if rng.random() < 0.2 else str(a)
    right = "\\infty" if rng.random() < 0.2 else str(b)
    if left == "-\\infty":
        lo = "("
    if right == "\\infty":
        hi = ")"
    gold = f"{lo}{left}, {right}{hi}"
    eq = [gold, f"{lo}{left},{right}{hi}", f"\\left{lo}{left}, {right}\\right{hi}", f"{lo} {left} , {right} {hi}"]
    flip = {"(": "[", "[": "(", ")": "]", "]": ")"}
    wrong = [f"{flip[lo]}{left}, {right}{hi}", f"{lo}{left}, {right}{flip[hi]}", f"{lo}{left}, {b + 1}{hi}"]
    if rng.random() < 0.3:
        c = b + rng.randint(1, 5)
        d = c + rng.randint(1, 5)
        gold = f"({a}, {b}) \\cup ({c}, {d})"
        eq = [gold, f"({a},{b})\\cup({c},{d})", f"\\left({a}, {b}\\right) \\cup \\left({c}, {d}\\right)"]
        wrong = [f"({a}, {b}] \\cup ({c}, {d})", f"({a}, {d})"]
    return gold, eq, wrong


def shape_set(rng):
    k = rng.randint(2, 4)
    xs = rng.sample(range(-15, 25), k)
    els = [str(x) for x in xs]
    gold = ", ".join(els) if rng.random() < 0.6 else "\\{" + ", ".join(els) + "\\}"
    perm = els[:]
    rng.shuffle(perm)
    eq = [", ".join(els), ",".join(perm), "\\{" + ", ".join(perm) + "\\}", " \\text{ and } ".join(els) if k == 2 else
          ", ".join(els), f"x = {', '.join(els)}"]
    wrong = [", ".join(els[:-1]), ", ".join(els[:-1] + [str(xs[-1] + 1)]), "\\{" + ", ".join(els + ["99"]) + "\\}"]
    return gold, eq, wrong


def shape_tuple(rng):
    k = rng.choice([2, 2, 3])
    xs = [rng.randint(-9, 9) for _ in range(k)]
    gold = "(" + ", ".join(map(str, xs)) + ")"
    eq = [gold, "(" + ",".join(map(str, xs)) + ")", "\\left(" + ", ".join(map(str, xs)) + "\\right)"]
    rev = list(reversed(xs))
    wrong = ["(" + ", ".join(map(str, rev)) + ")" if rev != xs else "(0, 0, 1)",
             "(" + ", ".join(map(str, [x + 1 for x in xs])) + ")"]
    return gold, eq, wrong


def shape_expression(rng):
    a, b, c = rng.randint(1, 6), rng.randint(1, 6), rng.randint(-5, 5)
    v = rng.choice(["x", "x", "n", "t", "a"])
    pick = rng.randrange(6)
    if pick == 0:
        gold = f"{a}{v}^2 + {b}{v} {'+' if c >= 0 else '-'} {abs(c)}"
        eq = [gold, f"{b}{v} + {a}{v}^{{2}} {'+' if c >= 0 else '-'} {abs(c)}", f"{a}\\cdot {v}^2+{b}\\cdot {v}{'+' if c >= 0 else '-'}{abs(c)}"]
        wrong = [f"{a}{v}^2 + {b + 1}{v} {'+' if c >= 0 else '-'} {abs(c)}", f"{a}{v}^3 + {b}{v}"]
    elif pick == 1:
        gold = f"({v}+{a})({v}+{b})"
        eq = [gold, f"{v}^2 + {a + b}{v} + {a * b}", f"({v}+{b})({v}+{a})"]
        wrong = [f"{v}^2 + {a + b}{v} + {a * b + 1}", f"({v}-{a})({v}+{b})"]
    elif pick == 2:
        gold = f"\\frac{{{v}+{a}}}{{{b}}}"
        eq = [gold, f"\\frac{{{v}}}{{{b}}} + \\frac{{{a}}}{{{b}}}", f"({v}+{a})/{b}"]
        wrong = [f"\\frac{{{v}+{a + 1}}}{{{b}}}", f"\\frac{{{b}}}{{{v}+{a}}}"]
    elif pick == 3:
        gold = f"{v} = {a}"
        eq = [gold, str(a), f"{v}={a}"]
        wrong = [str(a + 1), f"{v} = {-a}"]
    elif pick == 4:
        gold = f"{v} > {a}" if rng.random() < 0.5 else f"{v} \\le {a}"
        inv = {">": "<", "\\le": "\\ge"}
        op = ">" if ">" in gold else "\\le"
        eq = [gold, f"{a} {inv[op]} {v}"]
        wrong = [f"{v} {inv[op]} {a}", f"{v} {op} {a + 1}"]
    else:
        gold = f"{a}\\sqrt{{{v}}}" if rng.random() < 0.5 else f"{v}^{{{a + 1}}}"
        eq = [gold, gold.replace(" ", "")]
        wrong = [gold.replace(v, "y"), f"{a + 7}"]
    return gold, eq, wrong


def shape_text(rng):
    word = rng.choice(["Monday", "yes", "no", "A", "B", "C", "D", "E", "even", "odd", "Tuesday"])
    gold = rng.choice([word, f"\\text{{{word}}}", f"\\text{{({word})}}" if len(word) == 1 else word])
    eq = [word, f"\\text{{{word}}}", f"\\textbf{{{word}}}", word.lower() if len(word) > 1 else word]
    wrong = [rng.choice(["Friday", "maybe", "F", "G", "prime"]), "0"]
    return gold, eq, wrong


def shape_percent(rng):
    p = rng.randint(1, 99)
    gold = rng.choice([f"{p}\\%", str(p), f"{p}%"])
    eq = [f"{p}\\%", str(p), f"{p} \\%", f"{p}\\text{{ percent}}"]
    wrong = [f"{p + 1}\\%", str(p + 1)]
    return gold, eq, wrong


def shape_degree(rng):
    d = rng.choice([30, 45, 60, 90, 120, 135, 150, 36, 72])
    gold = rng.choice([str(d), f"{d}^\\circ", f"{d}^{{\\circ}}"])
    eq = [str(d), f"{d}^\\circ", f"{d}^{{\\circ}}", f"{d} \\text{{ degrees}}"]
    wrong = [str(d + 1), str(180 - d) if d != 90 else "45"]
    return gold, eq, wrong


def shape_matrix(rng):
    xs = [rng.randint(-5, 5) for _ in range(rng.choice([2, 3, 4]))]
    env = rng.choice(["pmatrix", "bmatrix"])
    if len(xs) == 4 and rng.random() < 0.5:
        body = f"{xs[0]} & {xs[1]} \\\\ {xs[2]} & {xs[3]}"
    else:
        body = " \\\\ ".join(map(str, xs))
    gold = f"\\begin{{{env}}} {body} \\end{{{env}}}"
    eq = [gold, gold.replace(" ", "")]
    wrong = [gold.replace(str(xs[0]), str(xs[0] + 1), 1)]
    return gold, eq, wrong


def shape_complex(rng):
    a, b = rng.randint(-9, 9), rng.choice([x for x in range(-9, 10) if x])
    def c(a, b, order=0):
        bi = ("" if abs(b) == 1 else str(abs(b))) + "i"
        if order == 0:
            return (f"{a} {'+' if b > 0 else '-'} {bi}" if a else (bi if b > 0 else "-" + bi))
        return f"{'-' if b < 0 else ''}{bi} {'+' if a >= 0 else '-'} {abs(a)}"
    gold = c(a, b)
    eq = [gold, c(a, b, 1), gold.replace(" ", "")]
    wrong = [c(a, -b), c(a + 1, b), c(b, a) if a else c(1, b)]
    return gold, eq, wrong


def shape_equation(rng):
    m, q = rng.randint(-5, 5) or 2, rng.randint(-9, 9)
    v = rng.choice(["y", "f(x)"])
    qs = f"{'+' if q >= 0 else '-'} {abs(q)}"
    gold = f"y = {m}x {qs}" if rng.random() < 0.7 else f"{m}x {qs}"
    eq = [f"y = {m}x {qs}", f"y={m}x{qs.replace(' ', '')}", f"y = {q} + {m}x" if q >= 0 else f"y = {m}x - {abs(q)}",
          f"{m}x {qs}", f"{v} = {m}x {qs}"]
    wrong = [f"y = {m + 1}x {qs}", f"y = {m}x {'+' if q < 0 else '-'} {abs(q)}", f"x = {m}y {qs}"]
    if rng.random() < 0.3:
        r = rng.randint(2, 9)
        gold = f"x^2 + y^2 = {r * r}"
        eq = [gold, f"y^2 + x^2 = {r * r}", f"x^2+y^2={r}^2"]
        wrong = [f"x^2 + y^2 = {r}", f"x^2 - y^2 = {r * r}"]
    return gold, eq, wrong


def shape_trig_log(rng):
    pick = rng.randrange(5)
    if pick == 0:
        gold, eq, wrong = "\\frac{\\sqrt{3}}{2}", ["\\frac{\\sqrt3}{2}", "\\sin \\frac{\\pi}{3}", "\\cos(\\pi/6)",
                                                  "0.866025"], ["\\frac{\\sqrt{2}}{2}", "\\frac{1}{2}", "0.87"]
    elif pick == 1:
        b, e = rng.choice([2, 3, 5, 10]), rng.randint(1, 4)
        gold, eq, wrong = str(e), [f"\\log_{{{b}}} {b ** e}", f"\\log_{b}{{{b ** e}}}", str(e)], [str(e + 1), f"\\log_{{{b}}} {b ** e + 1}"]
    elif pick == 2:
        k = rng.randint(2, 5)
        gold, eq, wrong = f"e^{{{k}}}", [f"e^{k}", f"\\exp({k})", _dec(math.e ** k, 6)], [f"e^{{{k + 1}}}", f"{k}e"]
    elif pick == 3:
        k = rng.randint(2, 9)
        gold, eq, wrong = f"\\ln {k}", [f"\\ln({k})", f"\\log {k}", _dec(math.log(k), 7)], [f"\\ln {k + 1}", f"\\log_{{10}} {k}"]
    else:
        gold, eq, wrong = "\\frac{\\pi}{4}", ["\\pi/4", "\\frac{1}{4}\\pi", "0.785398", "\\arctan 1"], ["\\frac{\\pi}{3}", "45"]
    return gold, eq, wrong


def shape_mixed(rng):
    w, d = rng.randint(1, 9), rng.choice([2, 3, 4, 5, 8])
    r = rng.randint(1, d - 1)
    f = Fraction(w * d + r, d)
    gold = rng.choice([f"{w}\\frac{{{r}}}{{{d}}}", _frac_latex(f)])
    eq = [f"{w}\\frac{{{r}}}{{{d}}}", f"{w} \\dfrac{{{r}}}{{{d}}}", _frac_latex(f), f"{f.numerator}/{f.denominator}",
          _dec(float(f), 6)]
    wrong = [f"{w}\\frac{{{r}}}{{{d + 1}}}", _frac_latex(Fraction(w * r, d)), f"{w + 1}\\frac{{{r}}}{{{d}}}"]
    return gold, eq, wrong


def shape_big(rng):
    n = rng.randint(10**4, 10**9)
    gold = str(n) if rng.random() < 0.7 else _thousands(n)
    eq = [str(n), _thousands(n), _thousands(n).replace(",", "{,}"), _thousands(n).replace(",", "\\,"),
          _thousands(n).replace(",", " "), f"{n} \\text{{ dollars}}", f"\\${_thousands(n)}"]
    wrong = [str(n + 1), _thousands(n + 1000), str(n // 10)]
    return gold, eq, wrong


def shape_inequality(rng):
    a = rng.randint(-9, 9)
    b = a + rng.randint(1, 9)
    pick = rng.randrange(3)
    if pick == 0:
        gold = f"{a} < x < {b}"
        eq = [gold, f"({a}, {b})", f"{a}<x<{b}"]
        wrong = [f"{a} \\le x < {b}", f"[{a}, {b})", f"x < {b}"]
    elif pick == 1:
        gold = f"x \\geq {a}"
        eq = [gold, f"[{a}, \\infty)", f"x \\ge {a}", f"{a} \\leq x"]
        wrong = [f"x > {a}", f"({a}, \\infty)", f"x \\le {a}"]
    else:
        gold = f"({a}, {b})"
        eq = [gold, f"{a} < x < {b}", f"x \\in ({a}, {b})", f"{a}, {b}"]
        wrong = [f"[{a}, {b}]", f"{b}, {a}"]
    return gold, eq, wrong


def shape_pm(rng):
    a, b = rng.randint(-5, 5), rng.choice([2, 3, 5, 6, 7])
    gold = f"{a} \\pm \\sqrt{{{b}}}"
    eq = [gold, f"{a} + \\sqrt{{{b}}}, {a} - \\sqrt{{{b}}}", f"{a}-\\sqrt{{{b}}},{a}+\\sqrt{{{b}}}"]
    wrong = [f"{a} + \\sqrt{{{b}}}", f"{a} \\pm \\sqrt{{{b + 1}}}"]
    return gold, eq, wrong


def shape_malformed(rng):
    n = rng.randint(0, 99)
    gold = str(n)
    eq = [f"\\frac{{{n}", f"{n}}}", f"\\sqrt{{{n}", f"{{{n}}}", f"({n}", f"{n})", f"\\left( {n} \\right.",
          f"\\text{{{n}", f"{n} = ", f"= {n}", f"{n}^{{", f"\\boxed{{{n}}}"]
    wrong = [f"\\frac{{{n + 1}", "\\\\", "{}", "\\frac{}{}", "^", "\\text{}", "\\sqrt{-}"]
    return gold, eq, wrong


NOISE = [lambda s: s, lambda s: s.replace("\\frac", "\\dfrac"), lambda s: s.replace("(", "\\left(").replace(")", "\\right)"),
         lambda s: "\\displaystyle " + s, lambda s: s.replace(" ", ""), lambda s: s.replace(",", ", "),
         lambda s: s + "\\,", lambda s: s.replace("\\text", "\\mathrm"), lambda s: "  " + s + " ",
         lambda s: s + "\\!", lambda s: s.replace("\\sqrt", "\\sqrt "), lambda s: s + " \\text{units}"]


SHAPES = [(shape_integer, 24), (shape_fraction, 12), (shape_decimal, 5), (shape_radical, 8), (shape_pi, 4),
          (shape_power, 3), (shape_interval, 6), (shape_set, 4), (shape_tuple, 4), (shape_expression, 7),
          (shape_text, 3), (shape_percent, 2), (shape_degree, 2), (shape_matrix, 2), (shape_complex, 2),
          (shape_equation, 3), (shape_trig_log, 3), (shape_mixed, 2), (shape_big, 3), (shape_inequality, 3),
          (shape_pm, 1), (shape_malformed, 3)]

FILLER = ["Let me think step by step.", "First, we compute the sum of 3 and 4, which is 7.",
          "Then we multiply by 12 to get 84.", "Note that $x^2 - 1 = (x-1)(x+1)$.",
          "We check the case n = 5 separately.", "So the area is half of 10 times 6.",
          "By the Pythagorean theorem, $a^2 + b^2 = c^2$.", "There are 2 cases to consider.",
          "Substituting $y = 3$ gives $2y + 1 = 7$.", "Hence the value we want is what follows."]


def wrap(rng, ans):
    """A response around ans: the ways models end a solution, plus noise."""
    pre = " ".join(rng.sample(FILLER, rng.randint(0, 4)))
    r = rng.random()
    if r < 0.40:
        tail = f"Therefore, the answer is $\\boxed{{{ans}}}$."
    elif r < 0.55:
        tail = f"The answer is \\boxed{{{ans}}}"
    elif r < 0.62:
        tail = f"\\[\\boxed{{{ans}}}\\]"
    elif r < 0.68:
        tail = f"Final Answer: The final answer is ${ans}$. I hope it is correct."
    elif r < 0.74:
        tail = f"Answer: ${ans}$"
    elif r < 0.78:
        tail = f"Answer: {ans}"
    elif r < 0.83:
        tail = f"So the result is ${ans}$."
    elif r < 0.86:
        tail = f"The answer is {ans}."
    elif r < 0.89:
        tail = f"We first guessed \\boxed{{{rng.randint(0, 50)}}} but on reflection the answer is \\boxed{{{ans}}}."
    elif r < 0.91:
        tail = f"\\boxed{{{ans}"  # unclosed: a truncated generation
    elif r < 0.93:
        tail = f"$\\boxed{{ {ans} }}$ \n\nI hope this helps."
    elif r < 0.95:
        tail = f"**Answer:** \\(\\boxed{{{ans}}}\\)"
    elif r < 0.955:
        tail = f"The final answer is $\\boxed{{{ans}}}$"
    elif r < 0.96:
        tail = f"**Final Answer**\n\n\\[\n\\boxed{{{ans}}}\n\\]"
    elif r < 0.965:
        tail = f"Thus $x = \\boxed{{{ans}}}$ and we are done."
    elif r < 0.97:
        tail = f"$$\\boxed{{{ans}}}$$"
    elif r < 0.975:
        tail = f"so the answer: {ans}"
    elif r < 0.98:
        tail = f"The answer is $\\boxed{{{ans}}}$ (rounded)."
    else:
        tail = rng.choice(["I could not solve this.", "", "\\boxed{}", "The answer is $", "$$" + ans])
    return (pre + " " + tail).strip() if pre else tail


def draw(rng):
    fn = rng.choices([s for s, _ in SHAPES], weights=[w for _, w in SHAPES])[0]
    gold, eq, wrong = fn(rng)
    ans = rng.choice(eq) if rng.random() < 0.6 else rng.choice(wrong)
    if rng.random() < 0.25:
        ans = rng.choice(NOISE)(ans)
    if rng.random() < 0.05:
        gold = rng.choice(NOISE)(gold)
    return {"response": wrap(rng, ans), "ground_truth": gold}


_VERIFY = None


def _label(pair):
    global _VERIFY
    if _VERIFY is None:
        import logging
        from math_verify.metric import math_metric
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
        logging.getLogger("math_verify").setLevel(logging.CRITICAL)
        _VERIFY = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                              pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:
        score, _ = _VERIFY(["\\boxed{" + pair["ground_truth"] + "}"], [pair["response"]])
        pair["label"] = int(score)
    except BaseException:  # TimeoutException derives from BaseException; NeMo RL scores it 0.0
        pair["label"] = -1
    return pair


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pairs = [draw(rng) for _ in range(args.n)]
    with mp.Pool(args.jobs) as pool:
        labelled = pool.map(_label, pairs, chunksize=64)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        for p in labelled:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)
    n1 = sum(p["label"] == 1 for p in labelled)
    print(f"{args.out}: {len(labelled)} pairs, {n1} correct, {sum(p['label'] == -1 for p in labelled)} raised")


if __name__ == "__main__":
    main()
