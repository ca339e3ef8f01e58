"""Chat templates of pretrained models: family detection, and the built-in renderer of each
family against jinja2 rendering the family's reference template text (skipped without
jinja2). The reference texts follow the formats their model families publish."""

from __future__ import annotations

import pytest

from riftco_transformer.serving.chat_templates import (
    PretrainedChatTemplate,
    detect_chat_family,
)

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
GEMMA = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
# Phi-3.5-mini-instruct's tokenizer_config.json template.
PHI3 = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

TEMPLATES = {
    "chatml": (CHATML, "<|im_start|>", "<|im_end|>"),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    "llama2": (LLAMA2, "<s>", "</s>"),
    "mistral": (MISTRAL, "<s>", "</s>"),
    "gemma": (GEMMA, "<bos>", "<eos>"),
    "phi3": (PHI3, "<s>", "<|endoftext|>"),
}

CONVERSATION = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy? Ünïcode 東京 🙂"},
]
WITH_SYSTEM = [{"role": "system", "content": "Answer briefly."}, *CONVERSATION]


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_families_are_recognised_from_their_text(family):
    assert detect_chat_family(TEMPLATES[family][0]) == family


def test_unrecognised_text_names_the_markers():
    with pytest.raises(ValueError, match="<\\|im_start\\|>"):
        detect_chat_family("{{ messages }}")
    with pytest.raises(TypeError):
        detect_chat_family(None)


@pytest.mark.parametrize("family", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", ["plain", "system"])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_built_in_renderer_equals_jinja_rendering(family, conversation, generation_prompt):
    pytest.importorskip("jinja2")
    text, bos, eos = TEMPLATES[family]
    messages = CONVERSATION if conversation == "plain" else WITH_SYSTEM
    if conversation == "system" and family in ("mistral", "gemma"):
        pytest.skip(f"the {family} reference template has no system role")
    built_in = PretrainedChatTemplate.from_text(text, bos_token=bos, eos_token=eos,
                                                use_jinja=False)
    jinja = PretrainedChatTemplate.from_text(text, bos_token=bos, eos_token=eos, use_jinja=True)
    assert not built_in.renders_with_jinja and jinja.renders_with_jinja
    assert built_in.render(messages, generation_prompt) == jinja.render(messages,
                                                                         generation_prompt)


# Gemma 2's (gemma-2-2b-it's tokenizer_config.json): Gemma's turns, no system role.
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_gemma2s_template_is_gemmas_format(generation_prompt):
    assert detect_chat_family(GEMMA2) == "gemma"
    built_in = PretrainedChatTemplate.from_text(GEMMA2, bos_token="<bos>", eos_token="<eos>",
                                                use_jinja=False)
    assert built_in.stop_sequences == ("<end_of_turn>", "<eos>")
    rendered = built_in.render(CONVERSATION, generation_prompt)
    assert rendered.startswith("<bos><start_of_turn>user\nWhat is the capital of France?"
                               "<end_of_turn>\n<start_of_turn>model\nParis.<end_of_turn>\n")
    pytest.importorskip("jinja2")
    jinja = PretrainedChatTemplate.from_text(GEMMA2, bos_token="<bos>", eos_token="<eos>",
                                             use_jinja=True)
    assert jinja.render(CONVERSATION, generation_prompt) == rendered


def test_chatml_inserts_the_templates_default_system_message():
    template = PretrainedChatTemplate.from_text(CHATML, use_jinja=False)
    rendered = template.render([{"role": "user", "content": "Hi"}])
    assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                        "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    assert template.stop_sequences == ("<|im_end|>",)


def test_alternation_is_enforced_by_the_built_in_renderers():
    template = PretrainedChatTemplate.for_family("mistral")
    with pytest.raises(ValueError, match="alternate"):
        template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="family"):
        PretrainedChatTemplate("vicuna")
    with pytest.raises(ValueError, match="role"):
        PretrainedChatTemplate.for_family("chatml").render([{"role": "robot", "content": "x"}])
    with pytest.raises(TypeError, match="add_generation_prompt"):
        PretrainedChatTemplate.for_family("chatml").render(CONVERSATION, 1)
