"""Self-contained HTML pages: one file, Plotly's JS and the data inline, nothing fetched.

Strings never reach the page as markup: the data travels as JSON inside a script tag
(with ``<``, ``>``, ``&`` escaped as Unicode escapes so no ``</script>`` can close it) and
the page's scripts insert it with ``textContent``; chart labels are HTML-escaped because
Plotly renders a subset of HTML in text.
"""

import html
import json
from functools import lru_cache
from importlib.resources import files


@lru_cache(maxsize=1)
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _template(name: str) -> str:
    """A file of ``harness/report/templates``, read from the installed package."""
    return files("harness.report").joinpath("templates", name).read_text()


def json_for_script(data) -> str:
    text = json.dumps(data, sort_keys=True, allow_nan=False, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def page(title: str, data: dict, script: str) -> str:
    """A complete page: ``script`` (a file in harness/report/templates) renders ``data``."""
    return "\n".join(
        [
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
            f"<title>{html.escape(title)}</title><style>{_template('style.css')}</style>",
            f"<script>{plotly_js()}</script></head><body>",
            f"<script id='data' type='application/json'>{json_for_script(data)}</script>",
            f"<script>{_template('common.js')}\n{_template(script)}</script>",
            "</body></html>",
        ]
    )


def label(text) -> str:
    """A chart label safe for Plotly, which renders a subset of HTML in text."""
    return html.escape(str(text))
