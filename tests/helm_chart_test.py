#!/usr/bin/env python3
"""Structural test of the Helm chart in deploy/helm/onnxopt, without helm.

helm is not installed here (nor packaged in Debian), so this file carries a small renderer for the subset of
Go templates (text/template + the few Sprig functions) the chart uses, with Helm's semantics where they
matter: values files give numbers as float64 (so a large number printed as is comes out as 8.589934592e+09,
which is why the chart pipes numeric flags through int64), a missing value prints as "" and is falsy, a field
of a missing value is an error, the piped value is a function's last argument, {{- and -}} trim all
whitespace on their side, parse errors (unknown function, unclosed action or block) are errors.

It renders the chart for a few value sets (Helm-style overrides merged onto values.yaml) and checks the
manifests' structure: names, selectors, role and device flags, the job store secret, volumes and what they
refer to, security contexts, probes, the Service, PodDisruptionBudgets, the PVC, TLS. Exit 0 on success;
on the first failure, non-zero with the reason.

Run from anywhere: python3 tests/helm_chart_test.py
"""

import copy
import decimal
import math
import os
import re
import sys
from collections import Counter

try:
    import yaml
except ImportError:
    print("FAIL tests/helm_chart_test.py needs PyYAML (Debian: python3-yaml)", file=sys.stderr)
    sys.exit(1)

CHART_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "deploy", "helm", "onnxopt")
CHART_DIR = os.path.normpath(CHART_DIR)


# ----------------------------------------------------------------------------------------------------------
# A Go-template renderer for the subset the chart uses.
# ----------------------------------------------------------------------------------------------------------

class TemplateError(Exception):
    """The template does not parse or cannot be executed (what helm reports as a parse/execution error)."""


class ChartFail(Exception):
    """The chart itself refused the values: `fail` or `required`."""


_WS = " \t\r\n"
_NO_PIPE = object()  # no value piped into a command


def _lex(src, name):
    """Splits a template into ('text', str) and ('action', body, line) items and applies the trim markers:
    "{{- " drops all whitespace before the action, " -}}" all whitespace after it. Comments vanish."""
    items = []
    pos = 0
    trim_next = False
    while True:
        start = src.find("{{", pos)
        text = src[pos:] if start < 0 else src[pos:start]
        if trim_next:
            text = text.lstrip(_WS)
        if start < 0:
            items.append(("text", text))
            return items
        line = src.count("\n", 0, start) + 1
        where = f"{name}:{line}"
        i = start + 2
        if src.startswith("-", i) and i + 1 < len(src) and src[i + 1] in _WS:
            text = text.rstrip(_WS)
            i += 1
        items.append(("text", text))
        j = i
        while j < len(src) and src[j] in _WS:
            j += 1
        if src.startswith("/*", j):  # a comment: {{/* ... */}} or {{- /* ... */ -}}
            end = src.find("*/", j + 2)
            if end < 0:
                raise TemplateError(f"{where}: unclosed comment")
            m = re.compile(r"(\s-)?\}\}").match(src, end + 2)
            if not m:
                raise TemplateError(f"{where}: comment ends before closing delimiter")
            trim_next = m.group(1) is not None
            pos = m.end()
            continue
        k = i
        while True:
            if k >= len(src):
                raise TemplateError(f"{where}: unclosed action")
            c = src[k]
            if c == '"':
                k += 1
                while k < len(src) and src[k] != '"':
                    if src[k] == "\n":
                        raise TemplateError(f"{where}: unterminated quoted string")
                    k += 2 if src[k] == "\\" else 1
                if k >= len(src):
                    raise TemplateError(f"{where}: unterminated quoted string")
                k += 1
            elif c == "`":
                end = src.find("`", k + 1)
                if end < 0:
                    raise TemplateError(f"{where}: unterminated raw quoted string")
                k = end + 1
            elif src.startswith("}}", k):
                break
            else:
                k += 1
        body = src[i:k]
        trim_next = len(body) >= 2 and body.endswith("-") and body[-2] in _WS
        if trim_next:
            body = body[:-1]
        items.append(("action", body, line))
        pos = k + 2


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
  | (?P<var>\$[A-Za-z0-9_]*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>:=|[|()=,])
""", re.X)

_GO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "a": "\a", "b": "\b", "f": "\f",
               "v": "\v", "0": "\0"}


def _unquote(s, where):
    out = []
    i = 1
    while i < len(s) - 1:
        c = s[i]
        if c == "\\":
            e = s[i + 1]
            if e not in _GO_ESCAPES:
                raise TemplateError(f"{where}: unsupported escape \\{e} in {s}")
            out.append(_GO_ESCAPES[e])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _tokenize(body, where):
    tokens = []
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if not m:
            raise TemplateError(f"{where}: unexpected {body[pos:pos + 10]!r} in action")
        pos = m.end()
        kind = m.lastgroup
        text = m.group()
        if kind == "ws":
            continue
        if kind == "str":
            tokens.append(("const", _unquote(text, where)))
        elif kind == "raw":
            tokens.append(("const", text[1:-1]))
        elif kind == "num":
            tokens.append(("const", float(text) if re.search(r"[.eE]", text) else int(text)))
        elif kind == "field":
            tokens.append(("field", tuple(p for p in text.split(".") if p)))
        elif kind == "var":
            raise TemplateError(f"{where}: variables ({text}) are not supported by this renderer")
        elif kind == "ident":
            tokens.append(("ident", text))
        elif text in ("|", "(", ")"):
            tokens.append(("op", text))
        else:
            raise TemplateError(f"{where}: {text!r} (assignments) is not supported by this renderer")
    return tokens


def _parse_pipeline(tokens, where, pos=0, in_paren=False):
    """A pipeline: commands separated by "|"; a command is a function with arguments or one operand.
    Returns (list of commands, next position)."""
    commands = []
    current = []
    while pos < len(tokens):
        kind, value = tokens[pos]
        if kind == "op" and value == ")":
            if not in_paren:
                raise TemplateError(f"{where}: unexpected right paren")
            break
        pos += 1
        if kind == "op" and value == "|":
            if not current:
                raise TemplateError(f"{where}: missing command before |")
            commands.append(current)
            current = []
        elif kind == "op" and value == "(":
            sub, pos = _parse_pipeline(tokens, where, pos, in_paren=True)
            if pos >= len(tokens):
                raise TemplateError(f"{where}: unclosed left paren")
            pos += 1
            current.append(("pipe", sub))
        elif kind == "ident":
            if value in ("true", "false"):
                current.append(("const", value == "true"))
            elif value == "nil":
                current.append(("const", None))
            elif value in FUNCTIONS:
                if current:
                    raise TemplateError(f"{where}: function {value!r} as an argument needs parentheses")
                current.append(("func", value))
            else:
                raise TemplateError(f'{where}: function "{value}" not defined')
        else:
            current.append((kind, value))
    if in_paren and pos >= len(tokens):
        raise TemplateError(f"{where}: unclosed left paren")
    if not current:
        raise TemplateError(f"{where}: missing value for command")
    commands.append(current)
    for i, cmd in enumerate(commands):
        if cmd[0][0] != "func" and (len(cmd) > 1 or i > 0):
            raise TemplateError(f"{where}: can't give argument to non-function {cmd[0][1]!r}")
    return commands, pos


def _truth(v):
    if v is None:
        return False
    if isinstance(v, (bool, int, float, str, list, dict, tuple)):
        return bool(v)
    return True


def _go_float(f):
    """fmt's %v of a float64 (strconv 'g', shortest): the shortest digits that round-trip, in %e form when
    the decimal exponent is < -4 or >= 6 (so 1000000 prints as 1e+06 and 8589934592 as 8.589934592e+09)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    sign = "-" if f < 0 else ""
    t = decimal.Decimal(repr(abs(f))).as_tuple()
    digits = list(t.digits)
    exp = t.exponent
    while len(digits) > 1 and digits[-1] == 0:
        digits.pop()
        exp += 1
    while len(digits) > 1 and digits[0] == 0:
        digits.pop(0)
    d = "".join(map(str, digits))
    nd = len(d)
    dp = nd + exp  # value = 0.d x 10^dp
    x = dp - 1
    if x < -4 or x >= 6:  # strconv 'g' with the shortest precision decides with precision 6
        mant = d[0] + ("." + d[1:] if nd > 1 else "")
        return f"{sign}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if dp <= 0:
        return f"{sign}0.{'0' * -dp}{d}"
    if dp >= nd:
        return f"{sign}{d}{'0' * (dp - nd)}"
    return f"{sign}{d[:dp]}.{d[dp:]}"


