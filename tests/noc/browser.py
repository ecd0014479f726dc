"""The HTML report as a person sees it: headless Chromium (Debian's package) renders the page to
a DOM dump and a screenshot (tests/e2e/test_noc_view.py, tests/noc/test_inline_view.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]  # fmt: skip


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "Debian's chromium is not installed: run `make setup`"
    return path


def dom(page: Path, profile: Path) -> str:
    """The page's DOM after Chromium loaded it."""
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip


def screenshot(page: Path, png: Path, profile: Path, size: tuple[int, int]):
    """The page rendered at `size` (width, height) in CSS pixels, as an RGB image."""
    from PIL import Image

    subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    return Image.open(png).convert("RGB")


def not_blank(img) -> bool:
    """Real contrast and more than a handful of colours (text, tables, charts)."""
    from PIL import ImageStat

    return max(ImageStat.Stat(img).stddev) > 20 and len(img.getcolors(maxcolors=1 << 20) or []) > 50


def hex_rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def bands(img, colours: list[str]) -> list[tuple[int, int]]:
    """Vertical extents [(top, bottom)] of the horizontal bands where any of `colours` is painted:
    one band per bar row of a bar chart."""
    wanted = {hex_rgb(c) for c in colours}
    px = img.load()
    rows = [y for y in range(img.height) if any(px[x, y] in wanted for x in range(0, img.width, 2))]
    out: list[tuple[int, int]] = []
    for y in rows:
        if out and y == out[-1][1] + 1:
            out[-1] = (out[-1][0], y)
        else:
            out.append((y, y))
    return out


def runs(img, y: int, colour: str) -> list[tuple[int, int]]:
    """Horizontal runs [(x0, width)] of one colour along the pixel row y."""
    rgb, px = hex_rgb(colour), img.load()
    out: list[tuple[int, int]] = []
    for x in range(img.width):
        if px[x, y] == rgb:
            if out and out[-1][0] + out[-1][1] == x:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((x, 1))
    return out
