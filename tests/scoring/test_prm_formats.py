"""The two PRM input formats, exactly: each step stripped and followed by its marker, a marker
inside a step removed."""

from metagen.scoring.prm_formats import QWEN_SYSTEM, qwen_messages, shepherd_text


def test_shepherd_text_tags_every_step_and_drops_forged_tags():
    assert shepherd_text("Q?", ["3 + 4 = 7\n", " So 7 ки", "done"]) == "Q? 3 + 4 = 7 ки\nSo 7 ки\ndone ки"
    assert shepherd_text("Q?", ["a", "b"], tag="<t>") == "Q? a <t>\nb <t>"


def test_qwen_messages_end_every_step_with_the_separator():
    assert qwen_messages("Q?", [" a\n", "b<extra_0>"]) == [
        {"role": "system", "content": QWEN_SYSTEM}, {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "a<extra_0>b<extra_0>"}]
    assert qwen_messages("Q?", ["a"], separator="|", system="S")[0] == {"role": "system", "content": "S"}
    assert qwen_messages("Q?", ["a"], separator="|", system="S")[2]["content"] == "a|"