def _to_str(v):
    """fmt's %v of a value, as text/template prints it (Helm turns "<no value>" into "")."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_float(v)
    if isinstance(v, str):
        return v
    raise TemplateError(f"printing a {type(v).__name__} ({v!r:.60}) prints Go's map[...]/[...] form: "
                        "use toYaml")


def _go_quote(s):
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _to_int(v):
    """Sprig's int/int64 (spf13/cast, errors ignored)."""
    if v is None:
        return 0
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, str):
        s = v.strip()
        if re.fullmatch(r"-?\d+\.0*", s):
            s = s.split(".")[0]
        try:
            return int(s, 0)
        except ValueError:
            return 0
    return 0


def _plain(v):
    """Values as JSON would hold them again (sigs.k8s.io/yaml marshals through JSON): integral floats are
    written as integers."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        return int(v)
    return v


def _str_arg(fn, v):
    if not isinstance(v, str):
        raise TemplateError(f"{fn}: wrong type for value; expected string; got {type(v).__name__}")
    return v


def _basic_kind(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    raise TemplateError(f"eq/ne: non-comparable type {type(v).__name__}")


def _eq(a, *others):
    if not others:
        raise TemplateError("eq: missing argument for comparison")
    for b in others:
        if a is None or b is None:  # Go >= 1.18: an invalid (nil) value equals only nil
            if a is None and b is None:
                return True
            continue
        if _basic_kind(a) != _basic_kind(b):
            raise TemplateError(f"eq: incompatible types for comparison ({a!r} and {b!r})")
        if a == b:
            return True
    return False


def _printf(fmt, *args):
    out = []
    args = list(args)
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1] if i + 1 < len(fmt) else ""
        i += 2
        if verb == "%":
            out.append("%")
            continue
        if not args:
            raise TemplateError(f"printf {fmt!r}: missing argument for %{verb}")
        a = args.pop(0)
        if verb == "v":
            out.append(_to_str(a))
        elif verb == "s":
            if not isinstance(a, str):
                raise TemplateError(f"printf {fmt!r}: %s of a {type(a).__name__} prints %!s(...)")
            out.append(a)
        elif verb == "d":
            if isinstance(a, bool) or not isinstance(a, int):
                raise TemplateError(f"printf {fmt!r}: %d of a {type(a).__name__} prints %!d(...); use int")
            out.append(str(a))
        elif verb == "q":
            out.append(_go_quote(_str_arg("printf %q", a)))
        else:
            raise TemplateError(f"printf {fmt!r}: verb %{verb} is not supported by this renderer")
    if args:
        raise TemplateError(f"printf {fmt!r}: extra arguments %!(EXTRA ...)")
    return "".join(out)


def _to_yaml(v):
    text = yaml.safe_dump(_plain(v), default_flow_style=False, sort_keys=True, allow_unicode=True,
                          width=1 << 30)
    if text.endswith("\n...\n"):
        text = text[:-4]
    return text[:-1] if text.endswith("\n") else text


def _indent(n, s):
    pad = " " * _to_int(n)
    return pad + _str_arg("indent", s).replace("\n", "\n" + pad)


def _required(msg, v):
    if v is None or v == "":
        raise ChartFail(msg)
    return v


def _fail(msg):
    raise ChartFail(msg)


def _trunc(n, s):
    n = _to_int(n)
    s = _str_arg("trunc", s)
    if n < 0 and len(s) + n > 0:
        return s[len(s) + n:]
    if 0 <= n < len(s):
        return s[:n]
    return s


FUNCTIONS = {
    "quote": lambda *a: " ".join(_go_quote(_to_str(x)) for x in a if x is not None),
    "default": lambda d, *given: given[0] if given and _truth(given[0]) else d,
    "toYaml": _to_yaml,
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "required": _required,
    "fail": _fail,
    "printf": _printf,
    "trunc": _trunc,
    "trimSuffix": lambda suf, s: s[:-len(suf)] if suf and _str_arg("trimSuffix", s).endswith(suf) else s,
    "hasPrefix": lambda pre, s: _str_arg("hasPrefix", s).startswith(pre),
    "contains": lambda sub, s: sub in _str_arg("contains", s),
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "not": lambda v: not _truth(v),
    "and": None,  # short-circuits: evaluated in Renderer._command
    "or": None,
    "int": _to_int,
    "int64": _to_int,
    "add": lambda *a: sum(_to_int(x) for x in a),
    "include": None,  # needs the renderer
}


class Renderer:
    """Parses a set of template files (sharing their defines, as Helm does) and renders them."""

    def __init__(self):
        self.files = {}    # name -> node list
        self.defines = {}  # template name -> node list
        self._depth = 0

    def add(self, name, src):
        items = _lex(src, name)
        self._items, self._pos, self._name = items, 0, name
        nodes, _ = self._block(top=True)
        self.files[name] = nodes

    # -- parsing --

    def _block(self, top):
        nodes = []
        while self._pos < len(self._items):
            item = self._items[self._pos]
            self._pos += 1
            if item[0] == "text":
                if item[1]:
                    nodes.append(("text", item[1]))
                continue
            body, line = item[1], item[2]
            where = f"{self._name}:{line}"
            tokens = _tokenize(body, where)
            if not tokens:
                raise TemplateError(f"{where}: missing value for command")
            head = tokens[0]
            keyword = head[1] if head[0] == "ident" else None
            if keyword == "if":
                nodes.append(self._if(tokens[1:], where))
            elif keyword == "else":
                if top:
                    raise TemplateError(f"{where}: unexpected {{{{else}}}}")
                if len(tokens) > 1 and tokens[1] == ("ident", "if"):
                    return nodes, ("elseif", self._pipeline(tokens[2:], where), where)
                if len(tokens) > 1:
                    raise TemplateError(f"{where}: unexpected tokens after else")
                return nodes, ("else", None, where)
            elif keyword == "end":
                if top:
                    raise TemplateError(f"{where}: unexpected {{{{end}}}}")
                if len(tokens) > 1:
                    raise TemplateError(f"{where}: unexpected tokens after end")
                return nodes, ("end", None, where)
            elif keyword == "define":
                if not top:
                    raise TemplateError(f"{where}: define is allowed at the top level only")
                if len(tokens) != 2 or tokens[1][0] != "const" or not isinstance(tokens[1][1], str):
                    raise TemplateError(f"{where}: define needs one quoted name")
                name = tokens[1][1]
                body_nodes, term = self._block(top=False)
                if term[0] != "end":
                    raise TemplateError(f"{term[2]}: unexpected {{{{{term[0]}}}}} in define")
                if name in self.defines:
                    raise TemplateError(f"{where}: template {name!r} defined twice")
                self.defines[name] = body_nodes
            elif keyword in ("range", "with", "template", "block", "break", "continue"):
                raise TemplateError(f"{where}: {{{{{keyword}}}}} is not supported by this renderer")
            else:
                nodes.append(("action", self._pipeline(tokens, where), where))
        if not top:
            raise TemplateError(f"{self._name}: unexpected EOF: an {{{{if}}}} or {{{{define}}}} is not closed "
                                "by {{end}}")
        return nodes, None

    def _pipeline(self, tokens, where):
        if not tokens:
            raise TemplateError(f"{where}: missing pipeline")
        commands, pos = _parse_pipeline(tokens, where)
        if pos != len(tokens):
            raise TemplateError(f"{where}: unexpected {tokens[pos][1]!r}")
        return commands

    def _if(self, tokens, where):
        branches = [(self._pipeline(tokens, where), None)]
        else_nodes = []
        while True:
            body, term = self._block(top=False)
            branches[-1] = (branches[-1][0], body)
            if term[0] == "end":
                break
            if term[0] == "elseif":
                branches.append((term[1], None))
                continue
            else_nodes, term = self._block(top=False)
            if term[0] != "end":
                raise TemplateError(f"{term[2]}: expected {{{{end}}}} after {{{{else}}}}")
            break
        return ("if", branches, else_nodes, where)

    # -- execution --

    def render(self, name, root):
        out = []
        self._exec(self.files[name], root, out)
        return "".join(out)

    def include(self, name, dot):
        if name not in self.defines:
            raise TemplateError(f'no template "{name}" associated with template')
        self._depth += 1
        if self._depth > 100:
            raise TemplateError(f"include {name!r}: too deep (recursion?)")
        try:
            out = []
            self._exec(self.defines[name], dot, out)
            return "".join(out)
        finally:
            self._depth -= 1

    def _exec(self, nodes, dot, out):
        for node in nodes:
            if node[0] == "text":
                out.append(node[1])
            elif node[0] == "action":
                out.append(_to_str(self._eval(node[1], dot, node[2])))
            else:
                _, branches, else_nodes, where = node
                for pipe, body in branches:
                    if _truth(self._eval(pipe, dot, where)):
                        self._exec(body, dot, out)
                        break
                else:
                    self._exec(else_nodes, dot, out)

    def _eval(self, commands, dot, where):
        value = _NO_PIPE
        for cmd in commands:
            value = self._command(cmd, dot, value, where)
        return value

    def _command(self, cmd, dot, piped, where):
        kind, value = cmd[0]
        if kind != "func":
            return self._operand(cmd[0], dot, where)
        operands = list(cmd[1:])
        if value in ("and", "or"):
            thunks = [lambda o=o: self._operand(o, dot, where) for o in operands]
            if piped is not _NO_PIPE:
                thunks.append(lambda: piped)
            if not thunks:
                raise TemplateError(f"{where}: {value}: wrong number of args")
            result = None
            for thunk in thunks:
                result = thunk()
                if _truth(result) != (value == "and"):
                    return result
            return result
        args = [self._operand(o, dot, where) for o in operands]
        if piped is not _NO_PIPE:
            args.append(piped)
        try:
            if value == "include":
                if len(args) != 2 or not isinstance(args[0], str):
                    raise TemplateError("include needs a template name and a context")
                return self.include(args[0], args[1])
            return FUNCTIONS[value](*args)
        except TypeError as e:
            raise TemplateError(f"{where}: error calling {value}: wrong number or type of args ({e})") from None
        except TemplateError as e:
            msg = str(e)
            raise TemplateError(msg if msg.startswith(where) else f"{where}: error calling {value}: {msg}") \
                from None

    def _operand(self, operand, dot, where):
        kind, value = operand
        if kind == "const":
            return value
        if kind == "pipe":
            return self._eval(value, dot, where)
        if kind == "field":
            v = dot
            for i, key in enumerate(value):
                if v is None:
                    raise TemplateError(f"{where}: nil pointer evaluating interface {{}}.{key} "
                                        f"(.{'.'.join(value[:i])} is not set)")
                if not isinstance(v, dict):
                    raise TemplateError(f"{where}: can't evaluate field {key} in type {type(v).__name__}")
                v = v.get(key)
            return v
        raise TemplateError(f"{where}: unexpected operand {operand!r}")


# ----------------------------------------------------------------------------------------------------------
# Helm's side: values, the chart's files, manifests.
# ----------------------------------------------------------------------------------------------------------

def _floats(v):
    """Numbers as Helm holds values-file numbers: float64."""
    if isinstance(v, dict):
        return {k: _floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_floats(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def merge_values(base, override):
    """Helm's coalescing of user values onto the chart's: maps merge recursively, null deletes a key."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate keys (which the API server's decoder rejects)."""


