"""`expect EXPRESSION`: a check of the lab's runs, for handout scripts and tests. Pure.

An expression compares figures of the runs' summaries (summary.json): a run is named by
`run ... as NAME` (`last` is the latest), its figures by their keys, as
`spray.jct_fabric_s < 0.75 * ecmp.jct_fabric_s` or `last.switch.pause_tx > 0` or
`victim.flows[0].goodput_gbps < 0.75 * alone.flows[0].goodput_gbps`. Numbers, + - * /, the
comparisons, and/or/not and min, max, abs, len are allowed; nothing else is evaluated.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FUNCS = {"min": min, "max": max, "abs": abs, "len": len}


class ExpectError(ValueError):
    """The expression cannot be evaluated (syntax, an unknown run or figure); one line."""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    shown: str  # the expression with the figures it read, as `0.0021 < 0.75 * 0.0042`


def evaluate(text: str, runs: dict[str, dict]) -> Outcome:
    """Evaluate `text` against runs (name -> summary; `last` included by the caller)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpectError(f"expect: not an expression ({e.msg})") from None
    figures: list[tuple[str, object]] = []
    value = _eval(tree.body, runs, text, figures)
    if not isinstance(value, bool):
        raise ExpectError("expect: the expression is not a comparison (as last.switch.drops == 0)")
    shown = text.strip()
    for src, v in figures:
        shown = shown.replace(src, _fmt(v), 1)
    return Outcome(value, shown)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return repr(v) if isinstance(v, str) else str(v)


def _figure(node: ast.AST, runs: dict[str, dict], text: str) -> object:
    """A reference run.key[.key|[i]]...: the value from that run's summary."""
    parts: list[object] = []
    cur = node
    while not isinstance(cur, ast.Name):
        if isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        elif isinstance(cur, ast.Subscript) and isinstance(cur.slice, ast.Constant):
            parts.append(cur.slice.value)
            cur = cur.value
        else:
            raise ExpectError(f"expect: {ast.get_source_segment(text, node)}: only run.key.key[index] references")
    run = cur.id
    if run not in runs:
        names = ", ".join(sorted(runs)) or "none yet"
        raise ExpectError(f"expect: no run named {run!r} (runs: {names}; name one with `run ... as NAME`)")
    value: object = runs[run]
    path = run
    for p in reversed(parts):
        path += f"[{p}]" if isinstance(p, int) else f".{p}"
        try:
            value = value[p]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            raise ExpectError(f"expect: {path}: no such figure in that run's summary.json") from None
    return value


def _eval(node: ast.AST, runs: dict[str, dict], text: str, figures: list) -> object:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        value = _figure(node, runs, text)
        figures.append((ast.get_source_segment(text.strip(), node), value))
        return value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        a, b = _eval(node.left, runs, text, figures), _eval(node.right, runs, text, figures)
        try:
            return _BIN[type(node.op)](a, b)
        except (TypeError, ZeroDivisionError) as e:
            raise ExpectError(f"expect: {ast.get_source_segment(text.strip(), node)}: {e}") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        v = _eval(node.operand, runs, text, figures)
        return (not v) if isinstance(node.op, ast.Not) else -v  # type: ignore[operator]
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, runs, text, figures) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and all(type(o) in _CMP for o in node.ops):
        left = _eval(node.left, runs, text, figures)
        ok = True
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, runs, text, figures)
            try:
                ok = ok and bool(_CMP[type(op)](left, right))
            except TypeError:
                raise ExpectError(f"expect: cannot compare {_fmt(left)} with {_fmt(right)}") from None
            left = right
        return ok
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords):
        args = [_eval(a, runs, text, figures) for a in node.args]
        try:
            return _FUNCS[node.func.id](*args)
        except (TypeError, ValueError) as e:
            raise ExpectError(f"expect: {node.func.id}(): {e}") from None
    raise ExpectError(f"expect: {ast.get_source_segment(text.strip(), node)}: not allowed here "
                      "(figures, numbers, + - * /, comparisons, and/or/not, min max abs len)")
