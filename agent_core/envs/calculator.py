"""The calculator task: arithmetic word problems from a seed, solved with the `calculator` tool.

Answers are integers. Problems use 2-3 digit numbers so that a small model gains by calling
the tool. The reply is judged on its final 'Answer: <number>'.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from agent_core.core.records import Message, Task
from agent_core.envs.tool_env import ToolEnv
from agent_core.prompting.context import ContextPolicy
from agent_core.text.answers import extract_number_answer, numbers_match
from agent_core.tools.calculator import CalculatorTool

SYSTEM_PROMPT = (
    "You solve arithmetic word problems. Use the calculator tool for the arithmetic, "
    "then reply with the final answer as: Answer: <number>"
)

# Two worked exchanges: small models copy their shape far more reliably than instructions
# (measured with SmolLM2-135M at T=0.7: one example -> 3 of 64 episodes made a valid call,
# two examples -> 52 of 64).
EXAMPLES: list[Message] = [
    {"role": "user", "content": "A box holds 12 pens. How many pens are in 7 boxes?"},
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}'
        "</tool_call>",
    },
    {"role": "tool", "content": "84"},
    {"role": "assistant", "content": "Answer: 84"},
    {
        "role": "user",
        "content": "Tom has 250 dollars and spends 86 dollars. How many dollars are left?",
    },
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "250 - 86"}}'
        "</tool_call>",
    },
    {"role": "tool", "content": "164"},
    {"role": "assistant", "content": "Answer: 164"},
]

Problem = tuple[str, int, str]  # text, answer, an expression that computes it


def _orchard(r: random.Random) -> Problem:
    rows, per, cut = r.randint(11, 39), r.randint(11, 29), r.randint(10, 99)
    text = f"A farmer has {rows} rows of {per} trees. He cuts down {cut} trees. "
    return text + "How many trees are left?", rows * per - cut, f"{rows} * {per} - {cut}"


def _shop(r: random.Random) -> Problem:
    bags, days = r.randint(12, 89), r.randint(6, 31)
    return (
        f"A shop sells {bags} bags of rice each day. How many bags does it sell in {days} days?",
        bags * days,
        f"{bags} * {days}",
    )


def _classes(r: random.Random) -> Problem:
    classes, size = r.randint(6, 24), r.randint(18, 35)
    total = classes * size
    return (
        f"There are {total} students split equally into {classes} classes. "
        "How many students are in each class?",
        size,
        f"{total} / {classes}",
    )


def _stickers(r: random.Random) -> Problem:
    have, buy = r.randint(120, 899), r.randint(120, 899)
    return (
        f"Anna has {have} stickers and buys {buy} more. How many stickers does she have now?",
        have + buy,
        f"{have} + {buy}",
    )


def _savings(r: random.Random) -> Problem:
    start, spend = r.randint(300, 999), r.randint(101, 299)
    return (
        f"Tom has {start} dollars and spends {spend} dollars. How many dollars are left?",
        start - spend,
        f"{start} - {spend}",
    )


def _tickets(r: random.Random) -> Problem:
    adults, kids, price = r.randint(12, 60), r.randint(12, 60), r.randint(7, 19)
    return (
        f"A museum sells tickets at {price} dollars each to {adults} adults and {kids} children. "
        "How many dollars does it collect?",
        (adults + kids) * price,
        f"({adults} + {kids}) * {price}",
    )


def _pages(r: random.Random) -> Problem:
    per_day, days, extra = r.randint(12, 48), r.randint(5, 21), r.randint(10, 90)
    return (
        f"Mia reads {per_day} pages a day for {days} days, then {extra} more pages. "
        "How many pages did she read?",
        per_day * days + extra,
        f"{per_day} * {days} + {extra}",
    )


GENERATORS: tuple[Callable[[random.Random], Problem], ...] = (
    _orchard,
    _shop,
    _classes,
    _stickers,
    _savings,
    _tickets,
    _pages,
)


class CalculatorEnv(ToolEnv):
    """Word problems with one `calculator` tool; success = the correct final answer."""

    name = "calculator"
    reward_terms = (("answer_match", 1.0),)

    def __init__(
        self,
        max_steps: int = 3,
        few_shot: bool = True,
        context: ContextPolicy | None = None,
        tool_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(
            tools=[CalculatorTool()],
            system_prompt=SYSTEM_PROMPT,
            examples=EXAMPLES if few_shot else [],
            max_steps=max_steps,
            context=context,
            tool_timeout_s=tool_timeout_s,
        )

    @classmethod
    def make_task(cls, seed: int) -> Task:
        rng = random.Random(seed)
        generator = GENERATORS[rng.randrange(len(GENERATORS))]
        text, answer, expression = generator(rng)
        meta = {"seed": seed, "expression": expression}
        return Task(task_id=f"calculator-{seed}", prompt=text, answer=answer, meta=meta)

    def solve_step(self) -> str | None:
        """Call the calculator with the task's expression, then answer with its result."""
        if self.task is None:
            return None
        if self.tool_calls_ok == 0:
            call = {"name": "calculator", "arguments": {"expression": self.task.meta["expression"]}}
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        return f"Answer: {self.task.answer}"

    def is_success(self, final_text: str, task: Task) -> bool:
        return numbers_match(extract_number_answer(final_text), task.answer)
