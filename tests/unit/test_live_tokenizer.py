"""A real tokenizer for the live servers' text prompts (a tokenizer.json made here with the
``tokenizers`` library), and the rule when none is given or the library is absent."""

from __future__ import annotations

import sys

import openai
import pytest

from fleetsim.cli import main
from fleetsim.errors import FleetsimInputError
from fleetsim.live.emulate import emulated_backend
from fleetsim.live.server import ServerThread
from fleetsim.live.tokens import count_tokens, load_tokenizer, tokenize

MODEL = "llama-3.1-8b"
VOCAB = ("<unk>", "<s>", "hello", "world", "the", "quick", "brown", "fox", "<|user|>",
         "<|assistant|>")


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A word-level tokenizer that adds a BOS token, as Llama's does."""
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(VOCAB)},
                                           unk_token="<unk>"))
    tok.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    tok.post_processor = tk.processors.TemplateProcessing(single="<s> $A",
                                                          special_tokens=[("<s>", 1)])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_no_tokenizer_is_the_counting_rule():
    assert load_tokenizer(None) is tokenize


def test_a_tokenizer_json_counts_as_the_library_does(tokenizer_json):
    for path in (tokenizer_json, tokenizer_json.parent):  # the file or its model folder
        encode = load_tokenizer(str(path))
        assert encode("hello world hello") == [1, 2, 3, 2]
        assert encode("the quick brown fox jumps") == [1, 4, 5, 6, 7, 0]
    assert count_tokens("the quick brown fox jumps") == 8  # the rule differs here


def test_the_emulator_counts_prompts_with_the_tokenizer(tokenizer_json):
    encode = load_tokenizer(str(tokenizer_json))
    text = "the quick brown fox jumps " * 20
    with ServerThread(lambda: emulated_backend(speed=50.0, tokenizer=encode)) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=20.0)
        r = c.completions.create(model=MODEL, prompt=text, max_tokens=2)
        assert r.usage.prompt_tokens == len(encode(text)) == 101 != count_tokens(text)
        chat = c.chat.completions.create(model=MODEL, max_tokens=2,
                                         messages=[{"role": "user", "content": "hello world"}])
        # "<|user|>\nhello world\n<|assistant|>\n": BOS and four words
        assert chat.usage.prompt_tokens == 5


@pytest.mark.parametrize(("setup", "message"), [
    ("missing", "no such file"),
    ("bad", "not a tokenizer.json"),
    ("no_library", "needs the tokenizers package"),
])
def test_a_bad_tokenizer_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, setup, message):
    path = tmp_path / "tokenizer.json"
    if setup == "bad":
        path.write_text("{not json")
    elif setup == "no_library":
        path.write_text("{}")
        monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    with pytest.raises(FleetsimInputError, match=message):
        load_tokenizer(str(path))
    for command in ("emulate", "gateway"):
        extra = ["--backend", "http://127.0.0.1:9"] if command == "gateway" else []
        assert main([command, *extra, "--tokenizer", str(path)]) == 2
        err = capsys.readouterr().err
        assert "--tokenizer" in err and message in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
