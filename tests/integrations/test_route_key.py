"""route_key: which requests share a replica; rendezvous_order: stable, minimal movement."""
import json

from rase.integrations.route_key import PROMPT_BLOCK, rendezvous_order, route_key

SYSTEM = {"role": "system", "content": "You are terse."}


def chat(*messages, model="smollm2"):
    return json.dumps({"model": model, "messages": list(messages)}).encode()


def test_later_turns_of_a_conversation_keep_the_first_turns_key():
    first = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    later = first + [{"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]
    assert route_key("/v1/chat/completions", chat(*first)) == route_key("/v1/chat/completions", chat(*later))
    # the Ollama route reads the same shape
    assert route_key("/api/chat", chat(*first)) == route_key("/v1/chat/completions", chat(*first))


def test_different_openings_models_and_content_parts():
    a = route_key("/v1/chat/completions", chat(SYSTEM, {"role": "user", "content": "Name a colour."}))
    b = route_key("/v1/chat/completions", chat(SYSTEM, {"role": "user", "content": "Name a city."}))
    c = route_key("/v1/chat/completions", chat(SYSTEM, {"role": "user", "content": "Name a colour."}, model="other"))
    parts = route_key("/v1/chat/completions", chat(SYSTEM, {"role": "user", "content": [
        {"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]}))
    assert len({a, b, c}) == 3
    assert parts == a


def test_completion_key_is_the_first_prompt_block():
    head = "x" * PROMPT_BLOCK
    one = route_key("/v1/completions", json.dumps({"model": "m", "prompt": head + "tail one"}).encode())
    two = route_key("/v1/completions", json.dumps({"model": "m", "prompt": [head + "tail two"]}).encode())
    other = route_key("/v1/completions", json.dumps({"model": "m", "prompt": "y" + head}).encode())
    assert one == two != other


def test_requests_without_a_prompt_have_no_key():
    for path, body in [("/v1/models", b""), ("/tokenize", b'{"content": "hi"}'), ("/v1/chat/completions", b"{bad"),
                       ("/v1/chat/completions", b"[1, 2]"), ("/v1/chat/completions", b'{"messages": "hi"}'),
                       ("/v1/chat/completions", b'{"messages": [1]}'), ("/v1/completions", b'{"prompt": 5}'),
                       ("/v1/chat/completions", b"\xff\xfe")]:
        assert route_key(path, body) is None, (path, body)


def test_rendezvous_order_is_stable_and_moves_only_the_removed_names_keys():
    names = ["r1", "r2", "r3"]
    keys = [f"key{i}" for i in range(300)]
    first = {k: names[rendezvous_order(k, names)[0]] for k in keys}
    assert first == {k: names[rendezvous_order(k, list(names))[0]] for k in keys}  # deterministic
    assert set(first.values()) == set(names)  # every replica gets keys
    survivors = ["r1", "r3"]
    after = {k: survivors[rendezvous_order(k, survivors)[0]] for k in keys}
    moved = [k for k in keys if after[k] != first[k]]
    assert moved and all(first[k] == "r2" for k in moved)  # only r2's keys moved
    assert sorted(rendezvous_order("k", names)) == [0, 1, 2]