def _construct_mapping(loader, node, deep=False):
    keys = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_SPLIT = re.compile(r"(?:^|\s*\n)---\s*")


def load_chart():
    with open(os.path.join(CHART_DIR, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    with open(os.path.join(CHART_DIR, "values.yaml")) as f:
        values = yaml.safe_load(f) or {}
    renderer = Renderer()
    tdir = os.path.join(CHART_DIR, "templates")
    for fname in sorted(os.listdir(tdir)):
        if fname.endswith((".yaml", ".yml", ".tpl", ".txt")):
            with open(os.path.join(tdir, fname)) as f:
                renderer.add(f"{chart['name']}/templates/{fname}", f.read())
    return chart, values, renderer


def render_chart(chart, default_values, renderer, overrides, release="onnxopt", namespace="default"):
    """Renders every manifest template (not _*.tpl, not NOTES.txt) like helm template. Returns
    (values, documents as (file, parsed YAML), NOTES text)."""
    values = _floats(merge_values(default_values, overrides))
    root = {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": True,
                    "IsUpgrade": False, "Revision": 1},
        "Chart": {k[:1].upper() + k[1:]: v for k, v in chart.items()},
    }
    docs = []
    notes = None
    for name in renderer.files:
        base = os.path.basename(name)
        if base.startswith("_"):
            continue
        text = renderer.render(name, root)
        if base == "NOTES.txt":
            notes = text
            continue
        for part in _SPLIT.split(text):
            if not part.strip():
                continue
            try:
                doc = yaml.load(part, Loader=_UniqueKeyLoader)
            except yaml.YAMLError as e:
                numbered = "\n".join(f"{i + 1:4} {l}" for i, l in enumerate(part.splitlines()))
                raise CheckFailed(f"{name}: rendered YAML does not parse: {e}\n{numbered}") from None
            docs.append((name, doc))
    return values, docs, notes


# ----------------------------------------------------------------------------------------------------------
# Checks.
# ----------------------------------------------------------------------------------------------------------

class CheckFailed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def check_ref(where, what, name, ref, made, named):
    """A Secret or ConfigMap `ref` (a volume source, key ref or envFrom) refers to: rendered by the chart,
    named in the values, or marked optional."""
    check(name in made or name in named or ref.get("optional"),
          f"{where}: {what} {name} is neither rendered nor named in the values")


_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SCI = re.compile(r"^-?\d+(\.\d+)?e[-+]\d+$")
COMPONENT = "app.kubernetes.io/component"
DATA_DIR = "/var/lib/onnxopt"


def _subset(small, big):
    return bool(small) and all(big.get(k) == v for k, v in small.items())


def _flag(args, name):
    """The value of --name=value in args (the last one), or None."""
    found = None
    for a in args:
        if a.startswith(f"--{name}="):
            found = a.split("=", 1)[1]
    return found


def _external_names(v):
    """Objects the values name that the chart does not make: (secrets, configmaps, claims)."""
    secrets, configmaps, claims = set(), set(), set()
    if v["auth"]["enabled"]:
        secrets.add(v["auth"]["tokensSecret"])
    if v["tls"]["enabled"]:
        secrets.add(v["tls"]["secretName"])
        if v["tls"]["clientCaSecret"]:
            secrets.add(v["tls"]["clientCaSecret"])
    for key in ("existingSecret", "passwordSecret"):
        if v["jobStore"][key]:
            secrets.add(v["jobStore"][key])
    if v["persistence"]["existingClaim"]:
        claims.add(v["persistence"]["existingClaim"])
    for vol in v.get("extraVolumes") or []:
        if "secret" in vol:
            secrets.add(vol["secret"]["secretName"])
        if "configMap" in vol:
            configmaps.add(vol["configMap"]["name"])
        if "persistentVolumeClaim" in vol:
            claims.add(vol["persistentVolumeClaim"]["claimName"])
    for env in v.get("extraEnv") or []:
        ref = env.get("valueFrom") or {}
        if "secretKeyRef" in ref:
            secrets.add(ref["secretKeyRef"]["name"])
        if "configMapKeyRef" in ref:
            configmaps.add(ref["configMapKeyRef"]["name"])
    return secrets, configmaps, claims


def check_manifests(docs, v, release, namespace):
    kinds = Counter()
    objects = {}
    for fname, doc in docs:
        check(isinstance(doc, dict), f"{fname}: a document is not a mapping: {doc!r:.80}")
        for key in ("apiVersion", "kind", "metadata"):
            check(doc.get(key), f"{fname}: a document has no {key}")
        kind = doc["kind"]
        name = doc["metadata"].get("name")
        where = f"{kind} {name!r} ({fname})"
        check(isinstance(name, str) and len(name) <= 63 and _DNS1123_LABEL.fullmatch(name),
              f"{where}: metadata.name is not a DNS-1123 label of <= 63 characters")
        if kind == "Service":
            check(name[0].isalpha(), f"{where}: a Service name must start with a letter (DNS-1035)")
        check((kind, name) not in objects, f"{where}: rendered twice")
        check(doc["metadata"].get("namespace") == namespace, f"{where}: namespace is not the release's")
        labels = doc["metadata"].get("labels") or {}
        check(labels.get("app.kubernetes.io/instance") == release and labels.get("app.kubernetes.io/name"),
              f"{where}: missing the app.kubernetes.io/name and /instance labels")
        objects[(kind, name)] = doc
        kinds[kind] += 1

    def named(kind):
        return {n: d for (k, n), d in objects.items() if k == kind}

    deployments = named("Deployment")
    secrets_made = named("Secret")
    configmaps_made = named("ConfigMap")
    claims_made = named("PersistentVolumeClaim")
    ext_secrets, ext_configmaps, ext_claims = _external_names(v)
    gpu = v["gpuWorkers"]["enabled"]
    tls = v["tls"]["enabled"]

    # -- Deployments, one per pool --
    pools = {}
    for name, dep in deployments.items():
        comp = (dep["spec"]["template"]["metadata"].get("labels") or {}).get(COMPONENT)
        check(comp not in pools, f"Deployment {name}: a second Deployment of component {comp!r}")
        pools[comp] = dep
    expected = {"api", "cpu-worker"} | ({"gpu-worker"} if gpu else set())
    check(set(pools) == expected, f"Deployments by component: {sorted(pools, key=str)}, expected {sorted(expected)}")
    pool_values = {"api": v["api"], "cpu-worker": v["cpuWorkers"], "gpu-worker": v["gpuWorkers"]}
    drain = v["server"]["drainGraceSeconds"]

    for comp, dep in pools.items():
        name = dep["metadata"]["name"]
        where = f"Deployment {name} ({comp})"
        pv = pool_values[comp]
        spec = dep["spec"]
        tmpl = spec["template"]
        pod = tmpl["spec"]
        pod_labels = tmpl["metadata"]["labels"]
        check(_subset(spec["selector"]["matchLabels"], pod_labels),
              f"{where}: spec.selector.matchLabels is not a subset of the pod template's labels")
        check(spec["replicas"] == pv["replicas"], f"{where}: replicas {spec['replicas']} != {pv['replicas']}")
        for other, odep in pools.items():
            if other != comp:
                check(not _subset(spec["selector"]["matchLabels"], odep["spec"]["template"]["metadata"]["labels"]),
                      f"{where}: its selector also selects the {other} pods")
        ann = tmpl["metadata"].get("annotations") or {}
        check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == "9464",
              f"{where}: pod template lacks the prometheus.io annotations")

        containers = pod["containers"]
        check(len(containers) == 1, f"{where}: expected one container")
        c = containers[0]
        check(isinstance(c.get("image"), str) and re.fullmatch(r"[^\s:]+(:[^\s:]+)", c["image"]),
              f"{where}: image {c.get('image')!r} is not repository:tag")
        check(c.get("command") == ["/opt/onnxopt/bin/onnxopt-server"], f"{where}: command is not the server")
        check(c.get("workingDir") == DATA_DIR, f"{where}: workingDir is not {DATA_DIR}")
        args = c.get("args") or []
        check(all(isinstance(a, str) for a in args), f"{where}: args are not all strings: {args}")
        for a in args:
            check(not _SCI.match(a.split("=", 1)[-1]), f"{where}: {a} is in scientific notation")

        # role and device
        check(_flag(args, "role") == ("api" if comp == "api" else "worker"), f"{where}: --role is wrong: {args}")
        if comp == "api":
            check(_flag(args, "worker_device") is None, f"{where}: an API pod has --worker_device")
        else:
            want = {"gpu-worker": "cuda"}.get(comp) or pv["device"] or ("cpu" if gpu else "any")
            check(_flag(args, "worker_device") == want,
                  f"{where}: --worker_device={_flag(args, 'worker_device')}, expected {want}")
            check(_flag(args, "workers") == str(int(pv["workers"])), f"{where}: --workers is not {pv['workers']}")
        for flag, expect in (("listen", "0.0.0.0:50051"), ("metrics_listen", "0.0.0.0:9464"),
                             ("data_dir", DATA_DIR), ("lease_seconds", str(int(v["server"]["leaseSeconds"]))),
                             ("max_upload_bytes", str(int(v["server"]["maxUploadBytes"]))),
                             ("job_store_connections", str(int(v["server"]["jobStoreConnections"]))),
                             ("drain_grace_seconds", str(int(drain)))):
            check(_flag(args, flag) == expect, f"{where}: --{flag}={_flag(args, flag)}, expected {expect}")
        for extra in (v["server"]["extraArgs"] or []) + (pv.get("extraArgs") or []):
            check(extra in args, f"{where}: extra arg {extra} missing")

        # the job store: --job_store=$(ONNXOPT_JOB_STORE), the variable from the job store Secret
        check("--job_store=$(ONNXOPT_JOB_STORE)" in args, f"{where}: no --job_store=$(ONNXOPT_JOB_STORE)")
        env = {e["name"]: e for e in c.get("env") or []}
        check(len(env) == len(c.get("env") or []), f"{where}: an env variable is set twice")
        for a in args:
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                check(var in env, f"{where}: {a} refers to $({var}), which env does not define")
        ref = ((env.get("ONNXOPT_JOB_STORE") or {}).get("valueFrom") or {}).get("secretKeyRef")
        check(ref, f"{where}: ONNXOPT_JOB_STORE does not come from a secretKeyRef")
        check(not ref.get("optional"), f"{where}: the job store secret must not be optional")
        if v["jobStore"]["uri"]:
            check(ref["name"] in secrets_made, f"{where}: job store secret {ref['name']} is not rendered")
            data = secrets_made[ref["name"]].get("stringData") or {}
            check(data.get(ref["key"]) == v["jobStore"]["uri"],
                  f"{where}: the rendered secret's {ref['key']} is not jobStore.uri")
        else:
            check(ref == {"name": v["jobStore"]["existingSecret"], "key": v["jobStore"]["existingSecretKey"]},
                  f"{where}: ONNXOPT_JOB_STORE refers to {ref}, not jobStore.existingSecret/existingSecretKey")
        if v["jobStore"]["passwordSecret"]:
            pw = ((env.get("PGPASSWORD") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
            check(pw.get("name") == v["jobStore"]["passwordSecret"], f"{where}: PGPASSWORD is not from passwordSecret")

        # volumes, mounts and what they refer to
        volumes = {vol["name"]: vol for vol in pod.get("volumes") or []}
        check(len(volumes) == len(pod.get("volumes") or []), f"{where}: two volumes have one name")
        mounts = c.get("volumeMounts") or []
        for m in mounts:
            check(m["name"] in volumes, f"{where}: volumeMount {m['name']} names no volume")
        paths = [m["mountPath"] for m in mounts]
        check(len(paths) == len(set(paths)), f"{where}: two volumeMounts share a mountPath")
        by_path = {m["mountPath"]: volumes[m["name"]] for m in mounts}
        data_vol = by_path.get(DATA_DIR) or {}
        check("persistentVolumeClaim" in data_vol, f"{where}: {DATA_DIR} is not a PersistentVolumeClaim")
        check("emptyDir" in (by_path.get("/tmp") or {}), f"{where}: /tmp is not an emptyDir")
        for vol in volumes.values():
            if "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                check(claim in claims_made or claim in ext_claims, f"{where}: claim {claim} is neither rendered "
                      "nor persistence.existingClaim")
            if "secret" in vol:
                check_ref(where, f"volume {vol['name']}: secret", vol["secret"]["secretName"], vol["secret"],
                          secrets_made, ext_secrets)
            if "configMap" in vol:
                check_ref(where, f"volume {vol['name']}: configMap", vol["configMap"]["name"], vol["configMap"],
                          configmaps_made, ext_configmaps)
        for e in env.values():
            vf = e.get("valueFrom") or {}
            for key, kind, made, ext in (("secretKeyRef", "secret", secrets_made, ext_secrets),
                                         ("configMapKeyRef", "configMap", configmaps_made, ext_configmaps)):
                if key in vf:
                    check_ref(where, f"env {e['name']}: {kind}", vf[key]["name"], vf[key], made, ext)
        for ef in c.get("envFrom") or []:
            for key, made, ext in (("secretRef", secrets_made, ext_secrets),
                                   ("configMapRef", configmaps_made, ext_configmaps)):
                if key in ef:
                    check_ref(where, f"envFrom {key}", ef[key]["name"], ef[key], made, ext)

        # every file flag points into a mounted folder
        for flag in ("tls_cert", "tls_key", "tls_client_ca", "auth_tokens_file"):
            path = _flag(args, flag)
            if path is not None:
                folder = os.path.dirname(path)
                check(folder in by_path, f"{where}: --{flag}={path}: {folder} is not mounted")
                check(not any(m.get("subPath") for m in mounts if m["mountPath"] == folder),
                      f"{where}: {folder} is a subPath mount (it would not see secret updates)")

        # security
        psc = pod.get("securityContext") or {}
        check(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 10001 and psc.get("fsGroup") == 10001,
              f"{where}: the pod does not run as non-root uid 10001: {psc}")
        csc = c.get("securityContext") or {}
        check(csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
              and "ALL" in ((csc.get("capabilities") or {}).get("drop") or []),
              f"{where}: container securityContext is not locked down: {csc}")
        check(pod.get("automountServiceAccountToken") is False, f"{where}: the service account token is mounted")
        tgps = pod.get("terminationGracePeriodSeconds")
        check(isinstance(tgps, int) and tgps > drain,
              f"{where}: terminationGracePeriodSeconds {tgps} is not > --drain_grace_seconds {drain}")
        sa = pod.get("serviceAccountName")
        if v["serviceAccount"]["create"]:
            check(("ServiceAccount", sa) in objects, f"{where}: service account {sa} is not rendered")

        # ports and probes
        ports = {p["name"]: p["containerPort"] for p in c.get("ports") or []}
        check(ports == {"grpc": 50051, "metrics": 9464}, f"{where}: container ports are {ports}")
        for probe_name in ("readinessProbe", "livenessProbe"):
            probe = c.get(probe_name)
            check(probe, f"{where}: no {probe_name}")
            if tls:
                check("tcpSocket" in probe and "grpc" not in probe,
                      f"{where}: with TLS the {probe_name} must be tcpSocket (kubelet gRPC probes are plaintext)")
                check(probe["tcpSocket"]["port"] in (50051, "grpc"), f"{where}: {probe_name} port is not gRPC's")
            else:
                check("grpc" in probe and probe["grpc"]["port"] == 50051, f"{where}: {probe_name} is not gRPC on 50051")
                service = probe["grpc"].get("service", "")
                want = "onnxopt.v1.Optimizer" if comp == "api" and probe_name == "readinessProbe" else ""
                check(service == want, f"{where}: {probe_name} checks service {service!r}, expected {want!r}")

        # TLS
        if tls:
            check(_flag(args, "tls_cert") == "/etc/onnxopt/tls/tls.crt" and _flag(args, "tls_key") ==
                  "/etc/onnxopt/tls/tls.key", f"{where}: TLS is on but --tls_cert/--tls_key are missing")
            tvol = by_path.get("/etc/onnxopt/tls") or {}
            check((tvol.get("secret") or {}).get("secretName") == v["tls"]["secretName"],
                  f"{where}: /etc/onnxopt/tls is not tls.secretName")
            if v["tls"]["clientCaSecret"]:
                ca = _flag(args, "tls_client_ca")
                check(ca, f"{where}: tls.clientCaSecret is set but --tls_client_ca is missing")
                cvol = by_path.get(os.path.dirname(ca)) or {}
                check((cvol.get("secret") or {}).get("secretName") == v["tls"]["clientCaSecret"],
                      f"{where}: --tls_client_ca's folder is not tls.clientCaSecret")
        else:
            check(not any(a.startswith("--tls_") for a in args), f"{where}: TLS is off but args carry --tls_ flags")

        # auth: the API pods read the tokens file from the tokens secret
        if comp == "api" and v["auth"]["enabled"]:
            tokens = _flag(args, "auth_tokens_file")
            check(tokens == f"/etc/onnxopt/auth/{v['auth']['tokensKey']}", f"{where}: --auth_tokens_file is {tokens}")
            avol = by_path.get("/etc/onnxopt/auth") or {}
            check((avol.get("secret") or {}).get("secretName") == v["auth"]["tokensSecret"],
                  f"{where}: /etc/onnxopt/auth is not auth.tokensSecret")
        if comp == "api" and not v["auth"]["enabled"]:
            check(_flag(args, "auth_tokens_file") is None, f"{where}: auth is off but --auth_tokens_file is set")

        # GPUs
        limits = (c.get("resources") or {}).get("limits") or {}
        if comp == "gpu-worker":
            check(isinstance(limits.get("nvidia.com/gpu"), int) and limits["nvidia.com/gpu"] >= 1,
                  f"{where}: does not request nvidia.com/gpu: {limits}")
            check(pod.get("tolerations") == v["gpuWorkers"]["tolerations"] or not v["gpuWorkers"]["tolerations"],
                  f"{where}: tolerations are not gpuWorkers.tolerations")
        else:
            check("nvidia.com/gpu" not in limits, f"{where}: a non-GPU pool requests GPUs")
        check(c.get("resources") and limits.get("memory"), f"{where}: no memory limit")

    # -- Service: the API pods only --
    services = named("Service")
    check(len(services) == 1, f"expected one Service, got {sorted(services)}")
    (svc_name, svc), = services.items()
    sel = svc["spec"].get("selector") or {}
    check(_subset(sel, pools["api"]["spec"]["template"]["metadata"]["labels"]),
          f"Service {svc_name}: selector does not select the API pods")
    for comp, dep in pools.items():
        if comp != "api":
            check(not _subset(sel, dep["spec"]["template"]["metadata"]["labels"]),
                  f"Service {svc_name}: selector also selects the {comp} pods")
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    check(set(sports) == {"grpc", "metrics"}, f"Service {svc_name}: ports {sorted(sports)}")
    check(sports["grpc"]["port"] == v["service"]["port"] and sports["grpc"].get("appProtocol") == "grpc",
          f"Service {svc_name}: the grpc port is not {v['service']['port']} with appProtocol grpc")
    check(sports["metrics"]["port"] == v["service"]["metricsPort"], f"Service {svc_name}: metrics port")
    api_ports = {p["name"] for p in pools["api"]["spec"]["template"]["spec"]["containers"][0]["ports"]}
    for p in sports.values():
        check(p["targetPort"] in api_ports, f"Service {svc_name}: targetPort {p['targetPort']} is no API pod port")

    # -- PodDisruptionBudgets: each selects exactly one pool --
    covered = Counter()
    for name, pdb in named("PodDisruptionBudget").items():
        sel = pdb["spec"]["selector"]["matchLabels"]
        matches = [comp for comp, dep in pools.items() if _subset(sel, dep["spec"]["template"]["metadata"]["labels"])]
        check(len(matches) == 1, f"PodDisruptionBudget {name}: selects the pods of {matches}, expected exactly one pool")
        covered[matches[0]] += 1
        budget = [k for k in ("minAvailable", "maxUnavailable") if k in pdb["spec"]]
        check(len(budget) == 1 and pdb["spec"][budget[0]] not in (None, ""),
              f"PodDisruptionBudget {name}: needs exactly one of minAvailable/maxUnavailable")
    for comp in pools:
        want = 1 if pool_values[comp]["podDisruptionBudget"]["enabled"] else 0
        check(covered[comp] == want, f"pool {comp}: {covered[comp]} PodDisruptionBudgets, expected {want}")

    # -- the data volume --
    if v["persistence"]["existingClaim"]:
        check(not claims_made, f"persistence.existingClaim is set but the chart renders {sorted(claims_made)}")
    else:
        check(len(claims_made) == 1, f"expected one PersistentVolumeClaim, got {sorted(claims_made)}")
        (claim_name, claim), = claims_made.items()
        check(claim["spec"]["accessModes"] == ["ReadWriteMany"], f"PVC {claim_name}: not ReadWriteMany")
        check(claim["spec"]["resources"]["requests"]["storage"] == v["persistence"]["size"], f"PVC {claim_name}: size")
        if v["persistence"]["storageClassName"]:
            check(claim["spec"].get("storageClassName") == v["persistence"]["storageClassName"],
                  f"PVC {claim_name}: storageClassName")
    for comp, dep in pools.items():
        vols = {x["name"]: x for x in dep["spec"]["template"]["spec"]["volumes"]}
        claim = vols["data"]["persistentVolumeClaim"]["claimName"]
        want = v["persistence"]["existingClaim"] or next(iter(claims_made), None)
        check(claim == want, f"pool {comp}: data volume claims {claim}, expected {want}")

    # -- Secrets: only the job store's, and only from jobStore.uri --
    check(len(secrets_made) == (1 if v["jobStore"]["uri"] else 0),
          f"rendered Secrets {sorted(secrets_made)} (expected one only when jobStore.uri is set)")
    return kinds


# ----------------------------------------------------------------------------------------------------------
# Renderer self-test: it must be a real template engine, not a pass-through.
# ----------------------------------------------------------------------------------------------------------

def _render_text(src, values=None, defines=""):
    r = Renderer()
    if defines:
        r.add("defines.tpl", defines)
    r.add("t.yaml", src)
    return r.render("t.yaml", {"Values": _floats(values or {}), "Release": {"Name": "r"}})


def renderer_self_test():
    cases = [
        ("a  {{- \"b\" -}}  \n  c", {}, "abc"),
        ("x\n{{- if .Values.on }}\ny: 1\n{{- end }}\nz", {"on": True}, "x\ny: 1\nz"),
        ("x\n{{- if .Values.on }}\ny: 1\n{{- end }}\nz", {}, "x\nz"),
        ("{{ if eq .Values.s \"a\" }}A{{ else if eq .Values.s \"b\" }}B{{ else }}C{{ end }}", {"s": "b"}, "B"),
        ("{{ if eq .Values.s \"a\" }}A{{ else if eq .Values.s \"b\" }}B{{ else }}C{{ end }}", {"s": "z"}, "C"),
        ("{{ \"x\" | printf \"%s-%s\" \"a\" }}", {}, "a-x"),  # the piped value is the last argument
        ("[{{ .Values.nope }}]", {}, "[]"),
        ("{{ .Values.nope | default \"d\" }}", {}, "d"),
        ("{{ .Values.n }} {{ .Values.big }} {{ .Values.big | int64 }} {{ .Values.n | add 30 }}",
         {"n": 60, "big": 8589934592}, "60 8.589934592e+09 8589934592 90"),
        ("{{ and .Values.a (not .Values.b) }}|{{ or .Values.b \"y\" }}", {"a": "x", "b": ""}, "true|y"),
        ("{{- /* c */ -}}\n{{ \"abcdef-\" | trunc 7 | trimSuffix \"-\" | quote }}", {}, '"abcdef"'),
        ("k:\n  {{- toYaml .Values.m | nindent 2 }}", {"m": {"b": [1, "x"], "a": 2}}, "k:\n  a: 2\n  b:\n  - 1\n  - x"),
    ]
    for src, values, want in cases:
        got = _render_text(src, values)
        check(got == want, f"renderer: {src!r} rendered {got!r}, expected {want!r}")
    got = _render_text('l:\n  {{- include "t" . | nindent 2 }}', {"x": "v"},
                       defines='{{- define "t" -}}\na: {{ .Values.x }}\nb: {{ .Release.Name }}\n{{- end -}}')
    check(got == "l:\n  a: v\n  b: r", f"renderer: include | nindent rendered {got!r}")

    must_fail = [
        ("{{ frobnicate 1 }}", TemplateError, "not defined"),           # unknown function
        ("{{ if .Values.x }}abc", TemplateError, "unexpected EOF"),     # unclosed if
        ("{{ if .Values.x }}a{{ else }}b{{ else }}c{{ end }}", TemplateError, ""),
        ("{{ .Values.x", TemplateError, "unclosed action"),
        ("abc{{ end }}", TemplateError, "unexpected"),
        ("{{ .Values.nope.deeper }}", TemplateError, "nil pointer"),    # as Helm: a field of a missing value
        ("{{ .Values.m }}", TemplateError, "toYaml"),                   # a map printed as map[...]
        ("{{ eq .Values.n 1 }}", TemplateError, "incompatible"),        # float64 value vs int literal
        ("{{ include \"missing\" . }}", TemplateError, "no template"),
        ("{{ range .Values.l }}{{ end }}", TemplateError, "not supported"),
        ("{{ fail \"boom\" }}", ChartFail, "boom"),
        ("{{ required \"need x\" .Values.x }}", ChartFail, "need x"),
    ]
    for src, exc, text in must_fail:
        try:
            got = _render_text(src, {"m": {"a": 1}, "n": 1, "l": [1]})
        except exc as e:
            check(text in str(e), f"renderer: {src!r} raised {e!r}, expected a message with {text!r}")
        else:
            raise CheckFailed(f"renderer: {src!r} rendered {got!r} instead of raising {exc.__name__}")


# ----------------------------------------------------------------------------------------------------------
# Scenarios.
# ----------------------------------------------------------------------------------------------------------

PG_URI = "postgresql://onnxopt@postgres.db.svc:5432/onnxopt?sslmode=require"

SCENARIOS = [
    {
        "name": "defaults + jobStore.uri",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}},
    },
    {
        "name": "GPU pool + TLS (mutual) + existing job store secret + existingClaim",
        # 53 characters, Helm's longest release name; it contains the chart name, so fullname is the release
        "release": "team-vision-research-onnxopt-staging-eu-west-1-blue-x", "namespace": "onnxopt-staging",
        "set": {
            "gpuWorkers": {"enabled": True, "replicas": 2, "runtimeClassName": "nvidia",
                           "image": {"repository": "registry.example/onnxopt-cuda"}},
            "tls": {"enabled": True, "clientCaSecret": "onnxopt-client-ca"},
            "jobStore": {"existingSecret": "pg-onnxopt", "existingSecretKey": "dsn", "passwordSecret": "pg-password"},
            "persistence": {"existingClaim": "shared-onnxopt-data"},
            "serviceAccount": {"create": True},
            "api": {"replicas": 3, "podDisruptionBudget": {"minAvailable": 2}},
            "server": {"maxUploadBytes": 17179869184, "drainGraceSeconds": 300,
                       "extraArgs": ["--tenant_max_active_jobs=8"]},
            "extraEnv": [{"name": "PGSSLMODE", "value": "verify-full"},
                         {"name": "PGSSLROOTCERT", "value": "/etc/onnxopt/pg/ca.crt"}],
            "extraVolumes": [{"name": "pg-ca", "secret": {"secretName": "pg-ca"}}],
            "extraVolumeMounts": [{"name": "pg-ca", "mountPath": "/etc/onnxopt/pg", "readOnly": True}],
            "podAnnotations": {"example.com/team": "vision"},
            "podLabels": {"example.com/cost-center": "ml-42"},
            "imagePullSecrets": [{"name": "registry-credentials"}],
        },
    },
    {
        "name": "auth off, explicit CPU device beside a GPU pool, no PDBs, storage class",
        "release": "dev", "namespace": "default",
        "set": {"jobStore": {"uri": PG_URI}, "auth": {"enabled": False}, "gpuWorkers": {"enabled": True},
                "cpuWorkers": {"device": "any", "podDisruptionBudget": {"enabled": False}},
                "api": {"podDisruptionBudget": {"enabled": False}},
                "persistence": {"storageClassName": "nfs-client", "size": "1Ti"}},
    },
    {
        "name": "no job store",
        "release": "prod", "namespace": "ml", "set": {},
        "fails_with": "no job store configured",
    },
    {
        "name": "both jobStore.uri and jobStore.existingSecret",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI, "existingSecret": "pg"}},
        "fails_with": "not both",
    },
    {
        "name": "jobStore.uri in the postgres:// spelling",
        "release": "onnxopt", "namespace": "ml",
        "set": {"jobStore": {"uri": "postgres://onnxopt@pg:5432/onnxopt"}},
    },
    {
        "name": "jobStore.uri that is not PostgreSQL",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": "sqlite:///var/lib/onnxopt/jobs.sqlite3"}},
        "fails_with": "postgresql://",
    },
    {
        "name": "auth on without a tokens secret",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "auth": {"tokensSecret": ""}},
        "fails_with": "auth.tokensSecret is required",
    },
    {
        "name": "a CPU pool that would claim CUDA jobs",
        "release": "prod", "namespace": "ml",
        "set": {"jobStore": {"uri": PG_URI}, "cpuWorkers": {"device": "cuda"}},
        "fails_with": "cpuWorkers.device",
    },
]


