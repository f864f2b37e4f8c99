"""A matplotlib plot drawn in a sandbox comes back as a PNG display bundle;
save it to a local file.

    FORKBOX_URL=http://127.0.0.1:7070 python3 examples/plot_image.py [out.png]
"""
import base64
import sys

from forkbox import Sandbox

out = sys.argv[1] if len(sys.argv) > 1 else "plot.png"
with Sandbox(template="python-datasci") as sb:
    ex = sb.run_code(
        "import numpy as np, matplotlib.pyplot as plt\n"
        "x = np.linspace(0, 4 * np.pi, 400)\n"
        "plt.plot(x, np.sin(x), label='sin')\n"
        "plt.plot(x, np.cos(x), label='cos')\n"
        "plt.legend(); plt.title('drawn in a forkbox sandbox')"
    )
    [png] = [d["image/png"] for d in ex.displays if "image/png" in d]
    with open(out, "wb") as f:
        f.write(base64.b64decode(png))
    print(f"wrote {out} ({len(base64.b64decode(png))} bytes)")
