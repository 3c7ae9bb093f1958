"""The built-in suite: small Python function tasks in the HumanEval format, each with a reference
solution, inputs, and a pool of candidate answers (correct variants and subtly wrong ones) from
which the built-in provider draws. Written for this project; no benchmark data is copied.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SuiteTask:
    task_id: str
    entry_point: str
    prompt: str
    right: tuple[str, ...]  # function bodies that pass (the first is the reference)
    wrong: tuple[str, ...]  # function bodies that fail on at least one input
    inputs: tuple[tuple, ...]

    def program(self, body: str) -> str:
        return self.prompt + body


def _t(name: str, sig: str, doc: str, right: list[str], wrong: list[str], inputs: list[tuple]) -> tuple:
    return name, sig, doc, right, wrong, inputs


_SPECS = [
    _t("sum_list", "xs: list", "Return the sum of the numbers in xs.",
       ["return sum(xs)", "total = 0\n    for x in xs:\n        total += x\n    return total"],
       ["return sum(xs[1:])", "return sum(xs) + (1 if len(xs) > 3 else 0)"],
       [([],), ([1],), ([1, 2, 3],), ([-5, 5, 10, 2],), (list(range(20)),)]),
    _t("max_of", "xs: list", "Return the largest element of a non-empty list.",
       ["return max(xs)", "best = xs[0]\n    for x in xs:\n        if x > best:\n            best = x\n    return best"],
       ["return sorted(xs)[-2] if len(xs) > 1 else xs[0]", "return xs[-1]"],
       [([3],), ([1, 5, 2],), ([-3, -1, -2],), ([7, 7, 1],), ([0, 10, 9, 10],)]),
    _t("count_vowels", "s: str", "Count the vowels (a, e, i, o, u, either case) in s.",
       ["return sum(c in 'aeiouAEIOU' for c in s)", "return len([c for c in s.lower() if c in 'aeiou'])"],
       ["return sum(c in 'aeiou' for c in s)", "return sum(c in 'aeiouy' for c in s.lower())"],
       [("",), ("hello",), ("AEIOU",), ("rhythm",), ("Yay you",)]),
    _t("reverse_words", "s: str", "Return the words of s in reverse order, joined by single spaces.",
       ["return ' '.join(reversed(s.split()))", "return ' '.join(s.split()[::-1])"],
       ["return ' '.join(reversed(s.split(' ')))", "return s[::-1]"],
       [("a b c",), ("hello world",), ("  spaced   out  ",), ("one",), ("",)]),
    _t("is_palindrome", "s: str", "True if s reads the same backwards, ignoring case and non-letters.",
       ["t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]",
        "t = ''.join(c for c in s.lower() if c.isalpha())\n    return t == t[::-1]"],
       ["return s == s[::-1]", "t = s.lower().replace(' ', '')\n    return t == t[::-1]"],
       [("Racecar",), ("A man, a plan, a canal: Panama",), ("abc",), ("",), ("No 'x' in Nixon",)]),
    _t("fib", "n: int", "Return the n-th Fibonacci number, with fib(0) == 0 and fib(1) == 1.",
       ["a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        "if n < 2:\n        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n    return b"],
       ["a, b = 1, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        "a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n    return a"],
       [(0,), (1,), (2,), (10,), (25,)]),
    _t("factorial", "n: int", "Return n! for n >= 0.",
       ["r = 1\n    for k in range(2, n + 1):\n        r *= k\n    return r", "import math\n    return math.factorial(n)"],
       ["r = 1\n    for k in range(2, n):\n        r *= k\n    return r", "return n * (n - 1) if n > 1 else 1"],
       [(0,), (1,), (5,), (10,), (3,)]),
    _t("gcd", "a: int, b: int", "Greatest common divisor of two non-negative integers.",
       ["while b:\n        a, b = b, a % b\n    return a", "import math\n    return math.gcd(a, b)"],
       ["return min(a, b)", "while b > 1:\n        a, b = b, a % b\n    return a"],
       [(12, 18), (7, 13), (0, 5), (100, 75), (21, 14)]),
    _t("dedupe", "xs: list", "Remove duplicates from xs, keeping the first occurrence of each, in order.",
       ["seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out",
        "return list(dict.fromkeys(xs))"],
       ["return sorted(set(xs))", "return list(set(xs))"],
       [([3, 1, 3, 2, 1],), ([],), ([5, 4, 3],), ([2, 2, 2],), ([9, 1, 9, 0, 1],)]),
    _t("second_largest", "xs: list", "Return the second largest distinct value, or None if there is none.",
       ["u = sorted(set(xs))\n    return u[-2] if len(u) > 1 else None",
        "u = sorted(set(xs), reverse=True)\n    return u[1] if len(u) > 1 else None"],
       ["u = sorted(xs)\n    return u[-2] if len(u) > 1 else None", "u = sorted(set(xs))\n    return u[1] if len(u) > 1 else None"],
       [([1, 2, 3],), ([5, 5, 4],), ([1],), ([7, 7],), ([4, 9, 2, 9, 8],)]),
    _t("running_sum", "xs: list", "Return the list of prefix sums of xs.",
       ["out, t = [], 0\n    for x in xs:\n        t += x\n        out.append(t)\n    return out",
        "import itertools\n    return list(itertools.accumulate(xs))"],
       ["out, t = [], 0\n    for x in xs:\n        out.append(t)\n        t += x\n    return out", "return [sum(xs[:i]) for i in range(len(xs))]"],
       [([1, 2, 3],), ([],), ([5],), ([-1, 1, -1],), ([2, 2, 2, 2],)]),
    _t("word_count", "s: str", "Return the number of whitespace-separated words in s.",
       ["return len(s.split())", "return sum(1 for _ in s.split())"],
       ["return len(s.split(' '))", "return s.count(' ') + 1"],
       [("one two",), ("",), ("  lots   of  space ",), ("single",), ("a\tb\nc",)]),
    _t("title_case", "s: str", "Capitalize the first letter of each space-separated word, lowercasing the rest.",
       ["return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split(' '))",
        "return ' '.join(w.capitalize() for w in s.split(' '))"],
       ["return s.title()", "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))"],
       [("hello world",), ("HELLO",), ("it's mine",), ("a  b",), ("mIxEd CaSe",)]),
    _t("clamp", "x: float, lo: float, hi: float", "Limit x to the closed interval [lo, hi].",
       ["return max(lo, min(x, hi))", "if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x"],
       ["return min(lo, max(x, hi))", "return max(lo, min(x, hi - 1))"],
       [(5, 0, 10), (-1, 0, 10), (11, 0, 10), (0, 0, 0), (3.5, 1.0, 2.0)]),
    _t("digit_sum", "n: int", "Sum of the decimal digits of |n|.",
       ["return sum(int(c) for c in str(abs(n)))", "n = abs(n)\n    t = 0\n    while n:\n        t += n % 10\n        n //= 10\n    return t"],
       ["return sum(int(c) for c in str(n) if c.isdigit()) + (1 if n < 0 else 0)", "return n % 9"],
       [(0,), (123,), (-45,), (999,), (1001,)]),
    _t("is_prime", "n: int", "True if n is a prime number.",
       ["if n < 2:\n        return False\n    k = 2\n    while k * k <= n:\n        if n % k == 0:\n            return False\n        k += 1\n    return True",
        "return n > 1 and all(n % k for k in range(2, int(n ** 0.5) + 1))"],
       ["return n > 1 and all(n % k for k in range(2, int(n ** 0.5)))", "return n >= 1 and all(n % k for k in range(2, n))"],
       [(1,), (2,), (9,), (25,), (97,), (49,)]),
    _t("flatten", "xss: list", "Flatten a list of lists by one level.",
       ["return [x for xs in xss for x in xs]", "out = []\n    for xs in xss:\n        out.extend(xs)\n    return out"],
       ["return [xs[0] for xs in xss if xs]", "return [x for xs in xss for x in reversed(xs)]"],
       [([[1, 2], [3]],), ([],), ([[], [1]],), ([[1], [2], [3, 4]],), ([[5, 6]],)]),
    _t("chunk", "xs: list, n: int", "Split xs into consecutive chunks of length n (the last may be shorter).",
       ["return [xs[i:i + n] for i in range(0, len(xs), n)]",
        "out = []\n    for i in range(0, len(xs), n):\n        out.append(xs[i:i + n])\n    return out"],
       ["return [xs[i:i + n] for i in range(0, len(xs) - n + 1, n)]", "return [xs[i:i + n] for i in range(0, len(xs), n + 1)]"],
       [([1, 2, 3, 4, 5], 2), ([], 3), ([1, 2, 3], 3), ([1, 2, 3, 4], 1), ([1, 2], 5)]),
    _t("rotate", "xs: list, k: int", "Rotate xs to the right by k positions.",
       ["if not xs:\n        return []\n    k %= len(xs)\n    return xs[-k:] + xs[:-k] if k else list(xs)",
        "n = len(xs)\n    return [xs[(i - k) % n] for i in range(n)] if n else []"],
       ["if not xs:\n        return []\n    return xs[k:] + xs[:k]", "if not xs:\n        return []\n    return xs[-k:] + xs[:-k]"],
       [([1, 2, 3, 4], 1), ([1, 2, 3], 0), ([], 2), ([1, 2, 3], 5), ([1, 2], 2)]),
    _t("count_char", "s: str, c: str", "Count occurrences of character c in s, case-sensitively.",
       ["return s.count(c)", "return sum(1 for ch in s if ch == c)"],
       ["return s.lower().count(c.lower())", "return s.count(c) - (1 if s.startswith(c) else 0)"],
       [("banana", "a"), ("Banana", "B"), ("", "x"), ("aAaA", "a"), ("abc", "z")]),
    _t("mean", "xs: list", "Arithmetic mean of a non-empty list of numbers.",
       ["return sum(xs) / len(xs)", "import statistics\n    return statistics.fmean(xs)"],
       ["return sum(xs) // len(xs)", "return sum(xs) / (len(xs) + 1)"],
       [([1, 2, 3, 4],), ([5],), ([1, 2],), ([-1, 1, 3],), ([2.5, 3.5],)]),
    _t("median", "xs: list", "Median of a non-empty list (mean of the two middle values for even length).",
       ["s = sorted(xs)\n    m = len(s) // 2\n    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2",
        "import statistics\n    return statistics.median(xs)"],
       ["s = sorted(xs)\n    return s[len(s) // 2]", "s = xs\n    m = len(s) // 2\n    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2"],
       [([3, 1, 2],), ([4, 1, 3, 2],), ([5],), ([1, 1, 2, 9],), ([9, 8, 7, 6, 5],)]),
    _t("caesar", "s: str, k: int", "Shift lowercase letters of s by k places in the alphabet (wrapping); leave other characters.",
       ["return ''.join(chr((ord(c) - 97 + k) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
        "out = []\n    for c in s:\n        out.append(chr((ord(c) - 97 + k) % 26 + 97) if c.islower() and c.isascii() else c)\n    return ''.join(out)"],
       ["return ''.join(chr(ord(c) + k) if c.isalpha() else c for c in s)", "return ''.join(chr((ord(c) - 97 + k) % 25 + 97) if 'a' <= c <= 'z' else c for c in s)"],
       [("abc", 1), ("xyz", 3), ("Hello, world", 13), ("", 5), ("zz top", 27)]),
    _t("vowel_start", "words: list", "Return the words that start with a vowel (either case), in order.",
       ["return [w for w in words if w[:1].lower() in ('a', 'e', 'i', 'o', 'u')]",
        "return [w for w in words if w and w[0] in 'aeiouAEIOU']"],
       ["return [w for w in words if w[:1] in 'aeiou']", "return [w for w in words if w[:1].lower() in 'aeiouy']"],
       [(["apple", "Banana", "egg"],), ([],), (["", "Ice"],), (["yes", "owl"],), (["Under", "over", "x"],)]),
    _t("pairs_sum", "xs: list, target: int", "Count index pairs i < j with xs[i] + xs[j] == target.",
       ["n = 0\n    for i in range(len(xs)):\n        for j in range(i + 1, len(xs)):\n            n += xs[i] + xs[j] == target\n    return n",
        "import itertools\n    return sum(a + b == target for a, b in itertools.combinations(xs, 2))"],
       ["n = 0\n    for i in range(len(xs)):\n        for j in range(len(xs)):\n            n += i != j and xs[i] + xs[j] == target\n    return n",
        "return len({(a, b) for a in xs for b in xs if a + b == target and a < b})"],
       [([1, 2, 3, 4], 5), ([], 1), ([2, 2, 2], 4), ([1, -1, 0], 0), ([5, 5], 11)]),
    _t("binary_string", "n: int", "Binary representation of n >= 0 without the 0b prefix.",
       ["return bin(n)[2:]", "return format(n, 'b')"],
       ["return bin(n)[3:] or '0'", "out = ''\n    while n:\n        out = str(n % 2) + out\n        n //= 2\n    return out"],
       [(0,), (1,), (5,), (255,), (1024,)]),
    _t("anagrams", "a: str, b: str", "True if a and b are anagrams, ignoring case and spaces.",
       ["f = lambda s: sorted(s.replace(' ', '').lower())\n    return f(a) == f(b)",
        "import collections\n    f = lambda s: collections.Counter(s.replace(' ', '').lower())\n    return f(a) == f(b)"],
       ["return sorted(a) == sorted(b)", "return set(a.lower()) == set(b.lower())"],
       [("Listen", "Silent"), ("a b", "ba"), ("aab", "abb"), ("", ""), ("Dormitory", "dirty room")]),
    _t("merge_sorted", "a: list, b: list", "Merge two sorted lists into one sorted list.",
       ["return sorted(a + b)",
        "i = j = 0\n    out = []\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]"],
       ["return a + b", "return sorted(set(a + b))"],
       [([1, 3], [2, 4]), ([], [1]), ([1, 1], [1]), ([5], []), ([0, 2, 9], [1, 2])]),
    _t("triangle_kind", "a: int, b: int, c: int", "Return 'equilateral', 'isosceles', 'scalene' or 'invalid' for side lengths.",
       ["x, y, z = sorted((a, b, c))\n    if x <= 0 or x + y <= z:\n        return 'invalid'\n    if x == z:\n        return 'equilateral'\n    if x == y or y == z:\n        return 'isosceles'\n    return 'scalene'"],
       ["if a == b == c:\n        return 'equilateral'\n    if a == b or b == c or a == c:\n        return 'isosceles'\n    return 'scalene'",
        "x, y, z = sorted((a, b, c))\n    if x + y < z:\n        return 'invalid'\n    if x == z:\n        return 'equilateral'\n    if x == y or y == z:\n        return 'isosceles'\n    return 'scalene'"],
       [(3, 3, 3), (3, 4, 5), (2, 2, 3), (1, 2, 3), (0, 1, 1)]),
    _t("leap_year", "y: int", "True if y is a leap year in the Gregorian calendar.",
       ["return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)", "import calendar\n    return calendar.isleap(y)"],
       ["return y % 4 == 0", "return y % 4 == 0 and y % 100 != 0"],
       [(2000,), (1900,), (2024,), (2023,), (2400,)]),
    _t("roman", "n: int", "Roman numeral for 1 <= n <= 3999.",
       ["vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n    return out"],
       ["vals = [(1000, 'M'), (500, 'D'), (100, 'C'), (50, 'L'), (10, 'X'), (5, 'V'), (1, 'I')]\n    out = ''\n    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n    return out",
        "vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'), (40, 'XL'), (10, 'X'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n    return out"],
       [(1,), (4,), (9,), (1994,), (3999,)]),
    _t("count_upper", "s: str", "Number of uppercase letters in s.",
       ["return sum(c.isupper() for c in s)", "return len([c for c in s if c.isupper()])"],
       ["return sum('A' <= c <= 'Z' for c in s[1:])", "return sum(c.isupper() for c in s.split()[0]) if s.split() else 0"],
       [("Hello World",), ("",), ("ABC def",), ("lower",), ("X Y Z",)]),
    _t("nth_smallest", "xs: list, n: int", "Return the n-th smallest element (1-based) of xs.",
       ["return sorted(xs)[n - 1]", "import heapq\n    return heapq.nsmallest(n, xs)[-1]"],
       ["return sorted(xs)[n]", "return sorted(set(xs))[n - 1]"],
       [([5, 1, 4], 1), ([5, 1, 4, 1], 2), ([3], 1), ([9, 8, 7, 6], 4), ([2, 2, 1], 3)]),
    _t("compress", "s: str", "Run-length encode s, e.g. 'aaab' -> 'a3b1'.",
       ["out = ''\n    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out += s[i] + str(j - i)\n        i = j\n    return out",
        "import itertools\n    return ''.join(k + str(len(list(g))) for k, g in itertools.groupby(s))"],
       ["import collections\n    return ''.join(k + str(v) for k, v in collections.Counter(s).items())",
        "import itertools\n    return ''.join(k + str(len(list(g))) for k, g in itertools.groupby(s) if len(k))[:-1]"],
       [("aaab",), ("",), ("abc",), ("aabbaa",), ("zzzzzzzzzzzz",)]),
    _t("safe_div", "a: float, b: float", "Return a / b, or None when b is zero.",
       ["return None if b == 0 else a / b", "try:\n        return a / b\n    except ZeroDivisionError:\n        return None"],
       ["return 0 if b == 0 else a / b", "return None if b == 0 else a // b"],
       [(1, 2), (5, 0), (-3, 4), (0, 5), (7.5, 2.5)]),
    _t("interleave", "a: list, b: list", "Alternate elements of a and b, appending the rest of the longer list.",
       ["out = []\n    for i in range(max(len(a), len(b))):\n        if i < len(a):\n            out.append(a[i])\n        if i < len(b):\n            out.append(b[i])\n    return out"],
       ["return [x for pair in zip(a, b) for x in pair]",
        "out = []\n    for i in range(max(len(a), len(b))):\n        if i < len(b):\n            out.append(b[i])\n        if i < len(a):\n            out.append(a[i])\n    return out"],
       [([1, 2], [3, 4]), ([1], [2, 3, 4]), ([], [1]), ([1, 2, 3], []), (["a"], ["b"])]),
    _t("unique_chars", "s: str", "True if no character occurs twice in s.",
       ["return len(set(s)) == len(s)", "seen = set()\n    for c in s:\n        if c in seen:\n            return False\n        seen.add(c)\n    return True"],
       ["return len(set(s.lower())) == len(s)", "return all(s[i] != s[i + 1] for i in range(len(s) - 1))"],
       [("abc",), ("aba",), ("",), ("Aa",), ("abca",)]),
    _t("matrix_transpose", "m: list", "Transpose a rectangular matrix given as a list of rows.",
       ["return [list(r) for r in zip(*m)]", "return [[row[j] for row in m] for j in range(len(m[0]))] if m else []"],
       ["return [row[::-1] for row in m]", "return [list(r) for r in zip(*m[::-1])]"],
       [([[1, 2], [3, 4]],), ([[1, 2, 3]],), ([],), ([[1], [2]],), ([[5, 6], [7, 8], [9, 0]],)]),
]


def builtin_suite() -> list[SuiteTask]:
    tasks = []
    for i, (name, sig, doc, right, wrong, inputs) in enumerate(_SPECS):
        prompt = f'def {name}({sig}):\n    """{doc}"""\n'
        tasks.append(SuiteTask(f"NF/{i}", name, prompt, tuple("    " + b + "\n" for b in right),
                               tuple("    " + b + "\n" for b in wrong), tuple(tuple(x) for x in inputs)))
    return tasks


def write_dataset(tasks: list[SuiteTask], path: Path) -> Path:
    """The suite as an EvalPlus-format file, so `nfverify --dataset` grades it like HumanEval+."""
    with gzip.open(path, "wt") as fh:
        for t in tasks:
            fh.write(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "entry_point": t.entry_point,
                                 "canonical_solution": t.right[0], "base_input": [list(x) for x in t.inputs],
                                 "plus_input": [], "atol": 1e-9}) + "\n")
    return path
