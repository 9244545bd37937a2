"""Run the Tinker pipeline with no model and no model hub: for smoke tests and CI.

:func:`offline_tokenizer` trains a tiny byte-level BPE tokenizer with ChatML's special
tokens (a ``model_name`` directory); :class:`ReferencePolicy` replays each task's
reference solution as tokens the renderer produced. Needs ``tokenizers`` and
``transformers`` (tinker-cookbook's own dependencies).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from fleetenv.adapters.tinker import _cookbook as cb
from fleetenv.core.tasks import Task

__all__ = ["ReferencePolicy", "offline_tokenizer", "render_turn"]

CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_CORPUS = (
    '<tool_call>\n{"name": "get_ticket", "arguments": {"ticket_id": 1124}}\n</tool_call>',
    "You are an agent working in an application through its tools.",
    "<tool_response>\n{\"id\": 1, \"status\": \"open\"}\n</tool_response>",
    "system user assistant tool function parameters properties description type",
)


def offline_tokenizer(directory: str | os.PathLike[str], *,
                      corpus: Iterable[str] = (), vocab_size: int = 512) -> str:
    """Train and save a small byte-level BPE tokenizer; returns the directory (a
    ``model_name`` for :class:`~fleetenv.adapters.tinker.FleetEnvGroupBuilder`)."""
    hf: Any = cb.load("tokenizers")
    transformers: Any = cb.load("transformers")
    models, pre_tokenizers, trainers = hf.models, hf.pre_tokenizers, hf.trainers
    tokenizer = hf.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = hf.decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(CHATML_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([*_CORPUS, *corpus], trainer)
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    path = os.fspath(directory)
    wrapped.save_pretrained(path)
    return path


def render_turn(renderer: Any, message: dict[str, Any]) -> list[int]:
    """The tokens of an assistant ``message`` as the model would sample them (its
    content, its tool calls, and the stop token), rendered by ``renderer``."""
    ctx = cb.renderers.RenderContext(idx=1, is_last=True, last_user_index=0)
    lock = cb.tokenizer_lock(renderer.tokenizer)  # the envs render at the same time
    rendered = cb.guarded(lock, renderer.render_message, message, ctx)
    tokens: list[int] = []
    for chunk in rendered.output:
        tokens.extend(chunk.tokens)
    return tokens


class ReferencePolicy(cb.TokenCompleterBase):
    """A ``TokenCompleter`` replaying the reference solutions of ``tasks``.

    It reads the prompt as a model would: the task is the one whose prompt appears in
    it, the turn is how many assistant turns it already holds. ``final_answer`` is said
    after the last call (a task whose reference ends with ``submit_final_answer`` ends
    there). ``calls`` counts the completions asked for.
    """

    def __init__(self, renderer: Any, tasks: Sequence[Task], *,
                 final_answer: str = "Done.") -> None:
        self.renderer = renderer
        self.tasks = [task for task in tasks if task.reference_solution is not None]
        self.final_answer = final_answer
        self.calls = 0
        lock = cb.tokenizer_lock(renderer.tokenizer)
        header = cb.guarded(lock, renderer.build_generation_prompt, [])
        self._header = renderer.tokenizer.decode(header.to_ints())

    async def __call__(self, model_input: Any, stop: Any, *,
                       max_tokens: int | None = None) -> Any:
        self.calls += 1
        await asyncio.sleep(0)  # a real sampler yields to the loop while it works
        message = self.next_message(self.decode(model_input))
        tokens = render_turn(self.renderer, message)
        return cb.completers.TokensWithLogprobs(tokens=tokens,
                                                maybe_logprobs=[-0.1] * len(tokens))

    def decode(self, model_input: Any) -> str:
        lock = cb.tokenizer_lock(self.renderer.tokenizer)
        return str(cb.guarded(lock, self.renderer.tokenizer.decode, model_input.to_ints()))

    def task_of(self, prompt: str) -> Task:
        found = [task for task in self.tasks if task.prompt in prompt]
        if not found:
            raise LookupError("the prompt holds none of the tasks' prompts")
        return max(found, key=lambda task: len(task.prompt))

    def turn_of(self, prompt: str) -> int:
        return prompt.count(self._header) - 1

    def next_message(self, prompt: str) -> dict[str, Any]:
        task = self.task_of(prompt)
        turn = self.turn_of(prompt)
        solution = task.reference_solution or []
        if turn >= len(solution):
            return {"role": "assistant", "content": self.final_answer}
        call = solution[turn]
        tool_call = cb.renderers.ToolCall(function=cb.renderers.ToolCall.FunctionBody(
            name=call.name, arguments=json.dumps(call.arguments)))
        return {"role": "assistant", "content": "", "tool_calls": [tool_call]}
