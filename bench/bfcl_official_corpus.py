"""Make tests/data/bfcl_official_verdicts.jsonl.gz: BFCL candidates with the OFFICIAL checker's verdicts.

Run outside the project's environment, once, when the corpus should change:

    # gorilla fetched as a bare git dir (here by the fetch tool: github:ShishirPatil/gorilla)
    python3 bench/bfcl_official_corpus.py --gorilla-git /work/.mirror/ShishirPatil+gorilla/repo \
        --scratch /tmp/bfcl_official --data /work/shared/data/bfcl --out tests/data/bfcl_official_verdicts.jsonl.gz

It copies gorilla's `bfcl_eval/eval_checker/ast_eval/ast_checker.py` (and the two small constant
modules it imports) out of the git dir into the scratch folder (never into this repository), stubs
the rest (a two-entry model config: "fc" with underscore_to_dot=True, "prompt" with False; Java/JS
converters unused on the Python path), and grades every candidate the way BFCL grades an FC
model: each tool call's arguments through json.loads, the output-format check, then
`ast_checker(..., Language.PYTHON, category, model)`. Candidates: the ground truth (first, second
and third allowed values; dotted and underscored names) and systematic mutations of the
multiple and parallel sets (see `mutations`). Rows where the official checker raises are left out.
Standard library only; nothing of noisefloor is imported.
"""
import argparse
import copy
import gzip
import io
import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

_FILES = ("eval_checker/ast_eval/ast_checker.py", "constants/enums.py", "constants/type_mappings.py")
_STUBS = {
    "constants/model_config.py": "class _C:\n    def __init__(self, u):\n        self.underscore_to_dot = u\n\n\n"
                                 "MODEL_CONFIG_MAPPING = {\"fc/model\": _C(True), \"prompt/model\": _C(False)}\n",
    "eval_checker/ast_eval/type_convertor/java_type_converter.py": "def java_type_converter(*a, **k):\n    raise NotImplementedError\n",
    "eval_checker/ast_eval/type_convertor/js_type_converter.py": "def js_type_converter(*a, **k):\n    raise NotImplementedError\n",
}
_PKG = "berkeley-function-call-leaderboard/bfcl_eval"


def setup(git_dir, scratch):
    """The official checker in `scratch`, importable as bfcl_eval; returns (ast_checker, Language, format check)."""
    root = Path(scratch) / "bfcl_eval"
    for rel in _FILES + tuple(_STUBS):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        for parent in [(root / rel).parent, *(root / rel).parent.parents]:
            if parent == root.parent:
                break
            (parent / "__init__.py").touch()
    for rel in _FILES:
        text = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{_PKG}/{rel}"], check=True,
                              capture_output=True, text=True).stdout
        (root / rel).write_text(text)
    utils = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{_PKG}/utils.py"], check=True,
                           capture_output=True, text=True).stdout
    start = utils.index("def is_function_calling_format_output")
    end = utils.index("    return True\n", start) + len("    return True\n")
    (Path(scratch) / "fmt.py").write_text(utils[start:end])
    for rel, text in _STUBS.items():
        (root / rel).write_text(text)
    sys.path.insert(0, str(scratch))
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from fmt import is_function_calling_format_output
    return ast_checker, Language, is_function_calling_format_output


rng = random.Random(20261201)
rng = random.Random(20261201)


def load(cat):
    qs = [json.loads(line) for line in open(f"{ARGS.data}/BFCL_v4_{cat}.json")]
    ans = {d["id"]: d["ground_truth"] for d in map(json.loads, open(f"{ARGS.data}/possible_answer_BFCL_v4_{cat}.json"))}
    return [(q, ans[q["id"]]) for q in qs]


def official(q, gt, cat, calls, model):
    ast_checker, Language, is_function_calling_format_output = CHECKER
    try:
        decoded = [{name: json.loads(args)} for name, args in calls]
    except Exception:
        return False
    if not is_function_calling_format_output(decoded):
        return False
    try:
        return bool(ast_checker(q["function"], decoded, gt, Language.PYTHON, cat, model)["valid"])
    except Exception as exc:  # the official checker crashed: not a verdict
        return "error:" + type(exc).__name__


