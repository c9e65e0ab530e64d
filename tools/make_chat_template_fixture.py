#!/usr/bin/env python3
"""Renders the chat-template corpus with Hugging Face transformers, for dsarl's byte-for-byte check.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2    # no torch needed
    /tmp/venv/bin/python tools/make_chat_template_fixture.py    # writes tests/fixtures/chat_templates/cases.json

Every template tests/fixtures/chat_templates/*.jinja is rendered over a fixed corpus of conversations (system,
user and assistant turns, multi-turn, tool calls and tool results, reasoning_content and the older "thinking"
name, <think> inside content, empty content, content as a list of parts, unicode) with add_generation_prompt
true and false and enable_thinking unset, true and false, through transformers' own render_jinja_template: the
function apply_chat_template(..., tokenize=False) calls, with the variables it passes (messages, tools,
documents, add_generation_prompt, the special token strings of dsarl's byte tokenizer, then the caller's
kwargs). Where transformers
raises, the case records the error and dsarl must refuse it too. Run only when the corpus or templates change;
the output is deterministic.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "fixtures", "chat_templates")

# The special token strings the template sees. dsarl's test renders with its byte tokenizer, whose bos/eos/pad
# these are; transformers gets the same strings as kwargs, as its tokenizer's special_tokens_map would pass them.
SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city, in °C.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
            "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web <fast> & wide",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                         "limit": {"type": "number", "default": 2.5}}}}},
]

CALLS = [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}},
    {"type": "function", "function": {"name": "search", "arguments": {
        "query": "weather \"today\"\nnews", "limit": 2.5, "filters": {"lang": ["de", "en"], "safe": True},
        "cursor": None}}},
]

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "What is 2+2?"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    "multi_turn": [
        {"role": "system", "content": "  Be kind.  \n"},
        {"role": "user", "content": "Hello, who are you?"},
        {"role": "assistant", "content": "I am a model."},
        {"role": "user", "content": "Tell me a fact about the Moon"},
        {"role": "assistant", "content": "It has no air.\n\n"},
        {"role": "user", "content": "And Mars?"},
    ],
    "reasoning": [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No: 91 = 7 * 13.", "reasoning_content": "\nCheck 7: 7*13=91.\n"},
        {"role": "user", "content": "And 97?"},
        {"role": "assistant", "content": "Yes.", "reasoning_content": "Try 2,3,5,7: none divide."},
    ],
    "thinking_alias": [
        {"role": "user", "content": "Pick a colour"},
        {"role": "assistant", "content": "Blue.", "thinking": "Any will do."},
    ],
    "think_in_content": [
        {"role": "user", "content": "Compute 3*4"},
        {"role": "assistant", "content": "<think>\n3 times 4\n</think>\n\n12"},
        {"role": "user", "content": "Thanks /nothink"},
    ],
    "tool_calls": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Zürich, and news?"},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "3 results"},
        {"role": "assistant", "content": "It is 21 °C; three news items."},
        {"role": "user", "content": "Thanks"},
    ],
    "tool_then_generate": [
        {"role": "user", "content": "Look up the weather in Oslo"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                           "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny"},
    ],
    "empty_content": [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "still there?"},
    ],
    "content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "image"},
                                     {"type": "text", "text": "this."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français. 日本語もOK."},
        {"role": "user", "content": "Emoji 🙂👍🏽, RTL שלום, combining é, tab\tquote\" backslash\\ nbsp\u00a0end"},
        {"role": "assistant", "content": "D'accord — «très bien» ✓\u3000"},
        {"role": "user", "content": "中文问题：你好吗？\n第二行"},
    ],
    "unknown_role": [
        {"role": "user", "content": "Hi"},
        {"role": "narrator", "content": "Meanwhile..."},
    ],
}

# which conversations go with tools
WITH_TOOLS = {"tool_calls", "tool_then_generate"}


def main():
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
        import transformers
        import jinja2
    except ImportError:
        sys.exit("needs transformers and jinja2: pip install transformers jinja2")
    templates = sorted(f for f in os.listdir(OUT) if f.endswith(".jinja"))
    cases = []
    for tname in templates:
        with open(os.path.join(OUT, tname), encoding="utf-8") as f:
            source = f.read()
        for cname, messages in CONVERSATIONS.items():
            tools = TOOLS if cname in WITH_TOOLS else None
            for agp in (False, True):
                for thinking in (None, False, True):
                    if not agp and thinking is True:
                        continue
                    kwargs = {}
                    if thinking is not None:
                        kwargs["enable_thinking"] = thinking
                    case = {"template": tname, "conversation": cname, "tools": tools is not None,
                            "kwargs": kwargs, "add_generation_prompt": agp}
                    try:
                        rendered, _ = render_jinja_template(conversations=[messages], tools=tools,
                                                            chat_template=source, add_generation_prompt=agp,
                                                            **SPECIAL_TOKENS, **kwargs)
                        case["expected"] = rendered[0]
                    except Exception as e:  # the template refuses this input: dsarl must refuse it too
                        case["error"] = "%s: %s" % (type(e).__name__, e)
                    cases.append(case)
    doc = {"generator": "tools/make_chat_template_fixture.py",
           "transformers": transformers.__version__, "jinja2": jinja2.__version__, "special_tokens": SPECIAL_TOKENS, "conversations": CONVERSATIONS, "tools": TOOLS,
           "cases": cases}
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(1 for c in cases if "error" in c)
    print("wrote %d cases (%d expected refusals) for %d templates" % (len(cases), errors, len(templates)))


if __name__ == "__main__":
    main()
