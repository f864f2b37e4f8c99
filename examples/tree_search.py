"""Tree search with fork: load a DataFrame once, fork N children, try one idea
in each, keep the best with merge_into.

    FORKBOX_URL=http://127.0.0.1:7070 python3 examples/tree_search.py
"""
from forkbox import Sandbox

IDEAS = {
    "mean": "pred = df.groupby('x_bin').y.transform('mean')",
    "median": "pred = df.groupby('x_bin').y.transform('median')",
    "linear": "import numpy as np\nk, b = np.polyfit(df.x, df.y, 1)\npred = k * df.x + b",
    "constant": "pred = df.y * 0 + df.y.mean()",
}

with Sandbox(template="python-datasci") as root:
    # The expensive state: built once, shared copy-on-write by every child.
    root.run_code(
        "import numpy as np, pandas as pd\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.uniform(0, 10, 200_000)\n"
        "df = pd.DataFrame({'x': x, 'y': 3 * x + rng.normal(0, 1, x.size)})\n"
        "df['x_bin'] = (df.x * 2).round()"
    )
    children = root.fork(len(IDEAS))
    scores = {}
    for (name, code), child in zip(IDEAS.items(), children):
        child.run_code(code)
        scores[name] = float(child.run_code("float(((df.y - pred) ** 2).mean())").text)
        print(f"{name:>8}: mse {scores[name]:.3f}")
    best = min(scores, key=scores.get)
    winner = children[list(IDEAS).index(best)]
    root.merge_into(winner)  # root's id now drives the winner's REPL and files
    for child in children:
        child.close()        # the winner's close is a no-op: it was merged
    print("kept:", best, "->", root.run_code("print(type(pred).__name__, len(pred))").stdout.strip())