def pick(allowed, k):
    opts = [a for a in allowed if a != ""]
    if not opts:
        return None, False
    return render(opts[min(k, len(opts) - 1)], k), True


def render(v, k=0):
    if isinstance(v, dict):
        out = {}
        for key, al in v.items():
            if isinstance(al, list):
                val, ok = pick(al, k)
                if ok:
                    out[key] = val
            else:
                out[key] = al
        return out
    if isinstance(v, list):
        return [render(x, k) for x in v]
    return v


def gt_calls(gt, k=0, dotted=False):
    calls = []
    for entry in gt:
        for name, args in entry.items():
            a = {}
            for p, al in args.items():
                val, ok = pick(al, k)
                if ok:
                    a[p] = val
            calls.append([name if dotted else name.replace(".", "_"), a])
    return calls


def deep(v, f, depth=0):
    """Apply f(value, depth) to every leaf."""
    if isinstance(v, dict):
        return {k: deep(x, f, depth + 1) for k, x in v.items()}
    if isinstance(v, list):
        return [deep(x, f, depth + 1) for x in v]
    return f(v, depth)


def scalar_variants(v):
    out = [None]
    if isinstance(v, bool):
        out += [int(v), str(v).lower(), not v]
    elif isinstance(v, int):
        out += [float(v), str(v), v + 1, True if v == 1 else False, -v]
    elif isinstance(v, float):
        out += [str(v), v + 0.5, round(v) if v == v else 0]
        if v.is_integer():
            out.append(int(v))
    elif isinstance(v, str):
        out += [v.upper(), v.title(), v.swapcase(), "...", " ", "-_", v.replace(" ", ""), v + " ", v + ".",
                v.replace(" ", "-"), v.replace("'", '"'), "zzz", "'" + v + "'", v[:1]]
        if v.replace(".", "", 1).isdigit():
            out.append(float(v) if "." in v else int(v))
    elif isinstance(v, list):
        out += [[], list(reversed(v)), v[1:], v + v[:1], [v], deep(v, lambda x, d: x.upper() if isinstance(x, str) else x),
                deep(v, lambda x, d: int(x) if isinstance(x, float) and x.is_integer() else x),
                deep(v, lambda x, d: float(x) if type(x) is int else x),
                deep(v, lambda x, d: x + "." if isinstance(x, str) else x)]
        if v:
            out.append(v[0])
    elif isinstance(v, dict):
        out += [{}, {**v, "extra": 1}, {k: x for k, x in list(v.items())[1:]},
                deep(v, lambda x, d: x.upper() if isinstance(x, str) else x),
                deep(v, lambda x, d: int(x) if isinstance(x, float) and x.is_integer() else x),
                deep(v, lambda x, d: float(x) if type(x) is int else x),
                deep(v, lambda x, d: x + "." if isinstance(x, str) else x), [v], json.dumps(v)]
    return out


