"""The shape of the C wing (rase/kernels/*.h), checked as text: headers included only at their tops (no
include circles hidden below a declaration), no long macro carrying statements (kernels are
always-inline functions taking their type or tile as a constant), types named, never compared
as raw ggml ids, and one traits row per type."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

RASE = Path(__file__).resolve().parents[2] / "rase" / "kernels"
HEADERS = sorted(RASE.glob("*.h"))
CYTHON = sorted(RASE.glob("*.pyx")) + sorted(RASE.glob("*.pxi"))


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line outside comments."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), path.read_text(), flags=re.S)
    return [(i + 1, line.split("//")[0].rstrip()) for i, line in enumerate(text.split("\n"))]


@pytest.mark.parametrize("header", HEADERS, ids=lambda p: p.name)
def test_headers_are_included_only_at_the_top(header):
    first_decl, includes = None, []
    for no, line in _code_lines(header):
        s = line.strip()
        if re.match(r"#\s*include\b", s):
            includes.append(no)
        elif s and not s.startswith("#") and first_decl is None:
            first_decl = no
    assert first_decl is not None
    assert all(no < first_decl for no in includes), (header.name, includes, first_decl)


@pytest.mark.parametrize("header", HEADERS, ids=lambda p: p.name)
def test_no_macro_longer_than_15_lines_carries_statements(header):
    lines = header.read_text().split("\n")
    i = 0
    while i < len(lines):
        if re.match(r"\s*#\s*define\b", lines[i]):
            j = i
            while lines[j].rstrip().endswith("\\"):
                j += 1
            body = "\n".join(lines[i:j + 1])
            assert j - i + 1 <= 15 or ";" not in body, (header.name, i + 1, j - i + 1)
            i = j + 1
        else:
            i += 1


@pytest.mark.parametrize("path", HEADERS + CYTHON, ids=lambda p: p.name)
def test_no_raw_ggml_type_id_in_a_comparison(path):
    """Types are compared by their enum names (RASE_TYPE_Q4_K), never as the numbers ggml gives them."""
    raw = re.compile(r"\b(type|qtype|TYPE)\s*(==|!=|<=|>=|<|>)\s*(?!0\b)\d+\b|\b\d+\s*(==|!=)\s*(type|qtype|TYPE)\b"
                     r"|\bcase\s+(1[0-4]|30)\s*:")  # (type < 0: a range check, not an id)
    bad = [(no, line) for no, line in _code_lines(path) if raw.search(line)]
    assert not bad, bad



def test_the_traits_header_is_the_only_table_by_type():
    """Adding a type touches one row: no other header indexes a table by ggml type."""
    tables = [(p.name, m.group(0)) for p in HEADERS
              for m in re.finditer(r"static const \w+ \w+\[RASE_GGML_TYPE_COUNT\]", p.read_text())]
    assert tables == [("_traits.h", "static const rase_type_traits rase_type_traits_table[RASE_GGML_TYPE_COUNT]")]


def _body(text: str, signature: str) -> str:
    """A C function's body: from its signature to the brace that closes it."""
    start = text.index("{", text.index(signature))
    depth, i = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
        i += 1


def test_each_mixer_is_a_header_and_a_row_that_declares_its_scratch():
    """A token mixer is its own header (_mix_<name>.h) and one row of RASE_MIXERS: its block and
    what it needs of the step's scratch. The scratch allocation asks them and knows no mixer;
    the generic matmul knows no LM head (the head asks for its NaN check as an epilogue)."""
    model, forward = (RASE / "_model.h").read_text(), (RASE / "_forward.h").read_text()
    kinds = re.findall(r"RASE_MIXER_(\w+)", re.search(r"enum \{ (RASE_MIXER_[^}]*)\}", model).group(1))
    rows = dict(re.findall(r"\[RASE_MIXER_(\w+)\] = \{(\w+, \w+)\}", forward))
    assert sorted(rows) == sorted(kinds) and len(kinds) >= 3
    for kind, row in rows.items():
        block, needs = row.split(", ")
        header = (RASE / f"_mix_{kind.lower()}.h").read_text()
        assert f"static void {block}(" in header and f"static void {needs}(" in header, kind
    alloc = _body(model, "static int rase_scratch_alloc(")
    assert not re.search(r"ssm_|n_conv|attn_gate", alloc), "the allocation names a mixer's hyper-parameter"
    matmuls = _body((RASE / "_matmul.h").read_text(), "static void rase_matmuls(")
    assert "output" not in matmuls and "RASE_EPI_FINITE" in _body(forward, "static void rase_lm_head(")
