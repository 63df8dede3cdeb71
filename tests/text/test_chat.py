"""Chat templates: the seed's exact strings, Gemma's, and a model's own Jinja template."""
from __future__ import annotations

import pytest

from rase import ChatTemplateError, GGUFFile, InvalidRequest
from rase.text.chat import JinjaTemplate, render_chatml, render_gemma, render_llama3, render_mistral, select_template


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_seed_chatml():
    assert render_chatml(msgs(("system", "You are terse."), ("user", "Hi"))) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_seed_llama3():
    assert render_llama3(msgs(("user", "Hi"))) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_seed_mistral():
    assert render_mistral(msgs(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."),
                               ("user", "Bye"))) == "<s>[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]"
    assert render_mistral(msgs(("system", "dropped"))) == "<s>"  # no user turn follows
    with pytest.raises(InvalidRequest, match="unsupported chat role"):
        render_mistral(msgs(("tool", "x")))


def test_gemma():
    assert render_gemma(msgs(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Bye"))) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


@pytest.mark.parametrize("render", [render_chatml, render_llama3, render_mistral, render_gemma])
def test_empty_and_malformed_messages(render):
    with pytest.raises(InvalidRequest, match="must not be empty"):
        render([])
    with pytest.raises(InvalidRequest, match="string 'role' and a 'content'"):
        render([{"role": "user"}])
    with pytest.raises(InvalidRequest, match="string 'role'"):
        render(["hi"])
    with pytest.raises(InvalidRequest, match="list of text parts"):
        render([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(InvalidRequest, match="list of text parts"):
        render([{"role": "user", "content": None}])
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]
    assert render(parts) == render([{"role": "user", "content": "Hello"}])


@pytest.mark.needs_model
def test_smollm2_gguf_template_renders_what_transformers_would(smollm2_path):
    render = select_template(None, GGUFFile(smollm2_path), "llama")
    # SmolLM2's template adds its default system prompt when none is given
    assert render(msgs(("user", "Hi"))) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert render(msgs(("system", "Be brief."), ("user", "Hi"))) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.needs_model
def test_selection_order(smollm2_path):
    g = GGUFFile(smollm2_path)
    assert select_template("llama3", g, "llama") is render_llama3  # the manifest wins
    assert select_template(None, None, "qwen3") is render_chatml    # architecture default
    assert select_template(None, None, "gemma3") is render_gemma
    assert select_template(None, None, "llama") is render_mistral  # the seed's default for llama
    with pytest.raises(ChatTemplateError, match="no chat template for architecture 'phi9'"):
        select_template(None, None, "phi9")
    with pytest.raises(ChatTemplateError, match="unknown chat template 'zephyr'"):
        select_template("zephyr", g, "llama")
    with pytest.raises(ChatTemplateError, match="no tokenizer.chat_template"):
        select_template("gguf", None, "llama")


def test_jinja_is_sandboxed():
    for evil in ("{{ messages.__class__.__mro__ }}", "{{ messages.append(1) }}"):
        with pytest.raises(ChatTemplateError, match="is unsafe"):
            JinjaTemplate(evil).render(msgs(("user", "x")))
    refusing = JinjaTemplate("{{ raise_exception('only user roles') }}")
    with pytest.raises(ChatTemplateError, match="only user roles"):
        refusing.render(msgs(("user", "x")))
    with pytest.raises(ChatTemplateError, match="does not parse"):
        JinjaTemplate("{% for %}")


HOSTILE_TEMPLATES = {  # a model file's template is untrusted code
    "escape via class": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "escape via cycler": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "mutation": "{% set x = messages.append(1) %}{{ x }}",
    "huge range": "{% for i in range(10**9) %}x{% endfor %}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "output over the limit": "{% for i in range(100000) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}",
    "huge string": "{{ 'x' * 10**9 }}",
    "huge string reversed": "{{ 1000000000 * 'ab' }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
    "huge power": "{{ 10 ** 100000000 }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "division": "{{ 1 // 0 }}",
    "many iterations": "{% for i in range(100000) %}{% for j in range(20) %}{% endfor %}{% endfor %}",
    "silent nested loops over the input": "{% for a in messages[0].content %}{% for b in messages[0].content %}"
                                          "{% for c in messages[0].content %}{% endfor %}{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_templates_fail_typed_and_fast(name):
    import time

    from rase import ChatTemplateError
    from rase.text.chat import JinjaTemplate

    msgs = [{"role": "user", "content": "hello " * 50}]
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError):
        JinjaTemplate(HOSTILE_TEMPLATES[name]).render(msgs)
    assert time.monotonic() - t0 < 5.0, name


def test_sandbox_escapes_render_nothing_of_python():
    from rase.text.chat import JinjaTemplate

    for source in ("{{ raise_exception.__globals__ }}", "{{ messages.__class__ }}", "{{ lipsum.__globals__ }}",
                   "{{ '{0.__class__}'.format(messages) }}"):
        assert JinjaTemplate(source).render([{"role": "user", "content": "x"}]) == ""  # undefined, not Python


# ---------------------------------------------------------------- the families' own templates

@pytest.fixture(scope="module")
def card():
    """name -> the model card's chat template (tests/support/model_templates.py: from llama.cpp's sdist)."""
    from tests.support.models import models_dir
    from tests.support.model_templates import templates

    models_dir().mkdir(parents=True, exist_ok=True)
    return templates(models_dir())


CONVERSATION = msgs(("system", "You are terse."), ("user", "Hi"), ("assistant", "Hello."), ("user", "2+2?"))


@pytest.mark.parametrize("name", ["llama-3.1", "llama-3.2"])
def test_llama3_cards_render_header_tokens(card, name):
    import time

    out = JinjaTemplate(card[name], "<|begin_of_text|>", "<|eot_id|>").render(CONVERSATION)
    date = "26 Jul 2024" if name == "llama-3.1" else time.strftime("%d %b %Y")  # 3.2 asks strftime_now
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        f"Today Date: {date}\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_phi_cards_and_their_builtins(card):
    """Phi-4's <|im_sep|> and Phi-3.5/4-mini's tags: the card's template and rase's built-in
    fallback (a file without a template) render the same prompt."""
    from rase.text.chat import render_phi3, render_phi4

    phi4 = JinjaTemplate(card["phi-4"]).render(CONVERSATION)
    assert phi4 == ("<|im_start|>system<|im_sep|>You are terse.<|im_end|><|im_start|>user<|im_sep|>Hi<|im_end|>"
                    "<|im_start|>assistant<|im_sep|>Hello.<|im_end|><|im_start|>user<|im_sep|>2+2?<|im_end|>"
                    "<|im_start|>assistant<|im_sep|>") == render_phi4(CONVERSATION)
    phi3 = JinjaTemplate(card["phi-3.5-mini"], "<s>", "<|endoftext|>").render(CONVERSATION)
    assert phi3 == ("<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
                    "<|user|>\n2+2?<|end|>\n<|assistant|>\n") == render_phi3(CONVERSATION)


def test_smollm3_card_follows_the_think_flags(card):
    """SmolLM3 thinks by default; /no_think in the system prompt (rase's think="strip" soft
    switch adds it, thinking.with_no_think) turns it off and opens an empty think block."""
    from rase.text.thinking import with_no_think

    jt = JinjaTemplate(card["smollm3"], "", "<|im_end|>")
    think = jt.render(msgs(("user", "Hi")))
    assert "Reasoning Mode: /think\n" in think and think.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    quiet = jt.render(with_no_think(msgs(("system", "You are terse."), ("user", "Hi"))))
    assert "Reasoning Mode: /no_think\n" in quiet and "## Custom Instructions\n\nYou are terse.\n\n" in quiet
    assert quiet.endswith("<|im_start|>assistant\n<think>\n\n</think>\n") and "/no_think<|im_end|>" not in quiet


def test_granite_card_and_its_builtin(card):
    import time

    from rase.text.chat import render_granite

    jt = JinjaTemplate(card["granite-3.3"], "", "<|end_of_text|>")
    assert jt.render(CONVERSATION) == render_granite(CONVERSATION) == (
        "<|start_of_role|>system<|end_of_role|>You are terse.<|end_of_text|>\n"
        "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hello."
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>2+2?<|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>")
    default = jt.render(msgs(("user", "Hi")))  # no system message: the card's own, dated today
    assert default.startswith("<|start_of_role|>system<|end_of_role|>Knowledge Cutoff Date: April 2024. "
                              f"Today's Date: {time.strftime('%B %d, %Y')}. You are Granite, developed by IBM.")


@pytest.mark.parametrize("token,fmt", [("<|start_header_id|>", "llama3"), ("<|im_sep|>", "phi4"),
                                       ("<|start_of_role|>", "granite"), ("<|assistant|>", "phi3")])
def test_a_file_without_template_gets_its_vocabularys_format(tmp_path, token, fmt):
    from rase.text.chat import BUILTIN
    from tests.support.tinymodels import write_tiny_model
    from rase import QuantType

    path = write_tiny_model(tmp_path / "m.gguf", "llama", QuantType.Q8_0, extra_tokens={token: 3})
    assert select_template(None, GGUFFile(path), "llama") is BUILTIN[fmt]


def test_a_message_name_reaches_the_template():
    """OpenAI's `name` on any message (a speaker in a group chat) is passed to the template,
    which renders it where it reads it; a template that does not read it is unaffected."""
    named = [{"role": "user", "content": "hi", "name": "ada"}, {"role": "assistant", "content": "yo", "name": "bot"}]
    t = JinjaTemplate("{% for m in messages %}[{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}] "
                      "{{ m.content }}\n{% endfor %}")
    assert t.render(named) == "[user (ada)] hi\n[assistant (bot)] yo\n"
    plain = JinjaTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    assert plain.render(named) == plain.render([{k: v for k, v in m.items() if k != "name"} for m in named])
    with pytest.raises(InvalidRequest, match="name must be a string"):
        t.render([{"role": "user", "content": "hi", "name": 3}])


def test_every_template_name_a_manifest_may_give_has_a_renderer():
    """The store checks a manifest's chat_template against its own list of names (it does not
    import the renderers); the renderers are exactly those names."""
    from rase.store.registry import BUILTIN_TEMPLATES
    from rase.text.chat import BUILTIN

    assert list(BUILTIN) == list(BUILTIN_TEMPLATES)
