# SPDX-License-Identifier: Apache-2.0
"""The generated stubs (ferry/_ferry/*.pyi, nanobind's stubgen at build) against the module they describe,
and the binding's keyword arguments and counters against the core's field lists (d2h/detail/fields.hpp)."""

import ast
import inspect
import pathlib

import pytest

import ferry
from ferry import _ferry

STUB_DIR = pathlib.Path(_ferry.__file__).parent / "_ferry"


def _stub(name):
    path = STUB_DIR / f"{name}.pyi"
    if not path.exists():
        pytest.skip(f"no generated stub at {path} (an installed package without stubs?)")
    return ast.parse(path.read_text())


def _stub_classes(tree):
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def _public(cls):
    return {n for n in vars(cls) if not n.startswith("_") or n in ("__enter__", "__exit__", "__len__")}


@pytest.mark.parametrize("module", ["__init__", "host"] + (["cuda"] if _ferry.has_cuda else []))
def test_every_class_and_method_of_the_module_is_in_its_stub(module):
    mod = _ferry if module == "__init__" else getattr(_ferry, module)
    classes = _stub_classes(_stub(module))
    runtime = {n: c for n, c in vars(mod).items() if isinstance(c, type) and not issubclass(c, BaseException)}
    assert set(classes) == set(runtime), "classes of the stub vs the module"
    for name, cls in runtime.items():
        missing = {m for m in _public(cls) if callable(getattr(cls, m, None)) and not isinstance(vars(cls)[m], property)}
        missing -= classes[name]
        assert not missing, f"{module}.{name}: methods without a stub: {sorted(missing)}"


def test_channel_keywords_are_the_config_fields():
    # every d2h::config field but the ones the binding fixes is a keyword of Channel, in the stub and at run
    # time; a field added to config without a Python counterpart fails the C++ build (static_assert) or here
    fields = set(_ferry.channel_config_fields)
    assert fields and not fields & set(_ferry.channel_fixed_fields)
    tree = _stub("host")
    chan = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Channel")
    init = next(n for n in chan.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    stub_kw = {a.arg for a in init.args.kwonlyargs}
    assert stub_kw == fields | {"sink", "schema", "tuning"}  # the three keywords that are not config fields
    assert len(stub_kw) + 2 <= 12  # device and backend: at most 12 parameters besides tuning (issue 39)
    doc_sig = _ferry.host.Channel.__init__.__doc__.splitlines()[0]
    for f in fields:
        assert f"{f}:" in doc_sig
    ch = ferry.Channel(0, backend="host", **{"ring_bytes": 1 << 20, "publish_every": 4})
    assert set(ch.stats()) == set(_ferry.channel_counters)
    ch.close()


def test_tuning_keys_are_the_tuning_fields_and_documented_in_the_stub():
    # every d2h::tuning field is a tuning key (d2h/detail/fields.hpp), none is a keyword, and the generated
    # docstring of Channel.__init__ (in the stub) names each with its type and default
    keys = set(_ferry.channel_tuning_fields)
    assert keys and not keys & set(_ferry.channel_config_fields)
    doc = _ferry.host.Channel.__init__.__doc__
    for k in keys:
        assert f"  {k}: " in doc
    tree = _stub("host")
    chan = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Channel")
    init = next(n for n in chan.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    stub_doc = ast.get_docstring(init) or ""
    for k in keys:
        assert f"  {k}: " in stub_doc
    ch = ferry.Channel(0, backend="host", ring_bytes=1 << 20, tuning={k: v for k, v in _defaults(doc).items()})
    assert ch.close()["clean"]


def _defaults(doc):
    """{key: default} of the tuning keys as the docstring writes them ("  name: type = literal")."""
    out = {}
    for line in doc.splitlines():
        if line.startswith("  ") and ": " in line and " = " in line:
            name, rest = line.strip().split(": ", 1)
            out[name] = ast.literal_eval(rest.split(" = ", 1)[1])
    return out


def test_an_unknown_channel_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'ring_byte'"):
        ferry.Channel(0, backend="host", ring_byte=1 << 20)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'branch_publish' \(a tuning key: pass "
                                        r"tuning=\{'branch_publish': ...\}\)"):
        ferry.Channel(0, backend="host", branch_publish=False)


@pytest.mark.parametrize("kw,msg", [
    ({"ring_bytes": -1}, r"expected ring_bytes an int in \[0, "),
    ({"publish_every": 2**40}, r"expected publish_every an int in \[0, 4294967295\]"),
    ({"tuning": {"branch_publish": 1}}, r"expected tuning\['branch_publish'\] a bool, got int"),
    ({"on_full": "drop"}, "expected on_full one of 'block', 'fail_fast', got 'drop'"),
    ({"timeout": -0.5}, r"expected timeout a number of seconds in \[0, 1e\+09\], got -0.5"),
    ({"tuning": {"branch_publsh": True}}, r"tuning key 'branch_publsh' unknown: expected one of head_memory, "),
    ({"tuning": {"gather_batch": 1.5}}, r"expected tuning\['gather_batch'\] an int, got float"),
    ({"tuning": {"head_memory": 1}}, r"expected tuning\['head_memory'\] one of 'platform', 'managed', "
                                     r"'pinned_mapped', got 1"),
    ({"tuning": {1: True}}, "expected every tuning key a str, got int"),
    ({"tuning": [("branch_publish", True)]}, "expected tuning a dict of tuning keys"),
])
def test_bad_channel_keywords_name_the_keyword_and_the_range(kw, msg):
    with pytest.raises(ferry.LogicError, match=msg):
        ferry.Channel(0, backend="host", **kw)