def mutations(q, gt, cat):
    funcs = {f["name"].replace(".", "_"): f for f in q["function"]}
    base = gt_calls(gt)
    yield "gt", base
    yield "gt_dotted", gt_calls(gt, dotted=True)
    for k in (1, 2):
        c = gt_calls(gt, k)
        if c != base:
            yield f"gt_choice{k}", c
    yield "none", []
    yield "extra_call", base + base[:1]
    if len(base) > 1:
        yield "drop_call", base[:-1]
    yield "name_upper", [[n.upper(), a] for n, a in base]
    yield "name_dash", [[n.replace("_", "-"), a] for n, a in base]
    other = [f["name"] for f in q["function"] if f["name"].replace(".", "_") not in {n for n, _ in base}]
    if other:
        yield "other_function", [[other[0].replace(".", "_"), base[0][1]]] + base[1:]
        yield "other_function_dotted", [[other[0], base[0][1]]] + base[1:]
    yield "deep_int_for_float", [[n, deep(a, lambda x, d: int(x) if isinstance(x, float) and x.is_integer() else x)] for n, a in base]
    yield "deep_float_for_int", [[n, deep(a, lambda x, d: float(x) if type(x) is int else x)] for n, a in base]
    yield "deep_upper_2", [[n, deep(a, lambda x, d: x.upper() if isinstance(x, str) and d >= 2 else x)] for n, a in base]
    yield "deep_upper_3", [[n, deep(a, lambda x, d: x.upper() if isinstance(x, str) and d >= 3 else x)] for n, a in base]
    yield "deep_punct", [[n, deep(a, lambda x, d: x + "," if isinstance(x, str) else x)] for n, a in base]
    for i, (name, args) in enumerate(base):
        schema = funcs.get(name, {"parameters": {"properties": {}, "required": []}})
        props = schema["parameters"]["properties"]
        answers = list(gt[i].values())[0]
        for p in props:
            if p not in args:
                # a declared parameter the answer leaves out (or marks optional): give it
                t = props[p].get("type")
                for v in {"string": ["", "x", "..."], "integer": [0, "", 1], "float": [0.5, ""], "boolean": [True, False, ""],
                          "array": [[], ""], "dict": [{}, ""], "tuple": [[], ""]}.get(t, [""]):
                    yield f"add:{i}:{p}:{v!r}", replace(base, i, {**args, p: v})
        for p, v in args.items():
            yield f"omit:{i}:{p}", replace(base, i, {k: x for k, x in args.items() if k != p})
            yield f"empty:{i}:{p}", replace(base, i, {**args, p: ""})
            for j, nv in enumerate(scalar_variants(v)):
                yield f"var:{i}:{p}:{j}", replace(base, i, {**args, p: nv})
            for j, al in enumerate(answers.get(p, [])[1:4], 1):  # the other allowed values
                if al != "":
                    yield f"alt:{i}:{p}:{j}", replace(base, i, {**args, p: render(al)})
        yield f"extra_param:{i}", replace(base, i, {**args, "unexpected_param": 1})
    if cat == "parallel" and len(base) > 1:
        perms = list(itertools.permutations(range(len(base))))
        if len(perms) > 40:
            perms = [perms[0], perms[-1]] + rng.sample(perms, 38)
        for perm in perms[1:]:
            yield f"perm:{perm}", [base[j] for j in perm]
        # mutations that make one call satisfy two answers, in every order for small sets
        for i, (_name, args) in enumerate(base):
            for p in args:
                m = replace(base, i, {k: x for k, x in args.items() if k != p})
                for perm in perms[1:6]:
                    yield f"omit_perm:{i}:{p}:{perm}", [m[j] for j in perm]
        for a, b in itertools.combinations(range(len(base)), 2):
            if base[a][0] == base[b][0]:
                # both calls the same as one answer: matches first-fit never / both ways
                yield f"dup:{a}:{b}", replace(base, b, base[a][1])
                yield f"swapargs:{a}:{b}", replace(replace(base, a, base[b][1]), b, base[a][1])


def replace(calls, i, args):
    out = copy.deepcopy(calls)
    out[i] = [out[i][0], args]
    return out


def _fn(name, props, required):
    return {"name": name, "description": "", "parameters": {"type": "dict", "properties": props, "required": required}}