def main():
    try:
        renderer_self_test()
        print("ok   renderer self-test (trim markers, pipelines, if/else if, include | nindent, Helm's "
              "float64 numbers, parse errors)")
        chart, default_values, renderer = load_chart()
        check(chart.get("apiVersion") == "v2" and chart.get("name") == "onnxopt" and chart.get("version")
              and chart.get("appVersion"), "Chart.yaml: apiVersion v2, name onnxopt, version and appVersion")
        for sc in SCENARIOS:
            label = f"scenario {sc['name']!r}"
            try:
                values, docs, notes = render_chart(chart, default_values, renderer, sc["set"],
                                                   sc["release"], sc["namespace"])
            except ChartFail as e:
                if sc.get("fails_with") and sc["fails_with"] in str(e):
                    print(f"ok   {label}: refused as expected: {e}")
                    continue
                raise CheckFailed(f"{label}: the chart refused the values: {e}") from None
            except TemplateError as e:
                raise CheckFailed(f"{label}: template error: {e}") from None
            check(not sc.get("fails_with"), f"{label}: rendered, but should have failed with "
                                            f"{sc.get('fails_with')!r}")
            try:
                kinds = check_manifests(docs, values, sc["release"], sc["namespace"])
                check(notes and notes.strip() and sc["release"] in notes, "NOTES.txt rendered empty")
            except CheckFailed as e:
                raise CheckFailed(f"{label}: {e}") from None
            summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            print(f"ok   {label}: {sum(kinds.values())} documents: {summary}")
    except (CheckFailed, TemplateError, ChartFail) as e:
        print(f"FAIL {e}", file=sys.stderr)
        return 1
    print(f"PASS helm chart {CHART_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
