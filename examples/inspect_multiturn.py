"""A small inspect_ai task for running through nfproxy: several samples, two turns each.

    nfproxy --mode record --upstream https://api.openai.com --store recordings/inspect.lmdb -- \
        inspect eval examples/inspect_multiturn.py --model openai/gpt-4o-mini --max-connections 4
    nfproxy --mode replay --strict --store recordings/inspect.lmdb -- \
        inspect eval examples/inspect_multiturn.py --model openai/gpt-4o-mini --max-connections 4

A gpt-5 / o-series model (or `-M responses_api=true`) goes through the Responses API instead of
chat completions. `nfanalyze --inspect-logs LOG_DIR` turns the eval logs into outcome rows.
"""

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, user_message


@task
def nf_multiturn(samples: int = 6, reworded: int = -1) -> Task:
    """`-T reworded=N` changes sample N's prompt (a replay then misses only that sample)."""
    def prompt(i: int) -> str:
        return f"Reply with one sentence containing the number {i}." if i == reworded else \
            f"Reply with a sentence that contains the number {i}."

    return Task(
        dataset=[Sample(id=f"s{i}", input=prompt(i), target=str(i)) for i in range(samples)],
        solver=[generate(), user_message("Now reply once more, with the same number."), generate()],
        scorer=includes(),
    )
