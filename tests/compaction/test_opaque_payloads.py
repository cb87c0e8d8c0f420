"""Opaque payloads (sealed reasoning, base64 images and files) are counted by what the upstream
charges for them, never as text; ordinary text keeps its estimate."""

from __future__ import annotations

import base64
import random

from compaction.messages import (
    ANTHROPIC,
    IMAGE_HIGH_TOKENS,
    IMAGE_LOW_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    RESPONSES,
)
from compaction.tokens import HeuristicEstimator

ENCRYPTED_MAX_TOKENS = 32_768
"""The documented bound on one sealed payload (docs/compaction.md, messages/item.py)."""

RESPONSES_EST = HeuristicEstimator(shape=RESPONSES)
ANTHROPIC_EST = HeuristicEstimator(shape=ANTHROPIC)


def sealed(size: int) -> str:
    """Base64 of `size` random bytes, like a provider's ciphertext."""
    return base64.b64encode(random.Random(size).randbytes(size)).decode()


def test_three_megabytes_of_encrypted_reasoning_cost_a_bounded_number_of_tokens() -> None:
    # Counted as text it was 563k tokens: more than any window, for reasoning the upstream
    # charges at most a turn's output for (and drops entirely before the latest user message).
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": sealed(2_250_000),
    }
    assert len(reasoning["encrypted_content"]) == 3_000_000
    tokens = RESPONSES_EST.count_message(reasoning)
    assert tokens == MESSAGE_OVERHEAD_TOKENS + ENCRYPTED_MAX_TOKENS


def test_encrypted_reasoning_costs_far_less_than_its_text() -> None:
    blob = sealed(1_200)  # about what one real reasoning item carries
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": blob}
    as_text = RESPONSES_EST.count_text(blob)
    cost = RESPONSES_EST.count_message(reasoning) - MESSAGE_OVERHEAD_TOKENS
    assert 0 < cost <= as_text / 4 + 1


def test_the_summary_of_a_reasoning_item_still_counts_as_text() -> None:
    summary = [{"type": "summary_text", "text": "Checked the config loader. " * 40}]
    reasoning = {"type": "reasoning", "summary": summary, "encrypted_content": "QUJD"}
    text = RESPONSES_EST.count_text(summary[0]["text"])
    assert RESPONSES_EST.count_message(reasoning) >= MESSAGE_OVERHEAD_TOKENS + text


def test_redacted_thinking_is_bounded_and_a_signature_is_not_charged() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}
    redacted = {"type": "redacted_thinking", "data": sealed(2_250_000)}
    huge = {"role": "assistant", "content": [redacted, call]}
    bare = {"role": "assistant", "content": [call]}
    extra = ANTHROPIC_EST.count_message(huge) - ANTHROPIC_EST.count_message(bare)
    assert extra == ENCRYPTED_MAX_TOKENS

    thinking = "Let me list the files first."
    signed = {"type": "thinking", "thinking": thinking, "signature": sealed(300_000)}
    unsigned = {"type": "thinking", "thinking": thinking, "signature": ""}
    assert ANTHROPIC_EST.count_message(
        {"role": "assistant", "content": [signed, call]}
    ) == ANTHROPIC_EST.count_message({"role": "assistant", "content": [unsigned, call]})


def test_a_screenshot_a_computer_call_returns_costs_an_image_not_its_base64() -> None:
    output = {
        "type": "computer_call_output",
        "call_id": "call_1",
        "output": {
            "type": "computer_screenshot",
            "image_url": "data:image/png;base64," + sealed(600_000),
        },
    }
    assert RESPONSES_EST.count_message(output) == MESSAGE_OVERHEAD_TOKENS + IMAGE_HIGH_TOKENS
    output["output"]["detail"] = "low"  # type: ignore[index]
    assert RESPONSES_EST.count_message(output) == MESSAGE_OVERHEAD_TOKENS + IMAGE_LOW_TOKENS


def test_a_generated_image_passed_back_costs_an_image() -> None:
    generated = {"type": "image_generation_call", "id": "ig_1", "result": sealed(900_000)}
    assert RESPONSES_EST.count_message(generated) == MESSAGE_OVERHEAD_TOKENS + IMAGE_HIGH_TOKENS


def test_inline_base64_images_cost_the_same_in_every_dialect_whatever_their_size() -> None:
    small, large = "data:image/png;base64," + sealed(3), "data:image/png;base64," + sealed(900_000)
    chat = HeuristicEstimator()
    for url in (small, large):
        part = {"type": "image_url", "image_url": {"url": url}}
        assert chat.count_message({"role": "user", "content": [part]}) == (
            MESSAGE_OVERHEAD_TOKENS + IMAGE_HIGH_TOKENS
        )
        part = {"type": "input_image", "image_url": url}
        assert RESPONSES_EST.count_message({"role": "user", "content": [part]}) == (
            MESSAGE_OVERHEAD_TOKENS + IMAGE_HIGH_TOKENS
        )
    images = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        for data in (sealed(3), sealed(900_000))
    ]
    costs = {ANTHROPIC_EST.count_message({"role": "user", "content": [image]}) for image in images}
    assert len(costs) == 1


def test_a_chat_file_with_inline_data_costs_as_much_as_the_same_responses_file() -> None:
    data = sealed(240_000)
    chat_part = {"type": "file", "file": {"filename": "a.pdf", "file_data": data}}
    responses_part = {"type": "input_file", "filename": "a.pdf", "file_data": data}
    chat = HeuristicEstimator().count_message({"role": "user", "content": [chat_part]})
    responses = RESPONSES_EST.count_message({"role": "user", "content": [responses_part]})
    assert chat == responses
    assert chat < HeuristicEstimator().count_text(data)  # by its bytes, not as text
