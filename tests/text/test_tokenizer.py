"""Token ids equal llama.cpp's on every fixture text of both real models, and under every BPE
pre-tokenizer rase knows; decode round-trips."""
from __future__ import annotations

from pathlib import Path

import pytest

from rase import GGUFFile, TokenizerError
from rase.text.tokenizer import LocalTokenizer
from tests.support.conformance import load_fixture
from tests.support.ggufbuild import GGUFSpec, Tensor

FIXTURES = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma3-270m-q4_k_m"}


@pytest.fixture(scope="module", params=[pytest.param(n, marks=pytest.mark.needs_model) for n in sorted(FIXTURES)])
def vocab(request):
    path = request.getfixturevalue(f"{request.param}_path")
    return LocalTokenizer.from_gguf(GGUFFile(path)), load_fixture(FIXTURES[request.param])


def test_ids_equal_llama_cpp(vocab):
    tok, fx = vocab
    for e in fx["tokenize"]:  # llama.cpp: add_bos per metadata, special tokens not parsed
        assert tok.encode(e["text"], add_special_tokens=True, parse_special=False) == e["ids"], e["text"]
    for e in fx["tokenize_special"]:  # no BOS, special tokens parsed
        assert tok.encode(e["text"], add_special_tokens=False, parse_special=True) == e["ids"], e["text"]
    for p in fx["prompts"]:
        assert tok.encode(p["text"], add_special_tokens=True, parse_special=p["special"]) == p["ids"]
    assert len(fx["tokenize"]) + len(fx["tokenize_special"]) + len(fx["prompts"]) >= 15


def test_decode_round_trips(vocab):
    tok, fx = vocab
    for e in fx["tokenize"] + fx["tokenize_special"]:
        ids = tok.encode(e["text"], add_special_tokens=False, parse_special=True)
        assert tok.decode(ids, skip_special_tokens=False) == e["text"]
    # the template written in the model's own control tokens loses them when skipping specials
    shrunk = [e["text"] for e in fx["tokenize_special"]
              if len(tok.decode(tok.encode(e["text"], False, True), skip_special_tokens=True)) < len(e["text"])]
    assert len(shrunk) == 1


def test_bytes_of_a_prefix_may_end_inside_a_character(vocab):
    tok, _ = vocab
    ids = tok.encode("안녕 🙂", add_special_tokens=False)
    full = tok.decode_bytes(ids)
    assert full.decode() == "안녕 🙂"
    prefixes = [tok.decode_bytes(ids[:k]) for k in range(len(ids) + 1)]
    assert all(full.startswith(p) for p in prefixes)


def test_bos_follows_the_metadata(vocab):
    tok, fx = vocab
    ids = tok.encode("Hello", add_special_tokens=True, parse_special=False)
    assert (ids[0] == fx["bos"]) == (fx["model"].startswith("gemma"))  # gemma adds BOS, SmolLM2 not
    assert tok.encode("Hello", add_special_tokens=False)[0] != fx["bos"]


def test_unsupported_vocabularies_are_refused(tmp_path):
    spec = GGUFSpec(kvs=[("general.architecture", 8, "llama"), ("tokenizer.ggml.model", 8, "t5"),
                         ("tokenizer.ggml.tokens", 9, (8, ["a"]))],
                    tensors=[Tensor("t", (4,), 0, b"\0" * 16)])
    with pytest.raises(TokenizerError, match="'t5'"):
        LocalTokenizer.from_gguf(GGUFFile.from_buffer(spec.build()))
    spec.kvs[1] = ("tokenizer.ggml.model", 8, "gpt2")
    spec.kvs.append(("tokenizer.ggml.pre", 8, "some-new-pre"))
    with pytest.raises(TokenizerError, match="some-new-pre"):
        LocalTokenizer.from_gguf(GGUFFile.from_buffer(spec.build()))


@pytest.mark.parametrize("kv, key", [
    (("tokenizer.ggml.tokens", 9, (5, [1, 2])), "tokenizer.ggml.tokens"),       # numbers, not strings
    (("tokenizer.ggml.tokens", 9, (8, [])), "tokenizer.ggml.tokens"),
    (("tokenizer.ggml.token_type", 9, (5, [1])), "tokenizer.ggml.token_type"),  # 1 type for 2 tokens
    (("tokenizer.ggml.scores", 9, (8, ["x", "y"])), "tokenizer.ggml.scores"),
])
def test_malformed_vocabulary_metadata_is_refused_by_key(kv, key):
    kvs = [("general.architecture", 8, "llama"), ("tokenizer.ggml.model", 8, "llama")]
    if kv[0] != "tokenizer.ggml.tokens":
        kvs.append(("tokenizer.ggml.tokens", 9, (8, ["a", "b"])))
    spec = GGUFSpec(kvs=kvs + [kv], tensors=[Tensor("t", (4,), 0, b"\0" * 16)])
    with pytest.raises(TokenizerError, match=key.replace(".", r"\.")):
        LocalTokenizer.from_gguf(GGUFFile.from_buffer(spec.build()))


