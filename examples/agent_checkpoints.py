"""An agent loop with undo: checkpoint before each risky step, restore when the
step breaks the state. (A stand-in "agent" proposes the steps; a real one would
ask a model.) Needs the server's checkpoint routes (docs/state.md).

    FORKBOX_URL=http://127.0.0.1:7070 python3 examples/agent_checkpoints.py
"""
from forkbox import Sandbox

STEPS = [
    "data = [3, 1, 2]",
    "data.sort()",
    "data = None  # a bad idea: it destroys the data",
    "data.append(4)",
    "total = sum(data)",
]


def healthy(sb: Sandbox) -> bool:
    """The agent's check that the state is still good."""
    return sb.run_code("isinstance(data, list)").text == "True"


with Sandbox() as sb:
    for step in STEPS:
        cp = sb.checkpoint()              # memory and files, in milliseconds
        ex = sb.run_code(step)
        if not ex.ok or not healthy(sb):
            print(f"undo  {step!r}: {ex.error or 'state check failed'}")
            sb.restore(cp)                # back to before the step
        else:
            print(f"keep  {step!r}")
        sb.delete_checkpoint(cp)
    print("final:", sb.run_code("data, total").text)