# Shapes the published sets barely hold: nesting two and three levels deep, tuples, int/float
# answers at depth, "any", a required argument whose answers include "", parallel answers that overlap.
SYNTHETIC = [
    ({"id": "synthetic_0", "function": [_fn("cfg.set", {
        "cfg": {"type": "dict"}, "name": {"type": "string"}}, ["cfg"])]}, [{"cfg.set": {
            "cfg": [{"mode": ["Fast", "quick"], "inner": [{"a": "X", "b": 1.0}], "tags": [["Red", "blue"]],
                     "ratio": [2.0], "size": [3], "opt": ["", "On"]}], "name": ["", "Main Box"]}}], "multiple"),
    ({"id": "synthetic_1", "function": [_fn("grid.fill", {
        "grid": {"type": "array", "items": {"type": "array"}}, "point": {"type": "tuple", "items": {"type": "float"}},
        "ws": {"type": "array", "items": {"type": "float"}}, "label": {"type": "any"}}, ["grid", "point"])]},
     [{"grid.fill": {"grid": [[[1.0, 2.0], [3.5, "A b"]]], "point": [[1.0, 2.5], [1, 2]], "ws": [[1, 2], ""],
                     "label": ["", "Top Left"]}}], "multiple"),
    ({"id": "synthetic_2", "function": [_fn("math.scale", {
        "x": {"type": "float"}, "n": {"type": "integer"}, "flag": {"type": "boolean"}, "q": {"type": "string"}},
        ["x", "q"])]}, [{"math.scale": {"x": [5], "n": [3.0, ""], "flag": [True, ""], "q": ["", "Half"]}}], "multiple"),
    ({"id": "synthetic_3", "function": [_fn("db.rows", {
        "rows": {"type": "array", "items": {"type": "dict"}}, "limit": {"type": "integer"}}, ["rows"])]},
     [{"db.rows": {"rows": [[{"k": ["A"], "v": [1.5]}, {"k": ["b c"], "v": [2], "w": ["", "Z"]}], ""],
                   "limit": ["", 10]}}], "multiple"),
    ({"id": "synthetic_4", "function": [_fn("shop.order", {
        "item": {"type": "string"}, "qty": {"type": "integer"}, "note": {"type": "string"}}, ["item"])]},
     [{"shop.order": {"item": ["tea"], "qty": ["", 2], "note": ["", "fast"]}},
      {"shop.order": {"item": ["tea"], "qty": [2], "note": [""]}},
      {"shop.order": {"item": ["Green Tea", "tea"], "qty": [1, ""], "note": ["", "fast"]}}], "parallel"),
]


def main(path):
    seen = set()
    n = {"fc": 0, "prompt": 0, "rows": 0, "errors": 0}
    with gzip.GzipFile(path, "wb", mtime=0) as raw, io.TextIOWrapper(raw, encoding="utf-8") as out:
        work = [(q, gt, cat, None) for cat in ("multiple", "parallel") for q, gt in load(cat)]
        work += [(q, gt, cat, {"function": q["function"], "ground_truth": gt, "category": cat}) for q, gt, cat in SYNTHETIC]
        for q, gt, cat, inline in work:
            for tag, calls in mutations(q, gt, cat):
                enc = [[name, json.dumps(args)] for name, args in calls]
                key = (q["id"], json.dumps(enc))
                if key in seen:
                    continue
                seen.add(key)
                fc = official(q, gt, cat, enc, "fc_model")
                prompt = official(q, gt, cat, enc, "prompt_model")
                if isinstance(fc, str) or isinstance(prompt, str):
                    n["errors"] += 1
                    continue
                n["rows"] += 1
                n["fc"] += fc
                n["prompt"] += prompt
                row = {"id": q["id"], "m": tag, "calls": enc, "fc": fc, "prompt": prompt}
                if inline:
                    row["task"] = inline
                out.write(json.dumps(row, separators=(",", ":")) + "\n")
            # format failures, once per task
            for tag, enc in (("args_list", [[gt_calls(gt)[0][0], "[1]"]]), ("args_bad", [[gt_calls(gt)[0][0], "{"]]),
                             ("args_empty", [[gt_calls(gt)[0][0], ""]]), ("args_null", [[gt_calls(gt)[0][0], "null"]])):
                fc = official(q, gt, cat, enc, "fc_model")
                n["rows"] += 1
                out.write(json.dumps({"id": q["id"], "m": tag, "calls": enc, "fc": fc, "prompt": fc},
                                     separators=(",", ":")) + "\n")
    print(n)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gorilla-git", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ARGS = ap.parse_args()
    CHECKER = setup(ARGS.gorilla_git, ARGS.scratch)
    main(ARGS.out)