def test_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    tok = LocalTokenizer.from_file(tmp_path / "tokenizer.json")
    assert tok.encode("hello world there") == [0, 1, 2]
    assert tok.decode([0, 1]) == "hello world"
    with pytest.raises(TokenizerError):
        LocalTokenizer.from_file(tmp_path / "missing.json")


WORST = {  # inputs that make naive tokenizers quadratic
    "one character": lambda n: "a" * n,
    "digits": lambda n: "1" * n,
    "spaces": lambda n: " " * n,
    "special look-alikes": lambda n: ("<|<|im_start|>|>" * n)[:n],
    "nested look-alikes": lambda n: "<" * (n // 2) + "|im_start|" + ">" * (n // 2),
}


@pytest.mark.needs_model
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_worst_case_inputs_take_linear_time(request, model):
    """A megabyte (the server's body limit) of each finishes within seconds, and four times the
    input takes well under sixteen times as long (no quadratic merge loop)."""
    import time

    tok = LocalTokenizer.from_gguf(GGUFFile(request.getfixturevalue(f"{model}_path")))
    big = 1 << 20 if model == "smollm2" else 1 << 18  # Gemma's SentencePiece merge is ~8 us/char here
    for name, make in WORST.items():
        times = []
        for n in (big // 4, big):
            t0 = time.perf_counter()
            ids = tok.encode(make(n))
            times.append(time.perf_counter() - t0)
            assert 0 < len(ids) <= n + 2, name
        assert times[1] < 30 and times[1] < 10 * max(times[0], 0.01), (name, times)


PRE_TEXTS = [
    "Hello world", "  leading spaces\tand\ttabs\n\nnewlines\r\n\r\nx", "1234567 + 89 = 1234656 and ١٢٣",
    "I'm sure they'll say: \"we've done it!\" DON'T IT'S", "Café naïve — 日本語 ok?  ", "a\n\n\n   b  \n",
    "def add(a, b):\n    return a + b\n", "emoji 🙂🙂 and punctuation!!! ...", "",
    "cafe\u0301 x\u0308y \u0915\u094d\u0937\u093f \u0301lead", "'s marks\u0301!! \u0300\u0301\u0302 ok",
]


@pytest.mark.parametrize("pre", ["qwen2", "deepseek-r1-qwen", "olmo", "gpt-2", "llama-bpe", "smollm", "qwen35",
                                 "gpt-4o"])
def test_pre_tokenizers_equal_llamacpp(tmp_path, pre):
    """The byte-level BPE pre-tokenizers rase knows, on one vocabulary (the qwen2 tiny file's)
    relabelled with each `tokenizer.ggml.pre`, tokenize as llama.cpp itself does."""
    from llama_cpp import Llama

    from tests.support.ggufbuild import rewrite_gguf

    src = Path(__file__).parents[1] / "fixtures" / "archs" / "qwen2-tiny-q8_0.gguf"
    rewrite_gguf(src, tmp_path / "m.gguf", set_strings={"tokenizer.ggml.pre": pre})
    ref = Llama(str(tmp_path / "m.gguf"), vocab_only=True, verbose=False)
    tok = LocalTokenizer.from_gguf(GGUFFile(tmp_path / "m.gguf"))
    for text in PRE_TEXTS:
        want = ref.tokenize(text.encode(), add_bos=False, special=False)
        assert tok.encode(text, add_special_tokens=False, parse_special=False) == want, (pre, text)


def test_qwen35_keeps_combining_marks_with_their_letters():
    """Qwen3.5's pre-tokenizer is qwen2's with \\p{M} beside \\p{L}: a combining mark stays in its
    word (qwen2 starts a new piece at it). The tiny vocabulary has no merge across that split, so
    llama.cpp's ids above cannot tell the two apart; the pieces can."""
    from tokenizers import Regex, pre_tokenizers

    from rase.text.tokenizer import PRE_REGEXES

    def pieces(pre: str, text: str) -> list[str]:
        split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_REGEXES[pre]])
        return [p for p, _ in split.pre_tokenize_str(text)]

    assert pieces("qwen35", "cafe\u0301 au lait") == ["cafe\u0301", " au", " lait"]
    assert pieces("qwen2", "cafe\u0301 au lait") == ["cafe", "\u0301", " au", " lait"]
